// bandwidth.h: a STREAM-style memory-read bandwidth probe, the ceiling decode is measured against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pyinfer {

struct BandwidthResult {
  size_t n_bytes = 0;  // bytes read per pass (the whole array)
  int n_threads = 0;
  std::vector<double> seconds;  // one sample per pass, thread start-up excluded
  uint64_t checksum = 0;        // what one pass read (the same in every pass); see below
};

// Reads an array `repeats` times with n_threads threads, each summing its own contiguous
// slice with the active ISA's read_sum, and times every pass.
//
// n_bytes is rounded down to a multiple of 4096 * n_threads. The threads start once: each
// first touches (fills) its own slice, so its pages land near it, then all meet at a barrier
// before every pass and again after it; a pass's time runs from the one barrier to the
// other. The array is 2 MiB aligned and, on Linux, advised to transparent huge pages, as
// NumPy does for the large arrays weights are read from. Byte i of slice t holds
// (i * 131 + t) mod 256, and checksum is the sum modulo 2^64 of the array's little-endian
// 64-bit words: a caller can check that every byte was read.
// Throws std::invalid_argument for n_threads < 1, repeats < 1 or an array too small.
BandwidthResult measure_read_bandwidth(size_t n_bytes, int n_threads, int repeats);

// STREAM's copy (a = b) and triad (a = b + s * c) over float arrays that together take about
// n_bytes, each thread on its own slices, timed like the read probe. n_bytes in the result is
// STREAM's count: bytes read plus bytes written per pass. checksum is 0.
enum class StreamKernel { copy, triad };
BandwidthResult measure_stream_bandwidth(StreamKernel kernel, size_t n_bytes, int n_threads, int repeats);

}  // namespace pyinfer
