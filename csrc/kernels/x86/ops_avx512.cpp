// ops_avx512.cpp: AVX-512 RMSNorm, RoPE, SwiGLU, add, softmax, fp16 conversion, attention rows.
// This file alone is compiled with the AVX-512 flags. Everything except fill_ops_avx512 has
// internal linkage and no STL template is instantiated, so no code built with these flags can
// be merged into a portable caller. RoPE, add and the fp16 conversion match ops_ref.cpp bit for
// bit; the rest sum lane-wise and use a polynomial exp (within float32 bounds of the spec).
#include <immintrin.h>
#include <math.h>

#include "dispatch.h"
#include "half.h"
#include "kernels/rope_angles.h"

namespace pyinfer {
namespace {

// Mask of the first r lanes, r clamped to [0, 16].
inline __mmask16 lanes(int64_t r) {
  return r >= 16 ? static_cast<__mmask16>(0xffff) : r <= 0 ? 0 : static_cast<__mmask16>((1u << r) - 1);
}

// e^x for x in float32, relative error about 2 ulp (Cephes' expf polynomial on
// |r| <= ln2/2 after x = n ln2 + r). Inputs are clamped to [-87.34, 88.38], so large arguments
// give a finite value near FLT_MAX instead of inf; below -87.34 the result is 0 (exp would be
// subnormal there, or exp(-inf) for a masked score).
inline __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3762626647949f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

void rms_norm_f32_avx512(const float* x, const float* w, float* out, int64_t n, float eps) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
    acc1 = _mm512_fmadd_ps(b, b, acc1);
  }
  for (; i < n; i += 16) {
    const __m512 a = _mm512_maskz_loadu_ps(lanes(n - i), x + i);
    acc0 = _mm512_fmadd_ps(a, a, acc0);
  }
  const float ss = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
  const __m512 scale = _mm512_set1_ps(1.0f / sqrtf(ss / static_cast<float>(n) + eps));
  for (i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), scale);
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, w + i)));
  }
}

void rope_f32_avx512(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads, int64_t head_dim,
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
        for (int64_t i = 0; i < half; i += 16) {
          const __mmask16 k = lanes(half - i);
          const __m512 a = _mm512_maskz_loadu_ps(k, v + i), b = _mm512_maskz_loadu_ps(k, v + half + i);
          const __m512 cv = _mm512_maskz_loadu_ps(k, c + i), sv = _mm512_maskz_loadu_ps(k, s + i);
          _mm512_mask_storeu_ps(v + i, k, _mm512_sub_ps(_mm512_mul_ps(a, cv), _mm512_mul_ps(b, sv)));
          _mm512_mask_storeu_ps(v + half + i, k, _mm512_add_ps(_mm512_mul_ps(a, sv), _mm512_mul_ps(b, cv)));
        }
      } else {
        for (int64_t i = 0; i < head_dim; i += 16) {
          const __mmask16 k = lanes(head_dim - i);
          const __m512 a = _mm512_maskz_loadu_ps(k, v + i);
          const __m512 sw = _mm512_permute_ps(a, 0xB1);  // swap each adjacent pair
          const __m512 o = _mm512_add_ps(_mm512_mul_ps(a, _mm512_maskz_loadu_ps(k, cc + i)),
                                         _mm512_mul_ps(sw, _mm512_maskz_loadu_ps(k, ss + i)));
          _mm512_mask_storeu_ps(v + i, k, o);
        }
      }
    }
  }
}

void swiglu_f32_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(k, up + i)));
  }
}

void add_f32_avx512(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    _mm512_mask_storeu_ps(out + i, k,
                          _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
  }
}

// Max of x[n], n >= 1.
inline float max_f32(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

// out[i] = exp(x[i] - m); returns the sum. out may be x.
inline float exp_shift_sum(const float* x, float* out, int64_t n, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    const __m512 e = _mm512_maskz_mov_ps(k, exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), mv)));
    _mm512_mask_storeu_ps(out + i, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

inline void scale_f32(float* x, int64_t n, float a) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + i), av));
  }
}

void softmax_f32_avx512(const float* x, float* out, int64_t n) {
  const float sum = exp_shift_sum(x, out, n, max_f32(x, n));
  scale_f32(out, n, 1.0f / sum);
}

void f32_to_f16_avx512(const float* src, fp16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst + i, k, h);
  }
}

// 16 cached elements from p[idx..] (masked) as float32; f16 selects fp16 storage.
inline __m512 kv16(const void* p, int64_t idx, __mmask16 k, bool f16) {
  if (f16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const fp16_t*>(p) + idx));
  return _mm512_maskz_loadu_ps(k, static_cast<const float*>(p) + idx);
}

// (sum a, sum b, sum c, sum d) of four vectors.
inline __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // Within each 128-bit lane: pairwise sums of a, b, then of c, d, then one lane of each.
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));  // a02 b02 a13 b13
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(_mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm512_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));  // a b c d
  // Then across the four lanes.
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

// The attention row; always inlined into one wrapper per storage type so `f16` is a constant.
// The accumulators hold 64 elements of the output at a time (the whole row for head_dim <= 64),
// so V streams once per 64-wide slice with no stores in the inner loop.
__attribute__((always_inline)) inline void attn_row(const float* q, const void* k, const void* v,
                                                    int64_t n_kv, int64_t head_dim, float scale,
                                                    float* scores, float* out, bool f16) {
  const __m128 scale4 = _mm_set1_ps(scale);
  int64_t j = 0;
  // Four keys at a time: their four accumulators are reduced together (sum4), a quarter of the
  // shuffles of four separate horizontal sums.
  for (; j + 4 <= n_kv; j += 4) {
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t i = 0; i < head_dim; i += 16) {
      const __mmask16 m = lanes(head_dim - i);
      const __m512 qv = _mm512_maskz_loadu_ps(m, q + i);
      a0 = _mm512_fmadd_ps(qv, kv16(k, j * head_dim + i, m, f16), a0);
      a1 = _mm512_fmadd_ps(qv, kv16(k, (j + 1) * head_dim + i, m, f16), a1);
      a2 = _mm512_fmadd_ps(qv, kv16(k, (j + 2) * head_dim + i, m, f16), a2);
      a3 = _mm512_fmadd_ps(qv, kv16(k, (j + 3) * head_dim + i, m, f16), a3);
    }
    _mm_storeu_ps(scores + j, _mm_mul_ps(sum4(a0, a1, a2, a3), scale4));
  }
  for (; j < n_kv; ++j) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < head_dim; i += 16) {
      const __mmask16 m = lanes(head_dim - i);
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), kv16(k, j * head_dim + i, m, f16), acc);
    }
    scores[j] = _mm512_reduce_add_ps(acc) * scale;
  }
  const __m512 inv = _mm512_set1_ps(1.0f / exp_shift_sum(scores, scores, n_kv, max_f32(scores, n_kv)));
  for (int64_t i0 = 0; i0 < head_dim; i0 += 64) {
    const __mmask16 m0 = lanes(head_dim - i0), m1 = lanes(head_dim - i0 - 16);
    const __mmask16 m2 = lanes(head_dim - i0 - 32), m3 = lanes(head_dim - i0 - 48);
    __m512 o0 = _mm512_setzero_ps(), o1 = _mm512_setzero_ps();
    __m512 o2 = _mm512_setzero_ps(), o3 = _mm512_setzero_ps();
    for (int64_t j = 0; j < n_kv; ++j) {
      const int64_t at = j * head_dim + i0;
      const __m512 p = _mm512_set1_ps(scores[j]);
      o0 = _mm512_fmadd_ps(p, kv16(v, at, m0, f16), o0);
      if (m1) o1 = _mm512_fmadd_ps(p, kv16(v, at + 16, m1, f16), o1);
      if (m2) o2 = _mm512_fmadd_ps(p, kv16(v, at + 32, m2, f16), o2);
      if (m3) o3 = _mm512_fmadd_ps(p, kv16(v, at + 48, m3, f16), o3);
    }
    _mm512_mask_storeu_ps(out + i0, m0, _mm512_mul_ps(o0, inv));
    _mm512_mask_storeu_ps(out + i0 + 16, m1, _mm512_mul_ps(o1, inv));
    _mm512_mask_storeu_ps(out + i0 + 32, m2, _mm512_mul_ps(o2, inv));
    _mm512_mask_storeu_ps(out + i0 + 48, m3, _mm512_mul_ps(o3, inv));
  }
}

void attn_row_f32_avx512(const float* q, const void* k, const void* v, int64_t n_kv, int64_t head_dim,
                         float scale, float* scores, float* out) {
  attn_row(q, k, v, n_kv, head_dim, scale, scores, out, false);
}

void attn_row_f16_avx512(const float* q, const void* k, const void* v, int64_t n_kv, int64_t head_dim,
                         float scale, float* scores, float* out) {
  attn_row(q, k, v, n_kv, head_dim, scale, scores, out, true);
}

}  // namespace

void fill_ops_avx512(KernelTable& t) {
  t.rms_norm_f32 = rms_norm_f32_avx512;
  t.rope_f32 = rope_f32_avx512;
  t.swiglu_f32 = swiglu_f32_avx512;
  t.add_f32 = add_f32_avx512;
  t.softmax_f32 = softmax_f32_avx512;
  t.f32_to_f16 = f32_to_f16_avx512;
  t.attn_row[KV_F32] = attn_row_f32_avx512;
  t.attn_row[KV_F16] = attn_row_f16_avx512;
}

}  // namespace pyinfer
