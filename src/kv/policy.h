// Eviction policies: small objects that see a layer's host-side metadata (positions, mass) and
// name the survivors. They never touch K/V memory; LayerCache applies their choice in one pass.
#pragma once
#include <memory>
#include <vector>

#include "kv/kv_storage.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Whether attention must report the mass each retained key received.
  virtual bool needs_mass() const { return false; }
  // Most rows the layer may hold after a step.
  virtual int budget(const KvStorage& s) const { return s.capacity(); }
  // Writes the surviving slots to keep as [G][n_keep] (ascending per head) and returns n_keep;
  // returns s.count() (and leaves keep alone) when nothing is evicted.
  virtual int select(const KvStorage& s, std::vector<int>& keep) = 0;
};

// Keeps everything (the reference every other policy must match when its budget is not binding).
class FullPolicy final : public EvictionPolicy {
 public:
  int select(const KvStorage& s, std::vector<int>&) override { return s.count(); }
};

std::unique_ptr<EvictionPolicy> make_policy(const CacheConfig& cfg, int layer);

}  // namespace squeezekv
