// units_avx512.h: a 16-row group's quant columns and scales as the AVX-512 and AMX packed
// kernels unpack them (packed16.h's layout in, 64-byte columns of bytes out), and the per-call
// copy of a group's units. Included only by files compiled with the AVX-512 flags; everything
// here has internal linkage, so each such file keeps its own code.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "kernels/kquant_scales.h"
#include "kernels/packed16.h"

#ifndef PYINFER_INLINE
#define PYINFER_INLINE static inline __attribute__((always_inline))
#endif

namespace pyinfer {
namespace {

// Fifth bits of quant column g of Q5_0 and Q5_1 (bit g of each byte of the transposed word,
// packed16.h) as 16, from the 16 rows' word v. Shifts of 16-bit lanes: the mask keeps each
// byte's own bit.
PYINFER_INLINE __m512i fifth_bits(__m512i v, int g) {
  const __m512i b = g <= 4 ? _mm512_slli_epi16(v, 4 - g) : _mm512_srli_epi16(v, g - 4);
  return _mm512_and_si512(b, _mm512_set1_epi8(0x10));
}

// Unsigned quant column g of a 32-element group-block, as the dot product steps take it:
// Q8_0's bytes 4g..4g+3 (q + 128), the 4- and 5-bit types' elements 4g..4g+3.
PYINFER_INLINE __m512i q_column(int type, const uint8_t* gb, int g) {
  const int qo = packed_quants_offset(type);
  if (type_traits(type).qs_signed) return _mm512_loadu_si512(gb + qo + 64 * g);
  const __m512i v = _mm512_loadu_si512(gb + qo + 64 * (g % 4));  // high nibbles: elements 16..31
  __m512i q = _mm512_and_si512(g < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
  if (type_traits(type).quant_bits == 5)
    q = _mm512_or_si512(q, fifth_bits(_mm512_loadu_si512(gb + packed_qh_offset(type)), g));
  return q;
}

// 128 * h * q_w[jo] of a split activation block (q8_act.h) for the 16 rows: one more dot step
// on jo's quant column col, with h in jo's byte only. The stored offsets (Q8_0's 128, Q4_0's 8,

// Lane-wise 6-bit scale (mins: second = true) of sub-block s of Q4_K's (and Q5_K's) packed
// 12-byte field,
// whose three 4-byte columns are c0 (scales 0..3, top bits of 4..7), c1 (mins 0..3, top bits of
// 4..7), c2 (low 4 bits of scales 4..7 and, in the high nibbles, of mins 4..7).
PYINFER_INLINE __m512i k4_scale(__m512i c0, __m512i c1, __m512i c2, int s, bool second) {
  const __m512i six = _mm512_set1_epi32(63), four = _mm512_set1_epi32(15);
  const __m512i base = second ? c1 : c0;
  if (s < 4) return _mm512_and_si512(_mm512_srli_epi32(base, 8 * s), six);
  const int b = 8 * (s - 4);
  const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(c2, b + (second ? 4 : 0)), four);
  const __m512i hi = _mm512_slli_epi32(_mm512_srli_epi32(base, b + 6), 4);  // 2 bits: byte's top
  return _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi32(0x30)));
}

// Quant column c (elements 4c..4c+3, 16 rows) of 32-block s of a packed super-block, as
// unsigned bytes: Q4_K the nibble, Q5_K the 5-bit quant, Q6_K the 6-bit quant (offset 32
// still in).
PYINFER_INLINE __m512i k_column(int type, const uint8_t* gb, int s, int c) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  if (type != GGML_Q6_K) {
    const __m512i v = _mm512_loadu_si512(gb + packed_field(type, 3) + 64 * (8 * (s / 2) + c));
    const __m512i q = _mm512_and_si512(s % 2 == 0 ? v : _mm512_srli_epi16(v, 4), m4);
    if (type == GGML_Q4_K) return q;
    // Q5_K: bit s of each qh byte is the fifth bit of its element of sub-block s.
    return _mm512_or_si512(q, fifth_bits(_mm512_loadu_si512(gb + packed_field(GGML_Q5_K, 4) + 64 * c), s));
  }
  const int hf = s / 4, k = s % 4;
  const __m512i l = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 2) + 64 * (16 * hf + 8 * (k & 1) + c));
  const __m512i h = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 3) + 64 * (8 * hf + c));
  const __m512i lo = _mm512_and_si512(k < 2 ? l : _mm512_srli_epi16(l, 4), m4);
  // Bits 2k..2k+1 of each qh byte to bits 4..5 (shifts of 16-bit lanes: the mask keeps each
  // byte's own bits).
  const __m512i hs = k == 0   ? _mm512_slli_epi16(h, 4)
                     : k == 1 ? _mm512_slli_epi16(h, 2)
                     : k == 2 ? h
                              : _mm512_srli_epi16(h, 2);
  return _mm512_or_si512(lo, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)));
}

// Q6_K's int8 scale number t (0..15) of the 16 rows, sign-extended to int32 lanes.
PYINFER_INLINE __m512i k6_scale(const uint8_t* gb, int t) {
  const __m512i v = _mm512_loadu_si512(gb + packed_field(GGML_Q6_K, 1) + 64 * (t / 4));
  return _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * (t % 4)), 24);
}

// ---- a copy of each group's unpacked units ---------------------------------------------------
// With more activation rows than one tile takes, each tile of a group would unpack the same
// quant columns and scales again (a call of 64 prefill rows meets every group eight times). Instead the
// group is unpacked once per call into a per-thread buffer, one unit per 32-block: its eight
// quant columns (the bytes q_column and k_column give, 16 rows each), the row scale
// (K-quants: d times the sub-block's scale), and either the minimum factor (Q4_1, Q5_1: m;
// Q4_K, Q5_K: -(dmin * mn), as the scalar spec forms it) or Q6_K's two sub-block scales as
// int32. The tiles then read columns as Q8_0's read the group, with the scalar spec's float
// arithmetic per row and unit: the same results as the in-place tiles, bit for bit.
//
// The columns are unsigned, their stored offset in (the operand of vpdpbusd), or with signed
// set the quants themselves as int8, the offset (packed_quant_bias) taken off: the operand of
// AMX's signed dot products, which then need no correction through the activation sums.

constexpr int kUnitBytes = 8 * 64 + 3 * 64;  // columns; scale; minimum factor or Q6_K's two

PYINFER_INLINE __m512 negate(__m512 v) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN)));
}

// Writes the units of a group's nb 32-blocks (64-byte aligned dst), fetching the next group (pf,
// or nullptr) ahead as it goes.
PYINFER_INLINE void copy_units(int type, const uint8_t* group, int64_t nb, uint8_t* dst, const uint8_t* pf,
                               bool is_signed = false) {
  const int gbb = kPackRows * packed_block_bytes(type);
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(is_signed ? packed_quant_bias(type) : 0));
  const bool kq = type_traits(type).block_elems == QK_K;
  const int step = kq ? 8 : 1;  // 32-blocks per group-block
  for (int64_t i0 = 0; i0 < nb; i0 += step) {
    const uint8_t* gb = group + i0 / step * gbb;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb)));
    __m512 m = _mm512_setzero_ps();
    if (type_traits(type).has_min)  // Q4_1's and Q5_1's m, the K-quants' dmin
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + kPackedMins)));
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0;
    if (kq && type != GGML_Q6_K) {
      c0 = _mm512_loadu_si512(gb + packed_field(type, 2));
      c1 = _mm512_loadu_si512(gb + packed_field(type, 2) + 64);
      c2 = _mm512_loadu_si512(gb + packed_field(type, 2) + 128);
    }
#pragma GCC unroll 8
    for (int s = 0; s < step; ++s) {
      if (pf != nullptr) prefetch_part(pf, gbb, i0, s, step);
      uint8_t* u = dst + (i0 + s) * kUnitBytes;
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c)
        _mm512_store_si512(u + 64 * c, _mm512_sub_epi8(kq ? k_column(type, gb, s, c) : q_column(type, gb, c), bias));
      if (type == GGML_Q6_K) {
        _mm512_store_ps(u + 512, d);
        _mm512_store_si512(u + 576, k6_scale(gb, 2 * s));
        _mm512_store_si512(u + 640, k6_scale(gb, 2 * s + 1));
      } else if (kq) {
        _mm512_store_ps(u + 512, _mm512_mul_ps(d, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, false))));
        _mm512_store_ps(u + 576, negate(_mm512_mul_ps(m, _mm512_cvtepi32_ps(k4_scale(c0, c1, c2, s, true)))));
      } else {
        _mm512_store_ps(u + 512, d);
        if (type_traits(type).has_min) _mm512_store_ps(u + 576, m);  // read only where there is one
      }
    }
  }
}

}  // namespace
}  // namespace pyinfer
