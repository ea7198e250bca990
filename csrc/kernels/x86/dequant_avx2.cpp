// dequant_avx2.cpp: avx2 dequantization kernels (this file alone is compiled with avx2 flags).
#include "dispatch.h"

namespace pyinfer {

void fill_kernels_avx2(KernelTable& t) { (void)t; }

}  // namespace pyinfer
