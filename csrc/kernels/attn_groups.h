// attn_groups.h: the ISA-independent part of the SIMD attention kernels (dispatch.h, AttnTile):
// how a tile's queries form register groups, what each query of a group reads and writes, and
// which key blocks the tile spans. The functions are static and the struct has no code, so
// every ISA's file keeps its own copy (as with half.h).
#pragma once
#include <cstdint>

#include "dispatch.h"

namespace pyinfer {

// The queries of one register group of a tile: where each reads and writes, and the positions
// it sees.
template <int RG>
struct AttnQueries {
  const float* q[RG];
  float* out[RG];
  int64_t first[RG], last[RG];
};

// Queries i0..i0 + RG - 1 of the tile, numbered row-major over (row, head).
template <int RG>
static inline AttnQueries<RG> attn_queries(const AttnTile& t, int64_t i0) {
  AttnQueries<RG> g;
  for (int r = 0; r < RG; ++r) {
    const int64_t row = (i0 + r) / t.n_heads, h = (i0 + r) % t.n_heads;
    g.q[r] = t.q + row * t.q_stride + h * t.head_dim;
    g.out[r] = t.out + row * t.out_stride + h * t.head_dim;
    g.first[r] = attn_first(t, row);
    g.last[r] = t.last + row;
  }
  return g;
}

// Calls group(rg, i, b0, b1, s, ls) for the tile's queries in register groups of at most four,
// as even as can be (nine: 3 + 3 + 3): queries i..i + rg - 1, key blocks b0..b1 (the tile's
// span), s their rows of ls scores.
template <class Group>
static inline void attn_groups(const AttnTile& t, const Group& group) {
  const int64_t b0 = attn_first(t, 0) / kKeyBlock, b1 = (t.last + t.n_rows - 1) / kKeyBlock;
  const int64_t ls = (b1 - b0 + 1) * kKeyBlock, n_q = t.n_rows * t.n_heads;
  for (int64_t i = 0; i < n_q;) {
    const int64_t left = n_q - i, n_groups = (left + 3) / 4, rg = (left + n_groups - 1) / n_groups;
    group(static_cast<int>(rg), i, b0, b1, t.scores + i * ls, ls);
    i += rg;
  }
}

}  // namespace pyinfer
