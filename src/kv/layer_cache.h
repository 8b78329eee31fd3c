// One layer's KV cache: storage + eviction policy. The forward pass appends the step's rows, runs
// attention over view(), reports the mass when wants_mass(), and calls end_step() once every layer
// has run; end_step prepares the survivor set and applies it in one pass.
// Thread safety: none; owned by one sequence.
#pragma once
#include <memory>
#include <vector>

#include "kv/kv_storage.h"
#include "kv/policy.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

class LayerCache {
 public:
  LayerCache(int layer, KvStorage storage, std::unique_ptr<EvictionPolicy> policy);

  void append(const float* k, const float* v, const int32_t* pos, int T);  // k, v [T][G*D]
  cpu::KvView view() const { return storage_.view(); }
  bool wants_mass() const { return policy_->needs_mass(); }
  void observe(const float* mass) { storage_.add_mass(mass); }  // mass [G][count]
  void end_step();
  void reset();
  LayerStats stats() const;
  const KvStorage& storage() const { return storage_; }

 private:
  int layer_;
  KvStorage storage_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<int> keep_;  // [G][n_keep], reused every step
  int64_t tokens_seen_ = 0;
};

// Builds the caches of one sequence (one per layer).
struct ModelConfig;
std::vector<LayerCache> build_caches(const ModelConfig& model, const CacheConfig& cfg);

}  // namespace squeezekv
