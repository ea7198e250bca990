// packed16.h: the 16-row interleaved weight layout of Q8_0, Q4_0 and Q4_1 for the fast GEMV.
//
// Rows are taken 16 at a time (N is padded with zero rows to a multiple of 16). For each
// block index b of a group, the 16 rows' blocks are stored together, in the same number of
// bytes as the 16 blocks as stored in GGUF (16 * block bytes):
//   d[16]   fp16 scales, row r at 2r;
//   m[16]   fp16 mins (Q4_1 only);
//   quants  in 4-byte columns: column c (c = 0..3 for Q4, 0..7 for Q8_0) holds bytes
//           4c..4c+3 of each row's quants, row r at 4r: 64 bytes, one zmm, whose int32 lane r
//           belongs to row r. Q4 bytes keep their nibbles (low: element j, high: j + 16);
//           Q8_0 bytes are stored as q + 128 (unsigned), the operand order of vpdpbusd.
// So one broadcast of 4 activation bytes feeds a dot product step of 16 rows at once, and a
// block's 16 scales convert with one instruction.
#pragma once
#include <cstdint>

#include "kernels/quant_blocks.h"

namespace pyinfer {

constexpr int kPackRows = 16;

// The types with this layout: 32-element blocks that open with an fp16 scale (and min).
static inline bool packs16(uint32_t type) { return type == GGML_Q8_0 || type == GGML_Q4_0 || type == GGML_Q4_1; }
// Bytes of one block (of 32 elements) of one row, for the packable types; 0 otherwise.
static inline int packed_block_bytes(uint32_t type) { return packs16(type) ? type_traits(type).block_bytes : 0; }
// Offset of the mins in a 16-row group-block: after the scales.
constexpr int kPackedMins = kPackRows * static_cast<int>(sizeof(fp16_t));
// Offset of the quants in a 16-row group-block: after the scales (and mins).
static inline int packed_quants_offset(uint32_t type) {
  return type_traits(type).has_min ? 2 * kPackedMins : kPackedMins;
}
// Offset in a group-block of quant byte j (0..15 for Q4, 0..31 for Q8_0) of row r.
static inline int packed_quant_byte(uint32_t type, int r, int j) {
  return packed_quants_offset(type) + (j / 4) * 64 + r * 4 + j % 4;
}
// The offset a packed quant carries: Q8_0's signed quants are stored as q + 128, Q4_0's keep
// the file's 8.
static inline int packed_quant_bias(uint32_t type) {
  return type_traits(type).qs_signed ? 128 : type_traits(type).q_bias;
}

}  // namespace pyinfer
