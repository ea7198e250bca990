// matmul_ref.cpp: scalar matmul kernels and activation quantization, the executable spec.
//
// Exact mode multiplies float32 activations by the weights in float32. Fast mode quantizes
// the activations (q8_act.h) and takes each 32-block's dot product in integers, exactly; per
// output element it then sums, in float32, (d_w * d_x) * isum over the blocks, each term
// added by one fused multiply-add (and for Q4_1 m_w * (d_x * sum_x), fused the same way, in a
// second sum added at the end). SIMD paths compute the same integers and the same float
// operations in the same order for each output element.
#include <cmath>

#include "kernels/abi.h"
#include "kernels/half.h"
#include "kernels/kquant_scales.h"
#include "kernels/packed16.h"

namespace pyinfer {
namespace {

// ---- activation quantization -----------------------------------------------------------

void quantize_act_ref(const float* x, block_q8a* dst, int64_t k) {
  for (int64_t ib = 0; ib < k / QK8_A; ++ib, x += QK8_A) {
    int jo = 0;
    for (int j = 1; j < QK8_A; ++j)
      if (std::fabs(x[j]) > std::fabs(x[jo])) jo = j;
    float m2 = 0.0f;
    for (int j = 0; j < QK8_A; ++j)
      if (j != jo) m2 = std::fmax(m2, std::fabs(x[j]));
    bool split;
    const float amax = act_amax(std::fabs(x[jo]), m2, &split);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0, sum_lo = 0;
    int h = 0;
    for (int j = 0; j < QK8_A; ++j) {
      // Round half to even, as the SIMD conversions do in the default rounding mode.
      const int q = static_cast<int>(std::nearbyint(x[j] * id));
      dst[ib].qs[j] = static_cast<int8_t>(j == jo && split ? act_split(q, &h) : q);
      sum += q;
      if (j < QK8_A / 2) sum_lo += q;
    }
    act_finish(dst[ib], amax, sum, sum_lo, h, jo);
  }
}

// The activation block's integers a_j (a_jo whole).
inline int act_at(const block_q8a& b, int j) { return j == b.jo ? b.qs[j] + 128 * act_h(b) : b.qs[j]; }

// ---- exact mode: float weights ---------------------------------------------------------

// One weight element of a plain float row, by type.
inline float load_f32(const void* row, int64_t k) { return static_cast<const float*>(row)[k]; }
inline float load_f16(const void* row, int64_t k) {
  return fp16_to_f32(load_u16_le(static_cast<const uint8_t*>(row) + 2 * k));
}
inline float load_bf16(const void* row, int64_t k) {
  return bf16_to_f32(load_u16_le(static_cast<const uint8_t*>(row) + 2 * k));
}

// w: n_rows rows of K elements, w_row_bytes apart; x: [M, K]; y: [M, ldy].
#define PYINFER_EXACT_REF(NAME, LOAD)                                                                           \
  void NAME(const void* w, int64_t w_row_bytes, const float* x, int64_t M, int64_t K, int64_t n_rows, float* y, \
            int64_t ldy) {                                                                                      \
    for (int64_t n = 0; n < n_rows; ++n) {                                                                      \
      const void* row = static_cast<const uint8_t*>(w) + n * w_row_bytes;                                       \
      for (int64_t m = 0; m < M; ++m) {                                                                         \
        const float* xm = x + m * K;                                                                            \
        float acc = 0.0f;                                                                                       \
        for (int64_t k = 0; k < K; ++k) acc += xm[k] * LOAD(row, k);                                            \
        y[m * ldy + n] = acc;                                                                                   \
      }                                                                                                         \
    }                                                                                                           \
  }
PYINFER_EXACT_REF(matmul_f32_f32_ref, load_f32)
PYINFER_EXACT_REF(matmul_f16_f32_ref, load_f16)
PYINFER_EXACT_REF(matmul_bf16_f32_ref, load_bf16)
#undef PYINFER_EXACT_REF

// ---- fast mode: integer dot products per block ---------------------------------------------
// Every type is taken 32 elements at a time, one activation block each: a 32-block of W has a
// float32 scale d, a float32 min m (0 where the type has none) and 32 signed integers q with
// value = d * q + m, all exact:
//   Q8_0, Q4_0, Q5_0: d the block's, q the stored quant less its offset (8, 16);
//   Q4_1, Q5_1:       d and m the block's, q the stored quant;
//   Q4_K, Q5_K:       d = d_super * sc and m = -(dmin * mn) of the sub-block (products of an
//                     fp16 and a 6-bit integer: exact), q the stored quant;
//   Q6_K:             d = d_super, q = sc * (stored - 32) with sc the int8 scale of the
//                     element's 16-element sub-block (so isum is sc_lo * isum_lo + sc_hi *
//                     isum_hi, the two sub-blocks' integer sums).
// Per output element: acc = fma(d * d_x, float(isum), acc) over the 32-blocks, acc_min =
// fma(m, d_x * sum_x, acc_min) where the type has a min, y = acc + acc_min.

// Stored quant j (0..31) of 32-block s of a block as stored, its offset still in: Q8_0's
// signed, the others' unsigned with their high bits.
inline int block_quant(uint32_t type, const uint8_t* blk, int s, int j) {
  const TypeTraits& tt = type_traits(type);
  switch (type) {
    case GGML_Q5_0:
    case GGML_Q5_1: {
      const uint8_t* qh = blk + (type == GGML_Q5_0 ? offsetof(block_q5_0, qh) : offsetof(block_q5_1, qh));
      const uint8_t b = blk[tt.qs_offset + j % 16];  // Q4's nibble order
      return (j < 16 ? (b & 0x0f) : (b >> 4)) | (((qh[j / 8] >> (j % 8)) & 1) << 4);
    }
    case GGML_Q4_K:
    case GGML_Q5_K: {
      const uint8_t b = blk[tt.qs_offset + 32 * (s / 2) + j];
      const int lo = s % 2 == 0 ? (b & 0x0f) : (b >> 4);
      if (type == GGML_Q4_K) return lo;
      return lo | (((blk[offsetof(block_q5_K, qh) + j] >> s) & 1) << 4);
    }
    case GGML_Q6_K: {
      // Element l + 32k of half hf (s = 4 hf + k): low bits in ql[64 hf + l + 32 (k & 1)],
      // the low nibble for k < 2; top bits 2k..2k+1 of qh[32 hf + l].
      const int hf = s / 4, k = s % 4;
      const uint8_t b = blk[64 * hf + j + 32 * (k & 1)];
      const int lo = k < 2 ? (b & 0x0f) : (b >> 4);
      return lo | (((blk[offsetof(block_q6_K, qh) + 32 * hf + j] >> (2 * k)) & 3) << 4);
    }
    default: return stored_quant(type, blk, j);
  }
}

// Row n's 32-block ib of W in either layout: d, m and q as above.
inline void weight_block(uint32_t type, bool packed, const uint8_t* w, int64_t w_row_bytes, int64_t n, int64_t ib,
                         float* d, float* m, int* q) {
  const TypeTraits& tt = type_traits(type);
  const int bb = tt.block_bytes, per = tt.block_elems / QK8_A;  // 32-blocks per block
  const int64_t b = ib / per;
  const int s = static_cast<int>(ib % per);
  uint8_t tmp[sizeof(block_q6_K)];
  const uint8_t* blk = w + n * w_row_bytes + b * bb;
  if (packed) {
    const uint8_t* gb = w + (n / kPackRows) * kPackRows * w_row_bytes + b * kPackRows * bb;
    packed_to_block(type, gb, static_cast<int>(n % kPackRows), tmp);
    blk = tmp;
  }
  const float dd = fp16_to_f32(load_u16_le(blk + tt.d_offset));
  *d = dd;
  *m = tt.has_min ? fp16_to_f32(load_u16_le(blk + tt.m_offset)) : 0.0f;
  int sc = 1, mn = 0;
  if (type == GGML_Q4_K || type == GGML_Q5_K) {
    kquant_scale_min(blk + offsetof(block_q4_K, scales), s, &sc, &mn);
    *d = dd * static_cast<float>(sc);
    *m = -(*m * static_cast<float>(mn));
    sc = 1;
  }
  for (int j = 0; j < QK8_A; ++j) {
    if (type == GGML_Q6_K) sc = reinterpret_cast<const int8_t*>(blk + offsetof(block_q6_K, scales))[2 * s + j / 16];
    q[j] = sc * (block_quant(type, blk, s, j) - tt.q_bias);
  }
}

// Fast mode on W as stored (packed = false) or in the 16-row layout: one spec for both, so
// the layouts give identical results.
template <uint32_t T, bool Packed>
void matmul_fast_ref(const void* w, int64_t w_row_bytes, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows,
                     float* y, int64_t ldy) {
  const int64_t nb = K / QK8_A;
  float d, mn;
  int q[QK8_A];
  for (int64_t n = 0; n < n_rows; ++n) {
    for (int64_t m = 0; m < M; ++m) {
      const block_q8a* xb = xq + m * nb;
      float acc = 0.0f, acc_min = 0.0f;
      for (int64_t ib = 0; ib < nb; ++ib) {
        weight_block(T, Packed, static_cast<const uint8_t*>(w), w_row_bytes, n, ib, &d, &mn, q);
        int32_t isum = 0;
        for (int j = 0; j < QK8_A; ++j) isum += q[j] * act_at(xb[ib], j);
        acc = std::fma(d * xb[ib].d, static_cast<float>(isum), acc);
        if (type_traits(T).has_min) acc_min = std::fma(mn, xb[ib].dsum, acc_min);
      }
      y[m * ldy + n] = type_traits(T).has_min ? acc + acc_min : acc;
    }
  }
}

}  // namespace

void fill_matmul_scalar(KernelSet& t) {
  t.quantize_act = quantize_act_ref;
  t.matmul_exact[GGML_F32] = matmul_f32_f32_ref;
  t.matmul_exact_f32_many = matmul_f32_f32_ref;
  t.matmul_exact[GGML_F16] = matmul_f16_f32_ref;
  t.matmul_exact[GGML_BF16] = matmul_bf16_f32_ref;
#define PYINFER_FAST_REF(T)                     \
  t.matmul_fast[T] = matmul_fast_ref<T, false>; \
  t.matmul_fast_packed[T] = matmul_fast_ref<T, true>;
  PYINFER_FAST_REF(GGML_Q8_0)
  PYINFER_FAST_REF(GGML_Q4_0)
  PYINFER_FAST_REF(GGML_Q4_1)
  PYINFER_FAST_REF(GGML_Q5_0)
  PYINFER_FAST_REF(GGML_Q5_1)
  PYINFER_FAST_REF(GGML_Q4_K)
  PYINFER_FAST_REF(GGML_Q5_K)
  PYINFER_FAST_REF(GGML_Q6_K)
#undef PYINFER_FAST_REF
}

}  // namespace pyinfer
