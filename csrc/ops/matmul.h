// matmul.h: y[M, N] = x[M, K] @ W[N, K]^T over the active ISA's kernels and the thread pool.
#pragma once
#include <cstdint>

namespace pyinfer {

enum class Precision {
  exact,  // float32 activations, weights dequantized on the fly, float32 accumulation
  fast,   // activations quantized per 32-block to int8, integer dot products (Q8_0, Q4_0,
          // Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K weights); for a type without int8 kernels (F32,
          // F16, BF16) the same as exact
};

// Bytes of one weight row of K elements of the type, or -1 if matmul does not take the type
// (it takes those with an exact or a dequantization kernel: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) or K is not a positive multiple of 32 and of the type's block size.
int64_t matmul_row_bytes(uint32_t w_type, int64_t K);

// x: [M, K] float32, row-major; w: N rows of matmul_row_bytes(w_type, K) bytes (GGUF blocks
// as stored); y: [M, N] float32, row-major, not overlapping x or w. Runs on n_threads
// threads (the caller included), splitting the N rows; the result does not depend on
// n_threads. Throws std::invalid_argument on a bad type or shape.
void matmul(const float* x, int64_t M, int64_t K, const void* w, uint32_t w_type, int64_t N, float* y,
            Precision precision, int n_threads);

// The 16-row interleaved layout (kernels/packed16.h) of the int8 fast types' weights: faster
// fast-mode GEMV and GEMM, repacked once at load (the same bytes as stored, per row). packed_bytes is its size for N
// rows (N rounded up to a multiple of 16), or -1 for another type or a bad K.
int64_t packed_bytes(uint32_t w_type, int64_t N, int64_t K);
// w[N rows as stored] -> packed[packed_bytes], padding rows zero; and back (exactly).
void repack16(const void* w, uint32_t w_type, int64_t N, int64_t K, void* packed);
void unpack16(const void* packed, uint32_t w_type, int64_t N, int64_t K, void* w);
// matmul with W in the packed layout; the result is the same as matmul's on the unpacked W.
void matmul_packed(const float* x, int64_t M, int64_t K, const void* packed, uint32_t w_type, int64_t N, float* y,
                   Precision precision, int n_threads);

// One matrix of several that share their input: W[N, K] of type w_type, as stored or (packed)
// in the 16-row layout, and y, where its [M, N] outputs go at row stride ldy (>= N).
struct MatmulPart {
  const void* w;
  uint32_t w_type;
  int64_t N;
  float* y;
  int64_t ldy;
  bool packed;
};
// The kernel a part multiplies with: packed weights' fast kernel (fast mode), a type's fast
// kernel on weights as stored (fast mode), a type's exact kernel (F32, F16, BF16 in either
// mode; on the SIMD paths also quantized rows dequantized in registers: Q8_0, Q4_0, Q4_1, Q5_1
// and Q5_K, on AVX-512 Q5_0 and Q4_K too), rows dequantized a group at a time into scratch and multiplied by the F32
// exact kernel (the other quantized types as stored, in exact mode), or none (packed weights in exact mode, a type
// without kernels). matmul_parts takes the dequantized rows for an exact kernel's quantized type too from
// kExactDequantMinM activation rows on: the same values, so the same results (where a result is NaN, its sign and
// payload may differ).
enum class MatmulKernel { none, fast_packed, fast, exact, dequantized };
MatmulKernel matmul_part_kernel(uint32_t w_type, bool packed, Precision precision);
// y_i = x @ W_i^T for each of 1 to kMaxMatmulParts parts, every part with a kernel of its own:
// x quantized once (if any part wants it) and the parts' rows split over the threads as one
// job, by bytes, whatever their types; each part's results the same as its own matmul's, on
// any thread count.
constexpr int kMaxMatmulParts = 8;
void matmul_parts(const float* x, int64_t M, int64_t K, const MatmulPart* parts, int n_parts, Precision precision,
                  int n_threads);

// Fast mode's activation quantization (q8_act.h) of x[M, K] (K a multiple of 32), unpacked:
// q[M, K] int8, d[M, K/32] scales, sum[M, K/32] block sums, h[M, K/32] the split blocks'
// high parts (0 where not split), jo[M, K/32] each block's largest element. For tests and study.
void quantize_activations(const float* x, int64_t M, int64_t K, int8_t* q, float* d, int32_t* sum, int8_t* h,
                          int32_t* jo);

}  // namespace pyinfer
