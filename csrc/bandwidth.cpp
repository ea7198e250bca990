// bandwidth.cpp: the read-bandwidth probe's driver; the inner loop comes from the ISA table.
#include "bandwidth.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <thread>

#include "dispatch.h"

namespace pyinfer {

namespace {
struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Runs fn(thread_index) on n_threads threads (the caller is thread 0) and joins them.
template <class Fn>
void run_on_threads(int n_threads, Fn fn) {
  std::vector<std::thread> workers;
  workers.reserve(n_threads - 1);
  for (int t = 1; t < n_threads; ++t) workers.emplace_back(fn, t);
  fn(0);
  for (auto& w : workers) w.join();
}
}  // namespace

BandwidthResult measure_read_bandwidth(size_t n_bytes, int n_threads, int repeats) {
  if (n_threads < 1) throw std::invalid_argument("n_threads must be >= 1");
  if (repeats < 1) throw std::invalid_argument("repeats must be >= 1");
  const size_t chunk = 4096 * static_cast<size_t>(n_threads);
  n_bytes = (n_bytes / chunk) * chunk;
  if (n_bytes == 0) throw std::invalid_argument("n_bytes too small for that many threads");
  std::unique_ptr<uint8_t, FreeDeleter> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, n_bytes)));
  if (!buf) throw std::bad_alloc();
  const size_t slice = n_bytes / n_threads;
  const ReadSumFn read_sum = kernels().read_sum;

  // First touch from the reading thread: the pages land where that thread reads them.
  run_on_threads(n_threads, [&](int t) {
    uint8_t* p = buf.get() + t * slice;
    for (size_t i = 0; i < slice; ++i) p[i] = static_cast<uint8_t>(i * 131 + t);
  });

  BandwidthResult r;
  r.n_bytes = n_bytes;
  r.n_threads = n_threads;
  std::vector<uint64_t> sums(n_threads);
  for (int rep = 0; rep < repeats; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    run_on_threads(n_threads, [&](int t) { sums[t] = read_sum(buf.get() + t * slice, slice); });
    auto t1 = std::chrono::steady_clock::now();
    r.seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    for (uint64_t s : sums) r.checksum += s;
  }
  return r;
}

}  // namespace pyinfer
