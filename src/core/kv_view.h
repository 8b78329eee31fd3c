// One layer's retained keys and values as every backend's attention reads them. The memory
// belongs to the backend the cache was built on (host memory for the CPU); positions are host or
// device memory alike, next to the rows they describe.
#pragma once
#include <cstddef>
#include <cstdint>

namespace squeezekv {

enum class KvType : uint8_t { kF16, kF32 };
inline size_t kv_type_bytes(KvType t) { return t == KvType::kF16 ? 2 : 4; }

// Read-only view of one layer's retained keys and values.
struct KvView {
  KvType type = KvType::kF16;
  const void* k = nullptr;         // [G][capacity][D]
  const void* v = nullptr;         // [G][capacity][D]
  const int32_t* pos = nullptr;    // [G][capacity] absolute positions (slots in no particular order)
  int count = 0;                   // N rows held per head
  int capacity = 0;
  int n_kv_heads = 0;              // G
  int head_dim = 0;                // D
};

}  // namespace squeezekv
