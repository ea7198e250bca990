// q8_act.h: the block fast-mode matmul quantizes float32 activations into (not a GGUF type).
#pragma once
#include <cstdint>

namespace pyinfer {

constexpr int QK8_A = 32;
// 32 activations as int8 with a float32 scale and their integer sum. The sum lets a weight
// block with an offset fold it in without touching the quants: for Q4_1,
// sum_j (d_w*q_j + m_w) * d*a_j = d_w*d * sum_j q_j*a_j + m_w * (d * sum), and for Q4_0 and
// Q8_0 (stored as q+8 and q+128 unsigned for the u8 x s8 dot instructions) the offset times
// sum is an exact integer correction.
//
// Quantization (every path, bit for bit, and pyinfer.reference): amax = max |x_j|;
// d = amax / 127; id = amax != 0 ? 127 / amax : 0; a_j = round_half_even(x_j * id), which
// lies in [-127, 127]; sum = sum_j a_j. Non-finite activations are not supported.
struct block_q8a {
  float d;
  int32_t sum;
  int8_t qs[QK8_A];
};
static_assert(sizeof(block_q8a) == 40, "q8a block size");

}  // namespace pyinfer
