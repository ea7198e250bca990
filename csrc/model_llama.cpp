// model_llama.cpp: the llama-family forward pass (embedding, per layer RMSNorm, Q/K/V, RoPE,
// KV append, grouped-query attention, output projection, residual, RMSNorm, SwiGLU FFN;
// final norm, output head), one call per prefill chunk or decode step.
#include "model_llama.h"

#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "dispatch.h"
#include "kernels/packed16.h"
#include "ops.h"
#include "threadpool.h"

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

  if (repack_weights) repack_all();
}

void LlamaModel::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

namespace {

// Whether parts can share one packed matrix: one packable type and K, and every part but the
// last a whole number of 16-row groups (so each part starts on a group of its own).
bool fusable(std::initializer_list<const WeightRef*> parts) {
  const WeightRef& first = **parts.begin();
  size_t i = 0;
  for (const WeightRef* w : parts) {
    if (w->type != first.type || w->cols != first.cols || packed_bytes(w->type, w->rows, w->cols) < 0) return false;
    if (++i < parts.size() && w->rows % kPackRows != 0) return false;
  }
  return true;
}

}  // namespace

void LlamaModel::repack_all() {
  // Plan the arena: each layer's matrices in the order a forward pass reads them, fused
  // groups back to back, then the output head.
  struct Item {
    WeightRef* w;
    WeightRef* fused;  // the group this part starts or belongs to, or nullptr
  };
  std::vector<Item> items;
  for (LlamaLayerWeights& L : weights_.layers) {
    const bool f_qkv = fusable({&L.wq, &L.wk, &L.wv});
    for (WeightRef* w : {&L.wq, &L.wk, &L.wv}) items.push_back({w, f_qkv ? &L.qkv : nullptr});
    items.push_back({&L.wo, nullptr});
    const bool f_gu = fusable({&L.gate, &L.up});
    for (WeightRef* w : {&L.gate, &L.up}) items.push_back({w, f_gu ? &L.gate_up : nullptr});
    items.push_back({&L.down, nullptr});
  }
  items.push_back({&weights_.output, nullptr});
  size_t total = 0;
  for (const Item& it : items) {
    const int64_t n = packed_bytes(it.w->type, it.w->rows, it.w->cols);
    if (n > 0) total += static_cast<size_t>(n);
  }
  if (total == 0) return;
  // 2 MiB-aligned and advised onto transparent huge pages: on Zen 4 a stream over huge pages
  // reads 15-20% faster than over 4 KiB ones (fewer TLB misses in the prefetchers' way).
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t alloc = (total + kHugePage - 1) / kHugePage * kHugePage;
  packed_arena_.reset(static_cast<uint8_t*>(std::aligned_alloc(kHugePage, alloc)));
  if (!packed_arena_) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(packed_arena_.get(), alloc, MADV_HUGEPAGE);  // advice only: failure leaves small pages
#endif
  uint8_t* p = packed_arena_.get();
  for (const Item& it : items) {
    WeightRef& w = *it.w;
    const int64_t n = packed_bytes(w.type, w.rows, w.cols);
    if (n <= 0) continue;  // no interleaved layout for this type: stays as stored
    repack16(w.data, w.type, w.rows, w.cols, p);
    w.packed = p;
    if (it.fused != nullptr) {
      WeightRef& f = *it.fused;
      if (f.packed == nullptr) f = WeightRef{nullptr, w.type, 0, w.cols, p};
      f.rows += w.rows;
    }
    p += n;
  }
  repacked_bytes_ = total;
}

void LlamaModel::matmul(const WeightRef& w, const float* x, int64_t M, float* y, MatmulMode mode,
                        int n_threads) {
  if (w.packed != nullptr && mode == MatmulMode::fast)
    matmul_packed(x, M, w.cols, w.packed, w.type, w.rows, y, mode, n_threads);
  else
    pyinfer::matmul(x, M, w.cols, w.data, w.type, w.rows, y, mode, n_threads);
}

LlamaScratch::LlamaScratch(const LlamaConfig& c, int64_t rows) : n_rows(rows) {
  if (rows < 1) throw std::invalid_argument("a forward pass needs room for at least one row");
  const size_t R = static_cast<size_t>(rows);
  const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
  x.resize(R * c.n_embd);
  xn.resize(R * c.n_embd);
  qkv.resize(R * (q_dim + 2 * kv_dim));
  attn.resize(R * q_dim);
  ffn.resize(R * 2 * c.n_ff);
  act.resize(R * c.n_ff);
  rope.resize(R * c.head_dim);
  pos.resize(R);
  ids.resize(R);
}

namespace {

// `n` consecutive rows of a forward pass that belong to one sequence, at positions pos.. of
// its cache.
struct Segment {
  KVCache* cache;
  int64_t row0, n, pos;
};

// Appends each segment's new keys and values (k, v: rows of stride kv_stride) to its cache at
// layer il, then runs its rows' attention (args[i] for segs[i]). One segment (a prefill chunk
// or a single decode step) appends on this thread and spreads its (row, head) items over the
// pool; several (a batched decode step) make one pool job of a segment each, append and
// attention together, so the appends run in parallel and each is still in cache when read.
void append_and_attend(const std::vector<Segment>& segs, int64_t il, const float* k, const float* v,
                       int64_t kv_stride, const std::vector<AttentionArgs>& args, int n_threads) {
  const auto append = [&](const Segment& g) {
    g.cache->append(il, k + g.row0 * kv_stride, kv_stride, v + g.row0 * kv_stride, kv_stride, g.pos, g.n);
  };
  if (segs.size() == 1) {
    append(segs[0]);
    attention(args[0], n_threads);
    return;
  }
  // What append would reject, checked here, as nothing may throw inside the job; after the
  // append each segment's queries find their positions in its cache, as attention_check asks.
  int64_t n_scratch = 0;
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& g = segs[i];
    if (g.pos < 0 || g.pos > g.cache->n_pos(il) || g.pos + g.n > g.cache->n_ctx())
      throw std::invalid_argument("batched step: position " + std::to_string(g.pos) + " is outside its cache");
    const int64_t need = attention_scratch(args[i]);
    if (need > n_scratch) n_scratch = need;
  }
  if (n_threads < 1) n_threads = 1;
  std::vector<float> scratch(static_cast<size_t>(n_scratch) * static_cast<size_t>(n_threads));
  parallel_for(n_threads, static_cast<int64_t>(segs.size()), 1, [&](int64_t i0, int64_t i1, int tid) {
    for (int64_t i = i0; i < i1; ++i) {
      append(segs[static_cast<size_t>(i)]);
      const AttentionArgs& a = args[static_cast<size_t>(i)];
      attention_range(a, 0, attention_items(a), scratch.data() + static_cast<size_t>(tid) * n_scratch);
    }
  });
}

// Row-wise work of a forward pass (norms, RoPE, residual adds, SwiGLU: each row independent
// of the others) on the pool, in items of 8 to 32 rows, two per thread where the rows allow
// (a batched decode step's 16 rows make two items; a prefill's, items of 32); a single decode
// step's row runs inline.
template <class F>
void rows(int n_threads, int64_t n_rows, const F& f) {
  int64_t grain = n_rows / (2 * static_cast<int64_t>(n_threads < 1 ? 1 : n_threads));
  grain = grain < 8 ? 8 : grain > 32 ? 32 : grain;
  parallel_for(n_threads, n_rows, grain, [&](int64_t r0, int64_t r1, int) { f(r0, r1 - r0); });
}

// The forward pass over n_rows token rows (s.ids, s.pos set), cut into segments of one
// sequence each, which it appends to their caches. logits[n_out][n_vocab] receives the rows
// out_rows[].
void forward(const LlamaModel& model, const std::vector<Segment>& segs, int64_t n_rows, LlamaScratch& s,
             const int64_t* out_rows, int64_t n_out, float* logits, MatmulMode mode, int n_threads) {
  const LlamaConfig& c = model.config();
  const LlamaWeights& W = model.weights();
  const KernelTable& kt = kernels();
  const int64_t E = c.n_embd, hd = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* x = s.x.data();      // [n_rows][E] the residual stream
  float* xn = s.xn.data();    // [n_rows][E] normed input of a block, then its output
  float* attn = s.attn.data();  // [n_rows][q_dim]
  float* ffn = s.ffn.data();    // [n_rows][2 * F]
  float* act = s.act.data();    // [n_rows][F]
  std::vector<AttentionArgs> args(segs.size());

  embedding(W.tok_embd.data, W.tok_embd.type, c.n_vocab, E, s.ids.data(), n_rows, x);
  // RoPE's cos and sin for each row's position, once for every layer.
  float* cos_sin = s.rope.data();  // [n_rows][hd]
  rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
    rope_table(s.pos.data() + r0, n, hd, c.rope_base, cos_sin + r0 * hd);
  });
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LlamaLayerWeights& L = W.layers[il];
    // Attention block. Q, K, V rows: side by side in one [n_rows][q_dim + 2 * kv_dim] output
    // when fused, else three blocks [n_rows][q_dim], [n_rows][kv_dim], [n_rows][kv_dim].
    if (il == 0) rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      rms_norm_rows(x + r0 * E, L.attn_norm, xn + r0 * E, n, E, c.rms_eps);
    });
    float *q, *k, *v;
    int64_t qs, ks;
    if (mode == MatmulMode::fast && L.qkv.packed != nullptr) {
      q = s.qkv.data(), k = q + q_dim, v = k + kv_dim;
      qs = ks = q_dim + 2 * kv_dim;
      LlamaModel::matmul(L.qkv, xn, n_rows, q, mode, n_threads);
    } else {
      q = s.qkv.data(), k = q + n_rows * q_dim, v = k + n_rows * kv_dim;
      qs = q_dim, ks = kv_dim;
      LlamaModel::matmul(L.wq, xn, n_rows, q, mode, n_threads);
      LlamaModel::matmul(L.wk, xn, n_rows, k, mode, n_threads);
      LlamaModel::matmul(L.wv, xn, n_rows, v, mode, n_threads);
    }
    rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      kt.rope_f32(q + r0 * qs, n, qs, c.n_head, hd, cos_sin + r0 * hd, false);
      kt.rope_f32(k + r0 * ks, n, ks, c.n_head_kv, hd, cos_sin + r0 * hd, false);
    });
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& g = segs[i];
      args[i] = AttentionArgs{q + g.row0 * qs, qs, attn + g.row0 * q_dim, q_dim, g.cache, il, g.pos, g.n,
                              c.n_head, scale, 0};
    }
    append_and_attend(segs, il, k, v, ks, args, n_threads);
    LlamaModel::matmul(L.wo, attn, n_rows, xn, mode, n_threads);
    // Residual, then the feed-forward block's norm, row by row.
    rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      kt.add_f32(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      rms_norm_rows(x + r0 * E, L.ffn_norm, xn + r0 * E, n, E, c.rms_eps);
    });
    // Gate and up: side by side per row ([n_rows][gate F | up F]) when fused, else two blocks
    // [n_rows][F]; silu(gate) * up goes to act [n_rows][F].
    const bool fused = mode == MatmulMode::fast && L.gate_up.packed != nullptr;
    const int64_t gs = fused ? 2 * F : F;
    float* up = fused ? ffn + F : ffn + n_rows * F;
    if (fused) {
      LlamaModel::matmul(L.gate_up, xn, n_rows, ffn, mode, n_threads);
    } else {
      LlamaModel::matmul(L.gate, xn, n_rows, ffn, mode, n_threads);
      LlamaModel::matmul(L.up, xn, n_rows, up, mode, n_threads);
    }
    rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      for (int64_t r = r0; r < r0 + n; ++r) kt.swiglu_f32(ffn + r * gs, up + r * gs, act + r * F, F);
    });
    LlamaModel::matmul(L.down, act, n_rows, xn, mode, n_threads);
    // Residual, then the next layer's attention norm, row by row.
    const float* next_norm = il + 1 < c.n_layer ? W.layers[il + 1].attn_norm : nullptr;
    rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      kt.add_f32(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      if (next_norm != nullptr) rms_norm_rows(x + r0 * E, next_norm, xn + r0 * E, n, E, c.rms_eps);
    });
  }
  // Output head, only for the rows whose logits are wanted.
  for (int64_t i = 0; i < n_out; ++i)
    rms_norm_rows(x + out_rows[i] * E, W.output_norm, xn + i * E, 1, E, c.rms_eps);
  LlamaModel::matmul(W.output, xn, n_out, logits, mode, n_threads);
}

}  // namespace

LlamaContext::LlamaContext(std::shared_ptr<const LlamaModel> model, int64_t n_ctx, int64_t n_batch,
                           KvType kv_type)
    : model_(std::move(model)),
      n_ctx_(n_ctx),
      n_batch_(n_batch),
      cache_(model_->config().n_layer, model_->config().n_head_kv, model_->config().head_dim, n_ctx,
             kv_type),
      scratch_(model_->config(), n_batch >= 1 ? n_batch : throw std::invalid_argument("n_batch must be >= 1")) {}

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
    scratch_.ids[i] = ids[i];
    scratch_.pos[i] = n_past_ + i;
  }
  const int64_t first = all_logits ? 0 : n - 1;
  std::vector<int64_t> out_rows;  // [n - first]
  for (int64_t i = first; i < n; ++i) out_rows.push_back(i);
  forward(*model_, {Segment{&cache_, 0, n, n_past_}}, n, scratch_, out_rows.data(),
          static_cast<int64_t>(out_rows.size()), logits, mode, n_threads);
  n_past_ += n;
}

LlamaBatch::LlamaBatch(std::shared_ptr<const LlamaModel> model, int64_t n_seq)
    : model_(std::move(model)),
      n_seq_(n_seq),
      scratch_(model_->config(), n_seq >= 1 ? n_seq : throw std::invalid_argument("n_seq must be >= 1")) {}

void LlamaBatch::decode(LlamaContext* const* contexts, const int32_t* ids, int64_t n, float* logits,
                        MatmulMode mode, int n_threads) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this batch is in use by another thread");
  if (n < 1 || n > n_seq_)
    throw std::invalid_argument("decode takes 1 to n_seq (" + std::to_string(n_seq_) + ") sequences, got " +
                                std::to_string(n));
  const int64_t n_vocab = model_->config().n_vocab;
  for (int64_t b = 0; b < n; ++b) {
    const LlamaContext* ctx = contexts[b];
    if (ctx == nullptr) throw std::invalid_argument("context " + std::to_string(b) + " is None");
    if (ctx->model_.get() != model_.get())
      throw std::invalid_argument("context " + std::to_string(b) + " belongs to another model");
    for (int64_t j = 0; j < b; ++j)
      if (contexts[j] == ctx)
        throw std::invalid_argument("context " + std::to_string(b) + " is also context " + std::to_string(j) +
                                    ": each sequence takes one token per step");
    if (ids[b] < 0 || ids[b] >= n_vocab)
      throw std::invalid_argument("token id " + std::to_string(ids[b]) + " for context " + std::to_string(b) +
                                  " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
  }
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(static_cast<size_t>(n));
  std::vector<Segment> segs;
  std::vector<int64_t> out_rows;
  for (int64_t b = 0; b < n; ++b) {
    LlamaContext& ctx = *contexts[b];
    locks.emplace_back(ctx.busy_, std::try_to_lock);
    if (!locks.back().owns_lock())
      throw std::runtime_error("context " + std::to_string(b) + " is in use by another thread");
    if (ctx.n_past_ + 1 > ctx.n_ctx_)
      throw std::invalid_argument("context " + std::to_string(b) + " is full: " + std::to_string(ctx.n_past_) +
                                  " + 1 tokens exceed n_ctx " + std::to_string(ctx.n_ctx_));
    scratch_.ids[b] = ids[b];
    scratch_.pos[b] = ctx.n_past_;
    segs.push_back(Segment{&ctx.cache_, b, 1, ctx.n_past_});
    out_rows.push_back(b);
  }
  forward(*model_, segs, n, scratch_, out_rows.data(), n, logits, mode, n_threads);
  for (int64_t b = 0; b < n; ++b) contexts[b]->n_past_ += 1;
}

}  // namespace pyinfer
