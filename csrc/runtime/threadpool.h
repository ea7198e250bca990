// threadpool.h: a persistent pool of worker threads that run one parallel job at a time.
//
// Workers start once (lazily, when a job first asks for them) and live until the process
// ends; a job costs a handful of atomic operations, not a thread start. Between jobs a worker
// spins for a short while (a decode step issues hundreds of small ops back to back, and waking
// a sleeping thread costs several microseconds), then sleeps on a condition variable.
//
// Concurrency: one process-wide pool runs one job at a time; a second caller (another Python
// thread with the GIL released) waits on a mutex until the first job ends, so two callers are
// safe and simply serialise. A job that calls run() again from inside itself runs the inner
// job on the calling thread alone instead of deadlocking.
//
// Only portable files include this header: the parallel_for template below must never be
// instantiated in a file compiled with ISA flags.
#pragma once
#include <atomic>
#include <cstdint>

namespace pyinfer {

// fn(ctx, tid, n_threads) runs once on the caller (tid 0) and once on each worker (tid 1 to
// n_threads - 1) that joins the job before the caller's own call returns.
using PoolJobFn = void (*)(void* ctx, int tid, int n_threads);

// Runs a job on up to n_threads threads (the caller is thread 0) and returns when every
// thread that took part is done. A worker that has not started by the time the caller's share
// returns takes no part (its core may be held by another process), so fn must hand out its
// work on demand, as parallel_for does: the caller alone may do all of it.
// Grows the pool if it has fewer than n_threads - 1 workers. n_threads < 1 counts as 1.
void pool_run(int n_threads, PoolJobFn fn, void* ctx);
// Threads a job can use without growing the pool: workers + the caller.
int pool_size();
// Starts or stops workers so that the pool holds n_threads - 1 of them (n_threads >= 1).
void pool_resize(int n_threads);

// Inside a job: returns once v holds at least `target`, spinning briefly, then yielding the
// core between looks. Only for a count raised by work handed out before the waiter's own (in
// parallel_for's order): the caller may run the whole job alone, and would wait forever on
// work that comes after its own.
void pool_wait_for(const std::atomic<int64_t>& v, int64_t target);

// Calls body(begin, end, tid) over [0, n) cut into chunks of `chunk` items (the last may be
// shorter), handed out to n_threads threads on demand, in increasing order; a thread finishes
// its chunk before it takes another. Chunk boundaries are multiples of `chunk` whatever the
// thread count, so a kernel that computes each item independently of its neighbours in the
// chunk gives the same bits on any number of threads.
template <class Body>
void parallel_for(int n_threads, int64_t n, int64_t chunk, const Body& body) {
  if (n <= 0) return;
  if (chunk < 1) chunk = 1;
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (n_threads > n_chunks) n_threads = static_cast<int>(n_chunks);
  if (n_threads <= 1) {
    body(int64_t{0}, n, 0);
    return;
  }
  struct Ctx {
    const Body* body;
    int64_t n, chunk;
    std::atomic<int64_t> next{0};
  } ctx{&body, n, chunk};
  pool_run(
      n_threads,
      [](void* p, int tid, int) {
        Ctx& c = *static_cast<Ctx*>(p);
        for (;;) {
          const int64_t i = c.next.fetch_add(1, std::memory_order_relaxed);
          const int64_t begin = i * c.chunk;
          if (begin >= c.n) break;
          const int64_t end = begin + c.chunk < c.n ? begin + c.chunk : c.n;
          (*c.body)(begin, end, tid);
        }
      },
      &ctx);
}

}  // namespace pyinfer
