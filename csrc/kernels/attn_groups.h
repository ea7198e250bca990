// attn_groups.h: the ISA-independent part of the SIMD attention kernels (kernels/abi.h, AttnTile):
// how a tile's queries form register groups, what each query of a group reads and writes,
// which key blocks the tile spans and in what steps, and the softmax's bookkeeping. The
// functions are static and the structs have no code, so every ISA's file keeps its own copy
// (as with half.h).
#pragma once
#include <cstdint>

#include "kernels/abi.h"

// The attention kernels' short loops over queries, key blocks and output chunks have compile-time
// counts; unrolling them where they are written lets GCC keep the accumulator arrays in
// registers (unrolled only later, the arrays stay in memory and are stored every iteration).
#define UNROLL _Pragma("GCC unroll 16")

namespace pyinfer {

// A count as a type, so a generic lambda can take it as a template argument (Count<N>::value).
template <int N>
struct Count {
  static constexpr int value = N;
};

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

// Calls group(Count<rg>(), i, b0, b1, s, ls) for the tile's queries in register groups of at
// most four, as even as can be (nine: 3 + 3 + 3): queries i..i + rg - 1, key blocks b0..b1
// (the tile's span), s their rows of ls scores.
template <class Group>
static inline void attn_groups(const AttnTile& t, const Group& group) {
  const int64_t b0 = attn_first(t, 0) / kKeyBlock, b1 = (t.last + t.n_rows - 1) / kKeyBlock;
  const int64_t ls = (b1 - b0 + 1) * kKeyBlock, n_q = t.n_rows * t.n_heads;
  for (int64_t i = 0; i < n_q;) {
    const int64_t left = n_q - i, n_groups = (left + kAttnGroupQueries - 1) / kAttnGroupQueries;
    const int64_t rg = (left + n_groups - 1) / n_groups;
    float* s = t.scores + i * ls;
    switch (rg) {
      case 1: group(Count<1>(), i, b0, b1, s, ls); break;
      case 2: group(Count<2>(), i, b0, b1, s, ls); break;
      case 3: group(Count<3>(), i, b0, b1, s, ls); break;
      default: group(Count<4>(), i, b0, b1, s, ls); break;
    }
    i += rg;
  }
}

// Calls score(Count<n>(), k, at) over key blocks [bs, be) of the tile's span b0..b1: NB blocks
// at a time while that many are left before b1, then one at a time, block b1 from t.k_last.
// k: the first of the n blocks (elem_bytes per cached element), at: its first score's index
// (from b0's first position).
template <int NB, class Score>
static inline void attn_key_blocks(const AttnTile& t, int64_t b0, int64_t b1, int64_t bs, int64_t be,
                                   int64_t elem_bytes, const Score& score) {
  const int64_t block_bytes = t.head_dim * kKeyBlock * elem_bytes;
  const auto* k = static_cast<const uint8_t*>(t.k);
  const int64_t whole_end = be <= b1 ? be : b1;  // blocks read from t.k
  int64_t b = bs;
  for (; b + NB <= whole_end; b += NB) score(Count<NB>(), k + b * block_bytes, (b - b0) * kKeyBlock);
  for (; b < whole_end; ++b) score(Count<1>(), k + b * block_bytes, (b - b0) * kKeyBlock);
  if (be > b1) score(Count<1>(), t.k_last, (b1 - b0) * kKeyBlock);
}

// Where the attention kernels request the cached keys and values ahead: not at all (the
// tuning leaves the streams to the hardware prefetcher), into L1, or into L2.
enum AttnFetch : int { FETCH_NONE, FETCH_L1, FETCH_L2 };

// A read of the cached keys or values at byte `byte` of p that starts a line requests the line
// kStreamFetchAhead bytes on, as FETCH says (KernelTuning::stream_fetch_ahead, AttnTile::reads_once).
template <int FETCH>
static inline void attn_fetch_ahead(const void* p, int64_t byte) {
  if constexpr (FETCH != FETCH_NONE)
    if (byte % 64 == 0)
      __builtin_prefetch(static_cast<const char*>(p) + byte + kStreamFetchAhead, 0, FETCH == FETCH_L2 ? 2 : 3);
}

// Softmax over each query's own positions: its scores (row r of s, position j at
// s[r * ls + j - base]) become exp(score - max) in place through exp_sum(p, n), which returns
// their sum; inv[r] = 1 / that sum.
template <int RG, class ExpSum>
static inline void attn_softmax(const AttnQueries<RG>& g, float* s, int64_t ls, int64_t base, float* inv,
                                const ExpSum& exp_sum) {
  for (int r = 0; r < RG; ++r) {
    float* p = s + r * ls + g.first[r] - base;
    inv[r] = 1.0f / exp_sum(p, g.last[r] + 1 - g.first[r]);
  }
}

// Positions the group's queries see: lo..hi by any of them, all_lo..all_hi by every one
// (all_lo = hi + 1, all_hi = hi when no position is common to all).
struct AttnReach {
  int64_t lo, hi, all_lo, all_hi;
};
template <int RG>
static inline AttnReach attn_reach(const AttnQueries<RG>& g) {
  AttnReach a{g.first[0], g.last[0], g.first[0], g.last[0]};
  for (int r = 1; r < RG; ++r) {
    a.lo = g.first[r] < a.lo ? g.first[r] : a.lo;
    a.hi = g.last[r] > a.hi ? g.last[r] : a.hi;
    a.all_lo = g.first[r] > a.all_lo ? g.first[r] : a.all_lo;
    a.all_hi = g.last[r] < a.all_hi ? g.last[r] : a.all_hi;
  }
  if (a.all_lo > a.all_hi) a.all_lo = a.hi + 1, a.all_hi = a.hi;
  return a;
}

// One ISA's attention entry points (AttnFn and AttnSteps) from its three steps for a register
// group of RG queries i0..i0 + RG - 1 of a tile (s: their rows of ls scores; b0..b1: the span):
//   Steps::scores<RG>(t, i0, b0, b1, bs, be, s, ls)   against key blocks [bs, be);
//   Steps::exp_sum(p, n)                              p[0..n) = exp(p - max) in place, their sum;
//   Steps::weigh<RG>(t, i0, b0, s, ls, inv, c0, c1)   output elements [c0, c1).
// whole runs the three for each register group in turn; the others run one for all groups.
// Reuse and Once: the same steps, requesting keys and values ahead as a tile that reads them
// again or once wants (AttnTile::reads_once). The softmax requests nothing ahead: Reuse's
// serves both.
template <class Reuse, class Once>
struct AttnEntries {
  static void whole(const AttnTile& t) {
    with_steps(t, [&](auto steps) {
      using S = decltype(steps);
      attn_groups(t, [&](auto rg, int64_t i, int64_t b0, int64_t b1, float* s, int64_t ls) {
        constexpr int RG = decltype(rg)::value;
        float inv[RG];
        S::template scores<RG>(t, i, b0, b1, b0, b1 + 1, s, ls);
        softmax_group<RG>(t, i, b0, s, ls, inv);
        S::template weigh<RG>(t, i, b0, s, ls, inv, 0, t.head_dim);
      });
    });
  }
  static void scores(const AttnTile& t, int64_t bs, int64_t be) {
    with_steps(t, [&](auto steps) {
      attn_groups(t, [&](auto rg, int64_t i, int64_t b0, int64_t b1, float* s, int64_t ls) {
        decltype(steps)::template scores<decltype(rg)::value>(t, i, b0, b1, bs, be, s, ls);
      });
    });
  }
  static void softmax(const AttnTile& t, float* inv) {
    attn_groups(t, [&](auto rg, int64_t i, int64_t b0, int64_t, float* s, int64_t ls) {
      softmax_group<decltype(rg)::value>(t, i, b0, s, ls, inv + i);
    });
  }
  // Softmax over each of the RG queries' own positions; inv[r] = 1 / the sum of its weights.
  template <int RG>
  static void softmax_group(const AttnTile& t, int64_t i0, int64_t b0, float* s, int64_t ls, float* inv) {
    attn_softmax(attn_queries<RG>(t, i0), s, ls, b0 * kKeyBlock, inv, Reuse::exp_sum);
  }
  static void weigh(const AttnTile& t, const float* inv, int64_t c0, int64_t c1) {
    with_steps(t, [&](auto steps) {
      attn_groups(t, [&](auto rg, int64_t i, int64_t b0, int64_t, float* s, int64_t ls) {
        decltype(steps)::template weigh<decltype(rg)::value>(t, i, b0, s, ls, inv + i, c0, c1);
      });
    });
  }
  static AttnSteps steps() { return {scores, softmax, weigh}; }
  // f(Once()) or f(Reuse()), as the tile reads its keys and values (the steps have no state: the
  // argument carries only its type).
  template <class F>
  static void with_steps(const AttnTile& t, const F& f) {
    if (t.reads_once)
      f(Once());
    else
      f(Reuse());
  }
};

// Slot kv (KvType) of t's attention entries, from the steps Reuse and Once (see AttnEntries).
template <class Reuse, class Once>
static inline void attn_fill(KernelSet& t, int kv) {
  t.attention[kv] = AttnEntries<Reuse, Once>::whole;
  t.attention_steps[kv] = AttnEntries<Reuse, Once>::steps();
}

}  // namespace pyinfer
