// model_llama.cpp: the llama-family forward pass (embedding, per layer RMSNorm, Q/K/V, RoPE,
// KV append, grouped-query attention, output projection, residual, RMSNorm, SwiGLU FFN;
// final norm, output head), one call per prefill chunk or decode step.
#include "model_llama.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "dispatch.h"
#include "ops.h"

namespace pyinfer {

namespace {

std::string shape_str(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

void check_weight(const WeightRef& w, const char* name, int64_t layer, int64_t rows, int64_t cols) {
  const std::string where = layer >= 0 ? "blk." + std::to_string(layer) + "." + name : name;
  if (w.data == nullptr) throw std::invalid_argument("missing weight " + where);
  if (w.rows != rows || w.cols != cols)
    throw std::invalid_argument(where + ": shape " + shape_str(w.rows, w.cols) + ", expected " +
                                shape_str(rows, cols));
  if (matmul_row_bytes(w.type, w.cols) < 0)
    throw std::invalid_argument(where + ": tensor type " + std::to_string(w.type) +
                                " has no matmul kernel");
}

void check_norm(const float* w, const char* name, int64_t layer) {
  if (w == nullptr)
    throw std::invalid_argument("missing weight " +
                                (layer >= 0 ? "blk." + std::to_string(layer) + "." + name : std::string(name)));
}

}  // namespace

LlamaModel::LlamaModel(const LlamaConfig& c, const LlamaWeights& weights, bool repack_weights)
    : config_(c), weights_(weights) {
  if (c.n_layer < 1 || c.n_embd < 1 || c.n_head < 1 || c.n_head_kv < 1 || c.head_dim < 2 ||
      c.n_ff < 1 || c.n_vocab < 1)
    throw std::invalid_argument("model dimensions must be positive");
  if (c.n_head % c.n_head_kv != 0)
    throw std::invalid_argument("n_head (" + std::to_string(c.n_head) + ") is not a multiple of n_head_kv (" +
                                std::to_string(c.n_head_kv) + ")");
  if (c.head_dim % 2 != 0 || c.head_dim > kRopeMaxDim)
    throw std::invalid_argument("head_dim must be even and at most " + std::to_string(kRopeMaxDim));
  if (static_cast<int64_t>(weights_.layers.size()) != c.n_layer)
    throw std::invalid_argument("expected " + std::to_string(c.n_layer) + " layers of weights, got " +
                                std::to_string(weights_.layers.size()));
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  if (embedding_row_bytes(weights_.tok_embd.type, c.n_embd) < 0 || weights_.tok_embd.data == nullptr ||
      weights_.tok_embd.rows != c.n_vocab || weights_.tok_embd.cols != c.n_embd)
    throw std::invalid_argument("token_embd.weight: expected " + shape_str(c.n_vocab, c.n_embd) +
                                " of a type with a dequantization kernel");
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LlamaLayerWeights& L = weights_.layers[il];
    check_norm(L.attn_norm, "attn_norm.weight", il);
    check_norm(L.ffn_norm, "ffn_norm.weight", il);
    check_weight(L.wq, "attn_q.weight", il, q_dim, c.n_embd);
    check_weight(L.wk, "attn_k.weight", il, kv_dim, c.n_embd);
    check_weight(L.wv, "attn_v.weight", il, kv_dim, c.n_embd);
    check_weight(L.wo, "attn_output.weight", il, c.n_embd, q_dim);
    check_weight(L.gate, "ffn_gate.weight", il, c.n_ff, c.n_embd);
    check_weight(L.up, "ffn_up.weight", il, c.n_ff, c.n_embd);
    check_weight(L.down, "ffn_down.weight", il, c.n_embd, c.n_ff);
  }
  check_norm(weights_.output_norm, "output_norm.weight", -1);
  check_weight(weights_.output, "output.weight", -1, c.n_vocab, c.n_embd);

  if (repack_weights) {
    for (LlamaLayerWeights& L : weights_.layers)
      for (WeightRef* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) repack(*w);
    repack(weights_.output);
  }
}

void LlamaModel::repack(WeightRef& w) {
  const int64_t n = packed_bytes(w.type, w.rows, w.cols);
  if (n <= 0) return;  // no interleaved layout for this type: stays as stored
  std::unique_ptr<uint8_t[]> buf(new uint8_t[static_cast<size_t>(n)]);
  repack16(w.data, w.type, w.rows, w.cols, buf.get());
  w.packed = buf.get();
  repacked_bytes_ += static_cast<size_t>(n);
  packed_buffers_.push_back(std::move(buf));
}

void LlamaModel::matmul(const WeightRef& w, const float* x, int64_t M, float* y, MatmulMode mode,
                        int n_threads) {
  if (w.packed != nullptr && mode == MatmulMode::fast)
    matmul_packed(x, M, w.cols, w.packed, w.type, w.rows, y, mode, n_threads);
  else
    pyinfer::matmul(x, M, w.cols, w.data, w.type, w.rows, y, mode, n_threads);
}

LlamaContext::LlamaContext(std::shared_ptr<const LlamaModel> model, int64_t n_ctx, int64_t n_batch,
                           KvType kv_type)
    : model_(std::move(model)),
      n_ctx_(n_ctx),
      n_batch_(n_batch),
      cache_(model_->config().n_layer, model_->config().n_head_kv, model_->config().head_dim, n_ctx,
             kv_type) {
  const LlamaConfig& c = model_->config();
  if (n_batch < 1) throw std::invalid_argument("n_batch must be >= 1");
  const size_t B = static_cast<size_t>(n_batch);
  x_.resize(B * c.n_embd);
  xn_.resize(B * c.n_embd);
  q_.resize(B * c.n_head * c.head_dim);
  k_.resize(B * c.n_head_kv * c.head_dim);
  v_.resize(B * c.n_head_kv * c.head_dim);
  attn_.resize(B * c.n_head * c.head_dim);
  gate_.resize(B * c.n_ff);
  up_.resize(B * c.n_ff);
  pos_.resize(B);
  ids64_.resize(B);
}

void LlamaContext::truncate(int64_t n) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this context is in use by another thread");
  if (n < 0) throw std::invalid_argument("cannot truncate to a negative length");
  if (n < n_past_) n_past_ = n;
  if (n_past_ == 0) cache_.clear();
}

void LlamaContext::eval(const int32_t* ids, int64_t n, float* logits, bool all_logits, MatmulMode mode,
                        int n_threads) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this context is in use by another thread");
  const LlamaConfig& c = model_->config();
  const LlamaWeights& W = model_->weights();
  if (n < 1 || n > n_batch_)
    throw std::invalid_argument("eval takes 1 to n_batch (" + std::to_string(n_batch_) + ") tokens, got " +
                                std::to_string(n));
  if (n_past_ + n > n_ctx_)
    throw std::invalid_argument("context full: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                                " tokens exceed n_ctx " + std::to_string(n_ctx_));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= c.n_vocab)
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(c.n_vocab) + ")");
    ids64_[i] = ids[i];
    pos_[i] = n_past_ + i;
  }
  const KernelTable& kt = kernels();
  const int64_t E = c.n_embd, hd = c.head_dim;
  const int64_t q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  float* x = x_.data();    // [n][E] the residual stream
  float* xn = xn_.data();  // [n][E] normed input of a block, then its output
  float* q = q_.data();    // [n][q_dim]
  float* k = k_.data();    // [n][kv_dim]
  float* v = v_.data();    // [n][kv_dim]
  float* attn = attn_.data();  // [n][q_dim]
  float* gate = gate_.data();  // [n][n_ff]
  float* up = up_.data();      // [n][n_ff]

  embedding(W.tok_embd.data, W.tok_embd.type, c.n_vocab, E, ids64_.data(), n, x);
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LlamaLayerWeights& L = W.layers[il];
    // Attention block.
    rms_norm_rows(x, L.attn_norm, xn, n, E, c.rms_eps);
    LlamaModel::matmul(L.wq, xn, n, q, mode, n_threads);
    LlamaModel::matmul(L.wk, xn, n, k, mode, n_threads);
    LlamaModel::matmul(L.wv, xn, n, v, mode, n_threads);
    kt.rope_f32(q, n, q_dim, c.n_head, hd, pos_.data(), c.rope_base, false);
    kt.rope_f32(k, n, kv_dim, c.n_head_kv, hd, pos_.data(), c.rope_base, false);
    cache_.append(il, k, kv_dim, v, kv_dim, n_past_, n);
    AttentionArgs a{q, q_dim, attn, q_dim, &cache_, il, n_past_, n, c.n_head,
                    1.0f / std::sqrt(static_cast<float>(hd)), 0};
    attention(a, n_threads);
    LlamaModel::matmul(L.wo, attn, n, xn, mode, n_threads);
    kt.add_f32(x, xn, x, n * E);
    // Feed-forward block.
    rms_norm_rows(x, L.ffn_norm, xn, n, E, c.rms_eps);
    LlamaModel::matmul(L.gate, xn, n, gate, mode, n_threads);
    LlamaModel::matmul(L.up, xn, n, up, mode, n_threads);
    kt.swiglu_f32(gate, up, gate, n * c.n_ff);
    LlamaModel::matmul(L.down, gate, n, xn, mode, n_threads);
    kt.add_f32(x, xn, x, n * E);
  }
  // Output head, only for the rows whose logits are wanted.
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  rms_norm_rows(x + first * E, W.output_norm, xn, rows, E, c.rms_eps);
  LlamaModel::matmul(W.output, xn, rows, logits, mode, n_threads);
  n_past_ += n;
}

}  // namespace pyinfer
