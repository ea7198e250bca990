// dequant_avx512.cpp: AVX-512 (F, BW, VL, DQ) dequantization kernels.
// This file alone is compiled with the AVX-512 flags. Everything here except
// fill_dequant_avx512 has internal linkage and no STL template is instantiated, so the linker
// cannot merge code compiled with these flags into a portable caller. Results match
// dequant_ref.cpp bit for bit.
#include <immintrin.h>

#include "kernels/abi.h"
#include "kernels/half.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {
namespace {

// fp16 scale at any address -> float32. F16C quiets a signalling NaN, which the following
// multiply would do anyway, so every product matches the scalar path.
inline float scale_f32(const void* p) { return _cvtsh_ss(load_u16_le(p)); }

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline void store16(float* dst, __m512i q, __m512 d) { _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d)); }

// Mask of the first r (< 16) lanes.
inline __mmask16 first_lanes(int64_t r) { return static_cast<__mmask16>((1u << r) - 1); }

// 16 fp16 -> 16 float32, exactly as fp16_to_f32: F16C, except that NaNs keep their payload
// unquieted (F16C sets the quiet bit of a signalling NaN).
inline __m512 f16x16(__m256i h) {
  const __m512 f = _mm512_cvtph_ps(h);
  const __m512i w = _mm512_cvtepu16_epi32(h);
  const __m512i exp_mask = _mm512_set1_epi32(0x7c00);
  const __mmask16 exp_all_ones = _mm512_cmpeq_epi32_mask(_mm512_and_si512(w, exp_mask), exp_mask);
  const __m512i special =
      _mm512_or_si512(_mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x8000)), 16),
                                      _mm512_slli_epi32(_mm512_and_si512(w, _mm512_set1_epi32(0x03ff)), 13)),
                      _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_mov_ps(f, exp_all_ones, _mm512_castsi512_ps(special));
}

inline __m512 bf16x16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

void dequant_f16_avx512(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, f16x16(load32(h + 2 * i)));
  if (i < n) {
    const __mmask16 k = first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, k, f16x16(_mm256_maskz_loadu_epi16(k, h + 2 * i)));
  }
}

void dequant_bf16_avx512(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, bf16x16(load32(h + 2 * i)));
  if (i < n) {
    const __mmask16 k = first_lanes(n - i);
    _mm512_mask_storeu_ps(dst + i, k, bf16x16(_mm256_maskz_loadu_epi16(k, h + 2 * i)));
  }
}

void dequant_q8_0_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t ib = 0; ib < n / QK8_0; ++ib, dst += QK8_0) {
    const __m512 d = _mm512_set1_ps(scale_f32(&b[ib].d));
    store16(dst + 0, _mm512_cvtepi8_epi32(load16(b[ib].qs)), d);
    store16(dst + 16, _mm512_cvtepi8_epi32(load16(b[ib].qs + 16)), d);
  }
}

void dequant_q4_0_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_0*>(src);
  const __m512i m4 = _mm512_set1_epi32(0x0f), eight = _mm512_set1_epi32(type_traits(GGML_Q4_0).q_bias);
  for (int64_t ib = 0; ib < n / QK4_0; ++ib, dst += QK4_0) {
    const __m512 d = _mm512_set1_ps(scale_f32(&b[ib].d));
    const __m512i w = _mm512_cvtepu8_epi32(load16(b[ib].qs));
    store16(dst + 0, _mm512_sub_epi32(_mm512_and_si512(w, m4), eight), d);   // low nibbles
    store16(dst + 16, _mm512_sub_epi32(_mm512_srli_epi32(w, 4), eight), d);  // high nibbles
  }
}

void dequant_q4_1_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_1*>(src);
  const __m512i m4 = _mm512_set1_epi32(0x0f);
  for (int64_t ib = 0; ib < n / QK4_1; ++ib, dst += QK4_1) {
    const __m512 d = _mm512_set1_ps(scale_f32(&b[ib].d));
    const __m512 m = _mm512_set1_ps(scale_f32(&b[ib].m));
    const __m512i w = _mm512_cvtepu8_epi32(load16(b[ib].qs));
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(w, m4));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(w, 4));
    _mm512_storeu_ps(dst + 0, _mm512_add_ps(_mm512_mul_ps(lo, d), m));
    _mm512_storeu_ps(dst + 16, _mm512_add_ps(_mm512_mul_ps(hi, d), m));
  }
}

void dequant_q5_0_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q5_0*>(src);
  const __m512i m4 = _mm512_set1_epi32(0x0f), sixteen = _mm512_set1_epi32(16);
  for (int64_t ib = 0; ib < n / QK5_0; ++ib, dst += QK5_0) {
    const __m512 d = _mm512_set1_ps(scale_f32(&b[ib].d));
    const uint8_t* h = b[ib].qh;
    // Bit i of qh is the fifth bit of element i: the two halves are lane masks as they are.
    const auto h_lo = static_cast<__mmask16>(h[0] | (h[1] << 8));
    const auto h_hi = static_cast<__mmask16>(h[2] | (h[3] << 8));
    const __m512i w = _mm512_cvtepu8_epi32(load16(b[ib].qs));
    __m512i lo = _mm512_and_si512(w, m4);
    __m512i hi = _mm512_srli_epi32(w, 4);
    lo = _mm512_mask_or_epi32(lo, h_lo, lo, sixteen);
    hi = _mm512_mask_or_epi32(hi, h_hi, hi, sixteen);
    store16(dst + 0, _mm512_sub_epi32(lo, sixteen), d);
    store16(dst + 16, _mm512_sub_epi32(hi, sixteen), d);
  }
}

void dequant_q4_K_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_K*>(src);
  const __m512i m4 = _mm512_set1_epi32(0x0f);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = scale_f32(&b[ib].d);
    const float dmin = scale_f32(&b[ib].dmin);
    const uint8_t* q = b[ib].qs;
    for (int j = 0; j < QK_K / 32; j += 2, q += 32, dst += 64) {
      int sc, mn;
      kquant_scale_min(b[ib].scales, j, &sc, &mn);
      const __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * mn);
      kquant_scale_min(b[ib].scales, j + 1, &sc, &mn);
      const __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * mn);
      const __m512i w0 = _mm512_cvtepu8_epi32(load16(q));
      const __m512i w1 = _mm512_cvtepu8_epi32(load16(q + 16));
      const __m512 q0 = _mm512_cvtepi32_ps(_mm512_and_si512(w0, m4));
      const __m512 q1 = _mm512_cvtepi32_ps(_mm512_and_si512(w1, m4));
      const __m512 q2 = _mm512_cvtepi32_ps(_mm512_srli_epi32(w0, 4));
      const __m512 q3 = _mm512_cvtepi32_ps(_mm512_srli_epi32(w1, 4));
      _mm512_storeu_ps(dst + 0, _mm512_sub_ps(_mm512_mul_ps(d1, q0), m1));
      _mm512_storeu_ps(dst + 16, _mm512_sub_ps(_mm512_mul_ps(d1, q1), m1));
      _mm512_storeu_ps(dst + 32, _mm512_sub_ps(_mm512_mul_ps(d2, q2), m2));
      _mm512_storeu_ps(dst + 48, _mm512_sub_ps(_mm512_mul_ps(d2, q3), m2));
    }
  }
}

void dequant_q6_K_avx512(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q6_K*>(src);
  const __m512i m4 = _mm512_set1_epi32(0x0f), m30 = _mm512_set1_epi32(0x30);
  const __m512i bias = _mm512_set1_epi32(type_traits(GGML_Q6_K).q_bias);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = scale_f32(&b[ib].d);
    const uint8_t* ql = b[ib].ql;
    const uint8_t* qh = b[ib].qh;
    const int8_t* sc = b[ib].scales;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; l += 16) {
        const int is = l / 16;
        const __m512i a = _mm512_cvtepu8_epi32(load16(ql + l));
        const __m512i c = _mm512_cvtepu8_epi32(load16(ql + l + 32));
        const __m512i h = _mm512_cvtepu8_epi32(load16(qh + l));
        // Low 4 bits from a nibble of ql, bits 4..5 from bit pair k of qh.
        const __m512i h0 = _mm512_and_si512(_mm512_slli_epi32(h, 4), m30);
        const __m512i h1 = _mm512_and_si512(_mm512_slli_epi32(h, 2), m30);
        const __m512i h2 = _mm512_and_si512(h, m30);
        const __m512i h3 = _mm512_and_si512(_mm512_srli_epi32(h, 2), m30);
        const __m512i q[4] = {
            _mm512_or_si512(_mm512_and_si512(a, m4), h0),
            _mm512_or_si512(_mm512_and_si512(c, m4), h1),
            _mm512_or_si512(_mm512_srli_epi32(a, 4), h2),
            _mm512_or_si512(_mm512_srli_epi32(c, 4), h3),
        };
        for (int k = 0; k < 4; ++k) {
          const __m512 ds = _mm512_set1_ps(d * sc[is + 2 * k]);
          store16(dst + l + 32 * k, _mm512_sub_epi32(q[k], bias), ds);
        }
      }
    }
  }
}

}  // namespace

void fill_dequant_avx512(KernelSet& t) {
  t.dequant_row[GGML_F16] = dequant_f16_avx512;
  t.dequant_row[GGML_BF16] = dequant_bf16_avx512;
  t.dequant_row[GGML_Q8_0] = dequant_q8_0_avx512;
  t.dequant_row[GGML_Q4_0] = dequant_q4_0_avx512;
  t.dequant_row[GGML_Q4_1] = dequant_q4_1_avx512;
  t.dequant_row[GGML_Q5_0] = dequant_q5_0_avx512;
  t.dequant_row[GGML_Q4_K] = dequant_q4_K_avx512;
  t.dequant_row[GGML_Q6_K] = dequant_q6_K_avx512;
}

}  // namespace pyinfer
