// matmul_avx2.cpp: AVX2+FMA+F16C matmul kernels and activation quantization.
// This file alone is compiled with the AVX2 flags. Everything here except fill_matmul_avx2
// has internal linkage and no STL template is instantiated, so the linker cannot merge code
// compiled with these flags into a portable caller.
//
// Every output element is computed by the same sequence of operations whatever tile it falls
// in, so results do not depend on how rows are split across threads.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>

#include "kernels/abi.h"
#include "kernels/kquant_scales.h"
#include "kernels/packed16.h"

#define PYINFER_INLINE static inline __attribute__((always_inline))
#define PYINFER_MEMBER inline __attribute__((always_inline))

namespace pyinfer {
namespace {

PYINFER_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

PYINFER_INLINE int32_t hsum8_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

PYINFER_INLINE float f16_scale(const uint8_t* p) { return _cvtsh_ss(load_u16_le(p)); }
PYINFER_INLINE float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// ---- activation quantization (bit for bit as quantize_act_ref) ---------------------------

void quantize_act_avx2(const float* x, block_q8a* dst, int64_t k) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t ib = 0; ib < k / QK8_A; ++ib, x += QK8_A) {
    __m256 v[4], a[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + 8 * i);
      a[i] = _mm256_andnot_ps(sign, v[i]);
    }
    const float m1 = hmax8(_mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3])));
    const __m256 m = _mm256_set1_ps(m1);
    uint32_t hit = 0;
    for (int i = 0; i < 4; ++i)
      hit |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a[i], m, _CMP_EQ_OQ))) << (8 * i);
    const int jo = hit != 0 ? __builtin_ctz(hit) : 0;
    __m256 rest[4];  // |x| with jo's lane zeroed
    for (int i = 0; i < 4; ++i)
      rest[i] = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(lane, _mm256_set1_epi32(jo - 8 * i))), a[i]);
    const float m2 = hmax8(_mm256_max_ps(_mm256_max_ps(rest[0], rest[1]), _mm256_max_ps(rest[2], rest[3])));
    bool split;
    const float amax = act_amax(m1, m2, &split);
    const float idf = amax != 0.0f ? 127.0f / amax : 0.0f;
    const __m256 id = _mm256_set1_ps(idf);
    __m256i q[4];
    // cvtps rounds half to even in the default rounding mode, like nearbyint.
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    // The packs work within 128-bit lanes; the permute restores element order. The largest
    // element saturates here when split; its l is written below.
    const __m256i p16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst[ib].qs), ordered);
    int h = 0;
    if (split) dst[ib].qs[jo] = static_cast<int8_t>(act_split(static_cast<int>(std::nearbyint(x[jo] * idf)), &h));
    act_finish(dst[ib], amax, hsum8_epi32(s), hsum8_epi32(_mm256_add_epi32(q[0], q[1])), h, jo);
  }
}

// ---- exact mode: float32 activations, float weights or quantized rows dequantized --------

// 8 weights of a row from element k, as float32. type: GGML_F32, GGML_F16 or GGML_BF16.
PYINFER_INLINE __m256 load_w8(int type, const uint8_t* row, int64_t k) {
  if (type == GGML_F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
  if (type == GGML_F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// 8 bytes at p, zero-extended to int32 lanes.
PYINFER_INLINE __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// Weights k..k+31 of a row (k a multiple of 32) as float32, 8 per vector: a float type's as
// stored; a quantized type's (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K) dequantized in
// registers with dequant_ref.cpp's operations per element, so they are the values its
// dequant_row gives, bit for bit.
PYINFER_INLINE void load_w32(int type, const uint8_t* row, int64_t k, __m256 (&wv)[4]) {
  if (type == GGML_F32 || type == GGML_F16 || type == GGML_BF16) {
    for (int i = 0; i < 4; ++i) wv[i] = load_w8(type, row, k + 8 * i);
    return;
  }
  const TypeTraits& tt = type_traits(type);
  const uint8_t* b = row + k / tt.block_elems * tt.block_bytes;  // the block holding the run
  const __m256i m4 = _mm256_set1_epi32(0x0f);
  if (tt.block_elems == QK8_0) {
    // Q8_0: element e is qs[e]. Q4_0, Q4_1, Q5_0, Q5_1: element e < 16 in the low nibble of
    // qs[e], e >= 16 in the high nibble of qs[e - 16]; the 5-bit types' fifth bit of element e
    // is bit e of qh.
    const __m256 d = _mm256_set1_ps(f16_scale(b));
    if (type == GGML_Q8_0) {
      for (int i = 0; i < 4; ++i)
        wv[i] = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 2 + 8 * i)))),
            d);
      return;
    }
    const bool has_min = tt.has_min, five = tt.quant_bits == 5;
    const __m256 m = _mm256_set1_ps(has_min ? f16_scale(b + 2) : 0.0f);
    const uint8_t* qh = b + (has_min ? 4 : 2);
    const uint8_t* qs = five ? qh + 4 : qh;
    const __m256i bias = _mm256_set1_epi32(tt.q_bias);
    for (int i = 0; i < 4; ++i) {
      const __m256i w = u8x8(qs + 8 * (i & 1));
      __m256i q = i < 2 ? _mm256_and_si256(w, m4) : _mm256_srli_epi32(w, 4);
      if (five) {
        const __m256i h = _mm256_srlv_epi32(_mm256_set1_epi32(qh[i]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        q = _mm256_or_si256(q, _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(1)), 4));
      }
      wv[i] = has_min ? _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q), d), m)
                      : _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, bias)), d);
    }
    return;
  }
  const int j = static_cast<int>(k % QK_K / 32);  // the run's 32-element sub-block
  // Q4_K, Q5_K: sub-blocks in pairs sharing 32 bytes of qs, low nibbles then high; Q5_K's
  // fifth bit of element l is bit j of qh[l]. value = (d * sc) * q - dmin * mn.
  int sc, mn;
  kquant_scale_min(b + 4, j, &sc, &mn);
  const __m256 d1 = _mm256_set1_ps(f16_scale(b) * sc), m1 = _mm256_set1_ps(f16_scale(b + 2) * mn);
  const bool five = type == GGML_Q5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = (five ? qh + 32 : qh) + 32 * (j / 2);
  for (int i = 0; i < 4; ++i) {
    const __m256i w = u8x8(qs + 8 * i);
    __m256i q = j % 2 == 0 ? _mm256_and_si256(w, m4) : _mm256_srli_epi32(w, 4);
    if (five)
      q = _mm256_or_si256(
          q, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u8x8(qh + 8 * i), j), _mm256_set1_epi32(1)), 4));
    wv[i] = _mm256_sub_ps(_mm256_mul_ps(d1, _mm256_cvtepi32_ps(q)), m1);
  }
}

// One row of W against MT activation rows; per element: four accumulators over each
// 32-run of k, summed (a0 + a1) + (a2 + a3) at the end. One weight row at a time keeps a
// GEMV to a single sequential stream, which reads faster than tiles of several rows
// (docs/tuning.md, "one weight row at a time"); with ahead, the stream's lines kStreamFetchAhead
// bytes on (across the row's end: rows are rb apart, back to back) are requested into L2 as it
// goes ("requests ahead on Intel", "requests ahead into L2"). In a GEMM each weight load serves
// the MT activation rows. The AVX-512 table uses these kernels too (see fill_matmul_avx512),
// except for float32 rows against three or more activation rows (matmul_exact_f32_many).
PYINFER_INLINE void exact_tile(int type, int MT, bool ahead, const uint8_t* row, const float* x, int64_t K, float* y,
                               int64_t ldy) {
  __m256 acc[2][4];
  for (int c = 0; c < MT; ++c)
    for (int i = 0; i < 4; ++i) acc[c][i] = _mm256_setzero_ps();
  const int64_t bb = type_traits(type).block_bytes, be = type_traits(type).block_elems;
  for (int64_t k = 0; k < K; k += 32) {
    if (ahead) exact_fetch_ahead(row, k, bb, be);
    __m256 wv[4];
    load_w32(type, row, k, wv);
    for (int c = 0; c < MT; ++c)
      for (int i = 0; i < 4; ++i) acc[c][i] = _mm256_fmadd_ps(wv[i], _mm256_loadu_ps(x + c * K + k + 8 * i), acc[c][i]);
  }
  for (int c = 0; c < MT; ++c)
    y[c * ldy] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[c][0], acc[c][1]), _mm256_add_ps(acc[c][2], acc[c][3])));
}

PYINFER_INLINE void exact_rows(int type, bool ahead, const void* w, int64_t rb, const float* x, int64_t M, int64_t K,
                               int64_t n_rows, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int64_t n = 0; n < n_rows; ++n) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) exact_tile(type, 2, ahead, wb + n * rb, x + m * K, K, y + m * ldy + n, ldy);
    for (; m < M; ++m) exact_tile(type, 1, ahead, wb + n * rb, x + m * K, K, y + m * ldy + n, ldy);
  }
}

template <int T, bool Ahead>
void matmul_exact_avx2(const void* w, int64_t rb, const float* x, int64_t M, int64_t K, int64_t n_rows, float* y,
                       int64_t ldy) {
  exact_rows(T, Ahead, w, rb, x, M, K, n_rows, y, ldy);
}

// ---- fast mode: integer dot products per block ----------------------------------------------

// Exact integer dot product of one weight block with one activation block, as 8 int32
// partial sums. maddubs multiplies unsigned by signed bytes and saturates pairs to int16:
// nibbles (0..15) x int8 cannot saturate; Q8_0 takes |w| (<= 128) x sign(w)*a (|.| <= 127),
// whose pairs stay within 32512.
// Adds 128 * h * q_w[jo] (a split block's largest activation, see q8_act.h) into lane 0, with
// q_w as the dot product above takes it: Q8_0 signed, Q4 the stored nibble.
PYINFER_INLINE __m256i add_split(int type, __m256i p, const uint8_t* blk, const block_q8a* xb) {
  if (xb->h4 == 0) return p;
  return _mm256_add_epi32(
      p, _mm256_zextsi128_si256(_mm_cvtsi32_si128(128 * act_h(*xb) * stored_quant(type, blk, xb->jo))));
}

PYINFER_INLINE __m256i block_dot(int type, const uint8_t* blk, const block_q8a* xb) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
  const __m256i ones = _mm256_set1_epi16(1);
  if (type_traits(type).qs_signed) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + type_traits(type).qs_offset));
    return add_split(
        type, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q)), ones), blk, xb);
  }
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + type_traits(type).qs_offset));
  // Low nibbles are elements 0..15, high nibbles 16..31.
  const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0f));
  __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(nib, a), ones);
  // Q4_0 stores q + 8: subtract 8 * sum(a), exactly, in one lane.
  if (type_traits(type).q_bias != 0)
    p = _mm256_add_epi32(p, _mm256_zextsi128_si256(_mm_cvtsi32_si128(-type_traits(type).q_bias * xb->sum)));
  return add_split(type, p, blk, xb);
}

// NR rows of W against one activation row. Per element: acc += float(partials) * (d_w*d_x)
// over the blocks, then a horizontal sum; Q4_1 adds sum_b m_w * (d_x * sum_x) at the end.
PYINFER_INLINE void fast_tile(int type, int NR, const uint8_t* w, int64_t rb, const block_q8a* x, int64_t nb,
                              float* y) {
  const int bb = type_traits(type).block_bytes;
  __m256 acc[4];
  float acc_min[4];
  for (int r = 0; r < NR; ++r) {
    acc[r] = _mm256_setzero_ps();
    acc_min[r] = 0.0f;
  }
  for (int64_t ib = 0; ib < nb; ++ib) {
    const block_q8a* xb = x + ib;
    const float s = xb->dsum;
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * rb + ib * bb;
      const __m256 p = _mm256_cvtepi32_ps(block_dot(type, blk, xb));
      acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(f16_scale(blk) * xb->d), acc[r]);
      if (type_traits(type).has_min) acc_min[r] += f16_scale(blk + type_traits(type).m_offset) * s;
    }
  }
  for (int r = 0; r < NR; ++r) y[r] = type_traits(type).has_min ? hsum8(acc[r]) + acc_min[r] : hsum8(acc[r]);
}

PYINFER_INLINE void fast_rows(int type, const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K,
                              int64_t n_rows, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t nb = K / QK8_A;
  int64_t n = 0;
  for (; n + 4 <= n_rows; n += 4)
    for (int64_t m = 0; m < M; ++m) fast_tile(type, 4, wb + n * rb, rb, xq + m * nb, nb, y + m * ldy + n);
  for (; n < n_rows; ++n)
    for (int64_t m = 0; m < M; ++m) fast_tile(type, 1, wb + n * rb, rb, xq + m * nb, nb, y + m * ldy + n);
}

template <int T>
void matmul_fast_avx2(const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows, float* y,
                      int64_t ldy) {
  fast_rows(T, w, rb, xq, M, K, n_rows, y, ldy);
}

// ---- fast mode on 16-row interleaved weights (packed16.h) -------------------------------------
// A 16-row group-block is taken as two halves of 8 rows: bytes 32h..32h+31 of each 64-byte
// quant column are rows 8h..8h+7, 4 bytes each, so int32 lane r of a ymm is row 8h + r and
// a block's 8 integer sums per half come out whole, with no horizontal sums. The integers
// are exact and each row's float arithmetic is the scalar reference's (acc = fma(d_w*d_x,
// isum, acc), one fused multiply-add): results match it bit for bit, as on AVX-512.

// Activation bytes 4c..4c+3 of a block, broadcast to the 8 lanes.
PYINFER_INLINE __m256i act4(const block_q8a* xb, int c) {
  int32_t v;
  __builtin_memcpy(&v, xb->qs + 4 * c, 4);
  return _mm256_set1_epi32(v);
}

// Integer dot products of 8 rows' quants (half h of group-block gb) with one activation block.
// Q4: maddubs of nibbles (0..15) by int8 gives pairs within +-3810, so the 8 columns' int16
// results add up without overflow (at most 30480) before one widening madd; Q4_0's stored
// q + 8 comes off as 8 * sum(a). Q8_0 stores q + 128, whose products by int8 would saturate
// maddubs' pairs: with q = stored ^ 0x80, |q| (<= 128) times sign(q)*a (|.| <= 127) keeps
// pairs within 32512, widened per column.
// Adds 128 * h * q_w[jo] for a split block (q8_act.h) to 8 rows' sums: one more dot step on
// jo's quant column with h in jo's byte only (|q| * sign-carrying h for Q8_0, as above).
// Fifth bits of quant column g of Q5_0 and Q5_1 (bit g of each byte of the transposed word,
// packed16.h) as 16. Shifts of 16-bit lanes: the mask keeps each byte's own bit.
PYINFER_INLINE __m256i fifth_bits(__m256i v, int g) {
  const __m256i b = g <= 4 ? _mm256_slli_epi16(v, 4 - g) : _mm256_srli_epi16(v, g - 4);
  return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

// Quant column g (elements 4g..4g+3; Q8_0: bytes 4g..4g+3) of rows 8h..8h+7 of a 32-element
// group-block: Q8_0 signed (q + 128 undone), the 4- and 5-bit types' unsigned quants.
PYINFER_INLINE __m256i q_column8(int type, const uint8_t* gb, int h, int g) {
  const int qo = packed_quants_offset(type);
  const auto load = [&](int o) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + o + 32 * h)); };
  if (type_traits(type).qs_signed)
    return _mm256_xor_si256(load(qo + 64 * g), _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i v = load(qo + 64 * (g % 4));  // high nibbles: elements 16..31
  __m256i q = _mm256_and_si256(g < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
  if (type_traits(type).quant_bits == 5) q = _mm256_or_si256(q, fifth_bits(load(packed_qh_offset(type)), g));
  return q;
}

// Adds 128 * h * q_w[jo] for a split block (q8_act.h) to 8 rows' sums: one more dot step on
// jo's quant column with h in jo's byte only (|q| * sign-carrying h for Q8_0, as above).
PYINFER_INLINE __m256i add_split8(int type, __m256i isum, const uint8_t* gb, int half, const block_q8a* xb) {
  if (xb->h4 == 0) return isum;
  const __m256i hb = _mm256_set1_epi32(xb->h4);
  const __m256i q = q_column8(type, gb, half, xb->jo / 4);
  const __m256i p = type_traits(type).qs_signed ? _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(hb, q))
                                                : _mm256_maddubs_epi16(q, hb);
  return _mm256_add_epi32(isum, _mm256_slli_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), 7));
}

// Quant columns 0..7 of rows 8h..8h+7 of a 32-element group-block, unpacked once for every
// activation row of a tile: Q8_0 signed, the 4- and 5-bit types' unsigned quants.
PYINFER_INLINE void unpack8(int type, const uint8_t* gb, int h, __m256i* wq) {
  if (type_traits(type).qs_signed) {
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) wq[c] = q_column8(type, gb, h, c);
    return;
  }
  const int qo = packed_quants_offset(type);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 8
  for (int c = 0; c < 4; ++c) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + qo + 64 * c + 32 * h));
    wq[c] = _mm256_and_si256(v, m4);                            // elements 4c..4c+3
    wq[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);  // elements 16+4c..
  }
  if (type_traits(type).quant_bits == 5) {
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + packed_qh_offset(type) + 32 * h));
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) wq[c] = _mm256_or_si256(wq[c], fifth_bits(hb, c));
  }
}

// 8 rows' integer sums of one activation block against unpacked columns wq.
PYINFER_INLINE __m256i packed_dot8(int type, const __m256i* wq, const uint8_t* gb, int h, const block_q8a* xb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i isum;
  if (type_traits(type).qs_signed) {
    isum = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(wq[c]), _mm256_sign_epi8(act4(xb, c), wq[c]));
      isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, ones));
    }
  } else {
    // Two chains of four columns in int16. 4-bit pairs (at most 30480 over eight columns, see
    // above) add both chains before one widening; pairs of 5-bit quants by int8 reach
    // 2 * 31 * 127 = 7874, so four columns are the most one int16 holds: each chain widens.
    __m256i a = _mm256_maddubs_epi16(wq[0], act4(xb, 0)), b = _mm256_maddubs_epi16(wq[4], act4(xb, 4));
#pragma GCC unroll 8
    for (int c = 1; c < 4; ++c) {
      a = _mm256_add_epi16(a, _mm256_maddubs_epi16(wq[c], act4(xb, c)));
      b = _mm256_add_epi16(b, _mm256_maddubs_epi16(wq[c + 4], act4(xb, c + 4)));
    }
    isum = type_traits(type).quant_bits == 5 ? _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones))
                                             : _mm256_madd_epi16(_mm256_add_epi16(a, b), ones);
  }
  if (type_traits(type).q_bias != 0)
    isum = _mm256_add_epi32(isum, _mm256_set1_epi32(-type_traits(type).q_bias * xb->sum));
  return add_split8(type, isum, gb, h, xb);
}

// Rows 8h..8h+7 of a group that hold real rows: how many of them.
PYINFER_INLINE int half_rows(int n_valid, int h) {
  const int v = n_valid - 8 * h;
  return v < 0 ? 0 : v > 8 ? 8 : v;
}

PYINFER_INLINE void store_rows(__m256 v, float* y, int n) {
  float out[8];
  _mm256_storeu_ps(out, v);
#pragma GCC unroll 8
  for (int r = 0; r < n; ++r) y[r] = out[r];
}

// ---- K-quants in the 16-row layout ------------------------------------------------------------
// As on AVX-512 (matmul_avx512.cpp), each 32-block of a super-block meets its activation block
// with the scalar spec's float arithmetic per row, on half h of the group (8 rows) at a time.

// Lane-wise 6-bit scale (mins: second = true) of sub-block s from Q4_K's three packed scale
// columns (see matmul_avx512.cpp's k4_scale).
PYINFER_INLINE __m256i k4_scale(__m256i c0, __m256i c1, __m256i c2, int s, bool second) {
  const __m256i base = second ? c1 : c0;
  if (s < 4) return _mm256_and_si256(_mm256_srli_epi32(base, 8 * s), _mm256_set1_epi32(63));
  const int b = 8 * (s - 4);
  const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(c2, b + (second ? 4 : 0)), _mm256_set1_epi32(15));
  const __m256i hi = _mm256_slli_epi32(_mm256_srli_epi32(base, b + 6), 4);
  return _mm256_or_si256(lo, _mm256_and_si256(hi, _mm256_set1_epi32(0x30)));
}

// Quant column c of 32-block s, rows 8h..8h+7, as unsigned bytes (Q4_K: the nibble, Q5_K: the
// 5-bit quant, Q6_K: the 6-bit quant with its offset of 32).
PYINFER_INLINE __m256i k_column(int type, const uint8_t* gb, int h, int s, int c) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const auto load = [&](int o) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + o + 32 * h)); };
  if (type != GGML_Q6_K) {
    const __m256i v = load(packed_field(type, 3) + 64 * (8 * (s / 2) + c));
    const __m256i q = _mm256_and_si256(s % 2 == 0 ? v : _mm256_srli_epi16(v, 4), m4);
    if (type == GGML_Q4_K) return q;
    return _mm256_or_si256(q, fifth_bits(load(packed_field(GGML_Q5_K, 4) + 64 * c), s));  // Q5_K: bit s
  }
  const int hf = s / 4, k = s % 4;
  const __m256i l = load(packed_field(GGML_Q6_K, 2) + 64 * (16 * hf + 8 * (k & 1) + c));
  const __m256i q = load(packed_field(GGML_Q6_K, 3) + 64 * (8 * hf + c));
  const __m256i lo = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), m4);
  const __m256i hs = k == 0   ? _mm256_slli_epi16(q, 4)
                     : k == 1 ? _mm256_slli_epi16(q, 2)
                     : k == 2 ? q
                              : _mm256_srli_epi16(q, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}

// Q6_K's int8 scale number t of rows 8h..8h+7, sign-extended.
PYINFER_INLINE __m256i k6_scale(const uint8_t* gb, int h, int t) {
  const __m256i v =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + packed_field(GGML_Q6_K, 1) + 64 * (t / 4) + 32 * h));
  return _mm256_srai_epi32(_mm256_slli_epi32(v, 24 - 8 * (t % 4)), 24);
}

// Exact int32 sums of 4 columns (16 elements) of unsigned quants by activation bytes: maddubs
// pairs are at most 2 * 63 * 127 = 16002, so two columns add in int16 before widening.
PYINFER_INLINE __m256i dot4(const __m256i* wq, const block_q8a* xb, int c0) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i a =
      _mm256_add_epi16(_mm256_maddubs_epi16(wq[0], act4(xb, c0)), _mm256_maddubs_epi16(wq[1], act4(xb, c0 + 1)));
  const __m256i b =
      _mm256_add_epi16(_mm256_maddubs_epi16(wq[2], act4(xb, c0 + 2)), _mm256_maddubs_epi16(wq[3], act4(xb, c0 + 3)));
  return _mm256_add_epi32(_mm256_madd_epi16(a, ones), _mm256_madd_epi16(b, ones));
}

// ---- where a tile finds a group's columns and scales ---------------------------------------
// A unit is what a tile's dot steps on 8 rows take at a time: half h of one 32-block (for the
// K-quants, 32-block s of a super-block): eight unsigned quant columns of 32 bytes and the
// float scale and minimum factor of each row (Q6_K: its two int8 sub-block scales, widened).
// InPlace unpacks them from the repacked group each time a tile needs them; Copied reads them
// from a copy that InPlace wrote once for every activation row of a call. Both give the same
// bytes and the same floats, so the results do not depend on which one a tile reads.

struct InPlace {
  int type;
  const uint8_t* group;
  int gbb;  // bytes of a group-block (a 32-block, or a K-quant super-block)

  PYINFER_MEMBER const uint8_t* gb(int64_t ib) const {
    return group + (type_traits(type).block_elems == QK_K ? ib / 8 : ib) * gbb;
  }
  PYINFER_MEMBER void columns(int64_t ib, int s, int h, __m256i* wq) const {
    if (type_traits(type).block_elems != QK_K) {
      unpack8(type, gb(ib), h, wq);
      return;
    }
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) wq[c] = k_column(type, gb(ib), h, s, c);
  }
  // The row scale of the unit (K-quants: d times the sub-block's scale; Q6_K: d) and the
  // minimum factor (K-quants: dmin times the sub-block's min), as the scalar spec forms them.
  PYINFER_MEMBER void scales(int64_t ib, int s, int h, __m256* d, __m256* mn) const {
    const uint8_t* g = gb(ib);
    *d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + 16 * h)));
    *mn = _mm256_setzero_ps();
    if (type_traits(type).block_elems != QK_K) {
      if (type_traits(type).has_min)
        *mn = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + kPackedMins + 16 * h)));
      return;
    }
    if (type == GGML_Q6_K) return;
    const uint8_t* sc = g + packed_field(type, 2) + 32 * h;
    const __m256i c0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc));
    const __m256i c1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 64));
    const __m256i c2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sc + 128));
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(g + kPackedMins + 16 * h)));
    *d = _mm256_mul_ps(*d, _mm256_cvtepi32_ps(k4_scale(c0, c1, c2, s, false)));
    *mn = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(k4_scale(c0, c1, c2, s, true)));
  }
  // Q6_K: the int8 scales of the unit's two 16-element sub-blocks.
  PYINFER_MEMBER void k6(int64_t ib, int s, int h, __m256i* lo, __m256i* hi) const {
    *lo = k6_scale(gb(ib), h, 2 * s);
    *hi = k6_scale(gb(ib), h, 2 * s + 1);
  }
};

// Bytes of one unit in the copy: the columns, then 8 + 8 floats (Q6_K: 8 + 8 int32 scales).
constexpr int kUnitBytes = 8 * 32 + 16 * 4;

struct Copied {
  const uint8_t* units;

  PYINFER_MEMBER const uint8_t* unit(int64_t ib, int h) const { return units + (2 * ib + h) * kUnitBytes; }
  PYINFER_MEMBER void columns(int64_t ib, int, int h, __m256i* wq) const {
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) wq[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(unit(ib, h) + 32 * c));
  }
  PYINFER_MEMBER void scales(int64_t ib, int, int h, __m256* d, __m256* mn) const {
    const float* f = reinterpret_cast<const float*>(unit(ib, h) + 256);
    *d = _mm256_load_ps(f);
    *mn = _mm256_load_ps(f + 8);
  }
  PYINFER_MEMBER void k6(int64_t ib, int, int h, __m256i* lo, __m256i* hi) const {
    const uint8_t* f = unit(ib, h) + 256;
    *lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(f));
    *hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(f + 32));
  }
};

// Writes the copy of a group's nb units per half (32-byte aligned dst), fetching the next
// group (pf, or nullptr) ahead as it goes.
PYINFER_INLINE void copy_units(const InPlace& src, int64_t nb, uint8_t* dst, const uint8_t* pf) {
  const bool k = type_traits(src.type).block_elems == QK_K;
  const int step = k ? 8 : 1;  // 32-blocks per group-block
  for (int64_t i0 = 0; i0 < nb; i0 += step) {
#pragma GCC unroll 8
    for (int s = 0; s < step; ++s)
      for (int h = 0; h < 2; ++h) {
        const int64_t ib = i0 + s;
        if (pf != nullptr && h == 0) prefetch_part(pf, src.gbb, i0, s, step);
        uint8_t* u = dst + (2 * ib + h) * kUnitBytes;
        __m256i wq[8];
        src.columns(ib, s, h, wq);
        for (int c = 0; c < 8; ++c) _mm256_store_si256(reinterpret_cast<__m256i*>(u + 32 * c), wq[c]);
        if (src.type == GGML_Q6_K) {
          __m256i lo, hi;
          src.k6(ib, s, h, &lo, &hi);
          _mm256_store_si256(reinterpret_cast<__m256i*>(u + 256), lo);
          _mm256_store_si256(reinterpret_cast<__m256i*>(u + 288), hi);
        } else {
          __m256 d, mn;
          src.scales(ib, s, h, &d, &mn);
          _mm256_store_ps(reinterpret_cast<float*>(u + 256), d);
          _mm256_store_ps(reinterpret_cast<float*>(u + 288), mn);
        }
      }
  }
}

// ---- tiles ------------------------------------------------------------------------------------

// The halves a tile's pass takes: with one activation row both halves of each unit (one pass
// over the group's lines, as a GEMV's stream wants); with more, one half over the whole row at
// a time, so that its columns stay in registers for all MT rows (16 ymm registers: eight
// columns, MT accumulators and their minimum terms).
template <int MT>
constexpr int kHalvesPerPass = MT == 1 ? 2 : 1;

// 8 rows' exact int32 sums of one K-quant unit by an activation block, the split term included.
PYINFER_INLINE __m256i k_dot(int type, const __m256i* wq, const InPlace& raw, int64_t ib, int s, int h, __m256i k6lo,
                             __m256i k6hi, const block_q8a* xb) {
  __m256i lo = dot4(wq, xb, 0), hi = dot4(wq + 4, xb, 4);
  if (xb->h4 != 0) {  // 128 * h * q_w[jo], into jo's half
    const __m256i p =
        _mm256_madd_epi16(_mm256_maddubs_epi16(k_column(type, raw.gb(ib), h, s, xb->jo / 4), _mm256_set1_epi32(xb->h4)),
                          _mm256_set1_epi16(1));
    if (xb->jo < 16)
      lo = _mm256_add_epi32(lo, _mm256_slli_epi32(p, 7));
    else
      hi = _mm256_add_epi32(hi, _mm256_slli_epi32(p, 7));
  }
  if (type != GGML_Q6_K) return _mm256_add_epi32(lo, hi);
  // Each sub-block less 32 times its activations' sum, times its scale.
  lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(32 * xb->sum_lo));
  hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(32 * (xb->sum - xb->sum_lo)));
  return _mm256_add_epi32(_mm256_mullo_epi32(lo, k6lo), _mm256_mullo_epi32(hi, k6hi));
}

// 16 rows of W (one group, n_valid of them real) against MT activation rows, the columns and
// scales from src (InPlace or Copied); raw, the repacked group, serves the split terms and
// Q6_K's d. Per row and unit the scalar spec's float arithmetic:
// acc = fma(scale * d_x, isum, acc); the minimum terms (Q4_1, Q5_1: + mn * d_x sum_x; Q4_K,
// Q5_K: - mn * d_x sum_x, each one fused multiply-add) in their own accumulator, added at the end. pf: the next group,
// fetched ahead (in place only).
template <int MT, class Src>
PYINFER_INLINE void packed_tile(int type, const Src& src, const InPlace& raw, const block_q8a* x, int64_t nb, float* y,
                                int64_t ldy, int n_valid, const uint8_t* pf) {
  constexpr int HP = kHalvesPerPass<MT>;
  const bool kq = type_traits(type).block_elems == QK_K;
  const bool has_min = type_traits(type).has_min;
  for (int h0 = 0; h0 < 2 && half_rows(n_valid, h0) > 0; h0 += HP) {
    __m256 acc[MT][HP], acc_min[MT][HP];
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c)
#pragma GCC unroll 8
      for (int i = 0; i < HP; ++i) acc[c][i] = acc_min[c][i] = _mm256_setzero_ps();
    const int step = kq ? 8 : 1;  // 32-blocks per group-block
    for (int64_t i0 = 0; i0 < nb; i0 += step) {
#pragma GCC unroll 8
      for (int s = 0; s < step; ++s)
#pragma GCC unroll 8
        for (int i = 0; i < HP; ++i) {
          const int64_t ib = i0 + s;
          const int h = h0 + i;
          if (pf != nullptr && h0 == 0 && i == 0) prefetch_part(pf, raw.gbb, i0, s, step);
          __m256i wq[8];
          src.columns(ib, s, h, wq);
          __m256 d = _mm256_setzero_ps(), mn = d;
          __m256i k6lo = _mm256_setzero_si256(), k6hi = k6lo;
          if (type == GGML_Q6_K) {
            src.k6(ib, s, h, &k6lo, &k6hi);
            raw.scales(ib, s, h, &d, &mn);  // Q6_K's d alone: one conversion
          } else {
            src.scales(ib, s, h, &d, &mn);
          }
#pragma GCC unroll 8
          for (int c = 0; c < MT; ++c) {
            const block_q8a* xb = x + c * nb + ib;
            const __m256i isum =
                kq ? k_dot(type, wq, raw, ib, s, h, k6lo, k6hi, xb) : packed_dot8(type, wq, raw.gb(ib), h, xb);
            const __m256 f = _mm256_mul_ps(d, _mm256_set1_ps(xb->d));
            acc[c][i] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(isum), acc[c][i]);
            if (has_min) {
              const __m256 s = _mm256_set1_ps(xb->dsum);
              acc_min[c][i] = kq ? _mm256_fnmadd_ps(mn, s, acc_min[c][i]) : _mm256_fmadd_ps(mn, s, acc_min[c][i]);
            }
          }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c)
#pragma GCC unroll 8
      for (int i = 0; i < HP; ++i)
        store_rows(has_min ? _mm256_add_ps(acc[c][i], acc_min[c][i]) : acc[c][i], y + c * ldy + 8 * (h0 + i),
                   half_rows(n_valid, h0 + i));
  }
}

// Copies pay where a group meets more than one tile of activation rows, on rows whose copy
// stays in L2 (docs/tuning.md, "columns unpacked once per call").
constexpr int64_t kCopyMinRows = 5;
constexpr int64_t kCopyMaxBlocks = 256;

template <class Src>
PYINFER_INLINE void group_tiles(int type, const Src& src, const InPlace& raw, const block_q8a* xq, int64_t M,
                                int64_t nb, float* y, int64_t ldy, int valid, const uint8_t* pf) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4, pf = nullptr) packed_tile<4>(type, src, raw, xq + m * nb, nb, y + m * ldy, ldy, valid, pf);
  // The last one to three rows in one tile.
  const block_q8a* xr = xq + m * nb;
  float* yr = y + m * ldy;
  if (M - m == 3) packed_tile<3>(type, src, raw, xr, nb, yr, ldy, valid, pf);
  if (M - m == 2) packed_tile<2>(type, src, raw, xr, nb, yr, ldy, valid, pf);
  if (M - m == 1) packed_tile<1>(type, src, raw, xr, nb, yr, ldy, valid, pf);
}

PYINFER_INLINE void packed_rows(int type, const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K,
                                int64_t n_rows, float* y, int64_t ldy) {
  static thread_local UnitBuffer buffer;
  const int64_t nb = K / QK8_A;
  const int64_t group_bytes = kPackRows * rb;
  const int gbb = kPackRows * packed_block_bytes(type);
  uint8_t* units = M >= kCopyMinRows && nb <= kCopyMaxBlocks ? buffer.get(2 * nb * kUnitBytes) : nullptr;
  for (int64_t n = 0; n < n_rows; n += kPackRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + n / kPackRows * group_bytes;
    const int valid = n_rows - n < kPackRows ? static_cast<int>(n_rows - n) : kPackRows;
    // The next group, fetched ahead (docs/tuning.md, "the next group fetched ahead").
    const uint8_t* pf = n + kPackRows < n_rows ? group + group_bytes : nullptr;
    const InPlace raw{type, group, gbb};
    if (units != nullptr) {
      copy_units(raw, nb, units, pf);
      group_tiles(type, Copied{units}, raw, xq, M, nb, y + n, ldy, valid, nullptr);
    } else {
      group_tiles(type, raw, raw, xq, M, nb, y + n, ldy, valid, pf);
    }
  }
}

template <int T>
void matmul_fast_packed_avx2(const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows,
                             float* y, int64_t ldy) {
  packed_rows(T, w, rb, xq, M, K, n_rows, y, ldy);
}

// Type T's exact kernel, requesting its stream ahead where the tuning says so.
template <int T>
void exact_kernel(KernelSet& t, const KernelTuning& tuning) {
  t.matmul_exact[T] = tuning.stream_fetch_ahead ? matmul_exact_avx2<T, true> : matmul_exact_avx2<T, false>;
}

}  // namespace

void fill_matmul_avx2(KernelSet& t, const KernelTuning& tuning) {
  t.quantize_act = quantize_act_avx2;
  exact_kernel<GGML_F32>(t, tuning);
  t.matmul_exact_f32_many = t.matmul_exact[GGML_F32];
  exact_kernel<GGML_F16>(t, tuning);
  exact_kernel<GGML_BF16>(t, tuning);
  // Quantized rows dequantized in registers, for the few activation rows ops/matmul.cpp gives
  // an exact kernel (kExactDequantMinM): where that beat rows dequantized into scratch. Q4_K
  // and Q5_0 ran as fast either way and Q6_K slower, so they stay with their dequant kernels
  // (docs/tuning.md, "exact mode: quantized rows dequantized in registers").
  exact_kernel<GGML_Q8_0>(t, tuning);
  exact_kernel<GGML_Q4_0>(t, tuning);
  exact_kernel<GGML_Q4_1>(t, tuning);
  exact_kernel<GGML_Q5_1>(t, tuning);
  exact_kernel<GGML_Q5_K>(t, tuning);
  t.matmul_fast[GGML_Q8_0] = matmul_fast_avx2<GGML_Q8_0>;
  t.matmul_fast[GGML_Q4_0] = matmul_fast_avx2<GGML_Q4_0>;
  t.matmul_fast[GGML_Q4_1] = matmul_fast_avx2<GGML_Q4_1>;
  t.matmul_fast_packed[GGML_Q8_0] = matmul_fast_packed_avx2<GGML_Q8_0>;
  t.matmul_fast_packed[GGML_Q4_0] = matmul_fast_packed_avx2<GGML_Q4_0>;
  t.matmul_fast_packed[GGML_Q4_1] = matmul_fast_packed_avx2<GGML_Q4_1>;
  t.matmul_fast_packed[GGML_Q5_0] = matmul_fast_packed_avx2<GGML_Q5_0>;
  t.matmul_fast_packed[GGML_Q5_1] = matmul_fast_packed_avx2<GGML_Q5_1>;
  t.matmul_fast_packed[GGML_Q4_K] = matmul_fast_packed_avx2<GGML_Q4_K>;
  t.matmul_fast_packed[GGML_Q5_K] = matmul_fast_packed_avx2<GGML_Q5_K>;
  t.matmul_fast_packed[GGML_Q6_K] = matmul_fast_packed_avx2<GGML_Q6_K>;
}

}  // namespace pyinfer
