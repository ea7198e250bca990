// ops_avx2.cpp: AVX2 (+FMA, F16C) RMSNorm, RoPE, SwiGLU, add, softmax, fp16 conversion,
// attention. This file alone is compiled with the AVX2 flags. Everything except
// fill_ops_avx2 has internal linkage and no STL template is instantiated, so no code built with
// these flags can be merged into a portable caller. RoPE, add and the fp16 conversion match
// ops_ref.cpp bit for bit; the rest sum lane-wise and use a polynomial exp (within float32
// bounds of the spec).
#include <immintrin.h>

#include <math.h>
#include <limits>

#include "kernels/abi.h"
#include "kernels/attn_groups.h"
#include "kernels/half.h"

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
// -87.34, inf past ln(FLT_MAX) as std::exp; NaN stays NaN, as std::exp in the scalar path, so
// a NaN score or activation shows in the output on every ISA path instead of being clamped).
inline __m256 exp256(__m256 x) {
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  // Past ln(FLT_MAX): inf, as std::exp (the polynomial below sees a clamped argument).
  const __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __m256 x_in = x;
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
  const __m256 y = _mm256_blendv_ps(_mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), keep), x_in, nan);
  return _mm256_blendv_ps(y, _mm256_set1_ps(std::numeric_limits<float>::infinity()), over);
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
                   const float* cos_sin, bool neox) {
  const int64_t half = head_dim / 2;
  // Normal mode, per element of a head: cc = (c0, c0, c1, c1, ...), ss = (-s0, s0, -s1, s1, ...),
  // so out = x * cc + swap_pairs(x) * ss gives (a c - b s, b c + a s) as the scalar code does.
  float cc[kRopeMaxDim], ss[kRopeMaxDim];
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos_sin + r * head_dim;
    const float* s = c + half;
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

// As geglu_f32_ref: u by the same float32 operations (no fused multiply-adds), then exp256.
void geglu_f32_avx2(const float* gate, const float* up, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), k0 = _mm256_set1_ps(kGeluK0), k1 = _mm256_set1_ps(kGeluK1);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i k = lanes(n - i);
    const __m256 g = load(gate + i, k);
    const __m256 u = _mm256_mul_ps(k0, _mm256_add_ps(g, _mm256_mul_ps(k1, _mm256_mul_ps(_mm256_mul_ps(g, g), g))));
    const __m256 e = exp256(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
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

// 8 whole cached elements from p[idx..] as float32.
template <bool F16>
inline __m256 kv8_full(const void* p, int64_t idx) {
  if (!F16) return _mm256_loadu_ps(static_cast<const float*>(p) + idx);
  const fp16_t* h = static_cast<const fp16_t*>(p) + idx;
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
}

// Scores of RG queries against NB consecutive key blocks from k: s[r * ls + i], i over the
// NB * 16 positions, two vectors per block. Each K vector load feeds RG multiply-adds, and
// each score is one multiply-add chain over d = 0..head_dim-1 in order, so its bits do not
// depend on RG or NB.
template <int RG, int NB, bool F16, int FETCH>
inline void score_blocks(const AttnQueries<RG>& g, int64_t head_dim, const void* k, float scale, float* s, int64_t ls) {
  __m256 acc[RG][2 * NB];
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < 2 * NB; ++n) acc[r][n] = _mm256_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m256 kv[2 * NB];
    UNROLL for (int n = 0; n < NB; ++n) {
      kv[2 * n] = kv8_full<F16>(k, (n * head_dim + d) * kKeyBlock);
      kv[2 * n + 1] = kv8_full<F16>(k, (n * head_dim + d) * kKeyBlock + 8);
      attn_fetch_ahead<FETCH>(k, (n * head_dim + d) * kKeyBlock * (F16 ? 2 : 4));
    }
    UNROLL for (int r = 0; r < RG; ++r) {
      const __m256 qd = _mm256_broadcast_ss(g.q[r] + d);
      UNROLL for (int n = 0; n < 2 * NB; ++n) acc[r][n] = _mm256_fmadd_ps(qd, kv[n], acc[r][n]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < 2 * NB; ++n)
      _mm256_storeu_ps(s + r * ls + n * 8, _mm256_mul_ps(acc[r][n], sc));
}

// For positions j in [j0, j1]: acc[r] += p[r * ls + j - base] v[j] over output elements
// [i0, i0 + 8 C), the last chunk holding `tail` (1..8) of them. With SOME, only the queries
// whose own range holds j add, which leaves the others' sums exactly as if j were skipped.
// Each V vector load feeds RG multiply-adds; each sum is one chain over j in order.
template <int RG, int C, bool F16, int FETCH, bool SOME>
inline void weigh_range(__m256 (&acc)[RG][C], const AttnQueries<RG>& g, const float* p, int64_t ls, int64_t base,
                        const void* v, int64_t j0, int64_t j1, int64_t head_dim, int64_t i0, int64_t tail) {
  for (int64_t j = j0; j <= j1; ++j) {
    const int64_t at = j * head_dim + i0;
    __m256 vv[C];
    UNROLL for (int c = 0; c < C; ++c) attn_fetch_ahead<FETCH>(v, (at + 8 * c) * (F16 ? 2 : 4));
    UNROLL for (int c = 0; c < C - 1; ++c) vv[c] = kv8_full<F16>(v, at + 8 * c);
    vv[C - 1] = tail == 8 ? kv8_full<F16>(v, at + 8 * (C - 1)) : kv8(v, at + 8 * (C - 1), tail, F16);
    UNROLL for (int r = 0; r < RG; ++r) {
      if (SOME && (j < g.first[r] || j > g.last[r])) continue;
      const __m256 pr = _mm256_broadcast_ss(p + r * ls + j - base);
      UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(pr, vv[c], acc[r][c]);
    }
  }
}

// out[r][i0 .. i0 + 8 C) = inv[r] * sum over j in first[r]..last[r] of p[r * ls + j - base] v[j].
// The positions all RG queries see go through the plain loop; rows of a tile that end (or,
// with a window, start) at different positions leave a few at either end for the other one.
template <int RG, int C, bool F16, int FETCH>
inline void weigh_values(const AttnQueries<RG>& g, const float* p, int64_t ls, int64_t base, const void* v,
                         int64_t head_dim, int64_t i0, int64_t tail, const float* inv) {
  __m256 acc[RG][C];
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  const AttnReach a = attn_reach(g);
  weigh_range<RG, C, F16, FETCH, true>(acc, g, p, ls, base, v, a.lo, a.all_lo - 1, head_dim, i0, tail);
  weigh_range<RG, C, F16, FETCH, false>(acc, g, p, ls, base, v, a.all_lo, a.all_hi, head_dim, i0, tail);
  weigh_range<RG, C, F16, FETCH, true>(acc, g, p, ls, base, v, a.all_hi + 1, a.hi, head_dim, i0, tail);
  UNROLL for (int r = 0; r < RG; ++r) {
    const __m256 iv = _mm256_set1_ps(inv[r]);
    UNROLL for (int c = 0; c < C; ++c)
      store(g.out[r] + i0 + 8 * c, lanes(c == C - 1 ? tail : 8), _mm256_mul_ps(acc[r][c], iv));
  }
}

// The steps of attention for RG queries of a tile, numbered from i0 row-major over (row, head)
// (see AttnTile); s: their rows of ls scores, from the first position of the span's block b0
// (the three steps AttnEntries, in attn_groups.h, takes). Block and slice counts keep
// accumulators, loaded vectors and a broadcast within the 16 registers. Scores against key
// blocks [bs, be) of the span b0..b1.
template <bool F16, int FETCH>
struct Steps {
  template <int RG>
  static void scores(const AttnTile& t, int64_t i0, int64_t b0, int64_t b1, int64_t bs, int64_t be, float* s, int64_t ls) {
    const AttnQueries<RG> g = attn_queries<RG>(t, i0);
    constexpr int NB = RG >= 3 ? 1 : 2;
    attn_key_blocks<NB>(t, b0, b1, bs, be, F16 ? 2 : 4, [&](auto nb, const void* k, int64_t at) {
      score_blocks<RG, decltype(nb)::value, F16, FETCH>(g, t.head_dim, k, t.scale, s + at, ls);
    });
  }

  // exp(x - max) in place; returns their sum.
  static float exp_sum(float* p, int64_t n) { return exp_shift_sum(p, p, n, max_f32(p, n)); }

  // Output elements [c0, c1) (c0 a multiple of 8), a slice at a time: the weighted sums of V.
  template <int RG>
  static void weigh(const AttnTile& t, int64_t i0, int64_t b0, const float* s, int64_t ls, const float* inv, int64_t c0,
                  int64_t c1) {
    const AttnQueries<RG> g = attn_queries<RG>(t, i0);
    const int64_t base = b0 * kKeyBlock, hd = t.head_dim;
    constexpr int C = RG <= 2 ? 4 : RG == 3 ? 3 : 2;
    for (int64_t i = c0; i < c1; i += 8 * C) {
      const int64_t rest = c1 - i, chunks = (rest + 7) / 8;
      const int64_t tail = rest >= 8 * C ? 8 : rest - 8 * (chunks - 1);
      if (chunks >= C) weigh_values<RG, C, F16, FETCH>(g, s, ls, base, t.v, hd, i, tail, inv);
      else if (chunks == 3) weigh_values<RG, 3, F16, FETCH>(g, s, ls, base, t.v, hd, i, tail, inv);
      else if (chunks == 2) weigh_values<RG, 2, F16, FETCH>(g, s, ls, base, t.v, hd, i, tail, inv);
      else weigh_values<RG, 1, F16, FETCH>(g, s, ls, base, t.v, hd, i, tail, inv);
    }
  }
};

// REUSE, ONCE: how the entries request keys and values ahead for a tile that reads them again
// or once (AttnTile::reads_once).
template <int REUSE, int ONCE>
void fill_attention(KernelSet& t) {
  attn_fill<Steps<false, REUSE>, Steps<false, ONCE>>(t, KV_F32);
  attn_fill<Steps<true, REUSE>, Steps<true, ONCE>>(t, KV_F16);
}

}  // namespace

void fill_ops_avx2(KernelSet& t, const KernelTuning& tuning) {
  t.rms_norm_f32 = rms_norm_f32_avx2;
  t.rope_f32 = rope_f32_avx2;
  t.swiglu_f32 = swiglu_f32_avx2;
  t.geglu_f32 = geglu_f32_avx2;
  t.add_f32 = add_f32_avx2;
  t.softmax_f32 = softmax_f32_avx2;
  t.f32_to_f16 = f32_to_f16_avx2;
  if (tuning.stream_fetch_ahead) fill_attention<FETCH_L1, FETCH_L2>(t);
  else fill_attention<FETCH_NONE, FETCH_NONE>(t);
}

}  // namespace pyinfer
