// packed16.h: the 16-row interleaved weight layout of the int8 fast GEMV/GEMM (Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
//
// Rows are taken 16 at a time (N is padded with zero rows to a multiple of 16). For each
// block index b of a group, the 16 rows' blocks are stored together, in the same number of
// bytes as the 16 blocks as stored in GGUF (16 * block bytes): the block's fields one after
// the other (pack_layout below), each as units of 2 or 4 bytes, unit u of row r at
// field + u * 16 * unit bytes + r * unit bytes. So an fp16 scale (one unit of 2) becomes
// d[16], one 32-byte vector whose lane r is row r; and quant bytes (units of 4) become
// 64-byte columns, column c holding bytes 4c..4c+3 of each row, row r at 4r: one zmm, whose
// int32 lane r belongs to row r. One broadcast of 4 activation bytes then feeds a dot
// product step of 16 rows at once, and 16 scales convert with one instruction.
//
// Two fields change on the way: Q8_0's signed quants are stored as q + 128 (unsigned, the
// operand order of vpdpbusd), and Q5_0's and Q5_1's fifth bits are transposed (bit g of byte
// k of a row's word is the fifth bit of element 4g + k, the element of byte k of quant column
// g), so that column g's fifth bits are bit g of each byte, as Q5_K's already are.
#pragma once
#include <cstdint>
#include <cstdlib>

#include "kernels/quant_blocks.h"

namespace pyinfer {

constexpr int kPackRows = 16;

enum PackTransform : int { PACK_COPY = 0, PACK_FLIP = 1, PACK_QH_T = 2 };

// One field of a block: its offset in the stored block, its units and their size.
struct PackField {
  int offset;
  int units;
  int unit_bytes;
  int transform;  // PackTransform
};
constexpr int kMaxPackFields = 5;
struct PackLayout {
  int n_fields;  // 0: the type has no packed layout
  PackField f[kMaxPackFields];
};

// Field order in a group-block. Scales come first, then the bits a dot product step reads.
static constexpr PackLayout pack_layout(uint32_t type) {
  switch (type) {
    case GGML_Q8_0: return {2, {{0, 1, 2, 0}, {2, 8, 4, PACK_FLIP}}};                              // d, qs
    case GGML_Q4_0: return {2, {{0, 1, 2, 0}, {2, 4, 4, 0}}};                                      // d, qs
    case GGML_Q4_1: return {3, {{0, 1, 2, 0}, {2, 1, 2, 0}, {4, 4, 4, 0}}};                        // d, m, qs
    case GGML_Q5_0: return {3, {{0, 1, 2, 0}, {6, 4, 4, 0}, {2, 1, 4, PACK_QH_T}}};                // d, qs, qh
    case GGML_Q5_1: return {4, {{0, 1, 2, 0}, {2, 1, 2, 0}, {8, 4, 4, 0}, {4, 1, 4, PACK_QH_T}}};  // d, m, qs, qh
    case GGML_Q4_K: return {4, {{0, 1, 2, 0}, {2, 1, 2, 0}, {4, 3, 4, 0}, {16, 32, 4, 0}}};  // d, dmin, scales, qs
    case GGML_Q5_K: return {5, {{0, 1, 2, 0}, {2, 1, 2, 0}, {4, 3, 4, 0}, {48, 32, 4, 0}, {16, 8, 4, 0}}};  // + qh
    case GGML_Q6_K: return {4, {{208, 1, 2, 0}, {192, 4, 4, 0}, {0, 32, 4, 0}, {128, 16, 4, 0}}};  // d, scales, ql, qh
    default: return {0, {}};
  }
}

// Each layout's fields lie inside the block and add up to it: the packed copy holds every
// byte of the stored one, in the same room. Units are 2 or 4 bytes (the repack copies them at
// those two sizes); only 4-byte units are transformed.
static constexpr bool pack_layouts_cover_blocks() {
  for (uint32_t t = 0; t < GGML_TYPE_SLOTS; ++t) {
    const PackLayout l = pack_layout(t);
    int bytes = 0;
    for (int i = 0; i < l.n_fields; ++i) {
      if (l.f[i].unit_bytes != 2 && l.f[i].unit_bytes != 4) return false;
      if (l.f[i].unit_bytes == 2 && l.f[i].transform != PACK_COPY) return false;
      const int n = l.f[i].units * l.f[i].unit_bytes;
      if (l.f[i].offset + n > type_traits(t).block_bytes) return false;
      bytes += n;
    }
    if (l.n_fields > 0 && bytes != type_traits(t).block_bytes) return false;
  }
  return true;
}
static_assert(pack_layouts_cover_blocks(), "a packed layout's fields do not cover its block");

// Offset of field i in a group-block.
static constexpr int packed_field(uint32_t type, int i) {
  const PackLayout l = pack_layout(type);
  int o = 0;
  for (int j = 0; j < i; ++j) o += kPackRows * l.f[j].units * l.f[j].unit_bytes;
  return o;
}

// The types with this layout.
static constexpr bool packs16(uint32_t type) { return pack_layout(type).n_fields > 0; }
// Bytes of one block of one row, for the packable types; 0 otherwise.
static constexpr int packed_block_bytes(uint32_t type) { return packs16(type) ? type_traits(type).block_bytes : 0; }
// Offset of the mins in a 16-row group-block of Q4_1 and Q5_1: after the scales.
constexpr int kPackedMins = kPackRows * static_cast<int>(sizeof(fp16_t));
// Offset of the (low) quants in a group-block of the 32-element types.
static constexpr int packed_quants_offset(uint32_t type) {
  return packed_field(type, type_traits(type).has_min ? 2 : 1);
}
// Offset of the fifth bits in a group-block of Q5_0 and Q5_1.
static constexpr int packed_qh_offset(uint32_t type) { return packed_field(type, type_traits(type).has_min ? 3 : 2); }
// Offset in a group-block of quant byte j (0..15 for Q4, 0..31 for Q8_0) of row r.
static inline int packed_quant_byte(uint32_t type, int r, int j) {
  return packed_quants_offset(type) + (j / 4) * 64 + r * 4 + j % 4;
}
// The offset a packed quant carries: Q8_0's signed quants are stored as q + 128, Q4_0's and
// Q5_0's keep the file's 8 and 16.
static constexpr int packed_quant_bias(uint32_t type) {
  return type_traits(type).qs_signed ? 128 : type_traits(type).q_bias;
}

// Q5's fifth-bit word: bit 4g + k (element 4g + k) <-> bit 8k + g, and back.
static inline uint32_t qh_transpose(uint32_t v) {
  uint32_t t = 0;
  for (int g = 0; g < 8; ++g)
    for (int k = 0; k < 4; ++k) t |= ((v >> (4 * g + k)) & 1u) << (8 * k + g);
  return t;
}
static inline uint32_t qh_untranspose(uint32_t t) {
  uint32_t v = 0;
  for (int g = 0; g < 8; ++g)
    for (int k = 0; k < 4; ++k) v |= ((t >> (8 * k + g)) & 1u) << (4 * g + k);
  return v;
}

// Row r's block, as stored in GGUF, from its place in group-block gb (the inverse of the
// repack; also how the scalar spec reads the packed layout).
static inline void packed_to_block(uint32_t type, const uint8_t* gb, int r, uint8_t* blk) {
  const PackLayout l = pack_layout(type);
  for (int i = 0, go = 0; i < l.n_fields; ++i) {
    const PackField& f = l.f[i];
    for (int u = 0; u < f.units; ++u) {
      const uint8_t* s = gb + go + (u * kPackRows + r) * f.unit_bytes;
      uint8_t* d = blk + f.offset + u * f.unit_bytes;
      if (f.unit_bytes == 2) {
        d[0] = s[0];
        d[1] = s[1];
        continue;
      }
      uint32_t v = static_cast<uint32_t>(s[0] | (s[1] << 8) | (s[2] << 16)) | (static_cast<uint32_t>(s[3]) << 24);
      if (f.transform == PACK_FLIP) v ^= 0x80808080u;
      if (f.transform == PACK_QH_T) v = qh_untranspose(v);
      for (int k = 0; k < 4; ++k) d[k] = static_cast<uint8_t>(v >> (8 * k));
    }
    go += kPackRows * f.units * f.unit_bytes;
  }
}

// The next group's lines for part s of its group-block i0 / step (step parts per group-block:
// a K-quant super-block's eight 32-blocks), requested ahead into L2 (locality 2, x86's T1) by
// the tile working on part s of the current group: a super-block's lines in eight parts, since
// one burst of all of them waited on the fill buffers (docs/tuning.md, "fetched ahead in eight
// parts").
static inline void prefetch_part(const uint8_t* pf, int gbb, int64_t i0, int s, int step) {
  const int from = (s * gbb / step + 63) / 64 * 64, to = ((s + 1) * gbb / step + 63) / 64 * 64;
  for (int o = from; o < to; o += 64) __builtin_prefetch(pf + i0 / step * gbb + o, 0, 2);
}

// The SIMD kernels' copy of one group's unpacked units for a call's tiles, per thread: grown
// as needed, never shrunk. In an unnamed namespace, so that each ISA's file, compiled with its
// own flags, keeps its own code, and the linker cannot hand one file's to another's callers.
namespace {
struct UnitBuffer {
  uint8_t* p = nullptr;
  int64_t cap = 0;
  ~UnitBuffer() { std::free(p); }
  uint8_t* get(int64_t n) {
    if (n > cap) {
      std::free(p);
      cap = (n + 4095) / 4096 * 4096;
      p = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(cap)));
      if (p == nullptr) cap = 0;
    }
    return p;
  }
};
}  // namespace

}  // namespace pyinfer
