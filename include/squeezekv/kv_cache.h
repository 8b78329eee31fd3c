// KV cache configuration and per-layer accounting (DESIGN.md "Cache architecture").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace squeezekv {

enum class KvPolicy : uint8_t { kFull };
enum class KvDType : uint8_t { kF16, kF32 };

struct CacheConfig {
  KvPolicy policy = KvPolicy::kFull;
  KvDType dtype = KvDType::kF16;
  int max_tokens = 0;  // capacity of a full cache per layer (0: the model's context length)
};

// One layer's accounting after the last step.
struct LayerStats {
  int layer = 0;
  int64_t tokens_seen = 0;  // rows ever appended
  int tokens_kept = 0;      // rows held now
  int budget = 0;           // most rows the layer may hold after a step
  int64_t kept_bytes = 0;   // bytes actually held (K and V)
  int64_t full_bytes = 0;   // f16 bytes with no eviction
};

KvPolicy parse_kv_policy(const std::string& name);  // throws Error naming the value
KvDType parse_kv_dtype(const std::string& name);

}  // namespace squeezekv
