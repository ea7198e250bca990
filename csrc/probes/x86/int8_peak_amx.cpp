// int8_peak_amx.cpp: the int8 peak probe's loop on AMX tiles (tdpbssd). This file alone is
// compiled with the AMX flags; nothing in it is called unless the active path has them.
#include <immintrin.h>

#include <cstdint>

#include "probes/probe_kernels.h"

namespace pyinfer {

namespace {
struct alignas(64) ProbeTiles {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
}  // namespace

// tdpbssd on full tiles: C[16][16] += A[16][64] . B[16][64], 16 * 16 * 64 multiply-adds, on
// four independent accumulators from two A and two B tiles (their latency hidden).
int64_t int8_peak_amx(int64_t n_iter, int32_t* sink) {
  ProbeTiles c{};
  c.palette = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  _tile_loadconfig(&c);
  alignas(64) int8_t src[16 * 64];
  for (int i = 0; i < 16 * 64; ++i) src[i] = static_cast<int8_t>(i % 7 - 3);
  _tile_loadd(4, src, 64);
  _tile_loadd(5, src, 64);
  _tile_loadd(6, src, 64);
  _tile_loadd(7, src, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < n_iter; ++it) {
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  alignas(64) int32_t out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
  uint32_t total = 0;  // the value only has to be kept; unsigned, so it may wrap
  for (int32_t v : out) total += static_cast<uint32_t>(v);
  *sink = static_cast<int32_t>(total);
  return n_iter * 4 * 16 * 16 * 64;
}

}  // namespace pyinfer
