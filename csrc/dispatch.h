// dispatch.h: the per-ISA kernel table and the run-time choice of one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "quant_blocks.h"

namespace pyinfer {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };
const char* isa_name(Isa isa);

// Dequantize n elements (a multiple of the type's block size) from raw GGUF blocks to float32.
using DequantRowFn = void (*)(const void* src, float* dst, int64_t n);
// Read n_bytes (a multiple of 64, 64-byte aligned) and return a value that depends on every
// byte, so the loads cannot be elided: the inner loop of the bandwidth probe.
using ReadSumFn = uint64_t (*)(const void* src, size_t n_bytes);

struct KernelTable {
  Isa isa;
  DequantRowFn dequant_row[GGML_TYPE_SLOTS];  // nullptr where a type has no kernel
  ReadSumFn read_sum;
};

// One table per compiled ISA; each is defined in that ISA's files.
void fill_kernels_scalar(KernelTable& t);
#if PYINFER_X86
void fill_kernels_avx2(KernelTable& t);
void fill_kernels_avx512(KernelTable& t);
#endif

// The table in use: the best the CPU supports, or PYINFER_ISA, or set_isa().
const KernelTable& kernels();
// Table of a given ISA; throws std::runtime_error if this CPU or build lacks it.
const KernelTable& kernels_for(Isa isa);
// Make isa the active path; throws std::runtime_error if this CPU or build lacks it.
void set_isa(Isa isa);
// Parse "scalar" | "avx2" | "avx512"; throws std::invalid_argument otherwise.
Isa parse_isa(const std::string& name);

}  // namespace pyinfer
