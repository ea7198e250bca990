// cpu_features.h: what the CPU and OS support, found with cpuid/xgetbv at run time.
#pragma once

namespace pyinfer {

struct CpuFeatures {
  bool sse42 = false, avx = false, avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_vnni = false, avx512_bf16 = false, avx_vnni = false;
  bool os_avx = false;     // OS saves ymm state (XCR0 bits 1, 2)
  bool os_avx512 = false;  // OS saves zmm/opmask state (XCR0 bits 5, 6, 7)
  bool x86 = false;
  bool vendor_intel = false;  // cpuid's vendor string is GenuineIntel

  // Everything the AVX2 path's files were compiled for.
  bool can_avx2() const { return x86 && os_avx && avx2 && fma && f16c; }
  // Everything the AVX-512 path's files were compiled for.
  bool can_avx512() const {
    return can_avx2() && os_avx512 && avx512f && avx512bw && avx512vl && avx512dq && avx512_vnni;
  }
};

// Detected once; this file is compiled with no ISA flags so it cannot fault itself.
const CpuFeatures& cpu_features();

}  // namespace pyinfer
