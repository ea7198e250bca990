// quant_blocks.h: GGUF tensor types, their block structs (byte for byte as stored in the file)
// and the per-type traits table every other file reads type facts from.
#pragma once
#include <array>
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
  GGML_I8 = 24,
  GGML_I16 = 25,
  GGML_I32 = 26,
  GGML_I64 = 27,
  GGML_F64 = 28,
  GGML_BF16 = 30,
  GGML_TYPE_SLOTS = 40,  // size of per-type tables indexed by the id
};

// The block structs below have alignment 1: a caller's buffer may hold blocks at any byte
// address (blocks are 18, 20, 22, ... bytes), and reading a field through a misaligned
// pointer of a wider alignment is undefined behaviour, even where x86 tolerates the load.
#if defined(__GNUC__)
#define PYINFER_BLOCK __attribute__((packed))
#else
#define PYINFER_BLOCK
#endif

using fp16_t = uint16_t;  // IEEE half, raw bits
using bf16_t = uint16_t;  // bfloat16, raw bits

constexpr int QK4_0 = 32;
struct PYINFER_BLOCK block_q4_0 {
  fp16_t d;               // scale
  uint8_t qs[QK4_0 / 2];  // low nibbles: elements 0..15, high nibbles: 16..31; value = (q - 8) * d
};
static_assert(sizeof(block_q4_0) == 18, "q4_0 block size");
static_assert(alignof(block_q4_0) == 1, "block_q4_0 at any address");

constexpr int QK4_1 = 32;
struct PYINFER_BLOCK block_q4_1 {
  fp16_t d;               // scale
  fp16_t m;               // min; value = q * d + m
  uint8_t qs[QK4_1 / 2];  // same nibble order as q4_0
};
static_assert(sizeof(block_q4_1) == 20, "q4_1 block size");
static_assert(alignof(block_q4_1) == 1, "block_q4_1 at any address");

constexpr int QK5_0 = 32;
struct PYINFER_BLOCK block_q5_0 {
  fp16_t d;
  uint8_t qh[4];          // fifth bit of each element, bit i for element i
  uint8_t qs[QK5_0 / 2];  // value = ((nibble | high bit << 4) - 16) * d
};
static_assert(sizeof(block_q5_0) == 22, "q5_0 block size");
static_assert(alignof(block_q5_0) == 1, "block_q5_0 at any address");

constexpr int QK5_1 = 32;
struct PYINFER_BLOCK block_q5_1 {
  fp16_t d;
  fp16_t m;  // value = (nibble | high bit << 4) * d + m
  uint8_t qh[4];
  uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(block_q5_1) == 24, "q5_1 block size");
static_assert(alignof(block_q5_1) == 1, "block_q5_1 at any address");

constexpr int QK8_0 = 32;
struct PYINFER_BLOCK block_q8_0 {
  fp16_t d;
  int8_t qs[QK8_0];  // value = q * d
};
static_assert(sizeof(block_q8_0) == 34, "q8_0 block size");
static_assert(alignof(block_q8_0) == 1, "block_q8_0 at any address");

constexpr int QK8_1 = 32;
struct PYINFER_BLOCK block_q8_1 {
  fp16_t d;
  fp16_t s;  // d * sum(qs), not a min
  int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36, "q8_1 block size");
static_assert(alignof(block_q8_1) == 1, "block_q8_1 at any address");

constexpr int QK_K = 256;  // super-block of the K-quants
constexpr int K_SCALE_SIZE = 12;
struct PYINFER_BLOCK block_q2_K {
  uint8_t scales[QK_K / 16];  // 16 sub-blocks of 16: 4-bit scale (low) and 4-bit min (high)
  uint8_t qs[QK_K / 4];       // 2-bit quants
  fp16_t d;
  fp16_t dmin;
};
static_assert(sizeof(block_q2_K) == 84, "q2_K block size");
static_assert(alignof(block_q2_K) == 1, "block_q2_K at any address");

struct PYINFER_BLOCK block_q3_K {
  uint8_t hmask[QK_K / 8];       // third bit of each quant
  uint8_t qs[QK_K / 4];          // low 2 bits
  uint8_t scales[K_SCALE_SIZE];  // 16 6-bit scales, packed
  fp16_t d;                      // value = d * (scale - 32) * (q - 4)
};
static_assert(sizeof(block_q3_K) == 110, "q3_K block size");
static_assert(alignof(block_q3_K) == 1, "block_q3_K at any address");

struct PYINFER_BLOCK block_q4_K {
  fp16_t d;                      // super-block scale for the 6-bit sub-block scales
  fp16_t dmin;                   // super-block scale for the 6-bit sub-block mins
  uint8_t scales[K_SCALE_SIZE];  // 8 sub-blocks of 32: 6-bit scale and 6-bit min each, packed
  uint8_t qs[QK_K / 2];          // per 64 elements: 32 bytes, low nibbles first 32, high nibbles next 32
};
static_assert(sizeof(block_q4_K) == 144, "q4_K block size");
static_assert(alignof(block_q4_K) == 1, "block_q4_K at any address");

struct PYINFER_BLOCK block_q5_K {
  fp16_t d;
  fp16_t dmin;
  uint8_t scales[K_SCALE_SIZE];  // as q4_K's
  uint8_t qh[QK_K / 8];          // fifth bit of each quant
  uint8_t qs[QK_K / 2];          // low 4 bits, as q4_K's
};
static_assert(sizeof(block_q5_K) == 176, "q5_K block size");
static_assert(alignof(block_q5_K) == 1, "block_q5_K at any address");

struct PYINFER_BLOCK block_q6_K {
  uint8_t ql[QK_K / 2];      // low 4 bits
  uint8_t qh[QK_K / 4];      // high 2 bits
  int8_t scales[QK_K / 16];  // 16 sub-blocks of 16, 8-bit scales
  fp16_t d;                  // super-block scale; value = d * scale * (q - 32)
};
static_assert(sizeof(block_q6_K) == 210, "q6_K block size");
static_assert(alignof(block_q6_K) == 1, "block_q6_K at any address");

struct PYINFER_BLOCK block_q8_K {
  float d;  // a float32 scale, unlike every other block
  int8_t qs[QK_K];
  int16_t bsums[QK_K / 16];  // sums of the quants in groups of 16
};
static_assert(sizeof(block_q8_K) == 292, "q8_K block size");
static_assert(alignof(block_q8_K) == 1, "block_q8_K at any address");

// ---- the traits table ------------------------------------------------------------------------

// What the code needs to know of a type's encoding. Kernels and drivers read these instead of
// writing sizes and offsets out; which kernels a type has is the kernel table's business
// (runtime/dispatch.h), not a trait.
struct TypeTraits {
  const char* name;  // as GGUF tools print it; nullptr for an id pyinfer does not know
  int block_elems;   // elements per block (1 for the plain types)
  int block_bytes;   // bytes per block
  int quant_bits;    // bits per element as stored (plain types: the element's bits)
  int qs_offset;     // byte offset of the quants (their low bits, where split) in a block
  int qs_bytes;      // bytes of them
  int d_offset;      // byte offset of the block's (super-block) scale d
  int m_offset;      // byte offset of its min (or the K-quants' dmin); -1 where it has none
  int q_bias;        // offset the stored quants carry: value = (q - q_bias) * scale (Q4_0: 8)
  int n_scales;      // scales per block (the K-quants' sub-block scales); 0 for plain types
  bool has_min;      // a min per (sub-)block added to q * scale: Q4_1, Q5_1, Q2_K, Q4_K, Q5_K
  bool qs_signed;    // stored as signed integers (the 8-bit types' quants; I8..I64)
  bool is_float;     // plain floating-point elements (F32, F16, BF16, F64)
};

namespace detail {

constexpr TypeTraits plain(const char* name, int bytes, bool is_float) {
  return {name, 1, bytes, 8 * bytes, 0, bytes, 0, -1, 0, 0, false, !is_float, is_float};
}

// Sizes and offsets given from the block's struct, so that they cannot drift from it.
constexpr TypeTraits block(const char* name, int elems, size_t bytes, int bits, size_t qs_offset, size_t qs_bytes,
                           size_t d_offset, long m_offset, int q_bias, int n_scales, bool qs_signed) {
  return {name,
          elems,
          static_cast<int>(bytes),
          bits,
          static_cast<int>(qs_offset),
          static_cast<int>(qs_bytes),
          static_cast<int>(d_offset),
          static_cast<int>(m_offset),
          q_bias,
          n_scales,
          m_offset >= 0,
          qs_signed,
          false};
}
#define PYINFER_AT(S, F) offsetof(S, F), sizeof(S::F)  // a field's offset and size

constexpr std::array<TypeTraits, GGML_TYPE_SLOTS> make_type_traits() {
  std::array<TypeTraits, GGML_TYPE_SLOTS> t{};
  t[GGML_F32] = plain("F32", 4, true);
  t[GGML_F16] = plain("F16", 2, true);
  t[GGML_BF16] = plain("BF16", 2, true);
  t[GGML_F64] = plain("F64", 8, true);
  t[GGML_I8] = plain("I8", 1, false);
  t[GGML_I16] = plain("I16", 2, false);
  t[GGML_I32] = plain("I32", 4, false);
  t[GGML_I64] = plain("I64", 8, false);
  // name, elements, bytes, bits, the quants' offset and size, d's offset, the min's offset,
  // q_bias, scales, signed quants
  t[GGML_Q4_0] =
      block("Q4_0", QK4_0, sizeof(block_q4_0), 4, PYINFER_AT(block_q4_0, qs), offsetof(block_q4_0, d), -1, 8, 1, false);
  t[GGML_Q4_1] = block("Q4_1", QK4_1, sizeof(block_q4_1), 4, PYINFER_AT(block_q4_1, qs), offsetof(block_q4_1, d),
                       offsetof(block_q4_1, m), 0, 1, false);
  t[GGML_Q5_0] = block("Q5_0", QK5_0, sizeof(block_q5_0), 5, PYINFER_AT(block_q5_0, qs), offsetof(block_q5_0, d), -1,
                       16, 1, false);
  t[GGML_Q5_1] = block("Q5_1", QK5_1, sizeof(block_q5_1), 5, PYINFER_AT(block_q5_1, qs), offsetof(block_q5_1, d),
                       offsetof(block_q5_1, m), 0, 1, false);
  t[GGML_Q8_0] =
      block("Q8_0", QK8_0, sizeof(block_q8_0), 8, PYINFER_AT(block_q8_0, qs), offsetof(block_q8_0, d), -1, 0, 1, true);
  t[GGML_Q8_1] =
      block("Q8_1", QK8_1, sizeof(block_q8_1), 8, PYINFER_AT(block_q8_1, qs), offsetof(block_q8_1, d), -1, 0, 1, true);
  t[GGML_Q2_K] = block("Q2_K", QK_K, sizeof(block_q2_K), 2, PYINFER_AT(block_q2_K, qs), offsetof(block_q2_K, d),
                       offsetof(block_q2_K, dmin), 0, QK_K / 16, false);
  t[GGML_Q3_K] = block("Q3_K", QK_K, sizeof(block_q3_K), 3, PYINFER_AT(block_q3_K, qs), offsetof(block_q3_K, d), -1, 4,
                       QK_K / 16, false);
  t[GGML_Q4_K] = block("Q4_K", QK_K, sizeof(block_q4_K), 4, PYINFER_AT(block_q4_K, qs), offsetof(block_q4_K, d),
                       offsetof(block_q4_K, dmin), 0, QK_K / 32, false);
  t[GGML_Q5_K] = block("Q5_K", QK_K, sizeof(block_q5_K), 5, PYINFER_AT(block_q5_K, qs), offsetof(block_q5_K, d),
                       offsetof(block_q5_K, dmin), 0, QK_K / 32, false);
  t[GGML_Q6_K] = block("Q6_K", QK_K, sizeof(block_q6_K), 6, PYINFER_AT(block_q6_K, ql), offsetof(block_q6_K, d), -1, 32,
                       QK_K / 16, false);
  t[GGML_Q8_K] =
      block("Q8_K", QK_K, sizeof(block_q8_K), 8, PYINFER_AT(block_q8_K, qs), offsetof(block_q8_K, d), -1, 0, 1, true);
  return t;
}
#undef PYINFER_AT

}  // namespace detail

// Indexed by ggml type id; an unknown id's entry is all zeros (name nullptr).
inline constexpr std::array<TypeTraits, GGML_TYPE_SLOTS> kTypeTraits = detail::make_type_traits();
inline constexpr TypeTraits kUnknownType{};

// static: every ISA's file keeps its own copy (no ODR merge across ISA flags).
static constexpr const TypeTraits& type_traits(uint32_t type) {
  return type < GGML_TYPE_SLOTS ? kTypeTraits[type] : kUnknownType;
}

namespace detail {
// A block type's entry agrees with itself: the quants lie inside the block and hold their low
// bits whole (8 for the 8-bit types, 4 for 4..6 bits, 2 for Q2_K and Q3_K, whose high bits
// sit elsewhere), and a block holds at least its quants' bits.
constexpr bool traits_consistent() {
  for (const TypeTraits& t : kTypeTraits) {
    if (t.name == nullptr || t.block_elems == 1) continue;
    const int low_bits = t.quant_bits >= 8 ? 8 : t.quant_bits >= 4 ? 4 : 2;
    if (t.qs_offset + t.qs_bytes > t.block_bytes || t.qs_bytes * 8 != t.block_elems * low_bits) return false;
    if (t.block_bytes * 8 < t.block_elems * t.quant_bits || t.n_scales < 1) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::traits_consistent(), "a block type's traits disagree with its struct");

// Quant j (0..31) of a Q8_0, Q4_0 or Q4_1 block as stored: Q8_0's signed byte, Q4's nibble
// (0..15; Q4_0's offset of 8 still in it). static inline: every ISA's file keeps its own copy.
static inline int stored_quant(uint32_t type, const uint8_t* blk, int j) {
  const TypeTraits& tt = type_traits(type);
  if (tt.qs_signed) return static_cast<int8_t>(blk[tt.qs_offset + j]);
  const uint8_t b = blk[tt.qs_offset + j % 16];
  return j < 16 ? (b & 0x0f) : (b >> 4);
}

// Elements per block and bytes per block of a type (from the traits); {0, 0} for ids pyinfer
// does not know.
struct TypeSize {
  int64_t block_elems;
  int64_t block_bytes;
};
static constexpr TypeSize type_size(uint32_t type) {
  return {type_traits(type).block_elems, type_traits(type).block_bytes};
}

}  // namespace pyinfer
