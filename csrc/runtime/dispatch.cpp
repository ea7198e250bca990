// dispatch.cpp: builds one kernel table per compiled ISA and picks the active one.
#include "runtime/dispatch.h"

#include <atomic>
#include <cstdlib>
#include <stdexcept>

#include "runtime/cpu_features.h"
#include "runtime/isa.h"

namespace pyinfer {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

Isa parse_isa(const std::string& name) {
  if (name == "scalar") return Isa::scalar;
  if (name == "avx2") return Isa::avx2;
  if (name == "avx512") return Isa::avx512;
  throw std::invalid_argument("unknown ISA path '" + name + "': expected scalar, avx2 or avx512");
}

namespace {

bool supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  switch (isa) {
    case Isa::scalar: return true;
#if PYINFER_X86
    case Isa::avx2: return f.can_avx2();
    case Isa::avx512: return f.can_avx512();
#endif
    default: (void)f; return false;
  }
}

#if PYINFER_X86
// The per-CPU choices: the AMD EPYC's hardware prefetcher kept a single stream of weights near
// the read bandwidth alone, where the Intel Xeon's needed requests ahead.
KernelTuning tuning() {
  KernelTuning k;
  k.stream_fetch_ahead = cpu_features().vendor_intel;
  return k;
}
#endif

KernelTable make_table(Isa isa) {
  KernelTable t{};
  t.isa = isa;
  // Every table starts from the scalar kernels, so a type without a SIMD variant still works.
  fill_dequant_scalar(t);
  fill_ops_scalar(t);
  fill_matmul_scalar(t);
#if PYINFER_X86
  const KernelTuning k = tuning();
  if (isa == Isa::avx2) {
    fill_dequant_avx2(t);
    fill_ops_avx2(t, k);
    fill_matmul_avx2(t, k);
  }
  if (isa == Isa::avx512) {
    fill_dequant_avx2(t);
    fill_ops_avx2(t, k);
    fill_matmul_avx2(t, k);
    fill_dequant_avx512(t);
    fill_ops_avx512(t, k);
    fill_matmul_avx512(t, k);
  }
#endif
  t.isa = isa;
  return t;
}

Isa best_isa() {
  if (supported(Isa::avx512)) return Isa::avx512;
  if (supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

Isa initial_isa() {
  const char* env = std::getenv("PYINFER_ISA");
  if (env == nullptr || *env == '\0') return best_isa();
  Isa isa;
  try {
    isa = parse_isa(env);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("PYINFER_ISA: ") + e.what());
  }
  if (!supported(isa))
    throw std::runtime_error(std::string("PYINFER_ISA=") + env +
                             ": this CPU (or this build) does not support that path; "
                             "pyinfer.cpu_info() lists the available ones");
  return isa;
}

std::atomic<const KernelTable*> g_active{nullptr};

}  // namespace

const KernelTable& kernels_for(Isa isa) {
  if (!supported(isa))
    throw std::runtime_error(std::string("ISA path '") + isa_name(isa) +
                             "' is not available on this CPU or in this build");
  static const KernelTable scalar = make_table(Isa::scalar);
  static const KernelTable avx2 = supported(Isa::avx2) ? make_table(Isa::avx2) : scalar;
  static const KernelTable avx512 = supported(Isa::avx512) ? make_table(Isa::avx512) : scalar;
  switch (isa) {
    case Isa::avx2: return avx2;
    case Isa::avx512: return avx512;
    default: return scalar;
  }
}

const KernelTable& kernels() {
  const KernelTable* t = g_active.load(std::memory_order_acquire);
  if (t == nullptr) {
    t = &kernels_for(initial_isa());
    g_active.store(t, std::memory_order_release);
  }
  return *t;
}

Isa active_isa() { return kernels().isa; }

void set_isa(Isa isa) { g_active.store(&kernels_for(isa), std::memory_order_release); }

}  // namespace pyinfer
