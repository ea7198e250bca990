// quant_blocks.h: GGUF tensor types and their block structs, byte for byte as stored in the file.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pyinfer {

// ggml_type ids as written in a GGUF tensor-info record.
enum GgmlType : uint32_t {
  GGML_F32 = 0,
  GGML_F16 = 1,
  GGML_Q4_0 = 2,
  GGML_Q4_1 = 3,
  GGML_Q5_0 = 6,
  GGML_Q5_1 = 7,
  GGML_Q8_0 = 8,
  GGML_Q8_1 = 9,
  GGML_Q2_K = 10,
  GGML_Q3_K = 11,
  GGML_Q4_K = 12,
  GGML_Q5_K = 13,
  GGML_Q6_K = 14,
  GGML_Q8_K = 15,
  GGML_BF16 = 30,
  GGML_TYPE_SLOTS = 40,  // size of per-type tables indexed by the id
};

using fp16_t = uint16_t;  // IEEE half, raw bits
using bf16_t = uint16_t;  // bfloat16, raw bits

constexpr int QK4_0 = 32;
struct block_q4_0 {
  fp16_t d;            // scale
  uint8_t qs[QK4_0 / 2];  // low nibbles: elements 0..15, high nibbles: 16..31; value = (q - 8) * d
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 block size");

constexpr int QK4_1 = 32;
struct block_q4_1 {
  fp16_t d;            // scale
  fp16_t m;            // min; value = q * d + m
  uint8_t qs[QK4_1 / 2];  // same nibble order as q4_0
};
static_assert(sizeof(block_q4_1) == 20, "q4_1 block size");

constexpr int QK5_0 = 32;
struct block_q5_0 {
  fp16_t d;
  uint8_t qh[4];       // fifth bit of each element, bit i for element i
  uint8_t qs[QK5_0 / 2];  // value = ((nibble | high bit << 4) - 16) * d
};
static_assert(sizeof(block_q5_0) == 22, "q5_0 block size");

constexpr int QK8_0 = 32;
struct block_q8_0 {
  fp16_t d;
  int8_t qs[QK8_0];    // value = q * d
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 block size");

constexpr int QK_K = 256;   // super-block of the K-quants
constexpr int K_SCALE_SIZE = 12;
struct block_q4_K {
  fp16_t d;            // super-block scale for the 6-bit sub-block scales
  fp16_t dmin;         // super-block scale for the 6-bit sub-block mins
  uint8_t scales[K_SCALE_SIZE];  // 8 sub-blocks of 32: 6-bit scale and 6-bit min each, packed
  uint8_t qs[QK_K / 2];  // per 64 elements: 32 bytes, low nibbles first 32, high nibbles next 32
};
static_assert(sizeof(block_q4_K) == 144, "q4_K block size");

struct block_q6_K {
  uint8_t ql[QK_K / 2];      // low 4 bits
  uint8_t qh[QK_K / 4];      // high 2 bits
  int8_t scales[QK_K / 16];  // 16 sub-blocks of 16, 8-bit scales
  fp16_t d;                  // super-block scale; value = d * scale * (q - 32)
};
static_assert(sizeof(block_q6_K) == 210, "q6_K block size");

// Quant j (0..31) of a Q8_0, Q4_0 or Q4_1 block as stored: Q8_0's signed byte, Q4's nibble
// (0..15; Q4_0's offset of 8 still in it). static inline: every ISA's file keeps its own copy.
static inline int stored_quant(uint32_t type, const uint8_t* blk, int j) {
  if (type == GGML_Q8_0) return static_cast<int8_t>(blk[2 + j]);
  const uint8_t b = blk[(type == GGML_Q4_1 ? 4 : 2) + j % 16];
  return j < 16 ? (b & 0x0f) : (b >> 4);
}

// Elements per block and bytes per block of a type; {0, 0} for types pyinfer cannot hold.
struct TypeSize {
  int64_t block_elems;
  int64_t block_bytes;
};
TypeSize type_size(uint32_t type);

}  // namespace pyinfer
