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

static inline uint32_t f32_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// binary32 to binary16, rounded to nearest even (as F16C's vcvtps2ph with rounding 0 and as
// NumPy's astype(float16)): overflow to +-inf, gradual underflow to subnormals. A NaN stays a
// NaN with the quiet bit set and the top of its payload kept.
static inline uint16_t f32_to_fp16(float f) {
  const uint32_t u = f32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (a < 0x38800000u) {
    // Below 2^-14: adding 0.5 leaves the float's ulp at 2^-24, the fp16 subnormal step, so
    // the add itself rounds to nearest even; the mantissa bits are then the fp16 bits.
    const float r = bits_to_f32(a) + 0.5f;
    return static_cast<uint16_t>(sign | (f32_to_bits(r) - 0x3f000000u));
  }
  // Normal: rebias the exponent (127 -> 15), round the 13 dropped bits to nearest even.
  const uint32_t odd = (a >> 13) & 1u;
  const uint32_t r = a - (112u << 23) + 0xfffu + odd;
  return static_cast<uint16_t>(sign | (r >> 13));
}

}  // namespace pyinfer
