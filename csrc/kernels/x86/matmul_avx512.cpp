// matmul_avx512.cpp: AVX-512 (F, BW, VL, DQ, VNNI) matmul kernels and activation quantization.
// This file alone is compiled with the AVX-512 flags. Everything here except
// fill_matmul_avx512 has internal linkage and no STL template is instantiated, so the linker
// cannot merge code compiled with these flags into a portable caller.
//
// Every output element is computed by the same sequence of operations whatever tile it falls
// in, so results do not depend on how rows are split across threads.
#include <immintrin.h>

#include <cmath>

#include "kernels/abi.h"
#include "kernels/kquant_scales.h"
#include "kernels/packed16.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own intrinsics as
// maybe-uninitialized once they are inlined here; they are never read.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define PYINFER_INLINE static inline __attribute__((always_inline))

namespace pyinfer {

namespace {

// The sum of v's 16 int32 lanes, wrapping like the lanes' own adds.
PYINFER_INLINE int32_t hsum_epi32(__m512i v) {
  __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

}  // namespace
namespace {

PYINFER_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

PYINFER_INLINE float f16_scale(const uint8_t* p) { return _cvtsh_ss(load_u16_le(p)); }

// ---- activation quantization (bit for bit as quantize_act_ref) ---------------------------

PYINFER_INLINE float max32(__m512 a0, __m512 a1) { return _mm512_reduce_max_ps(_mm512_max_ps(a0, a1)); }

// A block's fields once its quants are stored: a split block's largest element (jo) stored
// apart, then the scale and sums.
PYINFER_INLINE void finish_block(const float* x, block_q8a& dst, bool split, int jo, float amax, float idf, int32_t sum,
                                 int32_t sum_lo) {
  int h = 0;
  if (split) dst.qs[jo] = static_cast<int8_t>(act_split(static_cast<int>(std::nearbyint(x[jo] * idf)), &h));
  act_finish(dst, amax, sum, sum_lo, h, jo);
}

// One block at a time: for the blocks past the last whole run of 16.
PYINFER_INLINE void quantize_block(const float* x, block_q8a& dst) {
  const __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  const __m512 a0 = _mm512_abs_ps(v0), a1 = _mm512_abs_ps(v1);
  const float m1 = max32(a0, a1);
  const __m512 m = _mm512_set1_ps(m1);
  const uint32_t hit = static_cast<uint32_t>(_mm512_cmp_ps_mask(a0, m, _CMP_EQ_OQ)) |
                       static_cast<uint32_t>(_mm512_cmp_ps_mask(a1, m, _CMP_EQ_OQ)) << 16;
  const int jo = hit != 0 ? __builtin_ctz(hit) : 0;
  const uint32_t rest = ~(1u << jo);  // every element but jo
  const float m2 = max32(_mm512_maskz_mov_ps(static_cast<__mmask16>(rest), a0),
                         _mm512_maskz_mov_ps(static_cast<__mmask16>(rest >> 16), a1));
  bool split;
  const float amax = act_amax(m1, m2, &split);
  const float idf = amax != 0.0f ? 127.0f / amax : 0.0f;
  const __m512 id = _mm512_set1_ps(idf);
  // cvtps rounds half to even in the default rounding mode, like nearbyint.
  const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(v0, id));
  const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(v1, id));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst.qs), _mm512_cvtepi32_epi8(q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst.qs + 16), _mm512_cvtepi32_epi8(q1));
  // Sums in vector lanes, which wrap (a row holding inf or NaN converts to INT_MIN lanes):
  // equal to the exact sums whenever those fit, never undefined behaviour.
  finish_block(x, dst, split, jo, amax, idf, hsum_epi32(_mm512_add_epi32(q0, q1)), hsum_epi32(q0));
}

// Sixteen vectors' lanes folded by op into one vector, lane b holding op over all of v[b]'s
// lanes: halves, then quarters, then pairs, then single lanes, two vectors into one at each
// step (a transpose as it reduces), then the lanes put in block order.
template <class Op>
PYINFER_INLINE __m512 fold16(__m512* v, Op op) {
  for (int i = 0; i < 8; ++i)  // v[i]: block 2i's 16 lanes folded to 8 (lanes 0-7), block 2i + 1's (8-15)
    v[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  for (int i = 0; i < 4; ++i)  // 128-bit lane j of v[i]: block 4i + j, folded to 4
    v[i] = op(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x88), _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xDD));
  for (int i = 0; i < 2; ++i)  // 128-bit lane j of v[i]: blocks 8i + j and 8i + 4 + j, 2 each
    v[i] = op(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x44), _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xEE));
  // Lane 4j + k: block j + 4k.
  const __m512 r = op(_mm512_shuffle_ps(v[0], v[1], 0x88), _mm512_shuffle_ps(v[0], v[1], 0xDD));
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

PYINFER_INLINE __m512 max_op(__m512 a, __m512 b) { return _mm512_max_ps(a, b); }
PYINFER_INLINE __m512 add_i32_op(__m512 a, __m512 b) {
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}

// Sixteen blocks at once, each exactly as quantize_block does it: their maxima, second
// maxima and sums are reduced sixteen to a vector instead of one block at a time, and the
// scales come from one vector division. A run holding a NaN goes one block at a time: a
// maximum keeps or drops a NaN by the order it compares in, and that order differs here.
PYINFER_INLINE void quantize_16_blocks(const float* x, block_q8a* dst) {
  __m512 t[16];
  alignas(64) float m1[16], amax[16], idf[16];
  alignas(64) int32_t sum[16], sum_lo[16];
  int jo[16];
  __mmask16 nan = 0;
  for (int b = 0; b < 16; ++b) {
    const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
    nan |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
    t[b] = _mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1));
  }
  if (nan != 0) {
    for (int b = 0; b < 16; ++b) quantize_block(x + 32 * b, dst[b]);
    return;
  }
  const __m512 vm1 = fold16(t, max_op);
  _mm512_store_ps(m1, vm1);
  for (int b = 0; b < 16; ++b) {
    const __m512 a0 = _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b)), a1 = _mm512_abs_ps(_mm512_loadu_ps(x + 32 * b + 16));
    const __m512 m = _mm512_set1_ps(m1[b]);
    const uint32_t hit = static_cast<uint32_t>(_mm512_cmp_ps_mask(a0, m, _CMP_EQ_OQ)) |
                         static_cast<uint32_t>(_mm512_cmp_ps_mask(a1, m, _CMP_EQ_OQ)) << 16;
    jo[b] = hit != 0 ? __builtin_ctz(hit) : 0;
    const uint32_t rest = ~(1u << jo[b]);
    t[b] = _mm512_max_ps(_mm512_maskz_mov_ps(static_cast<__mmask16>(rest), a0),
                         _mm512_maskz_mov_ps(static_cast<__mmask16>(rest >> 16), a1));
  }
  const __m512 vm2 = fold16(t, max_op);
  // act_amax and the inverse scale, lane by lane.
  const __mmask16 split = _mm512_cmp_ps_mask(vm1, _mm512_mul_ps(_mm512_set1_ps(2.0f), vm2), _CMP_GT_OQ);
  const __m512 va = _mm512_mask_max_ps(vm1, split, vm2, _mm512_div_ps(vm1, _mm512_set1_ps(128.0f)));
  const __mmask16 nz = _mm512_cmp_ps_mask(va, _mm512_setzero_ps(), _CMP_NEQ_UQ);  // amax != 0, as in C
  _mm512_store_ps(amax, va);
  _mm512_store_ps(idf, _mm512_maskz_div_ps(nz, _mm512_set1_ps(127.0f), va));
  __m512 lo[16];
  for (int b = 0; b < 16; ++b) {
    const float* xb = x + 32 * b;
    const __m512 id = _mm512_set1_ps(idf[b]);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb), id));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), id));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[b].qs), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst[b].qs + 16), _mm512_cvtepi32_epi8(q1));
    lo[b] = _mm512_castsi512_ps(q0);
    t[b] = _mm512_castsi512_ps(_mm512_add_epi32(q0, q1));
  }
  _mm512_store_si512(sum_lo, _mm512_castps_si512(fold16(lo, add_i32_op)));
  _mm512_store_si512(sum, _mm512_castps_si512(fold16(t, add_i32_op)));
  for (int b = 0; b < 16; ++b)
    finish_block(x + 32 * b, dst[b], (split >> b) & 1, jo[b], amax[b], idf[b], sum[b], sum_lo[b]);
}

void quantize_act_avx512(const float* x, block_q8a* dst, int64_t k) {
  const int64_t nb = k / QK8_A;
  int64_t ib = 0;
  for (; ib + 16 <= nb; ib += 16) quantize_16_blocks(x + ib * QK8_A, dst + ib);
  for (; ib < nb; ++ib) quantize_block(x + ib * QK8_A, dst[ib]);
}

// ---- fast mode: integer dot products per block (VNNI) ---------------------------------------

// A weight block's 32 quants as unsigned bytes in element order, the first operand of
// vpdpbusd (unsigned x signed): Q8_0 as |q| (its signs go onto the activations, see act_q),
// Q4_0 and Q4_1 as nibbles (Q4_0's 8 comes off through the activation sum, see act_init).
// *raw keeps Q8_0's signed quants.
PYINFER_INLINE __m256i w_quants(int type, const uint8_t* blk, __m256i* raw) {
  if (type_traits(type).qs_signed) {
    *raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + type_traits(type).qs_offset));
    return _mm256_abs_epi8(*raw);  // -128 becomes 0x80, which is 128 unsigned
  }
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + type_traits(type).qs_offset));
  // Low nibbles are elements 0..15, high nibbles 16..31.
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0f));
}

// The activation operand: for Q8_0 with the weight's signs (a * sign(w), 0 where w is 0).
PYINFER_INLINE __m256i act_q(int type, __m256i a, __m256i raw) {
  return type_traits(type).qs_signed ? _mm256_sign_epi8(a, raw) : a;
}

// Starting value of the int32 partial sums: for Q4_0, which stores q + 8, minus 8 times the
// activation sum in lane 0, so the lanes add up to the exact signed dot product.
PYINFER_INLINE __m256i act_init(int type, const block_q8a* xb) {
  if (type_traits(type).q_bias == 0) return _mm256_setzero_si256();
  return _mm256_zextsi128_si256(_mm_cvtsi32_si128(-type_traits(type).q_bias * xb->sum));
}

// NR rows of W against MT activation rows. Per element: acc += float(partials) * (d_w*d_x)
// over the blocks, then a horizontal sum; Q4_1 adds sum_b m_w * (d_x * sum_x) at the end.
PYINFER_INLINE void fast_tile(int type, int NR, int MT, const uint8_t* w, int64_t rb, const block_q8a* x, int64_t nb,
                              float* y, int64_t ldy) {
  const int bb = type_traits(type).block_bytes;
  __m256 acc[4][4];
  float acc_min[4][4];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < MT; ++c) {
      acc[r][c] = _mm256_setzero_ps();
      acc_min[r][c] = 0.0f;
    }
  for (int64_t ib = 0; ib < nb; ++ib) {
    __m256i wq[4], wraw[4];
    float wd[4], wm[4];
    for (int r = 0; r < NR; ++r) {
      const uint8_t* blk = w + r * rb + ib * bb;
      wq[r] = w_quants(type, blk, &wraw[r]);
      wd[r] = f16_scale(blk);
      if (type_traits(type).has_min) wm[r] = f16_scale(blk + type_traits(type).m_offset);
    }
    for (int c = 0; c < MT; ++c) {
      const block_q8a* xb = x + c * nb + ib;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb->qs));
      const __m256i init = act_init(type, xb);
      const float s = xb->dsum;
      for (int r = 0; r < NR; ++r) {
        __m256i init_r = init;
        if (xb->h4 != 0) {  // a split block: 128 * h * q_w[jo] into lane 0
          init_r = _mm256_add_epi32(init, _mm256_zextsi128_si256(_mm_cvtsi32_si128(
                                              128 * act_h(*xb) * stored_quant(type, w + r * rb + ib * bb, xb->jo))));
        }
        const __m256 p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(init_r, wq[r], act_q(type, a, wraw[r])));
        acc[r][c] = _mm256_fmadd_ps(p, _mm256_set1_ps(wd[r] * xb->d), acc[r][c]);
        if (type_traits(type).has_min) acc_min[r][c] += wm[r] * s;
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < MT; ++c)
      y[c * ldy + r] = type_traits(type).has_min ? hsum8(acc[r][c]) + acc_min[r][c] : hsum8(acc[r][c]);
}

// 4 x 4 tiles: each weight block is unpacked once for four activation rows.
PYINFER_INLINE void fast_rows(int type, const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K,
                              int64_t n_rows, float* y, int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t nb = K / QK8_A;
  int64_t n = 0;
  for (; n + 4 <= n_rows; n += 4) {
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) fast_tile(type, 4, 4, wb + n * rb, rb, xq + m * nb, nb, y + m * ldy + n, ldy);
    for (; m < M; ++m) fast_tile(type, 4, 1, wb + n * rb, rb, xq + m * nb, nb, y + m * ldy + n, ldy);
  }
  for (; n < n_rows; ++n)
    for (int64_t m = 0; m < M; ++m) fast_tile(type, 1, 1, wb + n * rb, rb, xq + m * nb, nb, y + m * ldy + n, ldy);
}

template <int T>
void matmul_fast_avx512(const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows, float* y,
                        int64_t ldy) {
  fast_rows(T, w, rb, xq, M, K, n_rows, y, ldy);
}

// ---- fast mode on 16-row interleaved weights (packed16.h) -------------------------------------
// Int32 lane r of every dot product step is row r, so a block's 16 integer sums come out
// whole, with no horizontal sums, and each row's float arithmetic is the scalar reference's
// (acc = fma(d_w*d_x, isum, acc), one fused multiply-add): results match it bit for bit.

// Activation bytes 4c..4c+3 of a block, broadcast to the 16 lanes.
PYINFER_INLINE __m512i act4(const block_q8a* xb, int c) {
  int32_t v;
  __builtin_memcpy(&v, xb->qs + 4 * c, 4);
  return _mm512_set1_epi32(v);
}

// Fifth bits of quant column g of Q5_0 and Q5_1 (bit g of each byte of the transposed word,
// packed16.h) as 16, from the 16 rows' word v. Shifts of 16-bit lanes: the mask keeps each
// byte's own bit.
PYINFER_INLINE __m512i fifth_bits(__m512i v, int g) {
  const __m512i b = g <= 4 ? _mm512_slli_epi16(v, 4 - g) : _mm512_srli_epi16(v, g - 4);
  return _mm512_and_si512(b, _mm512_set1_epi8(0x10));
}

// Unsigned quant column g of a 32-element group-block, as the dot product steps take it:
// Q8_0's bytes 4g..4g+3 (q + 128), the 4- and 5-bit types' elements 4g..4g+3.
PYINFER_INLINE __m512i q_column(int type, const uint8_t* gb, int g) {
  const int qo = packed_quants_offset(type);
  if (type_traits(type).qs_signed) return _mm512_loadu_si512(gb + qo + 64 * g);
  const __m512i v = _mm512_loadu_si512(gb + qo + 64 * (g % 4));  // high nibbles: elements 16..31
  __m512i q = _mm512_and_si512(g < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
  if (type_traits(type).quant_bits == 5)
    q = _mm512_or_si512(q, fifth_bits(_mm512_loadu_si512(gb + packed_qh_offset(type)), g));
  return q;
}

// 128 * h * q_w[jo] of a split activation block (q8_act.h) for the 16 rows: one more dot step
// on jo's quant column col, with h in jo's byte only. The stored offsets (Q8_0's 128, Q4_0's 8,
// Q5_0's 16, Q6_K's 32) come off with the rest through the block sums, which count a_jo whole.
PYINFER_INLINE __m512i split_term(__m512i col, const block_q8a* xb) {
  return _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), col, _mm512_set1_epi32(xb->h4)), 7);
}

// A Q6_K 32-block's integer sum from its two 16-element halves and their int8 scales.
PYINFER_INLINE __m512i q6k_isum(__m512i lo, __m512i hi, __m512i sc_lo, __m512i sc_hi) {
  return _mm512_add_epi32(_mm512_mullo_epi32(lo, sc_lo), _mm512_mullo_epi32(hi, sc_hi));
}

// The MT rows' integer sums of 32-block ib, from its eight unsigned quant columns wq: NA chains
// of dot steps per row (8 / NA steps each, added at the end), the rows' chains interleaved, so
// that at least four are in flight (vpdpbusd's latency in steps it could issue). Integer sums
// do not depend on the order. Q8_0 stores q + 128 and Q4_0 q + 8: each row's first chain
// starts at -off * sum(a), which takes that off exactly, in every lane. The split terms are
// the caller's.
template <int MT>
PYINFER_INLINE void block_dots(const __m512i (&wq)[8], const block_q8a* x, int64_t nb, int64_t ib, int off,
                               __m512i (&isum)[MT]) {
  constexpr int NA = MT >= 4 ? 1 : MT >= 2 ? 2 : 4;
  __m512i part[MT][NA];
#pragma GCC unroll 8
  for (int c = 0; c < MT; ++c) {
    part[c][0] = _mm512_set1_epi32(-off * x[c * nb + ib].sum);
#pragma GCC unroll 8
    for (int a = 1; a < NA; ++a) part[c][a] = _mm512_setzero_si512();
  }
#pragma GCC unroll 8
  for (int g = 0; g < 8; ++g)
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c)
      part[c][g % NA] = _mm512_dpbusd_epi32(part[c][g % NA], wq[g], act4(x + c * nb + ib, g));
#pragma GCC unroll 8
  for (int c = 0; c < MT; ++c) {
#pragma GCC unroll 8
    for (int a = 1; a < NA; ++a) part[c][0] = _mm512_add_epi32(part[c][0], part[c][a]);
    isum[c] = part[c][0];
  }
}

// 16 rows of W (one group, n_valid of them real) against MT activation rows; pf, if set, is
// the group to prefetch meanwhile.
template <int MT>
PYINFER_INLINE void packed_tile(int type, const uint8_t* group, const block_q8a* x, int64_t nb, float* y, int64_t ldy,
                                int n_valid, const uint8_t* pf) {
  const int gbb = kPackRows * packed_block_bytes(type);  // bytes of a group-block
  const int qo = packed_quants_offset(type);
  __m512 acc[MT], acc_min[MT];
  for (int c = 0; c < MT; ++c) acc[c] = acc_min[c] = _mm512_setzero_ps();
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const uint8_t* gb = group + ib * gbb;
    if (pf != nullptr) prefetch_part(pf, gbb, ib, 0, 1);  // the next group's block ib
    // The weights' unsigned quant columns, unpacked once for the MT activation rows.
    __m512i wq[8];
    if (type_traits(type).qs_signed) {
      for (int c = 0; c < 8; ++c) wq[c] = _mm512_loadu_si512(gb + qo + 64 * c);
    } else {
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512(gb + qo + 64 * c);
        wq[c] = _mm512_and_si512(v, m4);                            // elements 4c..4c+3
        wq[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);  // elements 16+4c..
      }
      if (type_traits(type).quant_bits == 5) {
        const __m512i h = _mm512_loadu_si512(gb + packed_qh_offset(type));
        for (int c = 0; c < 8; ++c) wq[c] = _mm512_or_si512(wq[c], fifth_bits(h, c));
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    __m512 mn = _mm512_setzero_ps();
    if (type_traits(type).has_min)
      mn = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kPackedMins)));
    __m512i isum[MT];
    block_dots<MT>(wq, x, nb, ib, packed_quant_bias(type), isum);
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c) {
      const block_q8a* xb = x + c * nb + ib;
      if (xb->h4 != 0) isum[c] = _mm512_add_epi32(isum[c], split_term(q_column(type, gb, xb->jo / 4), xb));
    }
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c) {
      const block_q8a* xb = x + c * nb + ib;
      const __m512 f = _mm512_mul_ps(d, _mm512_set1_ps(xb->d));
      acc[c] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(isum[c]), acc[c]);
      if (type_traits(type).has_min) acc_min[c] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xb->dsum), acc_min[c]);
    }
  }
  const __mmask16 k = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int c = 0; c < MT; ++c)
    _mm512_mask_storeu_ps(y + c * ldy, k, type_traits(type).has_min ? _mm512_add_ps(acc[c], acc_min[c]) : acc[c]);
}

// ---- fast mode on 16-row interleaved K-quants (packed16.h) -----------------------------------
// A super-block of 256 is eight 32-blocks, one activation block each; per 32-block and row
// the float arithmetic is matmul_ref.cpp's (acc = fma(d * d_x, float(isum), acc), Q4_K's and
// Q5_K's min term acc_min = fma(-(dmin * mn), d_x * sum_x, acc_min), taken as a fused
// negated multiply-add), so results match the scalar spec bit for bit. Integer sums are exact in any order.

// Lane-wise 6-bit scale (mins: second = true) of sub-block s of Q4_K's (and Q5_K's) packed
// 12-byte field,
// whose three 4-byte columns are c0 (scales 0..3, top bits of 4..7), c1 (mins 0..3, top bits of
// 4..7), c2 (low 4 bits of scales 4..7 and, in the high nibbles, of mins 4..7).
PYINFER_INLINE __m512i k4_scale(__m512i c0, __m512i c1, __m512i c2, int s, bool second) {
  const __m512i six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(15);
  const __m512i base = second ? c1 : c0;
  if (s < 4) return _mm512_and_si512(_mm512_srli_epi32(base, 8 * s), six);
  const int b = 8 * (s - 4);
  const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(c2, b + (second ? 4 : 0)), four);
  const __m512i hi = _mm512_slli_epi32(_mm512_srli_epi32(base, b + 6), 4);  // 2 bits: byte's top
  return _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi32(0x30)));
}

// Quant column c (elements 4c..4c+3, 16 rows) of 32-block s of a packed super-block, as
// unsigned bytes: Q4_K the nibble, Q5_K the 5-bit quant, Q6_K the 6-bit quant (offset 32
// still in).
PYINFER_INLINE __m512i k_column(int type, const uint8_t* gb, int s, int c) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  if (type != GGML_Q6_K) {
    const __m512i v = _mm512_loadu_si512(gb + packed_field(type, 3) + 64 * (8 * (s / 2) + c));
    const __m512i q = _mm512_and_si512(s % 2 == 0 ? v : _mm512_srli_epi16(v, 4), m4);
    if (type == GGML_Q4_K) return q;
    // Q5_K: bit s of each qh byte is the fifth bit of its element of sub-block s.
    return _mm512_or_si512(q, fifth_bits(_mm512_loadu_si512(gb + packed_field(GGML_Q5_K, 4) + 64 * c), s));
  }
  const int hf = s / 4, k = s % 4;
  const __m512i l = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 2) + 64 * (16 * hf + 8 * (k & 1) + c));
  const __m512i h = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 3) + 64 * (8 * hf + c));
  const __m512i lo = _mm512_and_si512(k < 2 ? l : _mm512_srli_epi16(l, 4), m4);
  // Bits 2k..2k+1 of each qh byte to bits 4..5 (shifts of 16-bit lanes: the mask keeps each
  // byte's own bits).
  const __m512i hs = k == 0   ? _mm512_slli_epi16(h, 4)
                     : k == 1 ? _mm512_slli_epi16(h, 2)
                     : k == 2 ? h
                              : _mm512_srli_epi16(h, 2);
  return _mm512_or_si512(lo, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)));
}

// Q6_K's int8 scale number t (0..15) of the 16 rows, sign-extended to int32 lanes.
PYINFER_INLINE __m512i k6_scale(const uint8_t* gb, int t) {
  const __m512i v = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 1) + 64 * (t / 4));
  return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * (t % 4)), 24);
}

// (a & 0x0f) | b, for b with bits in 0x30 only: the low nibble of a and the high bits b.
PYINFER_INLINE __m512i nibble_or(__m512i a, __m512i b) {
  return _mm512_ternarylogic_epi32(a, _mm512_set1_epi8(0x0f), b, 0xEA);  // (A & B) | C
}

// Q6_K's 16 rows against one activation row (a GEMV), the integer sums a half super-block at
// a time: each quant column's three stored vectors (its low nibbles of sub-blocks k and k + 2,
// of k + 1 and k + 3, and the high bits of all four) are loaded once for the half's four
// sub-blocks, where k_column loads two of them for each. The float arithmetic per row and
// sub-block is packed_tile_k's, in the same order: the same bits.
PYINFER_INLINE void q6k_gemv_tile(const uint8_t* group, const block_q8a* x, int64_t nb, float* y, int n_valid,
                                  const uint8_t* pf) {
  constexpr int gbb = kPackRows * packed_block_bytes(GGML_Q6_K);  // bytes of a group-block
  const __m512i m30 = _mm512_set1_epi8(0x30);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t ib = 0; ib < nb; ib += 8) {
    const uint8_t* gb = group + ib / 8 * gbb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
#pragma GCC unroll 2
    for (int hf = 0; hf < 2; ++hf) {
      const block_q8a* xh = x + ib + 4 * hf;
      // Sub-block k of the half: elements 0..15 (lo) and 16..31 (hi), each chain starting at -32
      // times its activations' sum.
      __m512i lo[4], hi[4];
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        lo[k] = _mm512_set1_epi32(-32 * xh[k].sum_lo);
        hi[k] = _mm512_set1_epi32(-32 * (xh[k].sum - xh[k].sum_lo));
      }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        if (pf != nullptr && c % 2 == 0) prefetch_part(pf, gbb, ib, 4 * hf + c / 2, 8);  // as packed_tile_k
        const __m512i l0 = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 2) + 64 * (16 * hf + c));
        const __m512i l1 = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 2) + 64 * (16 * hf + 8 + c));
        const __m512i h = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 3) + 64 * (8 * hf + c));
        // Bits 2k..2k+1 of each qh byte to bits 4..5 (shifts of 16-bit lanes: the mask keeps each
        // byte's own bits).
        const __m512i col[4] = {
            nibble_or(l0, _mm512_and_si512(_mm512_slli_epi16(h, 4), m30)),
            nibble_or(l1, _mm512_and_si512(_mm512_slli_epi16(h, 2), m30)),
            nibble_or(_mm512_srli_epi16(l0, 4), _mm512_and_si512(h, m30)),
            nibble_or(_mm512_srli_epi16(l1, 4), _mm512_and_si512(_mm512_srli_epi16(h, 2), m30)),
        };
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          if (c < 4)
            lo[k] = _mm512_dpbusd_epi32(lo[k], col[k], act4(xh + k, c));
          else
            hi[k] = _mm512_dpbusd_epi32(hi[k], col[k], act4(xh + k, c));
        }
      }
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const int s = 4 * hf + k;
        const block_q8a* xb = xh + k;
        if (xb->h4 != 0) {  // 128 * h * q_w[jo], into jo's half
          const __m512i sp = split_term(k_column(GGML_Q6_K, gb, s, xb->jo / 4), xb);
          if (xb->jo < 16)
            lo[k] = _mm512_add_epi32(lo[k], sp);
          else
            hi[k] = _mm512_add_epi32(hi[k], sp);
        }
        const __m512i isum = q6k_isum(lo[k], hi[k], k6_scale(gb, 2 * s), k6_scale(gb, 2 * s + 1));
        acc = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(isum), acc);
      }
    }
  }
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << n_valid) - 1), acc);
}

// 16 rows of K-quant W against MT activation rows (see packed_tile).
template <int MT>
PYINFER_INLINE void packed_tile_k(int type, const uint8_t* group, const block_q8a* x, int64_t nb, float* y, int64_t ldy,
                                  int n_valid, const uint8_t* pf) {
  const int gbb = kPackRows * packed_block_bytes(type);  // bytes of a group-block
  // With four or more rows, Q4_K's and Q5_K's minimum terms are summed in a second pass over
  // the group: in the first, their accumulators and factors would crowd out the columns.
  constexpr bool kMinsAfter = MT >= 4;
  __m512 acc[MT], acc_min[MT];
  for (int c = 0; c < MT; ++c) acc[c] = acc_min[c] = _mm512_setzero_ps();
  for (int64_t ib = 0; ib < nb; ib += 8) {
    const uint8_t* gb = group + ib / 8 * gbb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    __m512 dmin = _mm512_setzero_ps();
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0;
    if (type != GGML_Q6_K) {
      dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kPackedMins)));
      c0 = _mm512_loadu_si512(gb + packed_field(type, 2));
      c1 = _mm512_loadu_si512(gb + packed_field(type, 2) + 64);
      c2 = _mm512_loadu_si512(gb + packed_field(type, 2) + 128);
    }
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
      if (pf != nullptr) prefetch_part(pf, gbb, ib, s, 8);  // an eighth of the next super-block
      __m512i wq[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) wq[c] = k_column(type, gb, s, c);
      __m512 ds = d, mn = dmin;
      __m512i sc_lo = _mm512_setzero_si512(), sc_hi = sc_lo;
      if (type != GGML_Q6_K) {
        ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, false)));
        if (!kMinsAfter) mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, true)));
      } else {
        sc_lo = k6_scale(gb, 2 * s);
        sc_hi = k6_scale(gb, 2 * s + 1);
      }
#pragma GCC unroll 8
      for (int c = 0; c < MT; ++c) {
        const block_q8a* xb = x + c * nb + ib + s;
        // Two chains, elements 0..15 and 16..31: Q6_K's two sub-blocks, each starting at
        // -32 times its activations' sum.
        __m512i lo = _mm512_setzero_si512(), hi = lo;
        if (type == GGML_Q6_K) {
          lo = _mm512_set1_epi32(-32 * xb->sum_lo);
          hi = _mm512_set1_epi32(-32 * (xb->sum - xb->sum_lo));
        }
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          lo = _mm512_dpbusd_epi32(lo, wq[g], act4(xb, g));
          hi = _mm512_dpbusd_epi32(hi, wq[g + 4], act4(xb, g + 4));
        }
        if (xb->h4 != 0) {  // 128 * h * q_w[jo], into jo's half
          const __m512i sp = split_term(k_column(type, gb, s, xb->jo / 4), xb);
          if (xb->jo < 16)
            lo = _mm512_add_epi32(lo, sp);
          else
            hi = _mm512_add_epi32(hi, sp);
        }
        const __m512i isum = type != GGML_Q6_K ? _mm512_add_epi32(lo, hi) : q6k_isum(lo, hi, sc_lo, sc_hi);
        const __m512 f = _mm512_mul_ps(ds, _mm512_set1_ps(xb->d));
        acc[c] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(isum), acc[c]);
        if (type != GGML_Q6_K && !kMinsAfter) acc_min[c] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(xb->dsum), acc_min[c]);
      }
    }
  }
  if (type != GGML_Q6_K && kMinsAfter)  // the same terms in the same order, with the registers free
    for (int64_t ib = 0; ib < nb; ib += 8) {
      const uint8_t* gb = group + ib / 8 * gbb;
      const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kPackedMins)));
      const __m512i c1 = _mm512_loadu_si512(gb + packed_field(type, 2) + 64);
      const __m512i c2 = _mm512_loadu_si512(gb + packed_field(type, 2) + 128);
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const __m512 mn = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(k4_scale(_mm512_setzero_si512(), c1, c2, s, true)));
#pragma GCC unroll 8
        for (int c = 0; c < MT; ++c)
          acc_min[c] = _mm512_fnmadd_ps(mn, _mm512_set1_ps(x[c * nb + ib + s].dsum), acc_min[c]);
      }
    }
  const __mmask16 k = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int c = 0; c < MT; ++c)
    _mm512_mask_storeu_ps(y + c * ldy, k, type != GGML_Q6_K ? _mm512_add_ps(acc[c], acc_min[c]) : acc[c]);
}

// ---- fast mode on a copy of each group's unpacked units --------------------------------------
// With more activation rows than one tile takes, each tile of a group would unpack the same
// quant columns and scales again (a call of 64 prefill rows meets every group eight times). Instead the
// group is unpacked once per call into a per-thread buffer, one unit per 32-block: its eight
// unsigned quant columns (the bytes q_column and k_column give, 16 rows each), the row scale
// (K-quants: d times the sub-block's scale), and either the minimum factor (Q4_1, Q5_1: m;
// Q4_K, Q5_K: -(dmin * mn), as the scalar spec forms it) or Q6_K's two sub-block scales as
// int32. The tiles then read columns as Q8_0's read the group, with the scalar spec's float
// arithmetic per row and unit: the same results as the in-place tiles, bit for bit.

constexpr int kUnitBytes = 8 * 64 + 3 * 64;  // columns; scale; minimum factor or Q6_K's two

PYINFER_INLINE __m512 negate(__m512 v) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
}

// Writes the units of a group's nb 32-blocks (64-byte aligned dst), fetching the next group (pf,
// or nullptr) ahead as it goes.
PYINFER_INLINE void copy_units(int type, const uint8_t* group, int64_t nb, uint8_t* dst, const uint8_t* pf) {
  const int gbb = kPackRows * packed_block_bytes(type);
  const bool kq = type_traits(type).block_elems == QK_K;
  const int step = kq ? 8 : 1;  // 32-blocks per group-block
  for (int64_t i0 = 0; i0 < nb; i0 += step) {
    const uint8_t* gb = group + i0 / step * gbb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    __m512 m = _mm512_setzero_ps();
    if (type_traits(type).has_min)  // Q4_1's and Q5_1's m, the K-quants' dmin
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kPackedMins)));
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0;
    if (kq && type != GGML_Q6_K) {
      c0 = _mm512_loadu_si512(gb + packed_field(type, 2));
      c1 = _mm512_loadu_si512(gb + packed_field(type, 2) + 64);
      c2 = _mm512_loadu_si512(gb + packed_field(type, 2) + 128);
    }
#pragma GCC unroll 8
    for (int s = 0; s < step; ++s) {
      if (pf != nullptr) prefetch_part(pf, gbb, i0, s, step);
      uint8_t* u = dst + (i0 + s) * kUnitBytes;
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) _mm512_store_si512(u + 64 * c, kq ? k_column(type, gb, s, c) : q_column(type, gb, c));
      if (type == GGML_Q6_K) {
        _mm512_store_ps(u + 512, d);
        _mm512_store_si512(u + 576, k6_scale(gb, 2 * s));
        _mm512_store_si512(u + 640, k6_scale(gb, 2 * s + 1));
      } else if (kq) {
        _mm512_store_ps(u + 512, _mm512_mul_ps(d, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, false))));
        _mm512_store_ps(u + 576, negate(_mm512_mul_ps(m, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, true)))));
      } else {
        _mm512_store_ps(u + 512, d);
        if (type_traits(type).has_min) _mm512_store_ps(u + 576, m);  // read only where there is one
      }
    }
  }
}

// 16 rows of W against MT activation rows from the group's units (see packed_tile). The
// minimum terms, in their own accumulators as in the spec, are summed in a second pass over
// the units, which leaves the first pass enough registers for eight rows.
template <int MT>
PYINFER_INLINE void copied_tile(int type, const uint8_t* units, const block_q8a* x, int64_t nb, float* y, int64_t ldy,
                                int n_valid) {
  const bool q6 = type == GGML_Q6_K;
  __m512 acc[MT];
  for (int c = 0; c < MT; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t ib = 0; ib < nb; ++ib) {
    const uint8_t* u = units + ib * kUnitBytes;
    __m512i wq[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) wq[c] = _mm512_load_si512(u + 64 * c);
    const __m512 d = _mm512_load_ps(u + 512);
    __m512i isum[MT];
    if (q6) {
      const __m512i sc_lo = _mm512_load_si512(u + 576), sc_hi = _mm512_load_si512(u + 640);
#pragma GCC unroll 8
      for (int c = 0; c < MT; ++c) {
        const block_q8a* xb = x + c * nb + ib;
        __m512i lo = _mm512_set1_epi32(-32 * xb->sum_lo), hi = _mm512_set1_epi32(-32 * (xb->sum - xb->sum_lo));
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          lo = _mm512_dpbusd_epi32(lo, wq[g], act4(xb, g));
          hi = _mm512_dpbusd_epi32(hi, wq[g + 4], act4(xb, g + 4));
        }
        if (xb->h4 != 0) {  // 128 * h * q_w[jo], into jo's half
          const __m512i sp = split_term(_mm512_load_si512(u + 64 * (xb->jo / 4)), xb);
          if (xb->jo < 16)
            lo = _mm512_add_epi32(lo, sp);
          else
            hi = _mm512_add_epi32(hi, sp);
        }
        isum[c] = q6k_isum(lo, hi, sc_lo, sc_hi);
      }
    } else {
      block_dots<MT>(wq, x, nb, ib, packed_quant_bias(type), isum);  // Q4_K, Q5_K: no offset
#pragma GCC unroll 8
      for (int c = 0; c < MT; ++c) {
        const block_q8a* xb = x + c * nb + ib;
        if (xb->h4 != 0) isum[c] = _mm512_add_epi32(isum[c], split_term(_mm512_load_si512(u + 64 * (xb->jo / 4)), xb));
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < MT; ++c) {
      const __m512 f = _mm512_mul_ps(d, _mm512_set1_ps(x[c * nb + ib].d));
      acc[c] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(isum[c]), acc[c]);
    }
  }
  if (type_traits(type).has_min) {
    __m512 acc_min[MT];
    for (int c = 0; c < MT; ++c) acc_min[c] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < nb; ++ib) {
      const __m512 m = _mm512_load_ps(units + ib * kUnitBytes + 576);
#pragma GCC unroll 8
      for (int c = 0; c < MT; ++c) acc_min[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[c * nb + ib].dsum), acc_min[c]);
    }
    for (int c = 0; c < MT; ++c) acc[c] = _mm512_add_ps(acc[c], acc_min[c]);
  }
  const __mmask16 k = static_cast<__mmask16>((1u << n_valid) - 1);
  for (int c = 0; c < MT; ++c) _mm512_mask_storeu_ps(y + c * ldy, k, acc[c]);
}

// A group's tiles over its copied units: eight rows at a time, then the last one to seven.
PYINFER_INLINE void copied_rows(int type, const uint8_t* units, const block_q8a* xq, int64_t M, int64_t nb, float* y,
                                int64_t ldy, int valid) {
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) copied_tile<8>(type, units, xq + m * nb, nb, y + m * ldy, ldy, valid);
  for (; m + 4 <= M; m += 4) copied_tile<4>(type, units, xq + m * nb, nb, y + m * ldy, ldy, valid);
  const block_q8a* xr = xq + m * nb;
  float* yr = y + m * ldy;
  if (M - m == 3) copied_tile<3>(type, units, xr, nb, yr, ldy, valid);
  if (M - m == 2) copied_tile<2>(type, units, xr, nb, yr, ldy, valid);
  if (M - m == 1) copied_tile<1>(type, units, xr, nb, yr, ldy, valid);
}

// The copy pays for the types whose unpacking costs most, the 5- and 6-bit types and the
// K-quants (their high bits, their 6-bit scales), where a group meets four or more eight-row
// tiles (docs/tuning.md, "AVX-512 packed fast matmul: columns unpacked once per call"). Q8_0's
// stored quants are its columns, and Q4_0's and Q4_1's a mask and a shift away: they stay in
// place. The copy of a group is meant to stay in L2: rows of at most kCopyMaxBlocks 32-blocks.
static constexpr bool copies_units(int type) {
  const int bits = type_traits(type).quant_bits;
  return bits == 5 || bits == 6 || type_traits(type).block_elems == QK_K;
}
constexpr int64_t kCopyMinRows = 32;
constexpr int64_t kCopyMaxBlocks = 256;

// One group's tile of MT activation rows: the 32-block types' or the K-quants'.
template <int MT>
PYINFER_INLINE void tile(int type, const uint8_t* group, const block_q8a* x, int64_t nb, float* y, int64_t ldy,
                         int n_valid, const uint8_t* pf) {
  if (MT == 1 && type == GGML_Q6_K)
    q6k_gemv_tile(group, x, nb, y, n_valid, pf);
  else if (type_traits(type).block_elems == QK_K)
    packed_tile_k<MT>(type, group, x, nb, y, ldy, n_valid, pf);
  else
    packed_tile<MT>(type, group, x, nb, y, ldy, n_valid, pf);
}

constexpr int64_t kWideTileMaxK = 1024;
constexpr int64_t kFetchAheadMinRows = 4;

PYINFER_INLINE void packed_rows(int type, bool gemv_ahead, const void* w, int64_t rb, const block_q8a* xq, int64_t M,
                                int64_t K, int64_t n_rows, float* y, int64_t ldy) {
  const int64_t nb = K / QK8_A;
  const int64_t group_bytes = kPackRows * rb;
  // Tiles of eight activation rows: each group's unpacked quant columns then feed twice the
  // dot steps. The 32-element types take them on short rows only (K up to kWideTileMaxK): on
  // longer ones the eight rows' blocks and the group crowd the L1 cache, and four per tile ran
  // faster. The K-quants, whose unpacking and scales cost more per block, gain at any K
  // (docs/tuning.md, "eight activation rows per tile").
  const bool wide = type_traits(type).block_elems == QK_K || K <= kWideTileMaxK;
  // Two or three activation rows stream as a GEMV does (gemv_ahead): their tiles are short
  // enough that the hardware prefetcher keeps up where it does for one row (docs/tuning.md,
  // "tiles of two and three rows left to the hardware prefetcher").
  const bool fetch_ahead = M >= kFetchAheadMinRows || gemv_ahead;
  if (M >= 2)  // the first group: all of its lines requested at once, not found one by one
    for (int64_t o = 0; o < group_bytes; o += 64) _mm_prefetch(static_cast<const char*>(w) + o, _MM_HINT_T0);
  static thread_local UnitBuffer buffer;
  const bool copy = copies_units(type) && M >= kCopyMinRows && nb <= kCopyMaxBlocks;
  uint8_t* units = copy ? buffer.get(nb * kUnitBytes) : nullptr;
  for (int64_t n = 0; n < n_rows; n += kPackRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + n / kPackRows * group_bytes;
    const int valid = n_rows - n < kPackRows ? static_cast<int>(n_rows - n) : kPackRows;
    if (units != nullptr) {
      copy_units(type, group, nb, units, n + kPackRows < n_rows ? group + group_bytes : nullptr);
      copied_rows(type, units, xq, M, nb, y + n, ldy, valid);
      continue;
    }
    // The first tile fetches the next group ahead: with two or more activation rows the
    // group's tiles take long enough for the stream to stall on DRAM (docs/tuning.md, "the
    // next group fetched ahead"); a GEMV does where gemv_ahead says so (packed_kernel).
    const uint8_t* pf = fetch_ahead && n + kPackRows < n_rows ? group + group_bytes : nullptr;
    int64_t m = 0;
    if (wide)
      for (; m + 8 <= M; m += 8, pf = nullptr) tile<8>(type, group, xq + m * nb, nb, y + m * ldy + n, ldy, valid, pf);
    for (; m + 4 <= M; m += 4, pf = nullptr) tile<4>(type, group, xq + m * nb, nb, y + m * ldy + n, ldy, valid, pf);
    // The last one to three rows in one tile.
    const block_q8a* xr = xq + m * nb;
    float* yr = y + m * ldy + n;
    if (M - m == 3) tile<3>(type, group, xr, nb, yr, ldy, valid, pf);
    if (M - m == 2) tile<2>(type, group, xr, nb, yr, ldy, valid, pf);
    if (M - m == 1) tile<1>(type, group, xr, nb, yr, ldy, valid, pf);
  }
}

// ---- exact mode on quantized rows, dequantized in registers -----------------------------------
// The AVX2 exact kernels' arithmetic (matmul_avx2.cpp, exact_tile and load_w32) on 16 lanes:
// per 32-run of a row, elements 0..15 in one vector and 16..31 in another, whose halves are the
// AVX2 kernel's four 8-lane accumulators, summed (a0 + a1) + (a2 + a3) at the end. Each
// element is dequantized with dequant_ref.cpp's operations and multiplied and added in the
// same order, so the results are the AVX2 kernels' and those through dequantized scratch (a
// NaN's sign and payload aside, ops/matmul.cpp): the dequantizing runs on twice the width.

// 16 bytes at p, zero-extended to int32 lanes.
PYINFER_INLINE __m512i u8x16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Weights k..k+31 of a quantized row (k a multiple of 32) as float32: w[0] elements 0..15,
// w[1] 16..31.
PYINFER_INLINE void dequant_run(int type, const uint8_t* row, int64_t k, __m512 (&w)[2]) {
  const TypeTraits& tt = type_traits(type);
  const uint8_t* b = row + k / tt.block_elems * tt.block_bytes;  // the block holding the run
  const __m512i m4 = _mm512_set1_epi32(0x0f);
  if (type == GGML_Q8_0) {
    const __m512 d = _mm512_set1_ps(f16_scale(b));
    for (int h = 0; h < 2; ++h)
      w[h] = _mm512_mul_ps(
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + 16 * h)))),
          d);
    return;
  }
  if (tt.block_elems == QK8_0) {  // Q4_0, Q4_1, Q5_0, Q5_1 (load_w32's layout)
    const bool has_min = tt.has_min, five = tt.quant_bits == 5;
    const __m512 d = _mm512_set1_ps(f16_scale(b));
    const __m512 m = _mm512_set1_ps(has_min ? f16_scale(b + 2) : 0.0f);
    const uint8_t* qh = b + (has_min ? 4 : 2);
    const __m512i v = u8x16(five ? qh + 4 : qh);
    for (int h = 0; h < 2; ++h) {
      __m512i q = h == 0 ? _mm512_and_si512(v, m4) : _mm512_srli_epi32(v, 4);
      if (five)  // bit e of qh is element e's fifth
        q = _mm512_mask_or_epi32(q, static_cast<__mmask16>(qh[2 * h] | (qh[2 * h + 1] << 8)), q, _mm512_set1_epi32(16));
      w[h] = has_min ? _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(q), d), m)
                     : _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(tt.q_bias))), d);
    }
    return;
  }
  const int j = static_cast<int>(k % QK_K / 32);  // the run's 32-element sub-block
  // Q4_K, Q5_K (load_w32's layout): value = (d * sc) * q - dmin * mn.
  int sc, mn;
  kquant_scale_min(b + 4, j, &sc, &mn);
  const __m512 d1 = _mm512_set1_ps(f16_scale(b) * sc), m1 = _mm512_set1_ps(f16_scale(b + 2) * mn);
  const bool five = type == GGML_Q5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = (five ? qh + 32 : qh) + 32 * (j / 2);
  for (int h = 0; h < 2; ++h) {
    const __m512i v = u8x16(qs + 16 * h);
    __m512i q = j % 2 == 0 ? _mm512_and_si512(v, m4) : _mm512_srli_epi32(v, 4);
    if (five)
      q = _mm512_or_si512(
          q, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u8x16(qh + 16 * h), j), _mm512_set1_epi32(1)), 4));
    w[h] = _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(q)), m1);
  }
}

// An output's sum from its two 16-lane accumulators (elements 0..15 and 16..31 of each run):
// their halves are the AVX2 kernel's four 8-lane ones, added (a0 + a1) + (a2 + a3) and then
// across, as there.
PYINFER_INLINE float exact_sum(__m512 lo, __m512 hi) {
  const __m256 a01 = _mm256_add_ps(_mm512_castps512_ps256(lo), _mm512_extractf32x8_ps(lo, 1));
  const __m256 a23 = _mm256_add_ps(_mm512_castps512_ps256(hi), _mm512_extractf32x8_ps(hi, 1));
  return hsum8(_mm256_add_ps(a01, a23));
}

// One quantized row against MT (1 or 2) activation rows; the stream requested ahead as the
// AVX2 kernel does it (with ahead).
template <int MT>
PYINFER_INLINE void exact_tile_q(int type, bool ahead, const uint8_t* row, const float* x, int64_t K, float* y,
                                 int64_t ldy) {
  __m512 acc[MT][2];
  for (int c = 0; c < MT; ++c) acc[c][0] = acc[c][1] = _mm512_setzero_ps();
  const int64_t bb = type_traits(type).block_bytes, be = type_traits(type).block_elems;
  for (int64_t k = 0; k < K; k += 32) {
    if (ahead) exact_fetch_ahead(row, k, bb, be);
    __m512 w[2];
    dequant_run(type, row, k, w);
    for (int c = 0; c < MT; ++c)
      for (int h = 0; h < 2; ++h) acc[c][h] = _mm512_fmadd_ps(w[h], _mm512_loadu_ps(x + c * K + k + 16 * h), acc[c][h]);
  }
  for (int c = 0; c < MT; ++c) y[c * ldy] = exact_sum(acc[c][0], acc[c][1]);
}

template <int T, bool Ahead>
void matmul_exact_q_avx512(const void* w, int64_t rb, const float* x, int64_t M, int64_t K, int64_t n_rows, float* y,
                           int64_t ldy) {
  const auto* wb = static_cast<const uint8_t*>(w);
  for (int64_t n = 0; n < n_rows; ++n) {
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) exact_tile_q<2>(T, Ahead, wb + n * rb, x + m * K, K, y + m * ldy + n, ldy);
    if (m < M) exact_tile_q<1>(T, Ahead, wb + n * rb, x + m * K, K, y + m * ldy + n, ldy);
  }
}

// Float32 rows against several activation rows: tiles of R weight rows by C activation rows,
// each output with the AVX2 kernel's four 8-lane accumulators as the halves of two 16-lane
// ones, in its order, so every output has matmul_exact[GGML_F32]'s values whatever its tile (a
// NaN's sign and payload aside, ops/matmul.cpp). A tile's R * C outputs share its loads.
template <int R, int C>
PYINFER_INLINE void exact_gemm_tile(const float* w, int64_t ldw, const float* x, int64_t K, float* y, int64_t ldy) {
  __m512 acc[R][C][2];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c][0] = acc[r][c][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    __m512 xv[C][2];
    for (int c = 0; c < C; ++c)
      for (int h = 0; h < 2; ++h) xv[c][h] = _mm512_loadu_ps(x + c * K + k + 16 * h);
    for (int r = 0; r < R; ++r)
      for (int h = 0; h < 2; ++h) {
        const __m512 wv = _mm512_loadu_ps(w + r * ldw + k + 16 * h);
        for (int c = 0; c < C; ++c) acc[r][c][h] = _mm512_fmadd_ps(wv, xv[c][h], acc[r][c][h]);
      }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[c * ldy + r] = exact_sum(acc[r][c][0], acc[r][c][1]);
}

// C activation rows against every weight row, three at a time.
template <int C>
PYINFER_INLINE void exact_gemm_cols(const float* w, int64_t ldw, const float* x, int64_t K, int64_t n_rows, float* y,
                                    int64_t ldy) {
  int64_t n = 0;
  for (; n + 3 <= n_rows; n += 3) exact_gemm_tile<3, C>(w + n * ldw, ldw, x, K, y + n, ldy);
  for (; n < n_rows; ++n) exact_gemm_tile<1, C>(w + n * ldw, ldw, x, K, y + n, ldy);
}

// Weight rows 16 at a time, each block against all M activation rows while it stays in L1 or
// L2: a thread's rows are read from memory once.
void matmul_exact_f32_many_avx512(const void* w, int64_t rb, const float* x, int64_t M, int64_t K, int64_t n_rows,
                                  float* y, int64_t ldy) {
  const int64_t ldw = rb / static_cast<int64_t>(sizeof(float));
  for (int64_t n0 = 0; n0 < n_rows; n0 += kPackRows) {
    const float* wf = static_cast<const float*>(w) + n0 * ldw;
    const int64_t nr = n_rows - n0 < kPackRows ? n_rows - n0 : kPackRows;
    float* yb = y + n0;
    int64_t m = 0;
    for (; m + 3 <= M; m += 3) exact_gemm_cols<3>(wf, ldw, x + m * K, K, nr, yb + m * ldy, ldy);
    if (M - m == 2) exact_gemm_cols<2>(wf, ldw, x + m * K, K, nr, yb + m * ldy, ldy);
    if (M - m == 1) exact_gemm_cols<1>(wf, ldw, x + m * K, K, nr, yb + m * ldy, ldy);
  }
}

template <int T>
void exact_kernel(KernelSet& t, const KernelTuning& tuning) {
  t.matmul_exact[T] = tuning.stream_fetch_ahead ? matmul_exact_q_avx512<T, true> : matmul_exact_q_avx512<T, false>;
}

template <int T, bool GemvAhead>
void matmul_fast_packed_avx512(const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows,
                               float* y, int64_t ldy) {
  packed_rows(T, GemvAhead, w, rb, xq, M, K, n_rows, y, ldy);
}

// Type T's packed kernel; whether its GEMV requests the next group ahead. A GEMV over the
// 32-element types and Q4_K reads each group as one stream (a 32-element type's fifth bits lie
// in the same few lines as its quants), which the AMD EPYCs measured keep near the read
// bandwidth with the hardware prefetcher alone, requests ahead only crowding it, and the Intel
// Xeon does not: there the tuning asks for them (docs/tuning.md, "a GEMV's stream left to the
// hardware prefetcher", "requests ahead on Intel", "Q5_0 and Q5_1 left to the hardware
// prefetcher"). Q5_K and Q6_K read their high bits from a field a super-block's quants away,
// two streams the hardware prefetcher follows poorly, and request ahead on every CPU.
template <int T>
MatmulFastFn packed_kernel(const KernelTuning& tuning) {
  if constexpr (type_traits(T).block_elems == QK_K && type_traits(T).quant_bits != 4)
    return matmul_fast_packed_avx512<T, true>;
  else
    return tuning.stream_fetch_ahead ? matmul_fast_packed_avx512<T, true> : matmul_fast_packed_avx512<T, false>;
}

}  // namespace

void fill_matmul_avx512(KernelSet& t, const KernelTuning& tuning) {
  t.quantize_act = quantize_act_avx512;
  // Exact mode on F32, F16 and BF16 weights stays AVX2's (this table is filled over the AVX2
  // one): where zmm work is split into two 256-bit halves the ymm kernels read and multiply
  // faster (docs/tuning.md, "exact kernels stay AVX2's").
  t.matmul_fast[GGML_Q8_0] = matmul_fast_avx512<GGML_Q8_0>;
  t.matmul_fast[GGML_Q4_0] = matmul_fast_avx512<GGML_Q4_0>;
  t.matmul_fast[GGML_Q4_1] = matmul_fast_avx512<GGML_Q4_1>;
  t.matmul_fast_packed[GGML_Q8_0] = packed_kernel<GGML_Q8_0>(tuning);
  t.matmul_fast_packed[GGML_Q4_0] = packed_kernel<GGML_Q4_0>(tuning);
  t.matmul_fast_packed[GGML_Q4_1] = packed_kernel<GGML_Q4_1>(tuning);
  t.matmul_fast_packed[GGML_Q5_0] = packed_kernel<GGML_Q5_0>(tuning);
  t.matmul_fast_packed[GGML_Q5_1] = packed_kernel<GGML_Q5_1>(tuning);
  t.matmul_fast_packed[GGML_Q4_K] = packed_kernel<GGML_Q4_K>(tuning);
  t.matmul_fast_packed[GGML_Q5_K] = packed_kernel<GGML_Q5_K>(tuning);
  t.matmul_fast_packed[GGML_Q6_K] = packed_kernel<GGML_Q6_K>(tuning);
  // Quantized rows dequantized in registers on 16 lanes, over AVX2's 8-lane kernels; Q6_K ran
  // as fast through scratch and stays there (docs/tuning.md, "exact mode: quantized rows
  // dequantized in registers").
  exact_kernel<GGML_Q8_0>(t, tuning);
  exact_kernel<GGML_Q4_0>(t, tuning);
  exact_kernel<GGML_Q4_1>(t, tuning);
  exact_kernel<GGML_Q5_0>(t, tuning);
  exact_kernel<GGML_Q5_1>(t, tuning);
  exact_kernel<GGML_Q4_K>(t, tuning);
  exact_kernel<GGML_Q5_K>(t, tuning);
  t.matmul_exact_f32_many = matmul_exact_f32_many_avx512;
}

}  // namespace pyinfer
