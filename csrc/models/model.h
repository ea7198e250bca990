// model.h: what every architecture's forward pass shares: weight references, the tensor map and
// parameters a model is built from, the repacked-weight arena, per-row scratch, sequences (a KV
// cache and a position each) and batches. One file per architecture (llama.cpp, ...) holds its
// config, tensor roles and forward pass, and registers itself by name.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/attention.h"
#include "ops/kv_cache.h"
#include "ops/matmul.h"
#include "runtime/threadpool.h"

namespace pyinfer {

// A weight matrix W[rows][cols] as stored in the GGUF file: `rows` rows of `cols` elements,
// each row matmul_row_bytes(type, cols) bytes. y = x @ W^T maps cols -> rows.
struct WeightRef {
  const void* data = nullptr;
  uint32_t type = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* packed = nullptr;  // the same matrix in the 16-row interleaved layout, if made
};

// The tensors a model is built from, by GGUF name. An architecture takes the ones it reads;
// any tensor left over is refused, so no tensor of a file is silently ignored.
class TensorMap {
 public:
  void add(const std::string& name, const WeightRef& w) { tensors_[name] = w; }
  // The tensor, or an empty reference (data == nullptr) if the map has none of that name.
  WeightRef take(const std::string& name);
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // std::invalid_argument naming the first tensor no take() asked for.
  void check_all_taken(const std::string& arch) const;

 private:
  std::map<std::string, WeightRef> tensors_;
  std::map<std::string, bool> taken_;
};

// Hyperparameters by name, as numbers (the Python description of the architecture turns the
// GGUF metadata into these).
class Params {
 public:
  void set(const std::string& name, double v) { values_[name] = v; }
  double get(const std::string& name) const;  // std::invalid_argument if absent
  double get(const std::string& name, double fallback) const;
  int64_t get_int(const std::string& name) const;
  bool has(const std::string& name) const { return values_.count(name) != 0; }

 private:
  std::map<std::string, double> values_;
};

// What code outside an architecture's file needs of its shape: scratch sizes, the KV cache.
struct ModelDims {
  int64_t n_layer = 0;
  int64_t n_embd = 0;     // model width
  int64_t n_head = 0;     // query heads
  int64_t n_head_kv = 0;  // key/value heads (grouped-query attention when < n_head)
  int64_t head_dim = 0;
  int64_t n_ff = 0;  // feed-forward width
  int64_t n_vocab = 0;
  void check() const;  // positive, n_head a multiple of n_head_kv, head_dim even and small enough
  // From the parameters of the same names, checked.
  static ModelDims from(const Params& p);
};

// `n` consecutive rows of a forward pass that belong to one sequence, at positions pos.. of
// its cache.
struct Segment {
  KVCache* cache;
  int64_t row0, n, pos;
};

// Per-row scratch of a forward pass over up to n_rows token rows.
struct Scratch {
  Scratch(const ModelDims& d, int64_t n_rows);
  int64_t n_rows;
  std::vector<float> x, xn;       // [n_rows][n_embd]: the residual stream; a block's normed input or output
  std::vector<float> qkv;         // [n_rows][q_dim + 2 * kv_dim]: Q, K, V side by side
  std::vector<float> attn;        // [n_rows][q_dim]
  std::vector<float> ffn;         // [n_rows][2 * n_ff]: gate and up
  std::vector<float> act;         // [n_rows][n_ff]: the feed-forward activation
  std::vector<float> rope;        // [n_rows][head_dim]: cos, sin of RoPE's angles (rope_table)
  std::vector<int64_t> pos, ids;  // [n_rows]
};

// The weights of one model, shared by any number of sequences.
class Model {
 public:
  virtual ~Model() = default;
  const ModelDims& dims() const { return dims_; }
  size_t repacked_bytes() const { return repacked_bytes_; }

  // The forward pass over n_rows token rows (s.ids, s.pos set), cut into segments of one
  // sequence each, which it appends to their caches. logits[n_out][n_vocab] receives the
  // rows out_rows[] (none when logits is nullptr); hidden[n_out][n_embd], when given, their
  // final hidden states (after the output norm: what the output head reads, embeddings).
  virtual void forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows,
                       int64_t n_out, float* logits, Precision precision, int n_threads,
                       float* hidden = nullptr) const = 0;

  // y[M][w.rows] = x[M][w.cols] @ W^T; fast mode goes through the repacked copy if there is one.
  static void matmul(const WeightRef& w, const float* x, int64_t M, float* y, Precision precision, int n_threads);

 protected:
  // The output head for the rows out_rows[] of the residual stream x [n_rows][n_embd]: each
  // normed with norm into xn [n_out][n_embd], copied to hidden when given, then projected
  // by output into logits [n_out][n_vocab] when given.
  void output_head(const float* x, const int64_t* out_rows, int64_t n_out, const float* norm, float eps,
                   const WeightRef& output, float* xn, float* logits, float* hidden, Precision precision,
                   int n_threads) const;

 protected:
  explicit Model(const ModelDims& dims) : dims_(dims) {}

  // Repacks every matrix whose type has the 16-row interleaved layout into one arena, in the
  // order given (the order a forward pass reads them: a decode step streams it front to
  // back), setting `packed`.
  void repack(const std::vector<WeightRef*>& items);
  // repack() for layers with the llama family's matrices (members wq, wk, wv, wo, gate, up,
  // down), each layer's in the order a forward pass reads them, then the output head.
  template <class Layer>
  void repack_layers(std::vector<Layer>& layers, WeightRef& output) {
    std::vector<WeightRef*> items;
    for (Layer& L : layers)
      for (WeightRef* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) items.push_back(w);
    items.push_back(&output);
    repack(items);
  }

 private:
  ModelDims dims_;
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> packed_arena_;
  size_t repacked_bytes_ = 0;
};

// Builds an architecture's model; with repack, the quantized matrices that have a 16-row
// interleaved layout are repacked once into an arena the model owns. Throws
// std::invalid_argument naming a missing, misshapen or unused tensor.
using ModelFactory = std::shared_ptr<const Model> (*)(const Params& params, TensorMap& tensors, bool repack);
// Called once per architecture from a static initializer in its file.
bool register_architecture(const std::string& name, ModelFactory factory);
std::shared_ptr<const Model> make_model(const std::string& arch, const Params& params, TensorMap& tensors, bool repack);
std::vector<std::string> architectures();

// One sequence: its KV cache, its position, and scratch for up to n_batch tokens per call.
class Sequence {
 public:
  Sequence(std::shared_ptr<const Model> model, int64_t n_ctx, int64_t n_batch, KvType kv_type);

  // Runs n tokens (1 <= n <= n_batch) at positions n_past..n_past+n-1, appending them to the
  // cache. logits receives [n][n_vocab] floats when all_logits, else the last token's
  // [n_vocab]. Throws std::invalid_argument (bad id, no room) before changing any state,
  // and std::runtime_error if another thread is using this sequence.
  void eval(const int32_t* ids, int64_t n, float* logits, bool all_logits, Precision precision, int n_threads);
  // As eval, writing the final hidden states (after the output norm) of every token (all_rows)
  // or of the last to hidden [rows][n_embd] instead of logits.
  void embed(const int32_t* ids, int64_t n, float* hidden, bool all_rows, Precision precision, int n_threads);

  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_batch() const { return n_batch_; }
  int64_t n_vocab() const { return model_->dims().n_vocab; }
  // Forget positions >= n (0 clears the sequence).
  void truncate(int64_t n);
  // Hold the first n positions of src (a sequence of the same model and KV type, with
  // n <= src.n_past() and n <= n_ctx()) and nothing after them, as if they had been evaluated
  // here: bit for bit the same cache. src may be this sequence (a truncation).
  void copy_prefix(Sequence& src, int64_t n);
  const KVCache& cache() const { return cache_; }
  const std::shared_ptr<const Model>& model() const { return model_; }

 private:
  friend class Batch;
  void run(const int32_t* ids, int64_t n, float* logits, float* hidden, bool all_rows, Precision precision,
           int n_threads);
  std::shared_ptr<const Model> model_;
  int64_t n_ctx_, n_batch_;
  KVCache cache_;
  int64_t n_past_ = 0;
  std::mutex busy_;
  Scratch scratch_;  // n_batch rows
};

// Many sequences (of one model, each at its own position) in one forward pass, so every weight
// is read once per step for all of them; attention stays per sequence. A step gives each
// sequence any number of tokens: one for those decoding, a chunk of the prompt for those
// prefilling.
class Batch {
 public:
  // n_rows: the most token rows one step holds (all sequences together).
  Batch(std::shared_ptr<const Model> model, int64_t n_rows);

  // Appends counts[b] >= 1 tokens to seqs[b] (b < n; the sequences' tokens back to back in
  // ids, sum(counts) <= n_rows; sequences distinct and of this model) and writes the
  // next-token logits after each one's last token to logits[b][n_vocab]. Throws
  // std::invalid_argument (bad id or count, no room, repeated or foreign sequence) before
  // changing any state, and std::runtime_error if a sequence is in use by another thread.
  // Each sequence's result is that of seqs[b]->eval(its tokens) alone, bit for bit in fast
  // mode; exact mode may differ in float rounding (its kernels block over rows).
  // n_logits (optional): per sequence, the logits of its last n_logits[b] tokens
  // (1 <= n_logits[b] <= counts[b]), rows back to back in logits[sum(n_logits)][n_vocab]:
  // a sequence verifying guessed tokens needs the row after each.
  void step(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* logits,
            Precision precision, int n_threads, const int64_t* n_logits = nullptr);
  // As step, writing instead the final hidden states (after the output norm) of every token
  // of every sequence, in the order of ids, to hidden[sum(counts)][n_embd]: many texts'
  // embeddings in one forward pass, each row what seqs[b]->embed gives for it alone.
  void embed(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* hidden,
             Precision precision, int n_threads);

  int64_t n_rows() const { return n_rows_; }

 private:
  void run(Sequence* const* seqs, const int32_t* ids, const int64_t* counts, int64_t n, float* logits, float* hidden,
           Precision precision, int n_threads, const int64_t* n_logits);
  std::shared_ptr<const Model> model_;
  int64_t n_rows_;
  std::mutex busy_;
  Scratch scratch_;
};

// ---- helpers for the architectures' forward passes

// Appends each segment's new keys and values (k, v: rows of stride kv_stride) to its cache at
// layer il, then runs its rows' attention (args[i] for segs[i]).
void append_and_attend(const std::vector<Segment>& segs, int64_t il, const float* k, const float* v, int64_t kv_stride,
                       const std::vector<AttentionArgs>& args, int n_threads);

// Row-wise work of a forward pass (norms, RoPE, residual adds, activations: each row
// independent of the others) on the pool, in items of 8 to 32 rows, two per thread where the
// rows allow (a batched decode step's 16 rows make two items; a prefill's, items of 32); a
// single decode step's row runs inline.
template <class F>
void for_rows(int n_threads, int64_t n_rows, const F& f) {
  int64_t grain = n_rows / (2 * static_cast<int64_t>(n_threads < 1 ? 1 : n_threads));
  grain = grain < 8 ? 8 : grain > 32 ? 32 : grain;
  parallel_for(n_threads, n_rows, grain, [&](int64_t r0, int64_t r1, int) { f(r0, r1 - r0); });
}

// Where a projection's outputs are in its buffer: Q, K, V (or gate and up) rows, each with its
// row stride.
struct Projected {
  float* part[3];
  int64_t stride[3];
};
// y = xn @ W^T for each of parts (2 or 3 matrices of n_embd columns): where every part has a
// kernel (matmul_part_kernel: all but packed weights in exact mode, which a model does not
// use), one job over all of them, whatever their types (each row's parts side by side in
// buf); else one matmul per part (one block of n_rows rows after another in buf).
Projected project(const std::vector<const WeightRef*>& parts, const float* xn, int64_t n_rows, float* buf,
                  Precision precision, int n_threads);

// Takes one layer's tensors ("blk.<layer>.<name>") from a map and checks them.
struct LayerTensors {
  TensorMap& map;
  int64_t layer;
  WeightRef weight(const char* name, int64_t rows, int64_t cols) const;  // as check_weight
  const float* vec(const char* name, int64_t n) const;                   // as check_vector
};
// token_embd.weight, [n_vocab][n_embd] of a type with a dequantization kernel.
WeightRef take_embedding(TensorMap& t, const ModelDims& d);
// output.weight, or the embedding table when the file has none (tied), checked as a matrix.
WeightRef take_output(TensorMap& t, const ModelDims& d, const WeightRef& tok_embd);

// "blk.<layer>.<name>", or name alone for layer < 0.
std::string tensor_name(int64_t layer, const char* name);
// std::invalid_argument unless w is present, of shape [rows][cols], with a matmul kernel.
void check_weight(const WeightRef& w, const std::string& name, int64_t rows, int64_t cols);
// A float32 vector of n values (a norm's weight, RoPE's factors), or std::invalid_argument.
const float* check_vector(const WeightRef& w, const std::string& name, int64_t n);

}  // namespace pyinfer
