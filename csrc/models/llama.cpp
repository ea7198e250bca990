// llama.cpp: the llama architecture (embedding, per layer RMSNorm, Q/K/V, RoPE, KV append,
// grouped-query attention, output projection, residual, RMSNorm, SwiGLU FFN; final norm, output
// head): its config, the tensors it reads, and its forward pass, one call per prefill chunk or
// decode step.
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

class LlamaModel final : public Model {
 public:
  LlamaModel(const ModelDims& dims, const Params& p, TensorMap& t, bool repack_weights) : Model(dims) {
    const ModelDims& c = dims;
    rms_eps_ = static_cast<float>(p.get("rms_eps"));
    rope_.base = static_cast<float>(p.get("rope_base"));
    rope_.freq_scale = static_cast<float>(p.get("rope_freq_scale", 1.0));
    if (!(rope_.base > 0) || !(rope_.freq_scale > 0) || !(rms_eps_ >= 0))
      throw std::invalid_argument("rope_base and rope_freq_scale must be > 0, rms_eps >= 0");
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    tok_embd_ = take_embedding(t, c);
    const WeightRef factors = t.take("rope_freqs.weight");
    if (factors.data != nullptr) {
      rope_.factors = check_vector(factors, "rope_freqs.weight", c.head_dim / 2);
      for (int64_t i = 0; i < c.head_dim / 2; ++i)
        if (!(rope_.factors[i] > 0) || !std::isfinite(rope_.factors[i]))
          throw std::invalid_argument("rope_freqs.weight: factor " + std::to_string(i) + " is not a positive number");
    }
    for (int64_t il = 0; il < c.n_layer; ++il) {
      LlamaLayer L;
      const LayerTensors lt{t, il};
      L.attn_norm = lt.vec("attn_norm.weight", c.n_embd);
      L.wq = lt.weight("attn_q.weight", q_dim, c.n_embd);
      L.wk = lt.weight("attn_k.weight", kv_dim, c.n_embd);
      L.wv = lt.weight("attn_v.weight", kv_dim, c.n_embd);
      L.wo = lt.weight("attn_output.weight", c.n_embd, q_dim);
      L.ffn_norm = lt.vec("ffn_norm.weight", c.n_embd);
      L.gate = lt.weight("ffn_gate.weight", c.n_ff, c.n_embd);
      L.up = lt.weight("ffn_up.weight", c.n_ff, c.n_embd);
      L.down = lt.weight("ffn_down.weight", c.n_embd, c.n_ff);
      layers_.push_back(L);
    }
    output_norm_ = check_vector(t.take("output_norm.weight"), "output_norm.weight", c.n_embd);
    output_ = take_output(t, c, tok_embd_);
    if (repack_weights) repack_layers(layers_, output_);
  }

  void forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows, int64_t n_out,
               float* logits, Precision precision, int n_threads, float* hidden) const override;

 private:
  float rms_eps_ = 1e-5f;
  RopeFreqs rope_;
  WeightRef tok_embd_;  // [n_vocab][n_embd]
  std::vector<LlamaLayer> layers_;
  const float* output_norm_ = nullptr;  // [n_embd]
  WeightRef output_;                    // [n_vocab][n_embd]; the embedding table when tied
};

void LlamaModel::forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows,
                         int64_t n_out, float* logits, Precision precision, int n_threads, float* hidden) const {
  const ModelDims& c = dims();
  const int64_t E = c.n_embd, hd = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * hd, kv_dim = c.n_head_kv * hd;
  const float eps = rms_eps_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* x = s.x.data();        // [n_rows][E] the residual stream
  float* xn = s.xn.data();      // [n_rows][E] normed input of a block, then its output
  float* attn = s.attn.data();  // [n_rows][q_dim]
  float* ffn = s.ffn.data();    // [n_rows][2 * F]
  float* act = s.act.data();    // [n_rows][F]
  std::vector<AttentionArgs> args(segs.size());

  embedding(tok_embd_.data, tok_embd_.type, c.n_vocab, E, s.ids.data(), n_rows, x);
  // RoPE's cos and sin for each row's position, once for every layer.
  float* cos_sin = s.rope.data();  // [n_rows][hd]
  for_rows(n_threads, n_rows,
           [&](int64_t r0, int64_t n) { rope_table(s.pos.data() + r0, n, hd, rope_, cos_sin + r0 * hd); });
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LlamaLayer& L = layers_[static_cast<size_t>(il)];
    // Attention block. Q, K, V rows: side by side in one [n_rows][q_dim + 2 * kv_dim] output
    // when fused, else three blocks [n_rows][q_dim], [n_rows][kv_dim], [n_rows][kv_dim].
    if (il == 0)
      for_rows(n_threads, n_rows,
               [&](int64_t r0, int64_t n) { rms_norm_rows(x + r0 * E, L.attn_norm, xn + r0 * E, n, E, eps); });
    float *q, *k, *v;
    int64_t qs, ks;
    if (precision == Precision::fast && L.qkv.packed != nullptr) {
      q = s.qkv.data(), k = q + q_dim, v = k + kv_dim;
      qs = ks = q_dim + 2 * kv_dim;
      matmul(L.qkv, xn, n_rows, q, precision, n_threads);
    } else {
      q = s.qkv.data(), k = q + n_rows * q_dim, v = k + n_rows * kv_dim;
      qs = q_dim, ks = kv_dim;
      matmul(L.wq, xn, n_rows, q, precision, n_threads);
      matmul(L.wk, xn, n_rows, k, precision, n_threads);
      matmul(L.wv, xn, n_rows, v, precision, n_threads);
    }
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      rope_rows(q + r0 * qs, n, qs, c.n_head, hd, cos_sin + r0 * hd, false);
      rope_rows(k + r0 * ks, n, ks, c.n_head_kv, hd, cos_sin + r0 * hd, false);
    });
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& g = segs[i];
      args[i] =
          AttentionArgs{q + g.row0 * qs, qs, attn + g.row0 * q_dim, q_dim, g.cache, il, g.pos, g.n, c.n_head, scale, 0};
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
    const bool fused = precision == Precision::fast && L.gate_up.packed != nullptr;
    const int64_t gs = fused ? 2 * F : F;
    float* up = fused ? ffn + F : ffn + n_rows * F;
    if (fused) {
      matmul(L.gate_up, xn, n_rows, ffn, precision, n_threads);
    } else {
      matmul(L.gate, xn, n_rows, ffn, precision, n_threads);
      matmul(L.up, xn, n_rows, up, precision, n_threads);
    }
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      for (int64_t r = r0; r < r0 + n; ++r) swiglu_vec(ffn + r * gs, up + r * gs, act + r * F, F);
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

const bool registered = register_architecture("llama", &make_llama);

}  // namespace

}  // namespace pyinfer
