// dispatch.h: the per-ISA kernel table and the run-time choice of one. Only the ops drivers
// (csrc/ops/) and the dispatcher itself include this: everything else calls the drivers.
#pragma once
#include "kernels/abi.h"
#include "runtime/isa.h"

namespace pyinfer {

// One ISA's kernel set, tagged with its ISA.
struct KernelTable : KernelSet {
  Isa isa;
};

// The table of the active path (active_isa()).
const KernelTable& kernels();
// Table of a given ISA; throws std::runtime_error if this CPU or build lacks it.
const KernelTable& kernels_for(Isa isa);

}  // namespace pyinfer
