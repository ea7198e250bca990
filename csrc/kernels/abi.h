// abi.h: the kernels' interface: the signature of every kernel slot, the attention tile they
// are handed, and the set of slots one ISA's files fill. Kernel files include this and the
// other kernels/ headers only; which set is in use is the dispatcher's business
// (runtime/dispatch.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/q8_act.h"
#include "kernels/quant_blocks.h"

namespace pyinfer {

// Dequantize n elements (a multiple of the type's block size) from raw GGUF blocks to float32.
using DequantRowFn = void (*)(const void* src, float* dst, int64_t n);

// ---- small ops and attention (kernels/ref/ops_ref.cpp, kernels/x86/ops_*.cpp) ----
// out[n] = x[n] / sqrt(mean(x^2) + eps) * w[n]; out may be x.
using RmsNormFn = void (*)(const float* x, const float* w, float* out, int64_t n, float eps);
// In place, x[n_rows][row_stride] holding n_heads heads of head_dim (even, <= kRopeMaxDim)
// each: row r rotated by the angles theta_i of its position, given as
// cos_sin[r][head_dim] = (cos theta_0 .. cos theta_{half-1}, sin theta_0 .. sin theta_{half-1})
// (rope_table in ops/ops.h computes them once for every layer of a forward pass). Pairs are
// (2i, 2i+1) (llama.cpp's normal mode, what llama-arch GGUFs expect) or, with neox,
// (i, i + head_dim/2).
using RopeFn = void (*)(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                        const float* cos_sin, bool neox);
// out[n] = silu(gate) * up (SwiGLU), or gelu_tanh(gate) * up (GeGLU); out may alias either input.
using SwigluFn = void (*)(const float* gate, const float* up, float* out, int64_t n);
using GegluFn = SwigluFn;
constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;
// out[n] = a + b; out may alias either input.
using AddFn = void (*)(const float* a, const float* b, float* out, int64_t n);
// out[n] = softmax(x[n]); out may be x.
using SoftmaxFn = void (*)(const float* x, float* out, int64_t n);
// dst[n] = fp16 of src[n], rounded to nearest even.
using F32ToF16Fn = void (*)(const float* src, fp16_t* dst, int64_t n);
// Keys are cached in blocks of kKeyBlock positions, each block [head_dim][kKeyBlock] (see
// KVCache), so the score of one query against a block is head_dim broadcast-multiply-adds of
// whole vectors, with no horizontal sums (a Q8_0 cache's: integer multiply-adds of dimension
// pairs, then one float multiply-add per 32 dimensions; AttnTile).
constexpr int64_t kKeyBlock = 16;
// The most queries of a tile that share each key and value load (one register group).
constexpr int64_t kAttnGroupQueries = 4;
// One tile of causal attention: n_rows consecutive query positions last, last + 1, ..., each
// with n_heads query heads that share one KV head. Row r sees cached positions first(r)..last + r,
// first(r) = max(0, last + r + 1 - window) when window > 0, else 0; each of its heads gets
// out = softmax(scale * K q) V over them.
struct AttnTile {
  const float* q;  // query (row r, head h) at q + r * q_stride + h * head_dim
  int64_t q_stride;
  float* out;  // the same layout, out_stride
  int64_t out_stride;
  int64_t n_rows, n_heads;
  int64_t last, window;
  // Keys in blocks [head_dim][kKeyBlock], block b at k + b * head_dim * kKeyBlock elements,
  // read for the blocks before that of the tile's last position; k_last: that block in the
  // same layout (positions after the tile's last in it may hold anything). Values
  // [n_pos][head_dim]. Element type by table slot.
  const void* k;
  const void* k_last;
  const void* v;
  // KV_Q8_0 only: int8 elements, each 32 consecutive ones of a key or value (dimensions
  // 32c..32c+31) sharing one float scale. Element i of key p is k8 * k_scale[(i / 32) *
  // k_scale_stride + p] (the scales of a chunk c side by side over positions), element i of
  // value j is v8 * v_scale[j * (head_dim / 32) + i / 32]. The values are used as exactly those
  // products, the cache's dequantized elements. A score takes the query in int16 per chunk
  // (attn_query_q16 in kernels/kv_query.h: qi, qd), sums each chunk exactly in integers, sum_c =
  // sum of qi * k8 over the chunk, and adds the chunks in order, acc = fma(float(sum_c),
  // qd_c * k_scale_c(p), acc) from 0; the score is acc * scale.
  const float* k_scale;
  int64_t k_scale_stride;
  const float* v_scale;
  int64_t head_dim;
  float scale;
  float* scores;  // scratch: n_rows * n_heads * attn_span(first(0), last + n_rows - 1) floats
  // Whether this call reads each cached key and value once (one query row whose heads fit one
  // register group: at most kAttnGroupQueries), rather than again for later rows or register
  // groups (prefill): where the kernels request them ahead, a line read once is requested into
  // L2, one read again into L1.
  bool reads_once;
};
// Each query's result depends on that query's inputs only, never on which rows and heads
// share its tile, so any tiling gives the same bits.
using AttnFn = void (*)(const AttnTile& tile);
// The three steps of AttnFn apart, so that threads can share one tile (a decode step over many
// positions and fewer KV heads than threads can keep busy): the same arithmetic on each query,
// so the same bits however the steps are split. The tile's span is its key blocks
// b0 = attn_first(t, 0) / kKeyBlock .. b1 = (t.last + t.n_rows - 1) / kKeyBlock; query i (row-major
// over (row, head)) keeps its scores at t.scores + i * attn_span(first(0), last + n_rows - 1).
//   scores: every query's scores against blocks [bs, be) of the span (b0 <= bs < be <= b1 + 1);
//   softmax: every query's scores become exp(score - max) over its own positions, in place,
//            and inv[i] = 1 / their sum;
//   weigh:   out elements [c0, c1) of every query (c0 a multiple of 16, c1 one or head_dim),
//            the exp weights times V, times inv.
struct AttnSteps {
  void (*scores)(const AttnTile& tile, int64_t bs, int64_t be);
  void (*softmax)(const AttnTile& tile, float* inv);
  void (*weigh)(const AttnTile& tile, const float* inv, int64_t c0, int64_t c1);
};
// Scores one query of a tile keeps: from the start of first's key block to the end of last's.
inline int64_t attn_span(int64_t first, int64_t last) { return (last / kKeyBlock - first / kKeyBlock + 1) * kKeyBlock; }
// First position row r of a tile sees.
inline int64_t attn_first(const AttnTile& t, int64_t r) {
  return t.window > 0 && t.last + r + 1 > t.window ? t.last + r + 1 - t.window : 0;
}
constexpr int64_t kRopeMaxDim = 1024;
enum KvType : int { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2, KV_TYPE_SLOTS = 3 };
// Elements per scale of a KV_Q8_0 cache, as GGML's Q8_0 blocks (llama.cpp's -ctk q8_0).
constexpr int64_t kKvQ8Chunk = 32;
// Bytes of one cached element (a KV_Q8_0 cache keeps its scales apart).
constexpr int kv_elem_bytes(int type) { return type == KV_F16 ? 2 : type == KV_Q8_0 ? 1 : 4; }

// Matmul row kernels, y[m*ldy + n] = sum_k x[m, k] * W[n, k] for m < M and n < n_rows: w
// points at the first of n_rows weight rows of w_row_bytes each (blocks as stored in GGUF),
// y at the output column of that row. K is a multiple of 32.
// Exact mode: float32 activations x[M, K] (row stride K), float32 accumulation.
using MatmulExactFn = void (*)(const void* w, int64_t w_row_bytes, const float* x, int64_t M, int64_t K, int64_t n_rows,
                               float* y, int64_t ldy);
// Fast mode: activations quantized to xq[M, K/32] (see q8_act.h), integer dot products.
using MatmulFastFn = void (*)(const void* w, int64_t w_row_bytes, const block_q8a* xq, int64_t M, int64_t K,
                              int64_t n_rows, float* y, int64_t ldy);
// Quantize k floats (a multiple of 32) to k/32 activation blocks.
using QuantizeActFn = void (*)(const float* x, block_q8a* dst, int64_t k);

// The slots of one ISA's kernels. Every ISA's set starts from the scalar one, then its files
// fill the slots they implement (runtime/dispatch.cpp builds each set in that order).
struct KernelSet {
  DequantRowFn dequant_row[GGML_TYPE_SLOTS];  // nullptr where a type has no kernel
  RmsNormFn rms_norm_f32;
  RopeFn rope_f32;
  SwigluFn swiglu_f32;
  GegluFn geglu_f32;
  AddFn add_f32;
  SoftmaxFn softmax_f32;
  F32ToF16Fn f32_to_f16;
  AttnFn attention[KV_TYPE_SLOTS];           // by KvType
  AttnSteps attention_steps[KV_TYPE_SLOTS];  // by KvType; null members where an ISA has none
  // Matmul (ops/matmul.cpp drives them). A quantized type without an exact kernel, or with
  // three or more activation rows, is dequantized a few rows at a time and multiplied as
  // float32 rows (matmul_exact_f32_many); a quantized type's exact kernel gives the same values
  // (a NaN's sign and payload aside).
  MatmulExactFn matmul_exact[GGML_TYPE_SLOTS];  // nullptr where a type has no kernel
  // Float32 rows against several activation rows (ops/matmul.cpp: F32 weights and dequantized
  // rows from kExactDequantMinM rows on): matmul_exact[GGML_F32]'s values (a NaN's sign and
  // payload aside), tiled for a GEMM where an ISA has the registers for it.
  MatmulExactFn matmul_exact_f32_many;
  MatmulFastFn matmul_fast[GGML_TYPE_SLOTS];
  // The same on weights in the 16-row interleaved layout (kernels/packed16.h): w points at
  // the group holding the first row; w_row_bytes is the row size as stored in GGUF.
  MatmulFastFn matmul_fast_packed[GGML_TYPE_SLOTS];
  QuantizeActFn quantize_act;
};

// What a kernel set is built with beyond its instruction set: choices that were measured to
// differ between CPUs (runtime/dispatch.cpp takes them from cpu_features).
struct KernelTuning {
  // Kernels that read the weights as one sequential stream request them ahead in software:
  // the AVX-512 GEMV (one activation row) over the 4- and 8-bit packed types, as every call of
  // more rows does, the exact kernels over F32/F16/BF16 rows, and attention over the cached
  // keys and values. Otherwise they leave the stream to the hardware prefetcher (docs/tuning.md,
  // "requests ahead on Intel").
  bool stream_fetch_ahead = true;
};
// How far ahead of what a kernel reads it requests a stream's lines, where it does (exact
// kernels and attention): bytes. The exact kernels and attention over lines it reads once
// request into L2 (x86's T1): into L1 they held the fill buffers the loads themselves wait on.
// Attention over lines it reads again (AttnTile::reads_once) requests into L1 (docs/tuning.md,
// "requests ahead into L2").
constexpr int64_t kStreamFetchAhead = 8192;
// An exact kernel's request ahead for the 32-element run of a row at element k, of a type with
// bb bytes per be elements: into L2, kStreamFetchAhead bytes on, each 64 bytes of the row once,
// from the run that starts on or before them. Static, so each ISA's file keeps its own copy.
static inline void exact_fetch_ahead(const uint8_t* row, int64_t k, int64_t bb, int64_t be) {
  for (int64_t o = (k * bb / be + 63) / 64 * 64; o < (k + 32) * bb / be; o += 64)
    __builtin_prefetch(row + o + kStreamFetchAhead, 0, 2);
}

// Each ISA's files fill their slots of a set; each function is defined in that ISA's files.
void fill_dequant_scalar(KernelSet& t);  // dequantization
void fill_ops_scalar(KernelSet& t);      // the small ops and attention
void fill_matmul_scalar(KernelSet& t);   // matmul and activation quantization
#if PYINFER_X86
void fill_dequant_avx2(KernelSet& t);
void fill_dequant_avx512(KernelSet& t);
void fill_ops_avx2(KernelSet& t, const KernelTuning& tuning);
void fill_ops_avx512(KernelSet& t, const KernelTuning& tuning);
void fill_matmul_avx2(KernelSet& t, const KernelTuning& tuning);
void fill_matmul_avx512(KernelSet& t, const KernelTuning& tuning);
#endif

}  // namespace pyinfer
