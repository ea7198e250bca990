// ops.h: portable drivers for the small ops: row loops over the per-ISA kernels, embedding,
// dequantization. Callers above the ops layer (models, bindings) go through these, never the
// kernel table.
#pragma once
#include <cstdint>

namespace pyinfer {

// out[n_rows][n] = rms_norm of each row of x[n_rows][n] times w[n]; out may be x.
void rms_norm_rows(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps);
// RoPE's frequencies: theta_i = pos * freq_scale * base^(-2i/head_dim) / factors[i] (factors
// nullptr: all 1). freq_scale < 1 is linear position interpolation; per-pair factors are Llama
// 3's frequency scaling, which converters store as the tensor rope_freqs.weight.
struct RopeFreqs {
  float base = 10000.0f;
  float freq_scale = 1.0f;
  const float* factors = nullptr;  // [head_dim / 2]
};
// cos_sin[n_rows][head_dim]: for each position pos[r], the cos then the sin of RoPE's angles
// theta_i, i < head_dim / 2 (the table RopeFn takes).
void rope_table(const int64_t* pos, int64_t n_rows, int64_t head_dim, const RopeFreqs& freqs, float* cos_sin);
// In place: RoPE on x[n_rows][row_stride] holding n_heads heads of head_dim (even, <=
// kRopeMaxDim) each, by the angles cos_sin[n_rows][head_dim] from rope_table (RopeFn in
// kernels/abi.h); pairs (2i, 2i+1) or, with neox, (i, i + head_dim/2).
void rope_rows(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim, const float* cos_sin,
               bool neox);
// out[n] = silu(gate) * up; out may alias either input.
void swiglu_vec(const float* gate, const float* up, float* out, int64_t n);
// out[n] = gelu(gate) * up, GELU by its tanh approximation (Gemma's GeGLU); out may alias
// either input. Portable: one float tanh per element, the same on every ISA path.
void geglu_vec(const float* gate, const float* up, float* out, int64_t n);
// In place: x[n] = cap * tanh(x / cap) (Gemma's logit soft-capping).
void softcap_vec(float* x, int64_t n, float cap);
// out[n] = a + b; out may alias either input.
void add_vec(const float* a, const float* b, float* out, int64_t n);
// out[n_rows][n] = softmax of each row of x[n_rows][n]; out may be x. n >= 1.
void softmax_rows(const float* x, float* out, int64_t n_rows, int64_t n);
// Whether the type has a dequantization kernel (the same on every ISA path).
bool has_dequant_kernel(uint32_t type);
// dst[n] = the float32 values of n elements (a multiple of the block size) of raw GGUF blocks
// of a type with a dequantization kernel (the caller checks both).
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);
// Bytes of one row of dim elements of a GGUF type; -1 if the type has no dequantization
// kernel or dim is not a positive multiple of its block size.
int64_t embedding_row_bytes(uint32_t type, int64_t dim);
// out[n_ids][dim] = rows ids[] of table (n_rows rows of the type's GGUF encoding), as float32.
// Throws std::invalid_argument for an id outside [0, n_rows) or an unsupported type.
void embedding(const void* table, uint32_t type, int64_t n_rows, int64_t dim, const int64_t* ids, int64_t n_ids,
               float* out);

}  // namespace pyinfer
