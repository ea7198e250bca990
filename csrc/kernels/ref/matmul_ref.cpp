// matmul_ref.cpp: scalar matmul kernels and activation quantization, the executable spec.
//
// Exact mode multiplies float32 activations by the weights in float32. Fast mode quantizes
// the activations (q8_act.h) and takes each 32-block's dot product in integers, exactly; per
// output element it then sums, in float32, (d_w * d_x) * isum over the blocks (and for Q4_1
// m_w * (d_x * sum_x) in a second sum added at the end). SIMD paths compute the same integers
// and products but may add them in another order.
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
    int32_t sum = 0;
    int h = 0;
    for (int j = 0; j < QK8_A; ++j) {
      // Round half to even, as the SIMD conversions do in the default rounding mode.
      const int q = static_cast<int>(std::nearbyint(x[j] * id));
      dst[ib].qs[j] = static_cast<int8_t>(j == jo && split ? act_split(q, &h) : q);
      sum += q;
    }
    act_finish(dst[ib], amax, sum, h, jo);
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

// Row n's block ib of W in either layout: its scale, its min (Q4_1; else 0) and its 32 quants
// as signed integers (the stored offset removed).
inline void weight_block(uint32_t type, bool packed, const uint8_t* w, int64_t w_row_bytes, int64_t n, int64_t ib,
                         float* d, float* m, int* q) {
  const TypeTraits& tt = type_traits(type);
  const int bb = tt.block_bytes;
  if (!packed) {
    const uint8_t* blk = w + n * w_row_bytes + ib * bb;
    *d = fp16_to_f32(load_u16_le(blk));
    *m = tt.has_min ? fp16_to_f32(load_u16_le(blk + tt.m_offset)) : 0.0f;
    for (int j = 0; j < QK8_A; ++j) q[j] = stored_quant(type, blk, j) - tt.q_bias;
    return;
  }
  const uint8_t* gb = w + (n / kPackRows) * kPackRows * w_row_bytes + ib * kPackRows * bb;
  const int r = static_cast<int>(n % kPackRows);
  *d = fp16_to_f32(load_u16_le(gb + 2 * r));
  *m = tt.has_min ? fp16_to_f32(load_u16_le(gb + kPackedMins + 2 * r)) : 0.0f;
  const int bias = packed_quant_bias(type);
  for (int j = 0; j < QK8_A; ++j) {
    if (tt.qs_signed) {
      q[j] = gb[packed_quant_byte(type, r, j)] - bias;
    } else {
      const uint8_t b = gb[packed_quant_byte(type, r, j % 16)];
      q[j] = (j < 16 ? (b & 0x0f) : (b >> 4)) - bias;
    }
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
        acc += (d * xb[ib].d) * static_cast<float>(isum);
        if (type_traits(T).has_min) acc_min += mn * xb[ib].dsum;
      }
      y[m * ldy + n] = type_traits(T).has_min ? acc + acc_min : acc;
    }
  }
}

}  // namespace

void fill_matmul_scalar(KernelSet& t) {
  t.quantize_act = quantize_act_ref;
  t.matmul_exact[GGML_F32] = matmul_f32_f32_ref;
  t.matmul_exact[GGML_F16] = matmul_f16_f32_ref;
  t.matmul_exact[GGML_BF16] = matmul_bf16_f32_ref;
  t.matmul_fast[GGML_Q8_0] = matmul_fast_ref<GGML_Q8_0, false>;
  t.matmul_fast[GGML_Q4_0] = matmul_fast_ref<GGML_Q4_0, false>;
  t.matmul_fast[GGML_Q4_1] = matmul_fast_ref<GGML_Q4_1, false>;
  t.matmul_fast_packed[GGML_Q8_0] = matmul_fast_ref<GGML_Q8_0, true>;
  t.matmul_fast_packed[GGML_Q4_0] = matmul_fast_ref<GGML_Q4_0, true>;
  t.matmul_fast_packed[GGML_Q4_1] = matmul_fast_ref<GGML_Q4_1, true>;
}

}  // namespace pyinfer
