// One layer's retained keys and values as every backend's attention reads them. The memory
// belongs to the backend the cache was built on (host memory for the CPU); positions are host or
// device memory alike, next to the rows they describe.
#pragma once
#include <cstddef>
#include <cstdint>

namespace squeezekv {

enum class KvType : uint8_t { kF16, kF32 };
inline size_t kv_type_bytes(KvType t) { return t == KvType::kF16 ? 2 : 4; }

// Read-only view of one layer's retained keys and values. No implicit padding: a device records
// its kernels' arguments byte for byte (a replayed step must find the same bytes).
struct KvView {
  const void* k = nullptr;         // [G][capacity][D]
  const void* v = nullptr;         // [G][capacity][D]
  const int32_t* pos = nullptr;    // [G][capacity] absolute positions (slots in no particular order)
  // The count in the backend's memory when the sequence stages it there (devices: a kernel reads
  // N from it, so the launches of a step do not change with N); null: count is all there is.
  const int32_t* count_dev = nullptr;
  int count = 0;                   // N rows held per head
  int capacity = 0;
  int n_kv_heads = 0;              // G
  int head_dim = 0;                // D
  KvType type = KvType::kF16;
  uint8_t pad_[7] = {};
};
static_assert(sizeof(KvView) == 4 * sizeof(void*) + 4 * sizeof(int) + 8, "KvView: no implicit padding");

}  // namespace squeezekv
