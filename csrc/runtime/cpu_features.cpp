// cpu_features.cpp: cpuid/xgetbv feature detection (compiled with no -m flags).
#include "runtime/cpu_features.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <cstdint>
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

CpuFeatures detect() {
  CpuFeatures f;
  f.x86 = true;
  unsigned a, b, c, d;
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 1) return f;
  __cpuid(0, a, b, c, d);
  f.vendor_intel = b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu;  // "Genu" "ineI" "ntel"
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
    if (max_sub >= 1) {
      __cpuid_count(7, 1, a, b, c, d);
      f.avx_vnni = a & (1u << 4);
      f.avx512_bf16 = a & (1u << 5);
    }
  }
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
