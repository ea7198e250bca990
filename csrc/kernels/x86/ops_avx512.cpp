// ops_avx512.cpp: AVX-512 RMSNorm, RoPE, SwiGLU, add, softmax, fp16 conversion, attention.
// This file alone is compiled with the AVX-512 flags. Everything except fill_ops_avx512 has
// internal linkage and no STL template is instantiated, so no code built with these flags can
// be merged into a portable caller. RoPE, add, the fp16 conversion and a Q8_0 cache's scores
// match ops_ref.cpp bit for bit; the rest sum lane-wise and use a polynomial exp (within
// float32 bounds of the spec).
#include <immintrin.h>

#include <math.h>
#include <cstring>
#include <limits>

#include "kernels/abi.h"
#include "kernels/attn_groups.h"
#include "kernels/half.h"
#include "kernels/kv_query.h"

namespace pyinfer {
namespace {

// Mask of the first r lanes, r clamped to [0, 16].
inline __mmask16 lanes(int64_t r) {
  return r >= 16 ? static_cast<__mmask16>(0xffff) : r <= 0 ? 0 : static_cast<__mmask16>((1u << r) - 1);
}

// e^x for x in float32, relative error about 2 ulp (Cephes' expf polynomial on
// |r| <= ln2/2 after x = n ln2 + r). Inputs are clamped to [-87.34, 88.38] for the polynomial;
// past ln(FLT_MAX) the result is inf, as std::exp's (so silu(-inf) is NaN on every path);
// below -87.34 it is 0 (exp would be subnormal there, or exp(-inf) for a masked score).
inline __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);  // stays NaN, as std::exp
  const __mmask16 over = _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ);
  const __m512 x_in = x;
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
  const __m512 y = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n)), nan, x_in);
  return _mm512_mask_mov_ps(y, over, _mm512_set1_ps(std::numeric_limits<float>::infinity()));
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

// As geglu_f32_ref: u by the same float32 operations (no fused multiply-adds), then exp512.
void geglu_f32_avx512(const float* gate, const float* up, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), k0 = _mm512_set1_ps(kGeluK0), k1 = _mm512_set1_ps(kGeluK1);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(k, gate + i);
    const __m512 u = _mm512_mul_ps(k0, _mm512_add_ps(g, _mm512_mul_ps(k1, _mm512_mul_ps(_mm512_mul_ps(g, g), g))));
    const __m512 e = exp512(_mm512_mul_ps(_mm512_set1_ps(-2.0f), u));
    _mm512_mask_storeu_ps(out + i, k,
                          _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_maskz_loadu_ps(k, up + i)));
  }
}

void add_f32_avx512(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = lanes(n - i);
    _mm512_mask_storeu_ps(out + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i)));
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
    const __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_mask_storeu_epi16(dst + i, k, h);
  }
}

// v, kept in a register: GCC would otherwise fold a load of it into each of the multiply-adds
// that use it, as a memory operand, several loads where one will do (docs/tuning.md, "the key
// vector pinned in a register"). The value passes through a local, not an array element: an
// array's element in the asm operand keeps the whole array on the stack, stored and reloaded.
inline __m512 pinned(__m512 v) {
  __asm__("" : "+v"(v));
  return v;
}

// 16 cached elements from p[idx..] (masked) as float32, of the cache's type KT (KvType); for
// KV_Q8_0 the int8 elements, their scales applied by the caller.
template <int KT>
inline __m512 kv16(const void* p, int64_t idx, __mmask16 k) {
  if (KT == KV_F16) return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, static_cast<const fp16_t*>(p) + idx));
  if (KT == KV_Q8_0)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(k, static_cast<const int8_t*>(p) + idx)));
  return _mm512_maskz_loadu_ps(k, static_cast<const float*>(p) + idx);
}

// Scores of RG queries against NB consecutive key blocks from k (a float32 or float16 cache):
// s[r * ls + i], i over the NB * 16 positions. Each K vector load feeds RG multiply-adds, and
// each score is one multiply-add chain over d = 0..head_dim-1 in order, so its bits do not
// depend on RG or NB.
template <int RG, int NB, int KT, int FETCH>
inline void score_blocks(const AttnQueries<RG>& g, int64_t head_dim, const void* k, float scale, float* s, int64_t ls) {
  static_assert(KT != KV_Q8_0, "a Q8_0 cache's scores are score_blocks_q8's");
  __m512 acc[RG][NB];
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < NB; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    __m512 kv[NB];
    UNROLL for (int n = 0; n < NB; ++n) {
      kv[n] = pinned(kv16<KT>(k, (n * head_dim + d) * kKeyBlock, 0xffff));
      attn_fetch_ahead<FETCH>(k, (n * head_dim + d) * kKeyBlock * kv_elem_bytes(KT));
    }
    UNROLL for (int r = 0; r < RG; ++r) {
      const __m512 qd = _mm512_set1_ps(g.q[r][d]);
      UNROLL for (int n = 0; n < NB; ++n) acc[r][n] = _mm512_fmadd_ps(qd, kv[n], acc[r][n]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < NB; ++n)
      _mm512_storeu_ps(s + r * ls + n * kKeyBlock, _mm512_mul_ps(acc[r][n], sc));
}

// The RG queries of a group as scores against a KV_Q8_0 cache take them (attn_query_q16): each
// query's int16 elements (a pair of dimensions 2i, 2i + 1 read as one int32, the lower
// dimension in its low half) and its chunk scales.
template <int RG>
struct Q8Queries {
  alignas(64) int16_t qi[RG][kRopeMaxDim];
  float qd[RG][kRopeMaxDim / kKvQ8Chunk];
};
inline int32_t q16_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Scores of RG queries against NB consecutive key blocks from k of a KV_Q8_0 cache (the spec:
// kernels/abi.h, AttnTile): s[r * ls + i], i over the NB * 16 positions. Per 32-dimension chunk,
// integer sums: a block's rows of dimensions d and d + 1 (32 adjacent bytes) widened to int16
// and interleaved by position, so that int32 lane p holds position p's pair, then one vpdpwssd
// by the query's pair per query; then acc = fma(float(sum), qd * key scale, acc). ks: the
// scales of the blocks' first position, chunk c's at c * ks_stride.
template <int RG, int NB, int FETCH>
inline void score_blocks_q8(const Q8Queries<RG>& qs, int64_t head_dim, const void* k, float scale, float* s,
                            int64_t ls, const float* ks, int64_t ks_stride) {
  // Word 2p <- word p (dimension d, position p), word 2p + 1 <- word 16 + p (dimension d + 1).
  const __m512i by_position = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7,
                                               22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const auto* kb = static_cast<const int8_t*>(k);
  __m512 acc[RG][NB];
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < NB; ++n) acc[r][n] = _mm512_setzero_ps();
  for (int64_t c = 0; c < head_dim / kKvQ8Chunk; ++c) {
    __m512i sum[RG][NB];
    UNROLL for (int r = 0; r < RG; ++r)
      UNROLL for (int n = 0; n < NB; ++n) sum[r][n] = _mm512_setzero_si512();
    for (int64_t d = c * kKvQ8Chunk; d < (c + 1) * kKvQ8Chunk; d += 2) {
      __m512i kv[NB];
      UNROLL for (int n = 0; n < NB; ++n) {
        const int64_t at = (n * head_dim + d) * kKeyBlock;
        attn_fetch_ahead<FETCH>(kb, at);
        kv[n] = _mm512_permutexvar_epi16(
            by_position, _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(kb + at))));
      }
      UNROLL for (int r = 0; r < RG; ++r) {
        const __m512i qp = _mm512_set1_epi32(q16_pair(qs.qi[r] + d));
        UNROLL for (int n = 0; n < NB; ++n) sum[r][n] = _mm512_dpwssd_epi32(sum[r][n], kv[n], qp);
      }
    }
    __m512 sv[NB];
    UNROLL for (int n = 0; n < NB; ++n) sv[n] = _mm512_loadu_ps(ks + c * ks_stride + n * kKeyBlock);
    UNROLL for (int r = 0; r < RG; ++r) {
      const __m512 qd = _mm512_set1_ps(qs.qd[r][c]);
      UNROLL for (int n = 0; n < NB; ++n)
        acc[r][n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r][n]), _mm512_mul_ps(qd, sv[n]), acc[r][n]);
    }
  }
  const __m512 sc = _mm512_set1_ps(scale);
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int n = 0; n < NB; ++n)
      _mm512_storeu_ps(s + r * ls + n * kKeyBlock, _mm512_mul_ps(acc[r][n], sc));
}

// For positions j in [j0, j1]: acc[r] += p[r * ls + j - base] v[j] over output elements
// [i0, i0 + 16 C), masks m. With SOME, only the queries whose own range holds j add; a masked
// multiply-add leaves the others' sums exactly as if j were skipped. Each V vector load feeds
// RG multiply-adds; each sum is one chain over j in order. KV_Q8_0: vs holds the values'
// scales ([n_pos][head_dim / 32]), each value vector its int8 elements times theirs.
template <int RG, int C, int KT, int FETCH, bool SOME>
inline void weigh_range(__m512 (&acc)[RG][C], const AttnQueries<RG>& g, const float* p, int64_t ls, int64_t base,
                        const void* v, const float* vs, int64_t j0, int64_t j1, int64_t head_dim, int64_t i0,
                        const __mmask16 (&m)[C]) {
  for (int64_t j = j0; j <= j1; ++j) {
    const int64_t at = j * head_dim + i0;
    __m512 vv[C];
    UNROLL for (int c = 0; c < C; ++c) {
      const __m512 e = kv16<KT>(v, at + 16 * c, m[c]);
      attn_fetch_ahead<FETCH>(v, (at + 16 * c) * kv_elem_bytes(KT));
      vv[c] = pinned(KT == KV_Q8_0 ? _mm512_mul_ps(e, _mm512_set1_ps(vs[(at + 16 * c) / kKvQ8Chunk])) : e);
    }
    UNROLL for (int r = 0; r < RG; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * ls + j - base]);
      if (SOME) {
        const __mmask16 on = j >= g.first[r] && j <= g.last[r] ? 0xffff : 0;
        UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_mask3_fmadd_ps(pr, vv[c], acc[r][c], on);
      } else {
        UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(pr, vv[c], acc[r][c]);
      }
    }
  }
}

// out[r][i0 .. i0 + 16 C) = inv[r] * sum over j in first[r]..last[r] of p[r * ls + j - base] v[j].
// The positions all RG queries see go through the plain loop; rows of a tile that end (or,
// with a window, start) at different positions leave a few at either end for the masked one.
template <int RG, int C, int KT, int FETCH>
inline void weigh_values(const AttnQueries<RG>& g, const float* p, int64_t ls, int64_t base, const void* v,
                         const float* vs, int64_t head_dim, int64_t i0, const float* inv) {
  __mmask16 m[C];
  UNROLL for (int c = 0; c < C; ++c) m[c] = lanes(head_dim - i0 - 16 * c);
  __m512 acc[RG][C];
  UNROLL for (int r = 0; r < RG; ++r)
    UNROLL for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const AttnReach a = attn_reach(g);
  weigh_range<RG, C, KT, FETCH, true>(acc, g, p, ls, base, v, vs, a.lo, a.all_lo - 1, head_dim, i0, m);
  weigh_range<RG, C, KT, FETCH, false>(acc, g, p, ls, base, v, vs, a.all_lo, a.all_hi, head_dim, i0, m);
  weigh_range<RG, C, KT, FETCH, true>(acc, g, p, ls, base, v, vs, a.all_hi + 1, a.hi, head_dim, i0, m);
  UNROLL for (int r = 0; r < RG; ++r) {
    const __m512 iv = _mm512_set1_ps(inv[r]);
    UNROLL for (int c = 0; c < C; ++c)
      _mm512_mask_storeu_ps(g.out[r] + i0 + 16 * c, m[c], _mm512_mul_ps(acc[r][c], iv));
  }
}

// The steps of attention for RG queries of a tile, numbered from i0 row-major over (row, head)
// (see AttnTile); s: their rows of ls scores, from the first position of the span's block b0
// (the three steps AttnEntries, in attn_groups.h, takes). Scores against key blocks [bs, be)
// of the span b0..b1.
template <int KT, int FETCH>
struct Steps {
  template <int RG>
  static void scores(const AttnTile& t, int64_t i0, int64_t b0, int64_t b1, int64_t bs, int64_t be, float* s, int64_t ls) {
    const AttnQueries<RG> g = attn_queries<RG>(t, i0);
    // Enough blocks per pass for at least four independent chains (the multiply-add latency).
    constexpr int NB = RG >= 3 ? 2 : 4;
    if constexpr (KT == KV_Q8_0) {
      Q8Queries<RG> qs;
      for (int r = 0; r < RG; ++r) attn_query_q16(g.q[r], t.head_dim, qs.qi[r], qs.qd[r]);
      attn_key_blocks<NB>(t, b0, b1, bs, be, kv_elem_bytes(KT), [&](auto nb, const void* k, int64_t at) {
        score_blocks_q8<RG, decltype(nb)::value, FETCH>(qs, t.head_dim, k, t.scale, s + at, ls,
                                                        t.k_scale + b0 * kKeyBlock + at, t.k_scale_stride);
      });
    } else {
      attn_key_blocks<NB>(t, b0, b1, bs, be, kv_elem_bytes(KT), [&](auto nb, const void* k, int64_t at) {
        score_blocks<RG, decltype(nb)::value, KT, FETCH>(g, t.head_dim, k, t.scale, s + at, ls);
      });
    }
  }

  // exp(x - max) in place; returns their sum.
  static float exp_sum(float* p, int64_t n) { return exp_shift_sum(p, p, n, max_f32(p, n)); }

  // Output elements [c0, c1) (c0 a multiple of 16), 64 at a time: the weighted sums of V.
  template <int RG>
  static void weigh(const AttnTile& t, int64_t i0, int64_t b0, const float* s, int64_t ls, const float* inv, int64_t c0,
                  int64_t c1) {
    const AttnQueries<RG> g = attn_queries<RG>(t, i0);
    const int64_t base = b0 * kKeyBlock, hd = t.head_dim;
    for (int64_t i = c0; i < c1; i += 64) {
      const int64_t rest = c1 - i;
      if (rest > 48) weigh_values<RG, 4, KT, FETCH>(g, s, ls, base, t.v, t.v_scale, hd, i, inv);
      else if (rest > 32) weigh_values<RG, 3, KT, FETCH>(g, s, ls, base, t.v, t.v_scale, hd, i, inv);
      else if (rest > 16) weigh_values<RG, 2, KT, FETCH>(g, s, ls, base, t.v, t.v_scale, hd, i, inv);
      else weigh_values<RG, 1, KT, FETCH>(g, s, ls, base, t.v, t.v_scale, hd, i, inv);
    }
  }
};

// REUSE, ONCE: how the entries request keys and values ahead for a tile that reads them again
// or once (AttnTile::reads_once).
template <int REUSE, int ONCE>
void fill_attention(KernelSet& t) {
  attn_fill<Steps<KV_F32, REUSE>, Steps<KV_F32, ONCE>>(t, KV_F32);
  attn_fill<Steps<KV_F16, REUSE>, Steps<KV_F16, ONCE>>(t, KV_F16);
  attn_fill<Steps<KV_Q8_0, REUSE>, Steps<KV_Q8_0, ONCE>>(t, KV_Q8_0);
}

}  // namespace

void fill_ops_avx512(KernelSet& t, const KernelTuning& tuning) {
  t.rms_norm_f32 = rms_norm_f32_avx512;
  t.rope_f32 = rope_f32_avx512;
  t.swiglu_f32 = swiglu_f32_avx512;
  t.geglu_f32 = geglu_f32_avx512;
  t.add_f32 = add_f32_avx512;
  t.softmax_f32 = softmax_f32_avx512;
  t.f32_to_f16 = f32_to_f16_avx512;
  if (tuning.stream_fetch_ahead) fill_attention<FETCH_L1, FETCH_L2>(t);
  else fill_attention<FETCH_NONE, FETCH_NONE>(t);
}

}  // namespace pyinfer
