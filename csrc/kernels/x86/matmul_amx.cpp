// matmul_amx.cpp: the packed fast matmul on AMX tiles (AMX-TILE, AMX-INT8), for calls of
// several activation rows (prefill, batched decode). This file alone is compiled with the
// AVX-512 and AMX flags; everything here except fill_matmul_amx and int8_peak_amx has internal
// linkage. The path is taken only where the CPU has the tiles and the OS has granted this
// process their state (runtime/cpu_features.cpp).
//
// One tile product takes a 32-block of 16 activation rows against the same 32-block of a
// group's 16 weight rows: A [16 rows][32] int8, the activations' quants; B [8][64], the
// group's eight quant columns (packed16.h: column c holds elements 4c..4c+3 of each row, row
// r at bytes 4r.., which is the layout tdpbssd reads its second operand in), as signed int8
// with their stored offset taken off; C [16][16] int32, row m the 16 weight rows' integer sums
// against activation row m: the int32 lanes the AVX-512 tiles compute one activation row at a
// time. C goes to memory and each row then takes the scalar spec's float arithmetic (acc +=
// (d_w * d_x) * float(isum), separate multiply and add), so results match the scalar kernel
// bit for bit, and the AVX-512 path's.
#include <immintrin.h>

#include <cstring>

#include "kernels/abi.h"
#include "kernels/packed16.h"
#include "kernels/x86/units_avx512.h"

namespace pyinfer {

namespace {

// Activation rows go to the tiles 16 at a time; a last tile of fewer rows computes padding
// too, and below kAmxMinTail rows it loses to the AVX-512 kernel, which takes those rows (and
// calls of fewer rows) instead (docs/tuning.md, "AMX tiles").
constexpr int64_t kAmxMinTail = 12;
constexpr int kTileRows = 16;

// ldtilecfg's operand (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tiles of the 32-element types and Q4_K, Q5_K: two slots of A (16 x 32 bytes), B (8 x 64)
// and C (16 x 64), tiles 0-2 and 3-5. Q6_K, whose 16-element halves carry their own scales, takes each half on
// its own: 0, 1 = A's halves (16 x 16), 2, 3 = B's halves (4 x 64), 4, 5 and 6, 7 = their C
// in two slots.
TileConfig tile_config(bool halves) {
  TileConfig c{};
  c.palette = 1;
  auto set = [&](int t, int rows, int colsb) {
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = static_cast<uint16_t>(colsb);
  };
  if (!halves) {
    for (int slot = 0; slot < 2; ++slot) {
      set(3 * slot, kTileRows, 32);
      set(3 * slot + 1, 8, 64);
      set(3 * slot + 2, kTileRows, 64);
    }
  } else {
    set(0, kTileRows, 16);
    set(1, kTileRows, 16);
    set(2, 4, 64);
    set(3, 4, 64);
    for (int t = 4; t < 8; ++t) set(t, kTileRows, 64);
  }
  return c;
}

// The activations of a call, tile by tile: for activation tile t (rows 16t..16t+15) and
// 32-block ib, the rows' quants [16][32] (A's memory, rows past M zero), their scales d[16]
// and factors d * sum[16] (zero past M). Tiles and blocks in the order the kernel reads them.
constexpr int kActTileBytes = kTileRows * QK8_A + 2 * kTileRows * 4;

PYINFER_INLINE void copy_activations(const block_q8a* xq, int64_t M, int64_t nb, uint8_t* dst, uint16_t* split) {
  const int64_t n_tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t t = 0; t < n_tiles; ++t)
    for (int64_t ib = 0; ib < nb; ++ib) {
      uint8_t* a = dst + (t * nb + ib) * kActTileBytes;
      auto* d = reinterpret_cast<float*>(a + kTileRows * QK8_A);
      float* dsum = d + kTileRows;
      uint16_t mask = 0;
      for (int r = 0; r < kTileRows; ++r) {
        const int64_t m = t * kTileRows + r;
        if (m >= M) {
          std::memset(a + r * QK8_A, 0, QK8_A);
          d[r] = dsum[r] = 0.0f;
          continue;
        }
        const block_q8a& b = xq[m * nb + ib];
        std::memcpy(a + r * QK8_A, b.qs, QK8_A);
        d[r] = b.d;
        dsum[r] = b.dsum;
        if (b.h4 != 0) mask = static_cast<uint16_t>(mask | (1u << r));
      }
      split[t * nb + ib] = mask;
    }
}

// 128 * h * q_w[jo] of activation row r's split block (q8_act.h) into its integer sums c (16
// weight rows), from jo's signed quant column.
PYINFER_INLINE void add_split_term(int32_t* c, const uint8_t* units_block, const block_q8a& xb) {
  const __m512i col = _mm512_load_si512(units_block + 64 * (xb.jo / 4));
  const __m512i q = _mm512_srai_epi32(_mm512_slli_epi32(col, 24 - 8 * (xb.jo % 4)), 24);
  const __m512i t = _mm512_mullo_epi32(q, _mm512_set1_epi32(128 * act_h(xb)));
  _mm512_store_si512(c, _mm512_add_epi32(_mm512_load_si512(c), t));
}

// The tile products of one 32-block, in two steps so that one block's product runs while the
// previous one's sums are scaled: issue loads A and B into slot S and starts the product into
// its C (tile 2 + 3 * S; Q6_K: A's and B's halves in tiles 0-3, the two C in 4 + 2 * S and
// 5 + 2 * S), stored writes C to cbuf (Q6_K's second half to cbuf + 256) and adds the split
// terms. GCC's tile intrinsics paste the tile number into their assembly: literals only.
template <int S>
PYINFER_INLINE void issue(bool q6, const uint8_t* u, const uint8_t* a) {
  if (q6) {
    _tile_loadd(0, a, QK8_A);
    _tile_loadd(1, a + 16, QK8_A);
    _tile_loadd(2, u, 64);
    _tile_loadd(3, u + 256, 64);
    if (S == 0) {
      _tile_zero(4);
      _tile_zero(5);
      _tile_dpbssd(4, 0, 2);
      _tile_dpbssd(5, 1, 3);
    } else {
      _tile_zero(6);
      _tile_zero(7);
      _tile_dpbssd(6, 0, 2);
      _tile_dpbssd(7, 1, 3);
    }
  } else if (S == 0) {
    _tile_loadd(0, a, QK8_A);
    _tile_loadd(1, u, 64);
    _tile_zero(2);
    _tile_dpbssd(2, 0, 1);
  } else {
    _tile_loadd(3, a, QK8_A);
    _tile_loadd(4, u, 64);
    _tile_zero(5);
    _tile_dpbssd(5, 3, 4);
  }
}

template <int S>
PYINFER_INLINE void stored(bool q6, const uint8_t* u, int32_t* cbuf, uint32_t split, const block_q8a* xq, int64_t t,
                           int64_t nb, int64_t ib) {
  if (q6 && S == 0) {
    _tile_stored(4, cbuf, 64);
    _tile_stored(5, cbuf + 256, 64);
  } else if (q6) {
    _tile_stored(6, cbuf, 64);
    _tile_stored(7, cbuf + 256, 64);
  } else if (S == 0) {
    _tile_stored(2, cbuf, 64);
  } else {
    _tile_stored(5, cbuf, 64);
  }
  for (; split != 0; split &= split - 1) {
    const int r = __builtin_ctz(split);
    const block_q8a& xb = xq[(t * kTileRows + r) * nb + ib];
    add_split_term(cbuf + (q6 && xb.jo >= 16 ? 256 : 0) + 16 * r, u, xb);
  }
}

// acc[r] += (d_w * d_x[r]) * float(isum[r]) for the 16 activation rows of block ib, from its
// integer sums in cbuf (Q6_K: its halves', times their scales).
PYINFER_INLINE void accumulate(bool q6, const uint8_t* u, const uint8_t* a, const int32_t* cbuf,
                               __m512 (&acc)[kTileRows]) {
  const __m512 d = _mm512_load_ps(u + 512);
  const auto* dx = reinterpret_cast<const float*>(a + kTileRows * QK8_A);
  if (q6) {
    const __m512i sc_lo = _mm512_load_si512(u + 576), sc_hi = _mm512_load_si512(u + 640);
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) {
      const __m512i isum = _mm512_add_epi32(_mm512_mullo_epi32(_mm512_load_si512(cbuf + 16 * r), sc_lo),
                                            _mm512_mullo_epi32(_mm512_load_si512(cbuf + 256 + 16 * r), sc_hi));
      acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(dx[r])), _mm512_cvtepi32_ps(isum)));
    }
    return;
  }
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r) {
    const __m512 f = _mm512_mul_ps(d, _mm512_set1_ps(dx[r]));
    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(f, _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + 16 * r))));
  }
}

// One group (16 weight rows, n_valid of them real) against activation tile t: its units
// (units_avx512.h, signed columns) against the copied activations. Each block's tile product
// is issued before the previous block's sums are scaled, in the other slot.
PYINFER_INLINE void amx_tile(int type, const uint8_t* units, const uint8_t* acts, const uint16_t* split,
                             const block_q8a* xq, int64_t t, int64_t M, int64_t nb, float* y, int64_t ldy,
                             int n_valid) {
  const bool q6 = type == GGML_Q6_K;
  alignas(64) int32_t cbuf[2][2 * kTileRows * 16];
  __m512 acc[kTileRows];
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_setzero_ps();
  issue<0>(q6, units, acts);
  for (int64_t ib = 0; ib < nb; ++ib) {
    const uint8_t* u = units + ib * kUnitBytes;
    const uint8_t* a = acts + ib * kActTileBytes;
    int32_t* c = cbuf[ib % 2];
    if (ib % 2 == 0) {
      stored<0>(q6, u, c, split[ib], xq, t, nb, ib);
      if (ib + 1 < nb) issue<1>(q6, u + kUnitBytes, a + kActTileBytes);
    } else {
      stored<1>(q6, u, c, split[ib], xq, t, nb, ib);
      if (ib + 1 < nb) issue<0>(q6, u + kUnitBytes, a + kActTileBytes);
    }
    accumulate(q6, u, a, c, acc);
  }
  if (type_traits(type).has_min) {  // the minimum terms in their own sums, as in the spec
    __m512 acc_min[kTileRows];
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) acc_min[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      const __m512 mn = _mm512_load_ps(units + i * kUnitBytes + 576);
      const auto* dsum = reinterpret_cast<const float*>(acts + i * kActTileBytes + kTileRows * QK8_A) + kTileRows;
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r)
        acc_min[r] = _mm512_add_ps(acc_min[r], _mm512_mul_ps(mn, _mm512_set1_ps(dsum[r])));
    }
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) acc[r] = _mm512_add_ps(acc[r], acc_min[r]);
  }
  const __mmask16 k = static_cast<__mmask16>((1u << n_valid) - 1);
  const int64_t rows = M - t * kTileRows < kTileRows ? M - t * kTileRows : kTileRows;
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r)
    if (r < rows) _mm512_mask_storeu_ps(y + (t * kTileRows + r) * ldy, k, acc[r]);
}

MatmulFastFn g_fallback[GGML_TYPE_SLOTS];  // the AVX-512 kernels, for calls of few rows

template <int T>
void matmul_fast_packed_amx(const void* w, int64_t rb, const block_q8a* xq, int64_t M, int64_t K, int64_t n_rows,
                            float* y, int64_t ldy) {
  const int64_t nb = K / QK8_A;
  // The rows the tiles take: whole tiles, and a last one of kAmxMinTail rows or more.
  const int64_t m_tiles = M % kTileRows >= kAmxMinTail ? M : M / kTileRows * kTileRows;
  if (m_tiles < M) g_fallback[T](w, rb, xq + m_tiles * nb, M - m_tiles, K, n_rows, y + m_tiles * ldy, ldy);
  if (m_tiles == 0) return;
  const int64_t n_tiles = (m_tiles + kTileRows - 1) / kTileRows;
  const int64_t group_bytes = kPackRows * rb;
  static thread_local UnitBuffer unit_buffer, act_buffer, split_buffer;
  uint8_t* units = unit_buffer.get(nb * kUnitBytes);
  uint8_t* acts = act_buffer.get(n_tiles * nb * kActTileBytes);
  auto* split = reinterpret_cast<uint16_t*>(split_buffer.get(n_tiles * nb * 2));
  if (units == nullptr || acts == nullptr || split == nullptr) {  // out of memory: the kernel that needs none
    g_fallback[T](w, rb, xq, m_tiles, K, n_rows, y, ldy);
    return;
  }
  copy_activations(xq, m_tiles, nb, acts, split);
  static const TileConfig config = tile_config(T == GGML_Q6_K);
  _tile_loadconfig(&config);
  for (int64_t n = 0; n < n_rows; n += kPackRows) {
    const uint8_t* group = static_cast<const uint8_t*>(w) + n / kPackRows * group_bytes;
    const int valid = n_rows - n < kPackRows ? static_cast<int>(n_rows - n) : kPackRows;
    copy_units(T, group, nb, units, n + kPackRows < n_rows ? group + group_bytes : nullptr, true);
    for (int64_t t = 0; t < n_tiles; ++t)
      amx_tile(T, units, acts + t * nb * kActTileBytes, split + t * nb, xq, t, m_tiles, nb, y + n, ldy, valid);
  }
  _tile_release();  // the tiles back to their initial state: a context switch saves none of them
}

}  // namespace

void fill_matmul_amx(KernelSet& t) {
#define PYINFER_AMX(T)                     \
  g_fallback[T] = t.matmul_fast_packed[T]; \
  t.matmul_fast_packed[T] = matmul_fast_packed_amx<T>;
  PYINFER_AMX(GGML_Q8_0)
  PYINFER_AMX(GGML_Q4_0)
  PYINFER_AMX(GGML_Q4_1)
  PYINFER_AMX(GGML_Q5_0)
  PYINFER_AMX(GGML_Q5_1)
  PYINFER_AMX(GGML_Q4_K)
  PYINFER_AMX(GGML_Q5_K)
  PYINFER_AMX(GGML_Q6_K)
#undef PYINFER_AMX
}

}  // namespace pyinfer
