// int8_peak_avx512.cpp: the int8 peak probe's loop on AVX-512 VNNI (vpdpbusd).
// This file alone is compiled with the AVX-512 flags; nothing in it is called unless the
// active path has them.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "probes/probe_kernels.h"

namespace pyinfer {

// vpdpbusd on zmm: 64 multiply-adds (u8 x s8, summed in fours into int32 lanes).
int64_t int8_peak_avx512(int64_t n_iter, int32_t* sink) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  __m512i w = _mm512_set1_epi8(3), x = _mm512_set1_epi8(5);
  for (int64_t it = 0; it < n_iter; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
    __asm__("" : "+v"(w), "+v"(x));  // opaque operands: the loop cannot be folded
  }
  __m512i r = acc[0];
  for (int i = 1; i < 12; ++i) r = _mm512_add_epi32(r, acc[i]);
  // The lanes wrap after billions of steps: sum them as unsigned (a signed sum would be
  // undefined behaviour), the value only has to be kept.
  alignas(64) uint32_t lanes[16];
  _mm512_store_si512(lanes, r);
  uint32_t total = 0;
  for (uint32_t v : lanes) total += v;
  *sink = static_cast<int32_t>(total);
  return n_iter * 12 * 64;
}

}  // namespace pyinfer
