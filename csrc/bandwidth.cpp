// bandwidth.cpp: the read-bandwidth probe's driver; the inner loop comes from the ISA table.
#include "bandwidth.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <new>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "dispatch.h"

namespace pyinfer {

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// A reusable barrier for a fixed number of threads. Waiters spin (a wake-up through the
// kernel would add tens of microseconds to a pass), then yield, so a run with more threads
// than cores still moves on.
class SpinBarrier {
 public:
  explicit SpinBarrier(int n) : n_(n) {}

  void wait() {
    const unsigned gen = gen_.load(std::memory_order_acquire);
    if (count_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      count_.store(0, std::memory_order_relaxed);
      gen_.fetch_add(1, std::memory_order_acq_rel);  // releases the others
      return;
    }
    for (int spins = 0; gen_.load(std::memory_order_acquire) == gen; ++spins)
      if (spins >= 4096) std::this_thread::yield();
  }

 private:
  const int n_;
  std::atomic<int> count_{0};
  std::atomic<unsigned> gen_{0};
};

}  // namespace

BandwidthResult measure_read_bandwidth(size_t n_bytes, int n_threads, int repeats) {
  if (n_threads < 1) throw std::invalid_argument("n_threads must be >= 1");
  if (repeats < 1) throw std::invalid_argument("repeats must be >= 1");
  const size_t chunk = 4096 * static_cast<size_t>(n_threads);
  n_bytes = (n_bytes / chunk) * chunk;
  if (n_bytes == 0) throw std::invalid_argument("n_bytes must be at least 4096 * n_threads");
  // The array gets the memory a decode's weights get. NumPy asks for transparent huge pages
  // on every large array (and the kernels read weights through NumPy), and on this machine's
  // Zen 4 a stream over 2 MiB pages reads 15-20% faster than one over 4 KiB pages (fewer
  // TLB misses and page walks in the way of the prefetchers): a probe on small pages was
  // no ceiling for a GEMV on huge ones. Where the kernel grants no huge pages, neither
  // does it to NumPy, and both read small pages.
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t alloc_bytes = (n_bytes + kHugePage - 1) / kHugePage * kHugePage;
  std::unique_ptr<uint8_t, FreeDeleter> buf(
      static_cast<uint8_t*>(std::aligned_alloc(kHugePage, alloc_bytes)));
  if (!buf) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(buf.get(), alloc_bytes, MADV_HUGEPAGE);  // advice only: failure leaves small pages
#endif
  const size_t slice = n_bytes / n_threads;
  const ReadSumFn read_sum = kernels().read_sum;

  // sums[rep * n_threads + t]: what thread t read in pass rep.
  std::vector<uint64_t> sums(static_cast<size_t>(repeats) * static_cast<size_t>(n_threads));
  std::vector<double> seconds(static_cast<size_t>(repeats));
  SpinBarrier barrier(n_threads);

  // Runs on every thread; thread 0 (the caller) also keeps the clock.
  auto body = [&](int t) {
    uint8_t* p = buf.get() + t * slice;
    for (size_t i = 0; i < slice; ++i) p[i] = static_cast<uint8_t>(i * 131 + t);
    for (int rep = 0; rep < repeats; ++rep) {
      barrier.wait();
      const auto t0 = std::chrono::steady_clock::now();
      sums[static_cast<size_t>(rep) * n_threads + t] = read_sum(p, slice);
      barrier.wait();
      if (t == 0)
        seconds[rep] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
  };

  // Workers wait for `go` before touching anything: if starting one fails, the ones already
  // running are told to leave instead of waiting at a barrier forever.
  std::atomic<int> go{0};  // 0: wait, 1: run, -1: leave
  std::vector<std::thread> workers;
  try {
    workers.reserve(static_cast<size_t>(n_threads) - 1);
    for (int t = 1; t < n_threads; ++t)
      workers.emplace_back([&, t] {
        int g;
        while ((g = go.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
        if (g > 0) body(t);
      });
  } catch (...) {
    go.store(-1, std::memory_order_release);
    for (auto& w : workers) w.join();
    throw;
  }
  go.store(1, std::memory_order_release);
  body(0);
  for (auto& w : workers) w.join();

  BandwidthResult r;
  r.n_bytes = n_bytes;
  r.n_threads = n_threads;
  r.seconds = seconds;
  for (int rep = 0; rep < repeats; ++rep) {
    uint64_t total = 0;
    for (int t = 0; t < n_threads; ++t) total += sums[static_cast<size_t>(rep) * n_threads + t];
    if (rep == 0) r.checksum = total;
    if (total != r.checksum)
      throw std::runtime_error("read bandwidth probe: passes read different sums");
  }
  return r;
}

}  // namespace pyinfer
