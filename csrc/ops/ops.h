// ops.h: portable drivers for the small ops: row loops over the per-ISA kernels, embedding.
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
// out[n_rows][n] = softmax of each row of x[n_rows][n]; out may be x. n >= 1.
void softmax_rows(const float* x, float* out, int64_t n_rows, int64_t n);
// Bytes of one row of dim elements of a GGUF type; -1 if the type has no dequantization
// kernel or dim is not a positive multiple of its block size.
int64_t embedding_row_bytes(uint32_t type, int64_t dim);
// out[n_ids][dim] = rows ids[] of table (n_rows rows of the type's GGUF encoding), as float32.
// Throws std::invalid_argument for an id outside [0, n_rows) or an unsupported type.
void embedding(const void* table, uint32_t type, int64_t n_rows, int64_t dim, const int64_t* ids,
               int64_t n_ids, float* out);

}  // namespace pyinfer
