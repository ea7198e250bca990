// dequant_ref.cpp: scalar dequantization of GGUF blocks to float32, the executable spec.
//
// Every SIMD variant must match these bit for bit. That holds even where a compiler fuses a
// multiply and an add into an FMA: in every type below each product (fp16 scale x small
// integer, or fp16 scale x 6- or 8-bit sub-block scale x quant) needs at most 24 significant
// bits and never underflows, so it is exact in float32, and a fused or unfused q*d+m rounds
// once, at the add. The order of the products is part of the spec, though: (d*sc)*q and
// d*(sc*q) differ in the sign of a zero.
#include <cstring>

#include "kernels/abi.h"
#include "kernels/half.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {
namespace {

void dequant_f32_ref(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequant_f16_ref(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);  // at any address: loaded byte-wise
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(load_u16_le(h + 2 * i));
}

void dequant_bf16_ref(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16_le(h + 2 * i));
}

void dequant_q8_0_ref(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t ib = 0; ib < n / QK8_0; ++ib, dst += QK8_0) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < QK8_0; ++j) dst[j] = b[ib].qs[j] * d;
  }
}

void dequant_q4_0_ref(const void* src, float* dst, int64_t n) {
  constexpr int kBias = type_traits(GGML_Q4_0).q_bias;
  const auto* b = static_cast<const block_q4_0*>(src);
  for (int64_t ib = 0; ib < n / QK4_0; ++ib, dst += QK4_0) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      dst[j] = ((b[ib].qs[j] & 0x0f) - kBias) * d;
      dst[j + QK4_0 / 2] = ((b[ib].qs[j] >> 4) - kBias) * d;
    }
  }
}

void dequant_q4_1_ref(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_1*>(src);
  for (int64_t ib = 0; ib < n / QK4_1; ++ib, dst += QK4_1) {
    const float d = fp16_to_f32(b[ib].d);
    const float m = fp16_to_f32(b[ib].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      dst[j] = (b[ib].qs[j] & 0x0f) * d + m;
      dst[j + QK4_1 / 2] = (b[ib].qs[j] >> 4) * d + m;
    }
  }
}

// Q5_0 (value = (q - 16) * d) and Q5_1 (value = q * d + m): Q4's nibbles plus a fifth bit per
// element, bit j of qh for element j.
template <class Block>
void dequant_q5_ref(const void* src, float* dst, int64_t n) {
  constexpr bool kMin = sizeof(Block) == sizeof(block_q5_1);
  constexpr int kBias = type_traits(kMin ? GGML_Q5_1 : GGML_Q5_0).q_bias;
  const auto* b = static_cast<const Block*>(src);
  for (int64_t ib = 0; ib < n / QK5_0; ++ib, dst += QK5_0) {
    const float d = fp16_to_f32(b[ib].d);
    float m = 0.0f;
    if constexpr (kMin) m = fp16_to_f32(b[ib].m);
    const uint8_t* h = b[ib].qh;
    const uint32_t qh = h[0] | (h[1] << 8) | (h[2] << 16) | (static_cast<uint32_t>(h[3]) << 24);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int lo = (b[ib].qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
      const int hi = (b[ib].qs[j] >> 4) | (((qh >> (j + QK5_0 / 2)) & 1) << 4);
      if constexpr (kMin) {
        dst[j] = lo * d + m;
        dst[j + QK5_0 / 2] = hi * d + m;
      } else {
        dst[j] = (lo - kBias) * d;
        dst[j + QK5_0 / 2] = (hi - kBias) * d;
      }
    }
  }
}

// 8 sub-blocks of 32 per super-block, in pairs sharing 32 bytes of qs: the pair's first
// sub-block is the low nibbles, the second the high nibbles; Q5_K adds a fifth bit, bit j of
// qh[l] for element l of sub-block j. value = (d*sc) * q - dmin*m.
template <class Block>
void dequant_q45_K_ref(const void* src, float* dst, int64_t n) {
  constexpr bool kFive = sizeof(Block) == sizeof(block_q5_K);
  const auto* b = static_cast<const Block*>(src);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    const float dmin = fp16_to_f32(b[ib].dmin);
    const uint8_t* q = b[ib].qs;
    for (int j = 0; j < QK_K / 32; j += 2, q += 32, dst += 64) {
      int sc, mn;
      kquant_scale_min(b[ib].scales, j, &sc, &mn);
      const float d1 = d * sc, m1 = dmin * mn;
      kquant_scale_min(b[ib].scales, j + 1, &sc, &mn);
      const float d2 = d * sc, m2 = dmin * mn;
      int h1[32] = {}, h2[32] = {};  // fifth bits, as 16
      if constexpr (kFive)
        for (int l = 0; l < 32; ++l) {
          h1[l] = ((b[ib].qh[l] >> j) & 1) << 4;
          h2[l] = ((b[ib].qh[l] >> (j + 1)) & 1) << 4;
        }
      for (int l = 0; l < 32; ++l) dst[l] = d1 * ((q[l] & 0x0f) | h1[l]) - m1;
      for (int l = 0; l < 32; ++l) dst[l + 32] = d2 * ((q[l] >> 4) | h2[l]) - m2;
    }
  }
}

// Two halves of 128 per super-block. In a half, element l + 32*k (l < 32, k < 4) takes its
// low 4 bits from ql[l + 32*(k & 1)] (low nibble for k < 2, high for k >= 2), its top 2 bits
// from bits 2k..2k+1 of qh[l], and scale number l/16 + 2k of the half's 8.
// value = (d * scale) * (q - 32).
void dequant_q6_K_ref(const void* src, float* dst, int64_t n) {
  constexpr int kBias = type_traits(GGML_Q6_K).q_bias;
  const auto* b = static_cast<const block_q6_K*>(src);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = fp16_to_f32(b[ib].d);
    const uint8_t* ql = b[ib].ql;
    const uint8_t* qh = b[ib].qh;
    const int8_t* sc = b[ib].scales;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - kBias;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - kBias;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - kBias;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - kBias;
        dst[l] = (d * sc[is + 0]) * q1;
        dst[l + 32] = (d * sc[is + 2]) * q2;
        dst[l + 64] = (d * sc[is + 4]) * q3;
        dst[l + 96] = (d * sc[is + 6]) * q4;
      }
    }
  }
}

}  // namespace

void fill_dequant_scalar(KernelSet& t) {
  t.dequant_row[GGML_F32] = dequant_f32_ref;
  t.dequant_row[GGML_F16] = dequant_f16_ref;
  t.dequant_row[GGML_BF16] = dequant_bf16_ref;
  t.dequant_row[GGML_Q8_0] = dequant_q8_0_ref;
  t.dequant_row[GGML_Q4_0] = dequant_q4_0_ref;
  t.dequant_row[GGML_Q4_1] = dequant_q4_1_ref;
  t.dequant_row[GGML_Q5_0] = dequant_q5_ref<block_q5_0>;
  t.dequant_row[GGML_Q5_1] = dequant_q5_ref<block_q5_1>;
  t.dequant_row[GGML_Q4_K] = dequant_q45_K_ref<block_q4_K>;
  t.dequant_row[GGML_Q5_K] = dequant_q45_K_ref<block_q5_K>;
  t.dequant_row[GGML_Q6_K] = dequant_q6_K_ref;
}

}  // namespace pyinfer
