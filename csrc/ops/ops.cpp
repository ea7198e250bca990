// ops.cpp: portable drivers for the small ops (row loops, embedding lookup).
#include "ops/ops.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/rope_angles.h"
#include "runtime/checked.h"
#include "runtime/dispatch.h"

namespace pyinfer {

void rms_norm_rows(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps) {
  const RmsNormFn fn = kernels().rms_norm_f32;
  for (int64_t r = 0; r < n_rows; ++r) fn(x + r * n, w, out + r * n, n, eps);
}

void rope_table(const int64_t* pos, int64_t n_rows, int64_t head_dim, const RopeFreqs& freqs, float* cos_sin) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* c = cos_sin + r * head_dim;
    rope_cos_sin(pos[r], head_dim, freqs.base, freqs.freq_scale, freqs.factors, c, c + head_dim / 2);
  }
}

void rope_rows(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim, const float* cos_sin,
               bool neox) {
  kernels().rope_f32(x, n_rows, row_stride, n_heads, head_dim, cos_sin, neox);
}

void swiglu_vec(const float* gate, const float* up, float* out, int64_t n) { kernels().swiglu_f32(gate, up, out, n); }

void geglu_vec(const float* gate, const float* up, float* out, int64_t n) { kernels().geglu_f32(gate, up, out, n); }

void softcap_vec(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void add_vec(const float* a, const float* b, float* out, int64_t n) { kernels().add_f32(a, b, out, n); }

void softmax_rows(const float* x, float* out, int64_t n_rows, int64_t n) {
  const SoftmaxFn fn = kernels().softmax_f32;
  for (int64_t r = 0; r < n_rows; ++r) fn(x + r * n, out + r * n, n);
}

bool has_dequant_kernel(uint32_t type) { return type < GGML_TYPE_SLOTS && kernels().dequant_row[type] != nullptr; }

void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n) { kernels().dequant_row[type](src, dst, n); }

int64_t embedding_row_bytes(uint32_t type, int64_t dim) {
  const TypeSize ts = type_size(type);
  if (ts.block_elems == 0 || !has_dequant_kernel(type)) return -1;
  if (dim < 1 || dim % ts.block_elems != 0) return -1;
  return checked_mul(dim / ts.block_elems, ts.block_bytes, "an embedding row's bytes (blocks * block bytes)");
}

void embedding(const void* table, uint32_t type, int64_t n_rows, int64_t dim, const int64_t* ids, int64_t n_ids,
               float* out) {
  const int64_t row_bytes = embedding_row_bytes(type, dim);
  if (row_bytes < 0)
    throw std::invalid_argument("embedding: type id " + std::to_string(type) + " with dim " + std::to_string(dim) +
                                " has no row kernel (dim must be a multiple of the block size)");
  for (int64_t i = 0; i < n_ids; ++i)
    if (ids[i] < 0 || ids[i] >= n_rows)
      throw std::invalid_argument("embedding: row id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                  " is outside [0, " + std::to_string(n_rows) + ")");
  const DequantRowFn fn = kernels().dequant_row[type];
  const auto* base = static_cast<const uint8_t*>(table);
  for (int64_t i = 0; i < n_ids; ++i) fn(base + ids[i] * row_bytes, out + i * dim, dim);
}

}  // namespace pyinfer
