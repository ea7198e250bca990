// kv_query.h: the query as the scores against a KV_Q8_0 cache's keys take it (kernels/abi.h,
// AttnTile): per 32 dimensions (kKvQ8Chunk, the keys' chunks), int16 elements and one float
// scale. Plain scalar code, the same operations on every ISA, so every path scores from the
// same integers; static inline, so each ISA's file keeps its own copy (as with half.h).
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/abi.h"

namespace pyinfer {

// The largest int16 element of a chunk: its largest |q_i| maps to it.
constexpr float kQueryQ16Max = 32767.0f;

// q[0..head_dim) (head_dim a multiple of kKvQ8Chunk) -> qi[head_dim] and qd[head_dim / 32]: in
// chunk c, with a its largest |q_i|, qi = nearbyint((q_i / a) * 32767) (|q_i / a| <= 1, so no
// element leaves int16's range, even for subnormal a) and qd[c] = a / 32767; q_i = qi * qd[c]
// to within qd[c] / 2 (and a rounding of the division). A chunk of zeros has qi = 0 and
// qd = 0. A chunk holding a NaN or an infinity has qi = 0 and qd = NaN: every score against it
// is NaN, on every path.
static inline void attn_query_q16(const float* q, int64_t head_dim, int16_t* qi, float* qd) {
  for (int64_t c = 0; c < head_dim / kKvQ8Chunk; ++c) {
    const float* x = q + c * kKvQ8Chunk;
    int16_t* o = qi + c * kKvQ8Chunk;
    float a = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kKvQ8Chunk; ++i) {
      const float v = std::fabs(x[i]);
      finite = finite && v <= std::numeric_limits<float>::max();
      a = v > a ? v : a;
    }
    if (!finite || a == 0.0f) {
      for (int64_t i = 0; i < kKvQ8Chunk; ++i) o[i] = 0;
      qd[c] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    for (int64_t i = 0; i < kKvQ8Chunk; ++i) o[i] = static_cast<int16_t>(std::nearbyint(x[i] / a * kQueryQ16Max));
    qd[c] = a / kQueryQ16Max;
  }
}

}  // namespace pyinfer
