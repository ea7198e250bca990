// threadpool.cpp: the persistent worker pool behind pool_run / parallel_for.
#include "runtime/threadpool.h"

#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace pyinfer {
namespace {

// How long an idle worker spins before it sleeps. Long enough to bridge the gap between two
// kernel calls of one decode step, short enough not to steal a shared core for long.
constexpr int kMaxThreads = 1024;
constexpr auto kSpin = std::chrono::microseconds(200);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Returns once ready() holds: a few hundred pauses, then the core yielded between looks (to
// the thread being waited for, when another process has crowded it onto this core).
template <class Ready>
void spin_then_yield(const Ready& ready) {
  for (int spins = 0; !ready();) {
    if (spins < 256) {
      cpu_relax();
      ++spins;
    } else {
      std::this_thread::yield();
    }
  }
}

class Pool {
 public:
  void run(int n_threads, PoolJobFn fn, void* ctx) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > kMaxThreads) n_threads = kMaxThreads;
    if (n_threads == 1 || in_job_) {
      // Nested call from inside a job, or nothing to share: run it here.
      for (int t = 0; t < n_threads; ++t) fn(ctx, t, n_threads);
      return;
    }
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    grow(n_threads - 1);
    fn_ = fn;
    ctx_ = ctx;
    job_ = (job_ + kGenStep) & ~kThreadsMask;
    done_.store(0, std::memory_order_relaxed);
    // Open for joining: written before the job is published, so a worker that sees the new
    // generation sees this job's number here (or a later one, and then takes no part).
    join_.store(job_number(job_), std::memory_order_relaxed);
    // Publishes the job. The thread count travels in the same word, so a worker that takes
    // no part reads nothing else, and cannot see a later job's fields with this generation.
    generation_.store(job_ | static_cast<uint64_t>(n_threads), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      // Taking the lock orders this notify after any worker's check-then-wait.
      {
        std::lock_guard<std::mutex> lk(sleep_mutex_);
      }
      sleep_cv_.notify_all();
    }
    in_job_ = true;
    fn(ctx, 0, n_threads);
    in_job_ = false;
    // Closes the job: a worker that has not joined by now (descheduled by another process,
    // or still waking up) takes no part, and is not waited for. Jobs hand out their work on
    // demand (parallel_for), so by the time the caller's share returns there is nothing left
    // for a latecomer, and waiting for it would cost up to a scheduler time slice per job,
    // hundreds of times per decode step, whenever another process holds its core.
    const uint64_t joined = join_.fetch_or(kClosed, std::memory_order_acq_rel) & kJoinedMask;
    // Those that joined are running, most of them about to finish.
    spin_then_yield([&] { return done_.load(std::memory_order_acquire) == joined; });
  }

  int size() {
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    return static_cast<int>(workers_.size()) + 1;
  }

  void resize(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    if (n_threads > kMaxThreads) n_threads = kMaxThreads;
    std::lock_guard<std::mutex> job_lock(job_mutex_);
    const size_t want = static_cast<size_t>(n_threads - 1);
    if (want >= workers_.size()) {
      grow(static_cast<int>(want));
      return;
    }
    for (size_t i = want; i < workers_.size(); ++i) workers_[i]->stop.store(true);
    {
      std::lock_guard<std::mutex> lk(sleep_mutex_);
    }
    sleep_cv_.notify_all();
    for (size_t i = want; i < workers_.size(); ++i) workers_[i]->thread.join();
    workers_.resize(want);
  }

 private:
  struct Worker {
    std::thread thread;
    std::atomic<bool> stop{false};
  };

  // Called with job_mutex_ held.
  void grow(int n_workers) {
    while (static_cast<int>(workers_.size()) < n_workers) {
      auto w = std::make_unique<Worker>();
      const int tid = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = generation_.load(std::memory_order_acquire);
      Worker* wp = w.get();
      w->thread = std::thread([this, wp, tid, seen] { loop(wp, tid, seen); });
      workers_.push_back(std::move(w));
    }
  }

  void loop(Worker* self, int tid, uint64_t seen) {
    in_job_ = true;  // a job body that calls run() on a worker runs it inline
    for (;;) {
      uint64_t gen = wait_for_job(self, seen);
      if (gen == seen) return;  // stopped
      seen = gen;
      const int n_threads = static_cast<int>(gen & kThreadsMask);
      if (tid < n_threads && join(gen)) {
        fn_(ctx_, tid, n_threads);
        done_.fetch_add(1, std::memory_order_release);
      }
    }
  }

  // Joins job `gen` unless it is closed (or over, a later job now open): true if this
  // worker takes part, and the caller then waits for it.
  bool join(uint64_t gen) {
    const uint64_t number = job_number(gen);
    uint64_t s = join_.load(std::memory_order_acquire);
    while ((s & ~kJoinedMask) == number) {
      if (join_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
    }
    return false;
  }

  // Returns the new generation, or `seen` when the worker is told to stop.
  uint64_t wait_for_job(Worker* self, uint64_t seen) {
    const auto spin_until = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0;; ++i) {
      const uint64_t g = generation_.load(std::memory_order_acquire);
      if (g != seen) return g;
      if (self->stop.load(std::memory_order_relaxed)) return seen;
      cpu_relax();
      // Now and then offer the core to another runnable thread: when the caller shares this
      // core (more runnable threads than cores), a worker that only spins takes half its
      // time. With nothing else to run, the yield returns at once.
      if ((i & 63) == 63) std::this_thread::yield();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() > spin_until) break;
    }
    std::unique_lock<std::mutex> lk(sleep_mutex_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    sleep_cv_.wait(lk, [&] { return generation_.load(std::memory_order_seq_cst) != seen || self->stop.load(); });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    const uint64_t g = generation_.load(std::memory_order_acquire);
    return g != seen ? g : seen;
  }

  std::mutex job_mutex_;  // one job at a time; also guards workers_
  std::vector<std::unique_ptr<Worker>> workers_;
  // The current job, written before generation_ is bumped and read after it is seen.
  // Participants read them after seeing the generation, and the next job waits for them.
  PoolJobFn fn_ = nullptr;
  void* ctx_ = nullptr;
  // generation_ = job counter * kGenStep | thread count of that job.
  static constexpr uint64_t kGenStep = uint64_t{1} << 20;
  static constexpr uint64_t kThreadsMask = kGenStep - 1;
  uint64_t job_ = 0;  // the counter part, written under job_mutex_
  std::atomic<uint64_t> generation_{0};
  // join_ = the open job's number (job_number) | kClosed once the caller's share is done |
  // how many workers joined it; done_ = how many of those have finished.
  static constexpr uint64_t kJoinedMask = kThreadsMask;
  static constexpr uint64_t kClosed = kGenStep;
  static uint64_t job_number(uint64_t gen) { return (gen / kGenStep) * (2 * kClosed); }
  std::atomic<uint64_t> join_{0};
  std::atomic<uint64_t> done_{0};
  std::mutex sleep_mutex_;
  std::condition_variable sleep_cv_;
  std::atomic<int> sleepers_{0};
  static thread_local bool in_job_;
};

thread_local bool Pool::in_job_ = false;

Pool* g_pool = nullptr;
std::once_flag g_pool_once;

// After fork() the child has none of the parent's workers: give it a fresh pool (the old one
// is leaked; its mutexes may have been held by threads that no longer exist).
void reset_after_fork() { g_pool = new Pool(); }

Pool& global() {
  std::call_once(g_pool_once, [] {
    // Never destroyed: workers may be asleep or spinning when the interpreter exits, and
    // joining them from a static destructor would race with the runtime's teardown.
    g_pool = new Pool();
    pthread_atfork(nullptr, nullptr, reset_after_fork);
  });
  return *g_pool;
}

}  // namespace

void pool_run(int n_threads, PoolJobFn fn, void* ctx) { global().run(n_threads, fn, ctx); }
int pool_size() { return global().size(); }
void pool_resize(int n_threads) { global().resize(n_threads); }
void pool_wait_for(const std::atomic<int64_t>& v, int64_t target) {
  spin_then_yield([&] { return v.load(std::memory_order_acquire) >= target; });
}

}  // namespace pyinfer
