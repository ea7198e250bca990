// llama.cpp: the llama family's forward pass (embedding, per layer RMSNorm, Q/K/V, RoPE, KV
// append, grouped-query attention, output projection, residual, RMSNorm, SwiGLU FFN; final norm,
// output head), one call per prefill chunk or decode step, with the variations its members add,
// each set by a model parameter: Q/K/V biases (qwen2), RMSNorm of each query and key head
// (qwen3), NeoX RoPE (qwen2, qwen3, phi3), RoPE on the first n_rot dims of a head (phi3), a
// sliding window on every layer (Mistral-style files), and Q/K/V or gate/up fused into one
// matrix in the file (phi3's attn_qkv and its 2 * n_ff-row ffn_up). Registered as llama, qwen2,
// qwen3 and phi3; the Python descriptions (pyinfer.arch) decide which file sets what.
#include <cmath>
#include <stdexcept>
#include <string>

#include "models/model.h"
#include "ops/ops.h"

namespace pyinfer {

namespace {

struct LlamaLayer {
  const float* attn_norm = nullptr;  // [n_embd]
  WeightRef wq;                      // [n_head * head_dim][n_embd]
  WeightRef wk;                      // [n_head_kv * head_dim][n_embd]
  WeightRef wv;                      // [n_head_kv * head_dim][n_embd]
  WeightRef wo;                      // [n_embd][n_head * head_dim]
  const float* bq = nullptr;         // [q_dim], [kv_dim], [kv_dim]: biases added to Q, K, V
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;    // [head_dim], applied to every query head before RoPE
  const float* k_norm = nullptr;    // [head_dim], to every key head
  const float* ffn_norm = nullptr;  // [n_embd]
  WeightRef gate;                   // [n_ff][n_embd]
  WeightRef up;                     // [n_ff][n_embd]
  WeightRef down;                   // [n_embd][n_ff]
  // [wq; wk; wv] as one matrix of q_dim + 2 * kv_dim rows and [gate; up] of 2 * n_ff rows,
  // where the file stores them fused (the parts above are then empty).
  WeightRef qkv;
  WeightRef gate_up;
};

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelDims& dims, const Params& p, TensorMap& t, bool repack_weights) : Model(dims) {
    const ModelDims& c = dims;
    rms_eps_ = static_cast<float>(p.get("rms_eps"));
    rope_.base = static_cast<float>(p.get("rope_base"));
    rope_.freq_scale = static_cast<float>(p.get("rope_freq_scale", 1.0));
    if (!(rope_.base > 0) || !(rope_.freq_scale > 0) || !(rms_eps_ >= 0))
      throw std::invalid_argument("rope_base and rope_freq_scale must be > 0, rms_eps >= 0");
    n_rot_ = p.has("n_rot") ? p.get_int("n_rot") : 0;
    if (n_rot_ == 0) n_rot_ = c.head_dim;
    if (n_rot_ < 2 || n_rot_ > c.head_dim || n_rot_ % 2 != 0)
      throw std::invalid_argument("n_rot (" + std::to_string(n_rot_) +
                                  ") must be even and in [2, head_dim = " + std::to_string(c.head_dim) + "]");
    neox_ = flag(p, "rope_neox");
    window_ = p.has("sliding_window") ? p.get_int("sliding_window") : 0;
    const bool qkv_bias = flag(p, "qkv_bias"), qk_norm = flag(p, "qk_norm"), ffn_fused = flag(p, "ffn_fused");
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    tok_embd_ = take_embedding(t, c);
    const WeightRef factors = t.take("rope_freqs.weight");
    if (factors.data != nullptr) {
      rope_.factors = check_vector(factors, "rope_freqs.weight", n_rot_ / 2);
      for (int64_t i = 0; i < n_rot_ / 2; ++i)
        if (!(rope_.factors[i] > 0) || !std::isfinite(rope_.factors[i]))
          throw std::invalid_argument("rope_freqs.weight: factor " + std::to_string(i) + " is not a positive number");
    }
    for (int64_t il = 0; il < c.n_layer; ++il) {
      LlamaLayer L;
      const LayerTensors lt{t, il};
      L.attn_norm = lt.vec("attn_norm.weight", c.n_embd);
      if (t.has(tensor_name(il, "attn_qkv.weight"))) {
        L.qkv = lt.weight("attn_qkv.weight", q_dim + 2 * kv_dim, c.n_embd);
      } else {
        L.wq = lt.weight("attn_q.weight", q_dim, c.n_embd);
        L.wk = lt.weight("attn_k.weight", kv_dim, c.n_embd);
        L.wv = lt.weight("attn_v.weight", kv_dim, c.n_embd);
      }
      if (qkv_bias) {
        L.bq = lt.vec("attn_q.bias", q_dim);
        L.bk = lt.vec("attn_k.bias", kv_dim);
        L.bv = lt.vec("attn_v.bias", kv_dim);
      }
      if (qk_norm) {
        L.q_norm = lt.vec("attn_q_norm.weight", c.head_dim);
        L.k_norm = lt.vec("attn_k_norm.weight", c.head_dim);
      }
      L.wo = lt.weight("attn_output.weight", c.n_embd, q_dim);
      L.ffn_norm = lt.vec("ffn_norm.weight", c.n_embd);
      if (ffn_fused) {
        L.gate_up = lt.weight("ffn_up.weight", 2 * c.n_ff, c.n_embd);
      } else {
        L.gate = lt.weight("ffn_gate.weight", c.n_ff, c.n_embd);
        L.up = lt.weight("ffn_up.weight", c.n_ff, c.n_embd);
      }
      L.down = lt.weight("ffn_down.weight", c.n_embd, c.n_ff);
      layers_.push_back(L);
    }
    output_norm_ = check_vector(t.take("output_norm.weight"), "output_norm.weight", c.n_embd);
    output_ = take_output(t, c, tok_embd_);
    if (repack_weights) repack_all();
  }

  void forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows, int64_t n_out,
               float* logits, Precision precision, int n_threads, float* hidden) const override;

 private:
  static bool flag(const Params& p, const char* name) { return p.get(name, 0.0) != 0; }

  // Each layer's matrices in the order a forward pass reads them (a file's fused matrix as
  // one), then the output head.
  void repack_all() {
    std::vector<WeightRef*> items;
    for (LlamaLayer& L : layers_) {
      if (L.qkv.data != nullptr)
        items.push_back(&L.qkv);
      else
        for (WeightRef* w : {&L.wq, &L.wk, &L.wv}) items.push_back(w);
      items.push_back(&L.wo);
      if (L.gate_up.data != nullptr)
        items.push_back(&L.gate_up);
      else
        for (WeightRef* w : {&L.gate, &L.up}) items.push_back(w);
      items.push_back(&L.down);
    }
    items.push_back(&output_);
    repack(items);
  }

  // The parts of a fused group of the file: one matmul, each row's parts side by side.
  static Projected project_stored(const WeightRef& fused, const int64_t* widths, size_t n_parts, const float* xn,
                                  int64_t n_rows, float* buf, Precision precision, int n_threads) {
    Projected p{};
    int64_t at = 0;
    for (size_t i = 0; i < n_parts; ++i) {
      p.part[i] = buf + at;
      p.stride[i] = fused.rows;
      at += widths[i];
    }
    matmul(fused, xn, n_rows, buf, precision, n_threads);
    return p;
  }

  // RoPE on the first n_rot_ dims of each of n_heads heads of every row of x[n][stride].
  void rope_heads(float* x, int64_t n, int64_t stride, int64_t n_heads, const float* cos_sin) const {
    const int64_t hd = dims().head_dim;
    if (n_rot_ == hd) {
      rope_rows(x, n, stride, n_heads, hd, cos_sin, neox_);
    } else {
      for (int64_t h = 0; h < n_heads; ++h) rope_rows(x + h * hd, n, stride, 1, n_rot_, cos_sin, neox_);
    }
  }

  float rms_eps_ = 1e-5f;
  RopeFreqs rope_;
  int64_t n_rot_ = 0;   // rotated dims at the start of each head (head_dim: all)
  bool neox_ = false;   // RoPE pairs (i, i + n_rot / 2) instead of (2i, 2i + 1)
  int64_t window_ = 0;  // each query sees the last window_ positions (0: all)
  WeightRef tok_embd_;  // [n_vocab][n_embd]
  std::vector<LlamaLayer> layers_;
  const float* output_norm_ = nullptr;  // [n_embd]
  WeightRef output_;                    // [n_vocab][n_embd]; the embedding table when tied
};

// In place: bias[width] added to the part of each row of x[n_rows][stride].
void add_bias(float* x, int64_t n_rows, int64_t stride, const float* bias, int64_t width) {
  for (int64_t r = 0; r < n_rows; ++r) add_vec(x + r * stride, bias, x + r * stride, width);
}

// In place: RMSNorm of each of n_heads heads of head_dim in each row of x[n_rows][stride].
void norm_heads(float* x, int64_t n_rows, int64_t stride, int64_t n_heads, int64_t head_dim, const float* w,
                float eps) {
  for (int64_t r = 0; r < n_rows; ++r) rms_norm_rows(x + r * stride, w, x + r * stride, n_heads, head_dim, eps);
}

void LlamaModel::forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows,
                         int64_t n_out, float* logits, Precision precision, int n_threads, float* hidden) const {
  const ModelDims& c = dims();
  const int64_t E = c.n_embd, hd = c.head_dim, F = c.n_ff, nr = n_rot_;
  const int64_t q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const int64_t qkv_widths[3] = {q_dim, kv_dim, kv_dim}, gu_widths[2] = {F, F};
  const float eps = rms_eps_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* x = s.x.data();        // [n_rows][E] the residual stream
  float* xn = s.xn.data();      // [n_rows][E] normed input of a block, then its output
  float* attn = s.attn.data();  // [n_rows][q_dim]
  float* act = s.act.data();    // [n_rows][F]
  std::vector<AttentionArgs> args(segs.size());

  embedding(tok_embd_.data, tok_embd_.type, c.n_vocab, E, s.ids.data(), n_rows, x);
  // RoPE's cos and sin for each row's position, once for every layer.
  float* cos_sin = s.rope.data();  // [n_rows][n_rot]
  for_rows(n_threads, n_rows,
           [&](int64_t r0, int64_t n) { rope_table(s.pos.data() + r0, n, nr, rope_, cos_sin + r0 * nr); });
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LlamaLayer& L = layers_[static_cast<size_t>(il)];
    // Attention block. Q, K, V rows: side by side in one [n_rows][q_dim + 2 * kv_dim] output
    // when fused, else three blocks [n_rows][q_dim], [n_rows][kv_dim], [n_rows][kv_dim].
    if (il == 0)
      for_rows(n_threads, n_rows,
               [&](int64_t r0, int64_t n) { rms_norm_rows(x + r0 * E, L.attn_norm, xn + r0 * E, n, E, eps); });
    const Projected qkv = L.qkv.data != nullptr
                              ? project_stored(L.qkv, qkv_widths, 3, xn, n_rows, s.qkv.data(), precision, n_threads)
                              : project({&L.wq, &L.wk, &L.wv}, xn, n_rows, s.qkv.data(), precision, n_threads);
    float *q = qkv.part[0], *k = qkv.part[1], *v = qkv.part[2];
    const int64_t qs = qkv.stride[0], ks = qkv.stride[1], vs = qkv.stride[2];
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      if (L.bq != nullptr) {
        add_bias(q + r0 * qs, n, qs, L.bq, q_dim);
        add_bias(k + r0 * ks, n, ks, L.bk, kv_dim);
        add_bias(v + r0 * vs, n, vs, L.bv, kv_dim);
      }
      if (L.q_norm != nullptr) {
        norm_heads(q + r0 * qs, n, qs, c.n_head, hd, L.q_norm, eps);
        norm_heads(k + r0 * ks, n, ks, c.n_head_kv, hd, L.k_norm, eps);
      }
      rope_heads(q + r0 * qs, n, qs, c.n_head, cos_sin + r0 * nr);
      rope_heads(k + r0 * ks, n, ks, c.n_head_kv, cos_sin + r0 * nr);
    });
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& g = segs[i];
      args[i] = AttentionArgs{q + g.row0 * qs, qs,     attn + g.row0 * q_dim, q_dim, g.cache, il, g.pos, g.n, c.n_head,
                              scale,           window_};
    }
    append_and_attend(segs, il, k, v, ks, args, n_threads);
    matmul(L.wo, attn, n_rows, xn, precision, n_threads);
    // Residual, then the feed-forward block's norm, row by row.
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      add_vec(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      rms_norm_rows(x + r0 * E, L.ffn_norm, xn + r0 * E, n, E, eps);
    });
    // Gate and up: side by side per row ([n_rows][gate F | up F]) when fused, else two blocks
    // [n_rows][F]; silu(gate) * up goes to act [n_rows][F].
    const Projected gu = L.gate_up.data != nullptr
                             ? project_stored(L.gate_up, gu_widths, 2, xn, n_rows, s.ffn.data(), precision, n_threads)
                             : project({&L.gate, &L.up}, xn, n_rows, s.ffn.data(), precision, n_threads);
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      for (int64_t r = r0; r < r0 + n; ++r)
        swiglu_vec(gu.part[0] + r * gu.stride[0], gu.part[1] + r * gu.stride[1], act + r * F, F);
    });
    matmul(L.down, act, n_rows, xn, precision, n_threads);
    // Residual, then the next layer's attention norm, row by row.
    const float* next_norm = il + 1 < c.n_layer ? layers_[static_cast<size_t>(il + 1)].attn_norm : nullptr;
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      add_vec(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      if (next_norm != nullptr) rms_norm_rows(x + r0 * E, next_norm, xn + r0 * E, n, E, eps);
    });
  }
  // Output head, only for the rows whose logits are wanted.
  output_head(x, out_rows, n_out, output_norm_, eps, output_, xn, logits, hidden, precision, n_threads);
}

std::shared_ptr<const Model> make_llama(const Params& p, TensorMap& t, bool repack) {
  return std::make_shared<LlamaModel>(ModelDims::from(p), p, t, repack);
}

// One forward pass for the family: the parameters say which of its variations a file uses.
const bool registered = register_architecture("llama", &make_llama) && register_architecture("qwen2", &make_llama) &&
                        register_architecture("qwen3", &make_llama) && register_architecture("phi3", &make_llama);

}  // namespace

}  // namespace pyinfer
