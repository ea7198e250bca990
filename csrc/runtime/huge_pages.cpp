// huge_pages.cpp: huge-page-advised allocations (huge_pages.h).
#include "runtime/huge_pages.h"

#include <cstdlib>
#include <cstring>

#include "runtime/checked.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace pyinfer {

uint8_t* huge_page_alloc(size_t n, bool zeroed, const char* what) {
  if (n > SIZE_MAX - kHugePage) throw AllocationError(n, what);
  const size_t alloc = n == 0 ? kHugePage : (n + kHugePage - 1) / kHugePage * kHugePage;
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, alloc));
  if (p == nullptr) throw AllocationError(n, what);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, alloc, MADV_HUGEPAGE);
#endif
  if (!zeroed) return p;
#if defined(__linux__) && defined(MADV_DONTNEED)
  // The block is private anonymous memory and whole pages of it are ours: given back, its
  // pages read as zero and are faulted in again only when touched.
  if (madvise(p, alloc, MADV_DONTNEED) == 0) return p;
#endif
  std::memset(p, 0, alloc);
  return p;
}

}  // namespace pyinfer
