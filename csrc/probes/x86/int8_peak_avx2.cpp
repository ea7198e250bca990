// int8_peak_avx2.cpp: the int8 peak probe's loop on AVX2 (vpmaddubsw).
// This file alone is compiled with the AVX2 flags; nothing in it is called unless the
// active path has them.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "probes/probe_kernels.h"

namespace pyinfer {

// vpmaddubsw on ymm, the AVX2 kernels' multiply-add step: 32 multiply-adds (u8 x s8, summed
// in pairs into int16 lanes); the widening that follows it in the kernels is left out.
int64_t int8_peak_avx2(int64_t n_iter, int32_t* sink) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi16(static_cast<int16_t>(i));
  __m256i x = _mm256_set1_epi8(5);
  for (int64_t it = 0; it < n_iter; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(acc[i], x));
    __asm__("" : "+x"(x));  // an opaque operand: the loop cannot be folded
  }
  __m256i r = acc[0];
  for (int i = 1; i < 12; ++i) r = _mm256_add_epi16(r, acc[i]);
  *sink = _mm256_extract_epi16(r, 0);
  return n_iter * 12 * 32;
}

}  // namespace pyinfer
