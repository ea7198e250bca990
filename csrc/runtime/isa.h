// isa.h: the ISA paths pyinfer is built for and the active one, for code that needs to know
// which path runs without reaching the kernel table (the probes, the bindings).
#pragma once
#include <string>

namespace pyinfer {

enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };
const char* isa_name(Isa isa);
// Parse "scalar" | "avx2" | "avx512"; throws std::invalid_argument otherwise.
Isa parse_isa(const std::string& name);

// The path in use: the best the CPU supports, or PYINFER_ISA, or set_isa(). The first call
// resolves it and throws std::runtime_error for a PYINFER_ISA this CPU or build lacks.
Isa active_isa();
// Make isa the active path; throws std::runtime_error if this CPU or build lacks it.
void set_isa(Isa isa);

}  // namespace pyinfer
