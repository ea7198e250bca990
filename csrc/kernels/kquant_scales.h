// kquant_scales.h: unpacking of the 12-byte scale/min field of q4_K (and q5_K) super-blocks.
// static inline so each ISA's file keeps its own copy (no ODR merge across ISA flags).
#pragma once
#include <cstdint>

namespace pyinfer {

// Sub-block j (0..7) of a q4_K super-block has a 6-bit scale and a 6-bit min. Bytes 0..3 hold
// the scales of sub-blocks 0..3 in their low 6 bits, bytes 4..7 the mins of 0..3; sub-blocks
// 4..7 keep their low 4 bits in the nibbles of bytes 8..11 (scale low, min high) and their top
// 2 bits in the spare top bits of bytes 0..3 (scales) and 4..7 (mins).
static inline void kquant_scale_min(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// A little-endian fp16 scale that may sit at any address (blocks are 18, 20, 22 ... bytes).
static inline uint16_t load_u16_le(const void* p) {
  const auto* b = static_cast<const uint8_t*>(p);
  return static_cast<uint16_t>(b[0] | (b[1] << 8));
}

}  // namespace pyinfer
