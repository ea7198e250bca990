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
  void repack(WeightRef& w);

  LlamaConfig config_;
  LlamaWeights weights_;  // with `packed` set where a repacked copy exists
  std::vector<std::unique_ptr<uint8_t[]>> packed_buffers_;
  size_t repacked_bytes_ = 0;
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

 private:
  std::shared_ptr<const LlamaModel> model_;
  int64_t n_ctx_, n_batch_;
  KVCache cache_;
  int64_t n_past_ = 0;
  std::mutex busy_;
  // Scratch, [n_batch][width] each.
  std::vector<float> x_, xn_, q_, k_, v_, attn_, gate_, up_;
  std::vector<int64_t> pos_, ids64_;
};

}  // namespace pyinfer
