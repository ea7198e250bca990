// cpu_features.cpp: cpuid/xgetbv feature detection (compiled with no -m flags).
#include "runtime/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <cstdint>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pyinfer {

namespace {

#if defined(__x86_64__) || defined(__i386__)
uint64_t read_xcr0() {
  uint32_t eax, edx;
  // xgetbv with ecx = 0; written as asm so no -mxsave flag is needed.
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

// Linux hands the tile data state (XSAVE feature 18) to a process only once it asks for it;
// a tile instruction before that faults. False where it is refused or the request is unknown.
bool request_tile_state() {
#if defined(__linux__) && defined(__x86_64__)
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  f.x86 = true;
  unsigned a, b, c, d;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid(1, a, b, c, d);
  f.sse42 = c & (1u << 20);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  f.avx = c & (1u << 28);
  bool osxsave = c & (1u << 27);
  if (osxsave) {
    uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;
    f.os_avx512 = f.os_avx && (xcr0 & 0xe0) == 0xe0;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    unsigned max_sub = a;
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512_vnni = c & (1u << 11);
    f.amx_tile = d & (1u << 24);
    f.amx_int8 = d & (1u << 25);
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx_vnni = a & (1u << 4);
      f.avx512_bf16 = a & (1u << 5);
    }
  }
  if (f.amx_tile && f.amx_int8 && osxsave && (read_xcr0() & 0x60000) == 0x60000) f.os_amx = request_tile_state();
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

}  // namespace pyinfer
