// bandwidth.h: a STREAM-style memory-read bandwidth probe, the ceiling decode is measured against.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pyinfer {

struct BandwidthResult {
  size_t n_bytes = 0;           // bytes read per pass (the whole array)
  int n_threads = 0;
  std::vector<double> seconds;  // one sample per pass
  uint64_t checksum = 0;        // sum of what was read, so the reads cannot be elided
};

// Reads an n_bytes array (first touched by the threads that read it) `repeats` times with
// n_threads threads, each summing its own contiguous slice, and times every pass.
BandwidthResult measure_read_bandwidth(size_t n_bytes, int n_threads, int repeats);

}  // namespace pyinfer
