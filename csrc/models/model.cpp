// model.cpp: the parts of a model every architecture shares: building from a tensor map, the
// repacked-weight arena, scratch, sequences, batched decode and the architecture registry.
#include "models/model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>

#include "kernels/packed16.h"
#include "ops/ops.h"
#include "runtime/checked.h"
#include "runtime/huge_pages.h"

namespace pyinfer {

// ---- building blocks -----------------------------------------------------------------------

WeightRef TensorMap::take(const std::string& name) {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) return WeightRef{};
  taken_[name] = true;
  return it->second;
}

void TensorMap::check_all_taken(const std::string& arch) const {
  for (const auto& [name, w] : tensors_)
    if (taken_.count(name) == 0)
      throw std::invalid_argument("tensor " + name + " is not used by architecture " + arch +
                                  ": the forward pass would ignore it");
}

double Params::get(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end()) throw std::invalid_argument("model parameter " + name + " is missing");
  return it->second;
}

double Params::get(const std::string& name, double fallback) const {
  const auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t Params::get_int(const std::string& name) const {
  const double v = get(name);
  if (!(v >= 0 && v <= 1e12) || v != static_cast<double>(static_cast<int64_t>(v)))
    throw std::invalid_argument("model parameter " + name + " must be a non-negative integer, got " +
                                std::to_string(v));
  return static_cast<int64_t>(v);
}

void ModelDims::check() const {
  if (n_layer < 1 || n_embd < 1 || n_head < 1 || n_head_kv < 1 || head_dim < 2 || n_ff < 1 || n_vocab < 1)
    throw std::invalid_argument("model dimensions must be positive");
  if (n_layer > 100000)
    throw std::invalid_argument("n_layer (the file's block_count) must be at most 100000, got " +
                                std::to_string(n_layer));
  if (n_head % n_head_kv != 0)
    throw std::invalid_argument("n_head (" + std::to_string(n_head) + ") is not a multiple of n_head_kv (" +
                                std::to_string(n_head_kv) + ")");
  if (head_dim % 2 != 0 || head_dim > kRopeMaxDim)
    throw std::invalid_argument(
        "head_dim (the file's attention.key_length, or embedding_length / head_count) "
        "must be even and at most " +
        std::to_string(kRopeMaxDim) + ", got " + std::to_string(head_dim));
  // The widths a forward pass sizes its buffers by, checked once here.
  checked_sum({checked_mul(n_head, head_dim, "query width (n_head * head_dim)"),
               checked_product({2, n_head_kv, head_dim}, "key/value width (2 * n_head_kv * head_dim)")},
              "fused QKV width");
  checked_mul(2, n_ff, "fused gate/up width (2 * n_ff)");
  checked_mul(n_vocab, n_embd, "embedding elements (n_vocab * n_embd)");
}

ModelDims ModelDims::from(const Params& p) {
  ModelDims d;
  d.n_layer = p.get_int("n_layer");
  d.n_embd = p.get_int("n_embd");
  d.n_head = p.get_int("n_head");
  d.n_head_kv = p.get_int("n_head_kv");
  d.head_dim = p.get_int("head_dim");
  d.n_ff = p.get_int("n_ff");
  d.n_vocab = p.get_int("n_vocab");
  d.check();
  return d;
}

std::string tensor_name(int64_t layer, const char* name) {
  return layer >= 0 ? "blk." + std::to_string(layer) + "." + name : std::string(name);
}

namespace {

std::string shape_str(int64_t rows, int64_t cols) {
  return "[" + std::to_string(rows) + ", " + std::to_string(cols) + "]";
}

}  // namespace

void check_weight(const WeightRef& w, const std::string& name, int64_t rows, int64_t cols) {
  if (w.data == nullptr) throw std::invalid_argument("missing weight " + name);
  if (w.rows != rows || w.cols != cols)
    throw std::invalid_argument(name + ": shape " + shape_str(w.rows, w.cols) + ", expected " + shape_str(rows, cols));
  if (matmul_row_bytes(w.type, w.cols) < 0)
    throw std::invalid_argument(name + ": tensor type " + std::to_string(w.type) + " has no matmul kernel");
}

const float* check_vector(const WeightRef& w, const std::string& name, int64_t n) {
  if (w.data == nullptr) throw std::invalid_argument("missing weight " + name);
  // One row of n (a 1-D tensor): a matrix of n values in all is a file's mistake, not a vector.
  if (w.type != GGML_F32 || w.rows != 1 || w.cols != n)
    throw std::invalid_argument(name + ": expected a vector of " + std::to_string(n) + " float32 values, got " +
                                (w.type == GGML_F32 ? "shape " + shape_str(w.rows, w.cols) : "another type"));
  return static_cast<const float*>(w.data);
}

WeightRef LayerTensors::weight(const char* name, int64_t rows, int64_t cols) const {
  const std::string n = tensor_name(layer, name);
  const WeightRef w = map.take(n);
  check_weight(w, n, rows, cols);
  return w;
}

const float* LayerTensors::vec(const char* name, int64_t n) const {
  const std::string s = tensor_name(layer, name);
  return check_vector(map.take(s), s, n);
}

WeightRef take_embedding(TensorMap& t, const ModelDims& c) {
  const WeightRef e = t.take("token_embd.weight");
  if (e.data == nullptr || e.rows != c.n_vocab || e.cols != c.n_embd)
    throw std::invalid_argument("token_embd.weight: its shape is [" + std::to_string(e.rows) + ", " +
                                std::to_string(e.cols) + "], the model's [n_vocab, n_embd] is [" +
                                std::to_string(c.n_vocab) + ", " + std::to_string(c.n_embd) +
                                "] (n_embd: the file's embedding_length)");
  if (embedding_row_bytes(e.type, c.n_embd) < 0)
    throw std::invalid_argument("token_embd.weight: GGML type " + std::to_string(e.type) +
                                " has no dequantization kernel for an embedding row of " + std::to_string(c.n_embd));
  return e;
}

WeightRef take_output(TensorMap& t, const ModelDims& c, const WeightRef& tok_embd) {
  WeightRef out = t.take("output.weight");
  if (out.data == nullptr) out = tok_embd;  // tied to the embedding
  check_weight(out, "output.weight", c.n_vocab, c.n_embd);
  return out;
}

Scratch::Scratch(const ModelDims& c, int64_t rows) : n_rows(rows) {
  if (rows < 1) throw std::invalid_argument("a forward pass needs room for at least one row");
  // Every size checked, and their sum, before the first allocation.
  const int64_t q_dim = checked_mul(c.n_head, c.head_dim, "query width (n_head * head_dim)");
  const int64_t kv_dim = checked_mul(c.n_head_kv, c.head_dim, "key/value width (n_head_kv * head_dim)");
  const int64_t n_x = checked_mul(rows, c.n_embd, "scratch rows * n_embd");
  const int64_t n_qkv = checked_mul(rows, checked_sum({q_dim, kv_dim, kv_dim}, "q_dim + 2 * kv_dim"),
                                    "scratch rows * (q_dim + 2 * kv_dim)");
  const int64_t n_attn = checked_mul(rows, q_dim, "scratch rows * q_dim");
  const int64_t n_ffn = checked_product({rows, 2, c.n_ff}, "scratch rows * 2 * n_ff");
  const int64_t n_act = checked_mul(rows, c.n_ff, "scratch rows * n_ff");
  const int64_t n_rope = checked_mul(rows, c.head_dim, "scratch rows * head_dim");
  checked_sum({checked_mul(checked_sum({n_x, n_x, n_qkv, n_attn, n_ffn, n_act, n_rope}, "scratch floats"), 4,
                           "scratch bytes of floats"),
               checked_product({2, rows, 8}, "scratch bytes of positions and ids")},
              "scratch bytes");
  x.resize(to_size(n_x, "scratch"));
  xn.resize(to_size(n_x, "scratch"));
  qkv.resize(to_size(n_qkv, "scratch"));
  attn.resize(to_size(n_attn, "scratch"));
  ffn.resize(to_size(n_ffn, "scratch"));
  act.resize(to_size(n_act, "scratch"));
  rope.resize(to_size(n_rope, "scratch"));
  pos.resize(to_size(rows, "scratch"));
  ids.resize(to_size(rows, "scratch"));
}

// ---- the model and its arena ---------------------------------------------------------------

void Model::FreeDeleter::operator()(uint8_t* p) const { std::free(p); }

namespace {

// W as a matmul part in `precision`: its packed copy in fast mode where there is one, else
// as stored; outputs to y at row stride ldy.
MatmulPart weight_part(const WeightRef& w, Precision precision, float* y, int64_t ldy) {
  const bool packed = precision == Precision::fast && w.packed != nullptr;
  return {packed ? w.packed : w.data, w.type, w.rows, y, ldy, packed};
}

}  // namespace

void Model::matmul(const WeightRef& w, const float* x, int64_t M, float* y, Precision precision, int n_threads) {
  const MatmulPart part = weight_part(w, precision, y, w.rows);
  if (part.packed)
    matmul_packed(x, M, w.cols, part.w, w.type, w.rows, y, precision, n_threads);
  else
    pyinfer::matmul(x, M, w.cols, part.w, w.type, w.rows, y, precision, n_threads);
}

void Model::output_head(const float* x, const int64_t* out_rows, int64_t n_out, const float* norm, float eps,
                        const WeightRef& output, float* xn, float* logits, float* hidden, Precision precision,
                        int n_threads) const {
  const int64_t E = dims_.n_embd;
  for (int64_t i = 0; i < n_out; ++i) rms_norm_rows(x + out_rows[i] * E, norm, xn + i * E, 1, E, eps);
  if (hidden != nullptr) std::copy(xn, xn + n_out * E, hidden);
  if (logits != nullptr) matmul(output, xn, n_out, logits, precision, n_threads);
}

namespace {

// Bytes a matrix takes in the arena, rounded up to a cache line: its 16-row interleaved
// layout, or for a float type (read in place by its exact kernel) its rows as stored; 0 if
// neither.
int64_t arena_bytes(const WeightRef& w) {
  int64_t n = packed_bytes(w.type, w.rows, w.cols);
  if (n <= 0 && matmul_part_kernel(w.type, false, Precision::exact) == MatmulKernel::exact)
    n = checked_mul(w.rows, matmul_row_bytes(w.type, w.cols), "a float matrix's bytes");
  return n <= 0 ? 0 : checked_round_up(n, 64, "a matrix's bytes in the arena");
}

}  // namespace

void Model::repack(const std::vector<WeightRef*>& items) {
  int64_t total_bytes = 0;
  for (const WeightRef* w : items) total_bytes = checked_add(total_bytes, arena_bytes(*w), "repacked weight bytes");
  const size_t total = to_size(total_bytes, "repacked weight bytes");
  if (total == 0) return;
  // On huge pages: fewer TLB misses in the prefetchers' way (docs/tuning.md has the
  // measurement). The file's own pages may be small ones (a file read back into the page cache
  // after it was evicted), so float matrices are copied here too.
  packed_arena_.reset(huge_page_alloc(total, false, "the repacked weights"));
  uint8_t* p = packed_arena_.get();
  for (WeightRef* w : items) {
    const int64_t n = arena_bytes(*w);
    if (n <= 0) continue;  // neither layout: stays as stored
    if (packed_bytes(w->type, w->rows, w->cols) > 0) {
      repack16(w->data, w->type, w->rows, w->cols, p);
      w->packed = p;
    } else {
      std::memcpy(p, w->data, static_cast<size_t>(w->rows * matmul_row_bytes(w->type, w->cols)));
      w->data = p;
    }
    p += n;
  }
  repacked_bytes_ = total;
}

Projected project(const std::vector<const WeightRef*>& parts, const float* xn, int64_t n_rows, float* buf,
                  Precision precision, int n_threads) {
  Projected p{};
  const size_t n = parts.size();
  MatmulPart mp[std::size(p.part)];
  // One job when every part fits the array, shares K and has a kernel of its own; the outputs
  // side by side, so their row stride (the total width) is set once it is known.
  bool one = n <= std::size(mp);
  int64_t width = 0;
  for (size_t i = 0; i < n && one; ++i) {
    mp[i] = weight_part(*parts[i], precision, nullptr, 0);
    one = parts[i]->cols == parts.front()->cols &&
          matmul_part_kernel(mp[i].w_type, mp[i].packed, precision) != MatmulKernel::none;
    width += parts[i]->rows;
  }
  float* at = buf;
  for (size_t i = 0; i < n; ++i) {
    p.part[i] = at;
    p.stride[i] = one ? width : parts[i]->rows;
    at += one ? parts[i]->rows : n_rows * parts[i]->rows;
    if (one) {
      mp[i].y = p.part[i];
      mp[i].ldy = width;
    }
  }
  if (one) {
    matmul_parts(xn, n_rows, parts.front()->cols, mp, static_cast<int>(n), precision, n_threads);
  } else {
    for (size_t i = 0; i < n; ++i) Model::matmul(*parts[i], xn, n_rows, p.part[i], precision, n_threads);
  }
  return p;
}

// ---- the registry ----------------------------------------------------------------------------

namespace {

std::map<std::string, ModelFactory>& registry() {
  static std::map<std::string, ModelFactory> r;  // filled by static initializers, read after
  return r;
}

}  // namespace

bool register_architecture(const std::string& name, ModelFactory factory) {
  registry()[name] = factory;
  return true;
}

std::shared_ptr<const Model> make_model(const std::string& arch, const Params& params, TensorMap& tensors,
                                        bool repack) {
  const auto it = registry().find(arch);
  if (it == registry().end()) throw std::invalid_argument("architecture '" + arch + "' is not supported");
  std::shared_ptr<const Model> model = it->second(params, tensors, repack);
  tensors.check_all_taken(arch);
  return model;
}

std::vector<std::string> architectures() {
  std::vector<std::string> out;
  for (const auto& [name, f] : registry()) out.push_back(name);
  return out;
}

// ---- attention over segments -----------------------------------------------------------------

// One segment (a prefill chunk or a single decode step) appends on this thread and spreads its
// (row, head) items over the pool; several (a batched decode step) make one pool job of a
// segment each, append and attention together, so the appends run in parallel and each is
// still in cache when read.
void append_and_attend(const std::vector<Segment>& segs, int64_t il, const float* k, const float* v, int64_t kv_stride,
                       const std::vector<AttentionArgs>& args, int n_threads) {
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

// ---- sequences and batches -------------------------------------------------------------------

Sequence::Sequence(std::shared_ptr<const Model> model, int64_t n_ctx, int64_t n_batch, KvType kv_type)
    : model_(std::move(model)),
      n_ctx_(n_ctx),
      n_batch_(n_batch),
      cache_(model_->dims().n_layer, model_->dims().n_head_kv, model_->dims().head_dim, n_ctx, kv_type),
      scratch_(model_->dims(), n_batch >= 1 ? n_batch : throw std::invalid_argument("n_batch must be >= 1")) {}

void Sequence::truncate(int64_t n) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this context is in use by another thread");
  if (n < 0) throw std::invalid_argument("cannot truncate to a negative length");
  if (n < n_past_) n_past_ = n;
  if (n_past_ == 0) cache_.clear();
}

void Sequence::eval(const int32_t* ids, int64_t n, float* logits, bool all_logits, Precision precision, int n_threads) {
  run(ids, n, logits, nullptr, all_logits, precision, n_threads);
}

void Sequence::embed(const int32_t* ids, int64_t n, float* hidden, bool all_rows, Precision precision, int n_threads) {
  run(ids, n, nullptr, hidden, all_rows, precision, n_threads);
}

void Sequence::run(const int32_t* ids, int64_t n, float* logits, float* hidden, bool all_rows, Precision precision,
                   int n_threads) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this context is in use by another thread");
  const int64_t n_vocab = model_->dims().n_vocab;
  if (n < 1 || n > n_batch_)
    throw std::invalid_argument("eval takes 1 to n_batch (" + std::to_string(n_batch_) + ") tokens, got " +
                                std::to_string(n));
  if (n_past_ + n > n_ctx_)
    throw std::invalid_argument("context full: " + std::to_string(n_past_) + " + " + std::to_string(n) +
                                " tokens exceed n_ctx " + std::to_string(n_ctx_));
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= n_vocab)
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " at index " + std::to_string(i) +
                                  " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    scratch_.ids[i] = ids[i];
    scratch_.pos[i] = n_past_ + i;
  }
  const int64_t first = all_rows ? 0 : n - 1;
  std::vector<int64_t> out_rows;  // [n - first]
  for (int64_t i = first; i < n; ++i) out_rows.push_back(i);
  model_->forward({Segment{&cache_, 0, n, n_past_}}, n, scratch_, out_rows.data(),
                  static_cast<int64_t>(out_rows.size()), logits, precision, n_threads, hidden);
  n_past_ += n;
}

void Sequence::copy_prefix(Sequence& src, int64_t n) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this context is in use by another thread");
  std::unique_lock<std::mutex> src_lock;
  if (&src != this) {
    src_lock = std::unique_lock<std::mutex>(src.busy_, std::try_to_lock);
    if (!src_lock.owns_lock()) throw std::runtime_error("the source context is in use by another thread");
  }
  if (src.model_.get() != model_.get()) throw std::invalid_argument("the source context belongs to another model");
  if (n < 0 || n > src.n_past_ || n > n_ctx_)
    throw std::invalid_argument("cannot copy " + std::to_string(n) + " positions: the source holds " +
                                std::to_string(src.n_past_) + ", this context has room for " + std::to_string(n_ctx_));
  cache_.copy_prefix(src.cache_, n);
  n_past_ = n;
}

Batch::Batch(std::shared_ptr<const Model> model, int64_t n_rows)
    : model_(std::move(model)),
      n_rows_(n_rows),
      scratch_(model_->dims(), n_rows >= 1 ? n_rows : throw std::invalid_argument("n_rows must be >= 1")) {}

void Batch::step(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* logits,
                 Precision precision, int n_threads, const int64_t* n_logits) {
  run(seqs, ids, counts, n, logits, nullptr, precision, n_threads, n_logits);
}

void Batch::embed(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* hidden,
                  Precision precision, int n_threads) {
  run(seqs, ids, counts, n, nullptr, hidden, precision, n_threads, nullptr);
}

// step (logits of each sequence's last token, or its last n_logits[b]) or embed (hidden states
// of every token).
void Batch::run(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* logits,
                float* hidden, Precision precision, int n_threads, const int64_t* n_logits) {
  std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
  if (!lock.owns_lock()) throw std::runtime_error("this batch is in use by another thread");
  if (n < 1 || n > n_rows_)
    throw std::invalid_argument("a step takes 1 to n_rows (" + std::to_string(n_rows_) + ") sequences, got " +
                                std::to_string(n));
  const int64_t n_vocab = model_->dims().n_vocab;
  int64_t rows = 0;
  for (int64_t b = 0; b < n; ++b) {
    const Sequence* seq = seqs[b];
    const std::string which = "context " + std::to_string(b);
    if (seq == nullptr) throw std::invalid_argument(which + " is None");
    if (seq->model_.get() != model_.get()) throw std::invalid_argument(which + " belongs to another model");
    for (int64_t j = 0; j < b; ++j)
      if (seqs[j] == seq)
        throw std::invalid_argument(which + " is also context " + std::to_string(j) +
                                    ": each sequence appears once per step");
    if (counts[b] < 1 || counts[b] > n_rows_ - rows)
      throw std::invalid_argument(which + " has " + std::to_string(counts[b]) + " tokens: each needs >= 1, and " +
                                  "the step holds n_rows = " + std::to_string(n_rows_) + " in all");
    if (n_logits != nullptr && (n_logits[b] < 1 || n_logits[b] > counts[b]))
      throw std::invalid_argument(which + " asks for the logits of " + std::to_string(n_logits[b]) +
                                  " tokens: 1 to its " + std::to_string(counts[b]));
    for (int64_t i = rows; i < rows + counts[b]; ++i)
      if (ids[i] < 0 || ids[i] >= n_vocab)
        throw std::invalid_argument("token id " + std::to_string(ids[i]) + " for " + which +
                                    " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    rows += counts[b];
  }
  std::vector<std::unique_lock<std::mutex>> locks;
  locks.reserve(static_cast<size_t>(n));
  std::vector<Segment> segs;
  std::vector<int64_t> out_rows;
  int64_t row = 0;
  for (int64_t b = 0; b < n; ++b) {
    Sequence& seq = *seqs[b];
    locks.emplace_back(seq.busy_, std::try_to_lock);
    if (!locks.back().owns_lock())
      throw std::runtime_error("context " + std::to_string(b) + " is in use by another thread");
    if (seq.n_past_ + counts[b] > seq.n_ctx_)
      throw std::invalid_argument("context " + std::to_string(b) + " is full: " + std::to_string(seq.n_past_) + " + " +
                                  std::to_string(counts[b]) + " tokens exceed n_ctx " + std::to_string(seq.n_ctx_));
    for (int64_t i = 0; i < counts[b]; ++i) {
      scratch_.ids[row + i] = ids[row + i];
      scratch_.pos[row + i] = seq.n_past_ + i;
    }
    segs.push_back(Segment{&seq.cache_, row, counts[b], seq.n_past_});
    if (hidden != nullptr)
      for (int64_t i = row; i < row + counts[b]; ++i) out_rows.push_back(i);
    row += counts[b];
    if (hidden == nullptr)
      for (int64_t i = row - (n_logits != nullptr ? n_logits[b] : 1); i < row; ++i) out_rows.push_back(i);
  }
  model_->forward(segs, rows, scratch_, out_rows.data(), static_cast<int64_t>(out_rows.size()), logits, precision,
                  n_threads, hidden);
  for (int64_t b = 0; b < n; ++b) seqs[b]->n_past_ += counts[b];
}

}  // namespace pyinfer
