// int8_peak.cpp: times the active ISA's int8 peak loop (portable code: compiled with no ISA
// flags; the loops live in probes/x86/, each file with its own flags).
#include "probes/int8_peak.h"

#include <chrono>
#include <cstdint>

#include "probes/probe_kernels.h"
#include "runtime/isa.h"

namespace pyinfer {

namespace {

Int8PeakFn int8_peak_for(Isa isa) {
#if PYINFER_X86
  if (isa == Isa::avx512) return int8_peak_avx512;
  if (isa == Isa::avx2) return int8_peak_avx2;
#endif
  (void)isa;
  return nullptr;
}

}  // namespace

double int8_peak_rate(double min_seconds) {
  const Int8PeakFn fn = int8_peak_for(active_isa());
  if (fn == nullptr) return 0.0;
  int32_t sink = 0;
  fn(1 << 16, &sink);  // warm up: clocks settle, the wide units power on
  int64_t n_iter = 1 << 16;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t macs = fn(n_iter, &sink);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sec >= min_seconds || n_iter > (int64_t{1} << 40)) return static_cast<double>(macs) / sec;
    n_iter *= 2;
  }
}

}  // namespace pyinfer
