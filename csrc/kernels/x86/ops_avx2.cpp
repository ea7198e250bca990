// ops_avx2.cpp: AVX2 (+FMA, F16C) RMSNorm, RoPE, SwiGLU, add, softmax, fp16 conversion,
// attention rows. This file alone is compiled with the AVX2 flags. Everything except
// fill_ops_avx2 has internal linkage and no STL template is instantiated, so no code built with
// these flags can be merged into a portable caller. RoPE, add and the fp16 conversion match
// ops_ref.cpp bit for bit; the rest sum lane-wise and use a polynomial exp (within float32
// bounds of the spec).
#include <immintrin.h>
#include <math.h>

#include "dispatch.h"
#include "half.h"
#include "kernels/rope_angles.h"

namespace pyinfer {
namespace {

// Sixteen int32: eight -1 then eight 0; a load at offset 8 - r is the mask of the first r lanes.
alignas(32) const int32_t kMaskTable[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};

// Mask of the first r lanes, r clamped to [0, 8].
inline __m256i lanes(int64_t r) {
  const int64_t c = r >= 8 ? 8 : r <= 0 ? 0 : r;
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kMaskTable + 8 - c));
}
inline __m256 load(const float* p, __m256i k) { return _mm256_maskload_ps(p, k); }
inline void store(float* p, __m256i k, __m256 v) { _mm256_maskstore_ps(p, k, v); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// e^x, the same polynomial and clamping as exp512 in ops_avx512.cpp (about 2 ulp; 0 below
// -87.34, finite near FLT_MAX above 88.38).
inline __m256 exp256(__m256 x) {
  const __m256 lo = _mm256_set1_ps(-87.33654f);
  const __m256 keep = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3762626647949f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n for n in [-126, 127]: build the float's exponent field directly.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep);
}

void rms_norm_f32_avx2(const float* x, const float* w, float* out, int64_t n, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  for (; i < n; i += 8) {
    const __m256 a = load(x + i, lanes(n - i));
    acc0 = _mm256_fmadd_ps(a, a, acc0);
  }
  const float ss = hsum(_mm256_add_ps(acc0, acc1));
  const __m256 scale = _mm256_set1_ps(1.0f / sqrtf(ss / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    store(out + i, k, _mm256_mul_ps(_mm256_mul_ps(load(x + i, k), scale), load(w + i, k)));
  }
}

void rope_f32_avx2(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                   const int64_t* pos, float base, bool neox) {
  const int64_t half = head_dim / 2;
  float c[kRopeMaxDim / 2], s[kRopeMaxDim / 2];
  // Normal mode, per element of a head: cc = (c0, c0, c1, c1, ...), ss = (-s0, s0, -s1, s1, ...),
  // so out = x * cc + swap_pairs(x) * ss gives (a c - b s, b c + a s) as the scalar code does.
  float cc[kRopeMaxDim], ss[kRopeMaxDim];
  for (int64_t r = 0; r < n_rows; ++r) {
    rope_cos_sin(pos[r], head_dim, base, c, s);
    if (!neox) {
      for (int64_t i = 0; i < half; ++i) {
        cc[2 * i] = c[i];
        cc[2 * i + 1] = c[i];
        ss[2 * i] = -s[i];
        ss[2 * i + 1] = s[i];
      }
    }
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + r * row_stride + h * head_dim;
      if (neox) {
        for (int64_t i = 0; i < half; i += 8) {
          const __m256i k = lanes(half - i);
          const __m256 a = load(v + i, k), b = load(v + half + i, k);
          const __m256 cv = load(c + i, k), sv = load(s + i, k);
          store(v + i, k, _mm256_sub_ps(_mm256_mul_ps(a, cv), _mm256_mul_ps(b, sv)));
          store(v + half + i, k, _mm256_add_ps(_mm256_mul_ps(a, sv), _mm256_mul_ps(b, cv)));
        }
      } else {
        for (int64_t i = 0; i < head_dim; i += 8) {
          const __m256i k = lanes(head_dim - i);
          const __m256 a = load(v + i, k);
          const __m256 sw = _mm256_permute_ps(a, 0xB1);  // swap each adjacent pair
          store(v + i, k, _mm256_add_ps(_mm256_mul_ps(a, load(cc + i, k)), _mm256_mul_ps(sw, load(ss + i, k))));
        }
      }
    }
  }
}

void swiglu_f32_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    const __m256 g = load(gate + i, k);
    const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    store(out + i, k, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), load(up + i, k)));
  }
}

void add_f32_avx2(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    store(out + i, k, _mm256_add_ps(load(a + i, k), load(b + i, k)));
  }
}

// Max of x[n], n >= 1.
inline float max_f32(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), load(x + i, k), _mm256_castsi256_ps(k)));
  }
  return hmax(m);
}

// out[i] = exp(x[i] - m); returns the sum. out may be x.
inline float exp_shift_sum(const float* x, float* out, int64_t n, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(load(x + i, k), mv)), _mm256_castsi256_ps(k));
    store(out + i, k, e);
    sum = _mm256_add_ps(sum, e);
  }
  return hsum(sum);
}

void softmax_f32_avx2(const float* x, float* out, int64_t n) {
  const __m256 inv = _mm256_set1_ps(1.0f / exp_shift_sum(x, out, n, max_f32(x, n)));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    store(out + i, k, _mm256_mul_ps(load(out + i, k), inv));
  }
}

void f32_to_f16_avx2(const float* src, fp16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_fp16(src[i]);  // same rounding as vcvtps2ph
}

// 8 cached elements from p[idx..] as float32 (the first r of them when r < 8, zeros after);
// f16 selects fp16 storage.
inline __m256 kv8(const void* p, int64_t idx, int64_t r, bool f16) {
  if (!f16) return load(static_cast<const float*>(p) + idx, lanes(r));
  const fp16_t* h = static_cast<const fp16_t*>(p) + idx;
  if (r >= 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
  float tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i < r; ++i) tmp[i] = fp16_to_f32(h[i]);
  return _mm256_loadu_ps(tmp);
}

// The attention row; always inlined into one wrapper per storage type so `f16` is a constant.
// Four accumulators hold 32 elements of the output (the whole row for head_dim <= 32), so V
// streams once per 32-wide slice with no stores in the inner loop.
__attribute__((always_inline)) inline void attn_row(const float* q, const void* k, const void* v,
                                                    int64_t n_kv, int64_t head_dim, float scale,
                                                    float* scores, float* out, bool f16) {
  const __m128 scale4 = _mm_set1_ps(scale);
  int64_t j = 0;
  // Four keys at a time, their accumulators reduced together with two rounds of hadd.
  for (; j + 4 <= n_kv; j += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < head_dim; i += 8) {
      const int64_t r = head_dim - i;
      const __m256 qv = load(q + i, lanes(r));
      a0 = _mm256_fmadd_ps(qv, kv8(k, j * head_dim + i, r, f16), a0);
      a1 = _mm256_fmadd_ps(qv, kv8(k, (j + 1) * head_dim + i, r, f16), a1);
      a2 = _mm256_fmadd_ps(qv, kv8(k, (j + 2) * head_dim + i, r, f16), a2);
      a3 = _mm256_fmadd_ps(qv, kv8(k, (j + 3) * head_dim + i, r, f16), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(scores + j, _mm_mul_ps(s4, scale4));
  }
  for (; j < n_kv; ++j) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= head_dim; i += 16) {
      acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), kv8(k, j * head_dim + i, 8, f16), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), kv8(k, j * head_dim + i + 8, 8, f16), acc1);
    }
    for (; i < head_dim; i += 8)
      acc0 = _mm256_fmadd_ps(load(q + i, lanes(head_dim - i)),
                             kv8(k, j * head_dim + i, head_dim - i, f16), acc0);
    scores[j] = hsum(_mm256_add_ps(acc0, acc1)) * scale;
  }
  const __m256 inv = _mm256_set1_ps(1.0f / exp_shift_sum(scores, scores, n_kv, max_f32(scores, n_kv)));
  for (int64_t i0 = 0; i0 < head_dim; i0 += 32) {
    const int64_t r = head_dim - i0;
    __m256 o0 = _mm256_setzero_ps(), o1 = _mm256_setzero_ps();
    __m256 o2 = _mm256_setzero_ps(), o3 = _mm256_setzero_ps();
    for (int64_t j = 0; j < n_kv; ++j) {
      const int64_t at = j * head_dim + i0;
      const __m256 p = _mm256_set1_ps(scores[j]);
      o0 = _mm256_fmadd_ps(p, kv8(v, at, r, f16), o0);
      if (r > 8) o1 = _mm256_fmadd_ps(p, kv8(v, at + 8, r - 8, f16), o1);
      if (r > 16) o2 = _mm256_fmadd_ps(p, kv8(v, at + 16, r - 16, f16), o2);
      if (r > 24) o3 = _mm256_fmadd_ps(p, kv8(v, at + 24, r - 24, f16), o3);
    }
    store(out + i0, lanes(r), _mm256_mul_ps(o0, inv));
    store(out + i0 + 8, lanes(r - 8), _mm256_mul_ps(o1, inv));
    store(out + i0 + 16, lanes(r - 16), _mm256_mul_ps(o2, inv));
    store(out + i0 + 24, lanes(r - 24), _mm256_mul_ps(o3, inv));
  }
}

void attn_row_f32_avx2(const float* q, const void* k, const void* v, int64_t n_kv, int64_t head_dim,
                       float scale, float* scores, float* out) {
  attn_row(q, k, v, n_kv, head_dim, scale, scores, out, false);
}

void attn_row_f16_avx2(const float* q, const void* k, const void* v, int64_t n_kv, int64_t head_dim,
                       float scale, float* scores, float* out) {
  attn_row(q, k, v, n_kv, head_dim, scale, scores, out, true);
}

}  // namespace

void fill_ops_avx2(KernelTable& t) {
  t.rms_norm_f32 = rms_norm_f32_avx2;
  t.rope_f32 = rope_f32_avx2;
  t.swiglu_f32 = swiglu_f32_avx2;
  t.add_f32 = add_f32_avx2;
  t.softmax_f32 = softmax_f32_avx2;
  t.f32_to_f16 = f32_to_f16_avx2;
  t.attn_row[KV_F32] = attn_row_f32_avx2;
  t.attn_row[KV_F16] = attn_row_f16_avx2;
}

}  // namespace pyinfer
