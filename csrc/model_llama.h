// model_llama.h: the llama-family transformer forward pass over the kernels: weights shared by
// any number of contexts, each context with its own KV cache and position.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "kv_cache.h"
#include "matmul.h"

namespace pyinfer {

struct LlamaConfig {
  int64_t n_layer = 0;
  int64_t n_embd = 0;     // model width
  int64_t n_head = 0;     // query heads
  int64_t n_head_kv = 0;  // key/value heads (grouped-query attention when < n_head)
  int64_t head_dim = 0;
  int64_t n_ff = 0;       // feed-forward width
  int64_t n_vocab = 0;
  float rope_base = 10000.0f;
  float rms_eps = 1e-5f;
};

// A weight matrix W[rows][cols] as stored in the GGUF file: `rows` rows of `cols` elements,
// each row matmul_row_bytes(type, cols) bytes. y = x @ W^T maps cols -> rows.
struct WeightRef {
  const void* data = nullptr;
  uint32_t type = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* packed = nullptr;  // the same matrix in the 16-row interleaved layout, if made
};

struct LlamaLayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  WeightRef wq;                      // [n_head * head_dim][n_embd]
  WeightRef wk;                      // [n_head_kv * head_dim][n_embd]
  WeightRef wv;                      // [n_head_kv * head_dim][n_embd]
  WeightRef wo;                      // [n_embd][n_head * head_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  WeightRef gate;                    // [n_ff][n_embd]
  WeightRef up;                      // [n_ff][n_embd]
  WeightRef down;                    // [n_embd][n_ff]
  // Fused copies for the fast path, set when repacking could make them (same type, each part
  // a whole number of 16-row groups): [wq; wk; wv] as one matrix of q_dim + 2 * kv_dim rows
  // and [gate; up] of 2 * n_ff rows, so a layer's input is quantized, and the pool started,
  // once per pair instead of once per matrix. Only `packed` is set (data is nullptr); the
  // parts' own `packed` point into them.
  WeightRef qkv;
  WeightRef gate_up;
};

struct LlamaWeights {
  WeightRef tok_embd;                 // [n_vocab][n_embd]
  std::vector<LlamaLayerWeights> layers;
  const float* output_norm = nullptr;  // [n_embd]
  WeightRef output;                    // [n_vocab][n_embd]; the embedding table when tied
};

class LlamaModel {
 public:
  // Checks every shape and type against the config (std::invalid_argument naming the
  // tensor). With repack, the quantized matrices that have a 16-row interleaved layout are
  // repacked once into buffers this model owns; the mapped file is then read only for the rest.
  LlamaModel(const LlamaConfig& config, const LlamaWeights& weights, bool repack);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  size_t repacked_bytes() const { return repacked_bytes_; }

  // y[M][w.rows] = x[M][w.cols] @ W^T; fast mode goes through the repacked copy if there is one.
  static void matmul(const WeightRef& w, const float* x, int64_t M, float* y, MatmulMode mode,
                     int n_threads);

 private:
  void repack_all();

  LlamaConfig config_;
  LlamaWeights weights_;  // with `packed` set where a repacked copy exists
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  // Every repacked matrix, in the order a forward pass reads them, in one buffer on
  // transparent huge pages: a decode step streams it front to back.
  std::unique_ptr<uint8_t, FreeDeleter> packed_arena_;
  size_t repacked_bytes_ = 0;
};

class LlamaContext;

// Per-row scratch of a forward pass over up to n_rows token rows.
struct LlamaScratch {
  LlamaScratch(const LlamaConfig& c, int64_t n_rows);
  int64_t n_rows;
  std::vector<float> x, xn;  // [n_rows][n_embd]: the residual stream; a block's normed input or output
  std::vector<float> qkv;    // [n_rows][q_dim + 2 * kv_dim]: Q, K, V side by side
  std::vector<float> attn;   // [n_rows][q_dim]
  std::vector<float> ffn;    // [n_rows][2 * n_ff]: gate and up
  std::vector<float> act;    // [n_rows][n_ff]: silu(gate) * up
  std::vector<float> rope;   // [n_rows][head_dim]: cos, sin of RoPE's angles (rope_table)
  std::vector<int64_t> pos, ids;  // [n_rows]
};

// One sequence: its KV cache, its position, and scratch for up to n_batch tokens per call.
class LlamaContext {
 public:
  LlamaContext(std::shared_ptr<const LlamaModel> model, int64_t n_ctx, int64_t n_batch, KvType kv_type);

  // Runs n tokens (1 <= n <= n_batch) at positions n_past..n_past+n-1, appending them to the
  // cache. logits receives [n][n_vocab] floats when all_logits, else the last token's
  // [n_vocab]. Throws std::invalid_argument (bad id, no room) before changing any state,
  // and std::runtime_error if another thread is using this context.
  void eval(const int32_t* ids, int64_t n, float* logits, bool all_logits, MatmulMode mode,
            int n_threads);

  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_batch() const { return n_batch_; }
  int64_t n_vocab() const { return model_->config().n_vocab; }
  // Forget positions >= n (0 clears the sequence).
  void truncate(int64_t n);
  const KVCache& cache() const { return cache_; }
  const std::shared_ptr<const LlamaModel>& model() const { return model_; }

 private:
  friend class LlamaBatch;
  std::shared_ptr<const LlamaModel> model_;
  int64_t n_ctx_, n_batch_;
  KVCache cache_;
  int64_t n_past_ = 0;
  std::mutex busy_;
  LlamaScratch scratch_;  // n_batch rows
};

// Batched decode: one token for each of up to n_seq sequences (contexts of one model, each at
// its own position) in one forward pass, so every weight is read once per step for all of
// them; attention stays per sequence.
class LlamaBatch {
 public:
  LlamaBatch(std::shared_ptr<const LlamaModel> model, int64_t n_seq);

  // Appends ids[b] to contexts[b] (b < n, 1 <= n <= n_seq, contexts distinct and of this
  // model) and writes its next-token logits to logits[b][n_vocab]. Throws
  // std::invalid_argument (bad id, full context, repeated or foreign context) before
  // changing any state, and std::runtime_error if a context is in use by another thread.
  // The result of each row is that of contexts[b]->eval(&ids[b], 1, ...) alone, bit for bit
  // in fast mode; exact mode may differ in float rounding (its kernels block over rows).
  void decode(LlamaContext* const* contexts, const int32_t* ids, int64_t n, float* logits, MatmulMode mode,
              int n_threads);

  int64_t n_seq() const { return n_seq_; }

 private:
  std::shared_ptr<const LlamaModel> model_;
  int64_t n_seq_;
  std::mutex busy_;
  LlamaScratch scratch_;
};

}  // namespace pyinfer
