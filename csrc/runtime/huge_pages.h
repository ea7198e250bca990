// huge_pages.h: memory for the arrays every decode step streams whole (the repacked weights,
// the KV cache), on transparent huge pages where the system allows.
#pragma once
#include <cstddef>
#include <cstdint>

namespace pyinfer {

constexpr size_t kHugePage = size_t{2} << 20;

// n bytes, 2 MiB-aligned and advised onto transparent huge pages (advice only: where it is
// refused the pages stay small), to be released with std::free. A stream over 4 KiB pages
// misses the TLB on every page, and the page walks' own reads miss the cache behind a stream
// of this size (docs/tuning.md, "the KV cache on huge pages"). With `zeroed`, every byte reads
// as zero; on Linux none is resident until first written (the pages come from the system as
// they are touched, as calloc's would, but 2 MiB at a time), elsewhere, or where the system
// refuses to take the pages back, the block is cleared, so all of it is resident at once.
// Throws AllocationError (what: what the bytes are for) if the system refuses the memory.
uint8_t* huge_page_alloc(size_t n, bool zeroed, const char* what);

}  // namespace pyinfer
