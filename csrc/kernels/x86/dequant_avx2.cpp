// dequant_avx2.cpp: AVX2+FMA+F16C dequantization kernels.
// This file alone is compiled with the AVX2 flags. Everything here except fill_dequant_avx2
// has internal linkage and no STL template is instantiated, so the linker cannot merge code
// compiled with these flags into a portable caller. Results match dequant_ref.cpp bit for bit.
#include <immintrin.h>

#include "kernels/abi.h"
#include "kernels/half.h"
#include "kernels/kquant_scales.h"

namespace pyinfer {
namespace {

// fp16 scale at any address -> float32. F16C quiets a signalling NaN, which the following
// multiply would do anyway, so every product matches the scalar path.
inline float scale_f32(const void* p) { return _cvtsh_ss(load_u16_le(p)); }

inline void store8(float* dst, __m256i q, __m256 d) { _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d)); }

// Bytes 0..7 (lo8) or 8..15 (hi8) of v, zero- (_u) or sign-extended (_s) to 8 int32.
inline __m256i lo8_u(__m128i v) { return _mm256_cvtepu8_epi32(v); }
inline __m256i hi8_u(__m128i v) { return _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)); }
inline __m256i lo8_s(__m128i v) { return _mm256_cvtepi8_epi32(v); }
inline __m256i hi8_s(__m128i v) { return _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)); }
// 8 bytes at p, zero-extended to 8 int32.
inline __m256i u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// 8 fp16 -> 8 float32, exactly as fp16_to_f32: F16C, except that NaNs keep their payload
// unquieted (F16C sets the quiet bit of a signalling NaN).
inline __m256 f16x8(__m128i h) {
  const __m256 f = _mm256_cvtph_ps(h);
  const __m256i w = _mm256_cvtepu16_epi32(h);
  const __m256i exp_mask = _mm256_set1_epi32(0x7c00);
  const __m256i exp_all_ones = _mm256_cmpeq_epi32(_mm256_and_si256(w, exp_mask), exp_mask);
  const __m256i special =
      _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x8000)), 16),
                                      _mm256_slli_epi32(_mm256_and_si256(w, _mm256_set1_epi32(0x03ff)), 13)),
                      _mm256_set1_epi32(0x7f800000));
  return _mm256_blendv_ps(f, _mm256_castsi256_ps(special), _mm256_castsi256_ps(exp_all_ones));
}

void dequant_f16_avx2(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i));
    _mm256_storeu_ps(dst + i, f16x8(v));
  }
  for (; i < n; ++i) dst[i] = fp16_to_f32(load_u16_le(h + 2 * i));
}

void dequant_bf16_avx2(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint8_t*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 2 * i));
    const __m256i w = _mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16);
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(w));
  }
  for (; i < n; ++i) dst[i] = bf16_to_f32(load_u16_le(h + 2 * i));
}

void dequant_q8_0_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t ib = 0; ib < n / QK8_0; ++ib, dst += QK8_0) {
    const __m256 d = _mm256_set1_ps(scale_f32(&b[ib].d));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs + 16));
    store8(dst + 0, lo8_s(q0), d);
    store8(dst + 8, hi8_s(q0), d);
    store8(dst + 16, lo8_s(q1), d);
    store8(dst + 24, hi8_s(q1), d);
  }
}

void dequant_q4_0_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_0*>(src);
  const __m128i m4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(type_traits(GGML_Q4_0).q_bias);
  for (int64_t ib = 0; ib < n / QK4_0; ++ib, dst += QK4_0) {
    const __m256 d = _mm256_set1_ps(scale_f32(&b[ib].d));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    // Low nibbles are elements 0..15, high nibbles 16..31.
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, m4), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), eight);
    store8(dst + 0, lo8_s(lo), d);
    store8(dst + 8, hi8_s(lo), d);
    store8(dst + 16, lo8_s(hi), d);
    store8(dst + 24, hi8_s(hi), d);
  }
}

void dequant_q4_1_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_1*>(src);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t ib = 0; ib < n / QK4_1; ++ib, dst += QK4_1) {
    const __m256 d = _mm256_set1_ps(scale_f32(&b[ib].d));
    const __m256 m = _mm256_set1_ps(scale_f32(&b[ib].m));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    const __m128i lo = _mm_and_si128(raw, m4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    const __m256i q[4] = {lo8_u(lo), hi8_u(lo), lo8_u(hi), hi8_u(hi)};
    for (int k = 0; k < 4; ++k)
      _mm256_storeu_ps(dst + 8 * k, _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(q[k]), d), m));
  }
}

void dequant_q5_0_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q5_0*>(src);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i one = _mm256_set1_epi32(1), sixteen = _mm256_set1_epi32(16);
  for (int64_t ib = 0; ib < n / QK5_0; ++ib, dst += QK5_0) {
    const __m256 d = _mm256_set1_ps(scale_f32(&b[ib].d));
    const uint8_t* h = b[ib].qh;
    const __m256i qh =
        _mm256_set1_epi32(static_cast<int>(h[0] | (h[1] << 8) | (h[2] << 16) | (static_cast<uint32_t>(h[3]) << 24)));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[ib].qs));
    const __m128i lo = _mm_and_si128(raw, m4);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    const __m256i nib[4] = {lo8_u(lo), hi8_u(lo), lo8_u(hi), hi8_u(hi)};
    for (int k = 0; k < 4; ++k) {
      // Bit 8k + lane of qh is the fifth bit of element 8k + lane.
      const __m256i shift = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * k));
      const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(qh, shift), one);
      const __m256i bit5 = _mm256_slli_epi32(bit, 4);
      store8(dst + 8 * k, _mm256_sub_epi32(_mm256_or_si256(nib[k], bit5), sixteen), d);
    }
  }
}

void dequant_q4_K_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q4_K*>(src);
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = scale_f32(&b[ib].d);
    const float dmin = scale_f32(&b[ib].dmin);
    const uint8_t* q = b[ib].qs;
    for (int j = 0; j < QK_K / 32; j += 2, q += 32, dst += 64) {
      int sc, mn;
      kquant_scale_min(b[ib].scales, j, &sc, &mn);
      const __m256 d1 = _mm256_set1_ps(d * sc), m1 = _mm256_set1_ps(dmin * mn);
      kquant_scale_min(b[ib].scales, j + 1, &sc, &mn);
      const __m256 d2 = _mm256_set1_ps(d * sc), m2 = _mm256_set1_ps(dmin * mn);
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i lo = _mm256_and_si256(raw, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
      const __m128i part[4] = {_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1), _mm256_castsi256_si128(hi),
                               _mm256_extracti128_si256(hi, 1)};
      for (int k = 0; k < 4; ++k) {
        const __m256 dk = k < 2 ? d1 : d2, mk = k < 2 ? m1 : m2;
        const __m256 a = _mm256_cvtepi32_ps(lo8_u(part[k]));
        const __m256 c = _mm256_cvtepi32_ps(hi8_u(part[k]));
        _mm256_storeu_ps(dst + 16 * k, _mm256_sub_ps(_mm256_mul_ps(dk, a), mk));
        _mm256_storeu_ps(dst + 16 * k + 8, _mm256_sub_ps(_mm256_mul_ps(dk, c), mk));
      }
    }
  }
}

void dequant_q6_K_avx2(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const block_q6_K*>(src);
  const __m256i m4 = _mm256_set1_epi32(0x0f), m30 = _mm256_set1_epi32(0x30);
  const __m256i bias = _mm256_set1_epi32(type_traits(GGML_Q6_K).q_bias);
  for (int64_t ib = 0; ib < n / QK_K; ++ib) {
    const float d = scale_f32(&b[ib].d);
    const uint8_t* ql = b[ib].ql;
    const uint8_t* qh = b[ib].qh;
    const int8_t* sc = b[ib].scales;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, dst += 128) {
      for (int l = 0; l < 32; l += 8) {
        const int is = l / 16;
        const __m256i a = u8x8(ql + l), c = u8x8(ql + l + 32), h = u8x8(qh + l);
        // Low 4 bits from a nibble of ql, bits 4..5 from bit pair k of qh.
        const __m256i h0 = _mm256_and_si256(_mm256_slli_epi32(h, 4), m30);
        const __m256i h1 = _mm256_and_si256(_mm256_slli_epi32(h, 2), m30);
        const __m256i h2 = _mm256_and_si256(h, m30);
        const __m256i h3 = _mm256_and_si256(_mm256_srli_epi32(h, 2), m30);
        const __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(a, m4), h0),
            _mm256_or_si256(_mm256_and_si256(c, m4), h1),
            _mm256_or_si256(_mm256_srli_epi32(a, 4), h2),
            _mm256_or_si256(_mm256_srli_epi32(c, 4), h3),
        };
        for (int k = 0; k < 4; ++k) {
          const __m256 ds = _mm256_set1_ps(d * sc[is + 2 * k]);
          store8(dst + l + 32 * k, _mm256_sub_epi32(q[k], bias), ds);
        }
      }
    }
  }
}

}  // namespace

void fill_dequant_avx2(KernelSet& t) {
  t.dequant_row[GGML_F16] = dequant_f16_avx2;
  t.dequant_row[GGML_BF16] = dequant_bf16_avx2;
  t.dequant_row[GGML_Q8_0] = dequant_q8_0_avx2;
  t.dequant_row[GGML_Q4_0] = dequant_q4_0_avx2;
  t.dequant_row[GGML_Q4_1] = dequant_q4_1_avx2;
  t.dequant_row[GGML_Q5_0] = dequant_q5_0_avx2;
  t.dequant_row[GGML_Q4_K] = dequant_q4_K_avx2;
  t.dequant_row[GGML_Q6_K] = dequant_q6_K_avx2;
}

}  // namespace pyinfer
