// q8_act.h: the block fast-mode matmul quantizes float32 activations into (not a GGUF type).
#pragma once
#include <cstdint>

namespace pyinfer {

constexpr int QK8_A = 32;

// 32 activations as integers a_j at one float32 scale d, with their integer sum. The sum lets a
// weight block with an offset fold it in without touching the quants: for Q4_1,
// sum_j (d_w*q_j + m_w) * d*a_j = d_w*d * sum_j q_j*a_j + m_w * (d * sum), and for Q4_0 and
// Q8_0 (stored as q+8 and q+128 unsigned for the u8 x s8 dot instructions) the offset times
// sum is an exact integer correction.
//
// The block's largest element (in magnitude; the first of equals), at index jo, does not set
// the scale: activations after RMSNorm carry a few channels tens of times larger than the
// rest, the same channels token after token, and a scale set by one of them would leave its 31
// neighbours one or two int8 levels. The scale comes from the others (or from the largest
// over 128 if that is larger), and the largest takes a_jo = 128 * h + l, l in [-64, 63]
// stored in qs[jo] with the others, h in [-127, 127] apart; a dot product adds
// 128 * h * q_w[jo] to the int8 one, exactly.
//
// Quantization (every path, bit for bit, and pyinfer.reference): m1 = max |x_j|, jo its
// first index, m2 = max over j != jo; amax = max(m2, m1 / 128); d = amax / 127;
// id = amax != 0 ? 127 / amax : 0; a_j = round_half_even(x_j * id), which lies in
// [-127, 127] for j != jo and in [-16256, 16256] for jo; sum = sum_j a_j. Non-finite
// activations are not supported.
struct block_q8a {
  float d;
  int32_t sum;
  int8_t qs[QK8_A];  // a_j, and l at jo
  int32_t h4;        // h in byte jo % 4, zero elsewhere: the broadcast operand of one dot step
  int32_t jo;
  float dsum;      // d * (float)sum: the factor of the min term (Q4_1, Q5_1, Q4_K, Q5_K), made once
  int32_t sum_lo;  // sum of a_j for j < 16 (a_jo whole): Q6_K's 16-element sub-blocks take their
                   // stored offset of 32 off through it and sum - sum_lo
};
static_assert(sizeof(block_q8a) == 56, "q8a block size");

// Splits a_jo into l (returned) and h.
static inline int act_split(int a, int* h) {
  const int l = ((a + 64) & 127) - 64;
  *h = (a - l) / 128;
  return l;
}

static inline int32_t act_h4(int h, int jo) {
  return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint8_t>(h)) << (8 * (jo % 4)));
}

// h of a block (0 when it is not split).
static inline int act_h(const block_q8a& b) { return static_cast<int8_t>(b.h4 >> (8 * (b.jo % 4))); }

// The block's amax from m1, its largest magnitude, and m2, the largest of the others; *split:
// whether the largest is kept apart.
static inline float act_amax(float m1, float m2, bool* split) {
  *split = m1 > 2.0f * m2;  // a clear outlier: the others set the scale
  return *split ? (m2 > m1 / 128.0f ? m2 : m1 / 128.0f) : m1;
}

// Every field but the quants, once they are written.
static inline void act_finish(block_q8a& b, float amax, int32_t sum, int32_t sum_lo, int h, int jo) {
  b.d = amax / 127.0f;
  b.sum = sum;
  b.sum_lo = sum_lo;
  b.h4 = act_h4(h, jo);
  b.jo = jo;
  b.dsum = b.d * static_cast<float>(sum);
}

}  // namespace pyinfer
