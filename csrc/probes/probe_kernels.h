// probe_kernels.h: the benchmark probes' inner loops, one per ISA where it has one, each
// defined in a file of probes/x86/ compiled with that ISA's flags. The probes pick theirs by
// the active path (runtime/isa.h); they are no part of the kernel table.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pyinfer {

// Read n_bytes (a multiple of 64, 64-byte aligned) and return a value that depends on every
// byte, so the loads cannot be elided: the inner loop of the bandwidth probe. Every variant
// returns the sum, modulo 2^64, of the buffer's little-endian 64-bit words.
using ReadSumFn = uint64_t (*)(const void* src, size_t n_bytes);

// The int8 multiply-add instruction the fast kernels are built on, issued n_iter times on
// each of 12 independent accumulators (so its latency is hidden): the rate a core can reach
// at best. Returns the multiply-adds done; *sink receives a value of the result, so that
// nothing is optimised away.
using Int8PeakFn = int64_t (*)(int64_t n_iter, int32_t* sink);

#if PYINFER_X86
uint64_t read_sum_avx2(const void* src, size_t n_bytes);
int64_t int8_peak_avx2(int64_t n_iter, int32_t* sink);
int64_t int8_peak_avx512(int64_t n_iter, int32_t* sink);
#endif

}  // namespace pyinfer
