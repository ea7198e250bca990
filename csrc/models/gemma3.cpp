// gemma3.cpp: the gemma3 architecture (Gemma 3's text models): embeddings times sqrt(width); per
// layer RMSNorm, Q/K/V, RMSNorm of each query and key head, NeoX RoPE (local layers with their own
// base), KV append, attention (a sliding window on local layers), output projection, RMSNorm of
// the block's output, residual; the same norms around a GeGLU feed-forward; final norm, tied
// output head, optional logit soft-cap. The norms' weights are used as the file stores them
// (llama.cpp's converter writes Gemma's 1 + w).
#include <cmath>
#include <stdexcept>
#include <string>

#include "models/model.h"
#include "ops/ops.h"

namespace pyinfer {

namespace {

struct Gemma3Layer {
  bool local = false;                // sliding-window attention with the local RoPE base
  const float* attn_norm = nullptr;  // [n_embd]
  WeightRef wq, wk, wv, wo;          // [q_dim][n_embd], [kv_dim][n_embd] twice, [n_embd][q_dim]
  const float* q_norm = nullptr;     // [head_dim], applied to every query head
  const float* k_norm = nullptr;     // [head_dim], to every key head
  const float* post_attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  WeightRef gate, up, down;  // [n_ff][n_embd] twice, [n_embd][n_ff]
  const float* post_ffn_norm = nullptr;
};

class Gemma3Model final : public Model {
 public:
  Gemma3Model(const ModelDims& dims, const Params& p, TensorMap& t, bool repack_weights) : Model(dims) {
    const ModelDims& c = dims;
    rms_eps_ = static_cast<float>(p.get("rms_eps"));
    global_.base = static_cast<float>(p.get("rope_base"));
    global_.freq_scale = static_cast<float>(p.get("rope_freq_scale", 1.0));
    local_.base = static_cast<float>(p.get("rope_base_local"));
    window_ = p.get_int("sliding_window");
    attn_scale_ = static_cast<float>(p.get("attn_scale"));
    softcap_ = static_cast<float>(p.get("final_logit_softcap", 0.0));
    if (!(global_.base > 0) || !(global_.freq_scale > 0) || !(local_.base > 0) || !(rms_eps_ >= 0))
      throw std::invalid_argument("rope_base, rope_base_local and rope_freq_scale must be > 0, rms_eps >= 0");
    if (window_ < 1 || !(attn_scale_ > 0) || !(softcap_ >= 0) || !std::isfinite(softcap_))
      throw std::invalid_argument("sliding_window and attn_scale must be > 0, final_logit_softcap >= 0");
    const int64_t q_dim = c.n_head * c.head_dim, kv_dim = c.n_head_kv * c.head_dim;
    tok_embd_ = take_embedding(t, c);
    for (int64_t il = 0; il < c.n_layer; ++il) {
      Gemma3Layer L;
      const LayerTensors lt{t, il};
      L.local = p.get("local." + std::to_string(il)) != 0;
      L.attn_norm = lt.vec("attn_norm.weight", c.n_embd);
      L.wq = lt.weight("attn_q.weight", q_dim, c.n_embd);
      L.wk = lt.weight("attn_k.weight", kv_dim, c.n_embd);
      L.wv = lt.weight("attn_v.weight", kv_dim, c.n_embd);
      L.q_norm = lt.vec("attn_q_norm.weight", c.head_dim);
      L.k_norm = lt.vec("attn_k_norm.weight", c.head_dim);
      L.wo = lt.weight("attn_output.weight", c.n_embd, q_dim);
      L.post_attn_norm = lt.vec("post_attention_norm.weight", c.n_embd);
      L.ffn_norm = lt.vec("ffn_norm.weight", c.n_embd);
      L.gate = lt.weight("ffn_gate.weight", c.n_ff, c.n_embd);
      L.up = lt.weight("ffn_up.weight", c.n_ff, c.n_embd);
      L.down = lt.weight("ffn_down.weight", c.n_embd, c.n_ff);
      L.post_ffn_norm = lt.vec("post_ffw_norm.weight", c.n_embd);
      layers_.push_back(L);
    }
    output_norm_ = check_vector(t.take("output_norm.weight"), "output_norm.weight", c.n_embd);
    output_ = take_output(t, c, tok_embd_);
    if (repack_weights) repack_layers(layers_, output_);
  }

  void forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows, int64_t n_out,
               float* logits, Precision precision, int n_threads, float* hidden) const override;

 private:
  float rms_eps_ = 1e-6f;
  RopeFreqs global_, local_;
  int64_t window_ = 0;
  float attn_scale_ = 1.0f;
  float softcap_ = 0.0f;
  WeightRef tok_embd_;
  std::vector<Gemma3Layer> layers_;
  const float* output_norm_ = nullptr;
  WeightRef output_;
};

// In place: RMSNorm of each of n_heads heads of head_dim in each row of x[n_rows][stride].
void norm_heads(float* x, int64_t n_rows, int64_t stride, int64_t n_heads, int64_t head_dim, const float* w,
                float eps) {
  for (int64_t r = 0; r < n_rows; ++r) rms_norm_rows(x + r * stride, w, x + r * stride, n_heads, head_dim, eps);
}

void Gemma3Model::forward(const std::vector<Segment>& segs, int64_t n_rows, Scratch& s, const int64_t* out_rows,
                          int64_t n_out, float* logits, Precision precision, int n_threads, float* hidden) const {
  const ModelDims& c = dims();
  const int64_t E = c.n_embd, hd = c.head_dim, F = c.n_ff;
  const int64_t q_dim = c.n_head * hd;
  const float eps = rms_eps_;
  float* x = s.x.data();        // [n_rows][E] the residual stream
  float* xn = s.xn.data();      // [n_rows][E] normed input of a block, then its output
  float* attn = s.attn.data();  // [n_rows][q_dim]
  float* act = s.act.data();    // [n_rows][F]
  std::vector<AttentionArgs> args(segs.size());

  embedding(tok_embd_.data, tok_embd_.type, c.n_vocab, E, s.ids.data(), n_rows, x);
  const float embd_scale = std::sqrt(static_cast<float>(E));
  // RoPE's cos and sin for each row's position, for the global and the local layers.
  float* rope_global = s.rope.data();  // [n_rows][hd]
  std::vector<float> rope_local(static_cast<size_t>(n_rows * hd));
  for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
    for (int64_t i = r0 * E; i < (r0 + n) * E; ++i) x[i] *= embd_scale;
    rope_table(s.pos.data() + r0, n, hd, global_, rope_global + r0 * hd);
    rope_table(s.pos.data() + r0, n, hd, local_, rope_local.data() + r0 * hd);
  });
  for (int64_t il = 0; il < c.n_layer; ++il) {
    const Gemma3Layer& L = layers_[static_cast<size_t>(il)];
    const float* cos_sin = L.local ? rope_local.data() : rope_global;
    if (il == 0)
      for_rows(n_threads, n_rows,
               [&](int64_t r0, int64_t n) { rms_norm_rows(x + r0 * E, L.attn_norm, xn + r0 * E, n, E, eps); });
    const Projected qkv = project({&L.wq, &L.wk, &L.wv}, xn, n_rows, s.qkv.data(), precision, n_threads);
    float *q = qkv.part[0], *k = qkv.part[1], *v = qkv.part[2];
    const int64_t qs = qkv.stride[0], ks = qkv.stride[1];
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      norm_heads(q + r0 * qs, n, qs, c.n_head, hd, L.q_norm, eps);
      norm_heads(k + r0 * ks, n, ks, c.n_head_kv, hd, L.k_norm, eps);
      rope_rows(q + r0 * qs, n, qs, c.n_head, hd, cos_sin + r0 * hd, true);
      rope_rows(k + r0 * ks, n, ks, c.n_head_kv, hd, cos_sin + r0 * hd, true);
    });
    for (size_t i = 0; i < segs.size(); ++i) {
      const Segment& g = segs[i];
      args[i] = AttentionArgs{q + g.row0 * qs, qs,          attn + g.row0 * q_dim, q_dim, g.cache, il, g.pos, g.n,
                              c.n_head,        attn_scale_, L.local ? window_ : 0};
    }
    append_and_attend(segs, il, k, v, ks, args, n_threads);
    matmul(L.wo, attn, n_rows, xn, precision, n_threads);
    // The block's output normed, the residual, then the feed-forward block's norm.
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      rms_norm_rows(xn + r0 * E, L.post_attn_norm, xn + r0 * E, n, E, eps);
      add_vec(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      rms_norm_rows(x + r0 * E, L.ffn_norm, xn + r0 * E, n, E, eps);
    });
    const Projected gu = project({&L.gate, &L.up}, xn, n_rows, s.ffn.data(), precision, n_threads);
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      for (int64_t r = r0; r < r0 + n; ++r)
        geglu_vec(gu.part[0] + r * gu.stride[0], gu.part[1] + r * gu.stride[1], act + r * F, F);
    });
    matmul(L.down, act, n_rows, xn, precision, n_threads);
    const float* next_norm = il + 1 < c.n_layer ? layers_[static_cast<size_t>(il + 1)].attn_norm : nullptr;
    for_rows(n_threads, n_rows, [&](int64_t r0, int64_t n) {
      rms_norm_rows(xn + r0 * E, L.post_ffn_norm, xn + r0 * E, n, E, eps);
      add_vec(x + r0 * E, xn + r0 * E, x + r0 * E, n * E);
      if (next_norm != nullptr) rms_norm_rows(x + r0 * E, next_norm, xn + r0 * E, n, E, eps);
    });
  }
  // Output head, only for the rows whose logits are wanted.
  output_head(x, out_rows, n_out, output_norm_, eps, output_, xn, logits, hidden, precision, n_threads);
  if (softcap_ > 0 && logits != nullptr)
    for_rows(n_threads, n_out,
             [&](int64_t r0, int64_t n) { softcap_vec(logits + r0 * c.n_vocab, n * c.n_vocab, softcap_); });
}

std::shared_ptr<const Model> make_gemma3(const Params& p, TensorMap& t, bool repack) {
  return std::make_shared<Gemma3Model>(ModelDims::from(p), p, t, repack);
}

const bool registered = register_architecture("gemma3", &make_gemma3);

}  // namespace

}  // namespace pyinfer
