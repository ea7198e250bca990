// ops_ref.cpp: scalar RMSNorm, RoPE, SwiGLU, add, softmax, fp16 conversion and the attention
// kernel: the executable spec of the SIMD variants in kernels/x86/ops_*.cpp.
//
// RoPE, add and the fp16 conversion are exact specs: the SIMD variants do the same float32
// operations in the same order and match bit for bit. RMSNorm, softmax, SwiGLU and attention
// sum in a different order (lane-wise) or use a polynomial exp, so they agree within bounds
// derived from float32's epsilon (see tests/test_ops.py and tests/test_attention.py).
#include <cmath>

#include "kernels/abi.h"
#include "kernels/half.h"
#include "kernels/kv_query.h"

namespace pyinfer {
namespace {

void rms_norm_f32_ref(const float* x, const float* w, float* out, int64_t n, float eps) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
}

void rope_f32_ref(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim, const float* cos_sin,
                  bool neox) {
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos_sin + r * head_dim;
    const float* s = c + half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + r * row_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        // (a, b) -> (a c - b s, a s + b c): element indices by pairing mode.
        const int64_t ia = neox ? i : 2 * i;
        const int64_t ib = neox ? i + half : 2 * i + 1;
        const float a = v[ia], b = v[ib];
        v[ia] = a * c[i] - b * s[i];
        v[ib] = a * s[i] + b * c[i];
      }
    }
  }
}

void swiglu_f32_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// GELU by its tanh approximation, 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3),
// written as g / (1 + exp(-2u)) (the same function: 1 + tanh(u) = 2 / (1 + exp(-2u))), so
// the SIMD paths need only their exp. u is computed by the same float32 operations on every
// path; only exp differs (a polynomial there).
void geglu_f32_ref(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float u = kGeluK0 * (g + kGeluK1 * (g * g * g));
    out[i] = g / (1.0f + std::exp(-2.0f * u)) * up[i];
  }
}

void add_f32_ref(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void softmax_f32_ref(const float* x, float* out, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = x[i] > m ? x[i] : m;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::exp(x[i] - m);
    sum += out[i];
  }
  const float inv = 1.0f / sum;
  for (int64_t i = 0; i < n; ++i) out[i] *= inv;
}

void f32_to_f16_ref(const float* src, fp16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_fp16(src[i]);
}

// Loads one cached element as float32.
inline float kv_load(const float* p, int64_t i) { return p[i]; }
inline float kv_load(const fp16_t* p, int64_t i) { return fp16_to_f32(p[i]); }

// Scores and values of one query as the cache's type T has them. Scores of a float or fp16
// cache: sum_i q_i * k_i in order of i. Of a Q8_0 (int8_t) cache: the query in int16 per
// 32-element chunk (attn_query_q16), each chunk's integer sum against the int8 key elements,
// acc = fma(float(sum_c), qd_c * key scale_c, acc) over the chunks in order (kernels/abi.h,
// AttnTile). Values: the stored element, or for Q8_0 the int8 times its scale.
template <typename T>
struct KvRead {
  const AttnTile& t;
  const float* q = nullptr;
  void query(const float* qq) { q = qq; }
  // Query . key; kj: the key's first element, in its block (element i at i * kKeyBlock).
  float score(const T* kj, int64_t) const {
    float d = 0.0f;
    for (int64_t i = 0; i < t.head_dim; ++i) d += q[i] * kv_load(kj, i * kKeyBlock);
    return d;
  }
  float value(int64_t j, int64_t i) const { return kv_load(static_cast<const T*>(t.v) + j * t.head_dim, i); }
};
template <>
struct KvRead<int8_t> {
  const AttnTile& t;
  int16_t qi[kRopeMaxDim];
  float qd[kRopeMaxDim / kKvQ8Chunk];
  void query(const float* q) { attn_query_q16(q, t.head_dim, qi, qd); }
  // p: the key's position (its scales' index).
  float score(const int8_t* kj, int64_t p) const {
    float acc = 0.0f;
    for (int64_t c = 0; c < t.head_dim / kKvQ8Chunk; ++c) {
      int32_t sum = 0;
      for (int64_t i = c * kKvQ8Chunk; i < (c + 1) * kKvQ8Chunk; ++i) sum += qi[i] * kj[i * kKeyBlock];
      acc = std::fma(static_cast<float>(sum), qd[c] * t.k_scale[c * t.k_scale_stride + p], acc);
    }
    return acc;
  }
  float value(int64_t j, int64_t i) const {
    return static_cast<float>(static_cast<const int8_t*>(t.v)[j * t.head_dim + i]) *
           t.v_scale[j * (t.head_dim / kKvQ8Chunk) + i / kKvQ8Chunk];
  }
};

// Per query, two passes over the keys: scores and their max, then exp(s - max) weights; the
// weighted sum of V is divided by the weights' sum at the end. Stable for any score range.
template <typename T>
void attention_ref(const AttnTile& t) {
  const int64_t hd = t.head_dim, last_block = (t.last + t.n_rows - 1) / kKeyBlock;
  KvRead<T> rd{t};
  float* scores = t.scores;
  for (int64_t row = 0; row < t.n_rows; ++row) {
    const int64_t first = attn_first(t, row), n_kv = t.last + row + 1 - first;
    for (int64_t h = 0; h < t.n_heads; ++h) {
      const float* q = t.q + row * t.q_stride + h * hd;
      float* out = t.out + row * t.out_stride + h * hd;
      float m = -INFINITY;
      rd.query(q);
      for (int64_t j = 0; j < n_kv; ++j) {
        // Element i of key p sits at (i, p % kKeyBlock) of its block.
        const int64_t p = first + j, b = p / kKeyBlock;
        const T* kj =
            (b == last_block ? static_cast<const T*>(t.k_last) : static_cast<const T*>(t.k) + b * hd * kKeyBlock) +
            p % kKeyBlock;
        scores[j] = rd.score(kj, p) * t.scale;
        m = scores[j] > m ? scores[j] : m;
      }
      for (int64_t i = 0; i < hd; ++i) out[i] = 0.0f;
      float sum = 0.0f;
      for (int64_t j = 0; j < n_kv; ++j) {
        const float w = std::exp(scores[j] - m);
        sum += w;
        for (int64_t i = 0; i < hd; ++i) out[i] += w * rd.value(first + j, i);
      }
      const float inv = 1.0f / sum;
      for (int64_t i = 0; i < hd; ++i) out[i] *= inv;
    }
  }
}

}  // namespace

void fill_ops_scalar(KernelSet& t) {
  t.rms_norm_f32 = rms_norm_f32_ref;
  t.rope_f32 = rope_f32_ref;
  t.swiglu_f32 = swiglu_f32_ref;
  t.geglu_f32 = geglu_f32_ref;
  t.add_f32 = add_f32_ref;
  t.softmax_f32 = softmax_f32_ref;
  t.f32_to_f16 = f32_to_f16_ref;
  t.attention[KV_F32] = attention_ref<float>;
  t.attention[KV_F16] = attention_ref<fp16_t>;
  t.attention[KV_Q8_0] = attention_ref<int8_t>;
}

}  // namespace pyinfer
