// dequant_ref.cpp: scalar dequantization of GGUF blocks to float32, the executable spec.
#include <cstring>

#include "dispatch.h"
#include "half.h"

namespace pyinfer {
namespace {

void dequant_f32_ref(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequant_f16_ref(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const fp16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
}

void dequant_bf16_ref(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const bf16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
}

void dequant_q8_0_ref(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t ib = 0; ib < n / QK8_0; ++ib, dst += QK8_0) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < QK8_0; ++j) dst[j] = b[ib].qs[j] * d;
  }
}

void dequant_q4_0_ref(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_0*>(src);
  for (int64_t ib = 0; ib < n / QK4_0; ++ib, dst += QK4_0) {
    const float d = fp16_to_f32(b[ib].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      dst[j] = ((b[ib].qs[j] & 0x0f) - 8) * d;
      dst[j + QK4_0 / 2] = ((b[ib].qs[j] >> 4) - 8) * d;
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

uint64_t read_sum_ref(const void* src, size_t n_bytes) {
  const auto* p = static_cast<const uint64_t*>(src);
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n_bytes / 8; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

}  // namespace

void fill_kernels_scalar(KernelTable& t) {
  t.dequant_row[GGML_F32] = dequant_f32_ref;
  t.dequant_row[GGML_F16] = dequant_f16_ref;
  t.dequant_row[GGML_BF16] = dequant_bf16_ref;
  t.dequant_row[GGML_Q8_0] = dequant_q8_0_ref;
  t.dequant_row[GGML_Q4_0] = dequant_q4_0_ref;
  t.dequant_row[GGML_Q4_1] = dequant_q4_1_ref;
  t.read_sum = read_sum_ref;
}

}  // namespace pyinfer
