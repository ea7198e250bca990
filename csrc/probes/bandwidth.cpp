// bandwidth.cpp: the read-bandwidth probe's driver (its inner loop picked by the active ISA
// path, probe_kernels.h) and STREAM's copy and triad.
#include "probes/bandwidth.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

#include "probes/probe_kernels.h"
#include "runtime/huge_pages.h"
#include "runtime/isa.h"

namespace pyinfer {

namespace {

// The sum, modulo 2^64, of the buffer's little-endian 64-bit words: every ISA's variant
// returns the same value for the same bytes.
uint64_t read_sum_scalar(const void* src, size_t n_bytes) {
  const auto* p = static_cast<const uint64_t*>(src);
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n_bytes / 8; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

ReadSumFn read_sum_for(Isa isa) {
#if PYINFER_X86
  // The AVX-512 path reads with AVX2's loop: 32-byte loads into 4 accumulators read fastest,
  // and the probe must find the ceiling, not the cost of a load width (docs/tuning.md,
  // "the read loop").
  if (isa == Isa::avx2 || isa == Isa::avx512) return read_sum_avx2;
#endif
  (void)isa;
  return read_sum_scalar;
}

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

namespace {

// Memory as the repacked weights get it (runtime/huge_pages.h): 2 MiB aligned and advised to
// transparent huge pages. NumPy asks for huge pages on every large array (and the kernels read
// weights through NumPy), and a stream over huge pages reads faster (fewer TLB misses), so a
// probe on small pages was no ceiling for a GEMV on huge ones (docs/tuning.md, "arrays on huge
// pages"). Where the kernel grants no huge pages, neither does it to NumPy, and both use small
// pages.
std::unique_ptr<uint8_t, FreeDeleter> alloc_like_weights(size_t n_bytes) {
  return std::unique_ptr<uint8_t, FreeDeleter>(huge_page_alloc(n_bytes, false, "the bandwidth probe's arrays"));
}

// Starts n_threads threads (the caller is thread 0) once; each runs init(t), then for every
// pass meets the others at a barrier, runs pass(t) and meets them again. Thread 0 times each
// pass from barrier to barrier. Returns the seconds of every pass and fills out[rep][t] with
// what pass() returned.
template <class Init, class Pass>
std::vector<double> timed_passes(int n_threads, int repeats, const Init& init, const Pass& pass,
                                 std::vector<uint64_t>& out) {
  out.assign(static_cast<size_t>(repeats) * static_cast<size_t>(n_threads), 0);
  std::vector<double> seconds(static_cast<size_t>(repeats));
  SpinBarrier barrier(n_threads);
  auto body = [&](int t) {
    init(t);
    for (int rep = 0; rep < repeats; ++rep) {
      barrier.wait();
      const auto t0 = std::chrono::steady_clock::now();
      out[static_cast<size_t>(rep) * n_threads + t] = pass(t);
      barrier.wait();
      if (t == 0) seconds[rep] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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
  return seconds;
}

void check_args(int n_threads, int repeats) {
  if (n_threads < 1) throw std::invalid_argument("n_threads must be >= 1");
  if (repeats < 1) throw std::invalid_argument("repeats must be >= 1");
}

}  // namespace

BandwidthResult measure_read_bandwidth(size_t n_bytes, int n_threads, int repeats) {
  check_args(n_threads, repeats);
  const size_t chunk = 4096 * static_cast<size_t>(n_threads);
  n_bytes = (n_bytes / chunk) * chunk;
  if (n_bytes == 0) throw std::invalid_argument("n_bytes must be at least 4096 * n_threads");
  auto buf = alloc_like_weights(n_bytes);
  const size_t slice = n_bytes / n_threads;
  const ReadSumFn read_sum = read_sum_for(active_isa());
  std::vector<uint64_t> sums;  // [rep][t]: what thread t read in pass rep
  BandwidthResult r;
  r.seconds = timed_passes(
      n_threads, repeats,
      [&](int t) {  // first touch from the reading thread: its pages land near it
        uint8_t* p = buf.get() + t * slice;
        for (size_t i = 0; i < slice; ++i) p[i] = static_cast<uint8_t>(i * 131 + t);
      },
      [&](int t) { return read_sum(buf.get() + t * slice, slice); }, sums);
  r.n_bytes = n_bytes;
  r.n_threads = n_threads;
  for (int rep = 0; rep < repeats; ++rep) {
    uint64_t total = 0;
    for (int t = 0; t < n_threads; ++t) total += sums[static_cast<size_t>(rep) * n_threads + t];
    if (rep == 0) r.checksum = total;
    if (total != r.checksum) throw std::runtime_error("read bandwidth probe: passes read different sums");
  }
  return r;
}

BandwidthResult measure_stream_bandwidth(StreamKernel kernel, size_t n_bytes, int n_threads, int repeats) {
  check_args(n_threads, repeats);
  const int n_arrays = kernel == StreamKernel::copy ? 2 : 3;
  // Each array gets n_bytes / n_arrays, cut into equal float slices per thread.
  const size_t per_thread = n_bytes / n_arrays / n_threads / 4096 * 4096;
  if (per_thread == 0) throw std::invalid_argument("n_bytes too small for that many threads");
  const size_t n = per_thread / sizeof(float);  // floats per thread per array
  const size_t array_bytes = per_thread * n_threads;
  auto buf = alloc_like_weights(array_bytes * n_arrays);
  float* a = reinterpret_cast<float*>(buf.get());
  float* b = reinterpret_cast<float*>(buf.get() + array_bytes);
  float* c = reinterpret_cast<float*>(buf.get() + 2 * array_bytes);  // triad only
  const float scale = 3.0f;
  std::vector<uint64_t> unused;
  BandwidthResult r;
  r.seconds = timed_passes(
      n_threads, repeats,
      [&](int t) {
        const size_t o = t * n;
        for (size_t i = 0; i < n; ++i) {
          a[o + i] = 0.0f;
          b[o + i] = static_cast<float>(i % 1024);
          if (n_arrays == 3) c[o + i] = 1.0f;
        }
      },
      [&](int t) -> uint64_t {
        const size_t o = t * n;
        if (n_arrays == 2) {
          for (size_t i = 0; i < n; ++i) a[o + i] = b[o + i];
        } else {
          for (size_t i = 0; i < n; ++i) a[o + i] = b[o + i] + scale * c[o + i];
        }
        return 0;
      },
      unused);
  // STREAM's count: bytes read plus bytes written, the write-allocate reads not included.
  r.n_bytes = array_bytes * n_arrays;
  r.n_threads = n_threads;
  // The result must be what the kernel computes, so the stores cannot be dropped.
  const float want = n_arrays == 2 ? b[n - 1] : b[n - 1] + scale * c[n - 1];
  if (a[n - 1] != want) throw std::runtime_error("stream bandwidth probe: wrong result");
  return r;
}

}  // namespace pyinfer
