// rope_angles.h: the cos/sin of RoPE's angles for one position, shared by every ISA's rope.
// static inline and plain double math with libm calls: each ISA's copy computes the same
// bits, so the rotations that follow can match the scalar path exactly.
#pragma once
#include <cmath>
#include <cstdint>

namespace pyinfer {

// c[half], s[half] = cos, sin of theta_i = pos * freq_scale * base^(-2i / head_dim) / factors[i],
// i < half = head_dim/2 (factors nullptr: all 1). Computed in double and rounded once: the
// angle reaches thousands of radians at long contexts, where a float32 product would already
// be off by a large fraction of an ulp.
static inline void rope_cos_sin(int64_t pos, int64_t head_dim, float base, float freq_scale, const float* factors,
                                float* c, float* s) {
  const int64_t half = head_dim / 2;
  const double log_base = std::log(static_cast<double>(base));
  for (int64_t i = 0; i < half; ++i) {
    double inv_freq = std::exp(-2.0 * static_cast<double>(i) / static_cast<double>(head_dim) * log_base);
    if (factors != nullptr) inv_freq /= static_cast<double>(factors[i]);
    const double theta = static_cast<double>(pos) * static_cast<double>(freq_scale) * inv_freq;
    c[i] = static_cast<float>(std::cos(theta));
    s[i] = static_cast<float>(std::sin(theta));
  }
}

}  // namespace pyinfer
