// dequant_avx512.cpp: avx512 dequantization kernels (this file alone is compiled with avx512 flags).
#include "dispatch.h"

namespace pyinfer {

void fill_kernels_avx512(KernelTable& t) { (void)t; }

}  // namespace pyinfer
