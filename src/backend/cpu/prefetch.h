// Asking for a weight row's cache lines before they are read (software prefetch), shared by the
// decode kernels of every instruction set. Internal linkage (static): files compiled for AVX-512
// include it too, and no copy of theirs may be picked by the linker for the others.
#pragma once
#include <cstddef>

namespace squeezekv::cpu {

// Every 64-byte line of the `bytes` bytes at row, for reading (kept in every cache level).
static inline void prefetch_row(const void* row, size_t bytes) {
  const char* p = static_cast<const char*>(row);
  for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 3);
}

}  // namespace squeezekv::cpu
