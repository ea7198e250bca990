// read_sum_avx2.cpp: the bandwidth probe's read loop on AVX2.
// This file alone is compiled with the AVX2 flags; nothing in it is called unless the
// active path has them.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "probes/probe_kernels.h"

namespace pyinfer {

// Sum of the buffer's 64-bit words modulo 2^64 (as the scalar one), from 32-byte loads into
// four independent accumulators so several cache-line misses are in flight at once.
uint64_t read_sum_avx2(const void* src, size_t n_bytes) {
  const auto* p = static_cast<const __m256i*>(src);
  const size_t n = n_bytes / 32;
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i + 0));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 1));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 2));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 3));
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i + 4));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + i + 5));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + i + 6));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + i + 7));
  }
  for (; i < n; ++i) a0 = _mm256_add_epi64(a0, _mm256_load_si256(p + i));
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  const __m128i t = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(t)) + static_cast<uint64_t>(_mm_extract_epi64(t, 1));
}

}  // namespace pyinfer
