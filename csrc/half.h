// half.h: portable fp16/bf16 -> fp32 conversions (exact), usable from every ISA's files.
// static inline: each file keeps its own copy, so the linker can never hand the scalar path
// a copy compiled with AVX-512 flags (an ODR merge of inline functions would).
#pragma once
#include <cstdint>
#include <cstring>

namespace pyinfer {

static inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// IEEE binary16 to binary32, exact for normals, subnormals, infinities and NaNs.
static inline float fp16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));
  if (exp != 0) return bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float32.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

static inline float bf16_to_f32(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }

}  // namespace pyinfer
