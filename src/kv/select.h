// The survivor rule shared by the score-based policies (h2o, squeeze, snapkv, pyramidkv) and
// window: keep the first `sinks` positions of the sequence, the newest `recent` positions, and the
// `budget - sinks - recent` highest scores among the rest (ties to the older position); evict the
// others. Positions, not slots, identify tokens: slots are unordered after eviction.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kv/kv_storage.h"

namespace squeezekv {

// scores: per head g, scores + g * stride gives one score per slot [count].
// Writes the slots to evict as [G][count - budget] (ascending per head) and returns how many
// (0 when count <= budget: nothing written).
int select_sinks_recent_top(const KvStorage& s, int budget, int sinks, int recent, const float* scores,
                            size_t stride, std::vector<int>& evict);

// The positions select_sinks_recent_top never evicts, as the range of positions it may evict:
// [keep_below, keep_from) (sinks are the first min(sinks, budget) positions, the recent window
// the newest min(recent, budget - sinks) ones).
struct EvictableRange {
  int32_t keep_below = 0, keep_from = 0;
};
EvictableRange evictable_range(int budget, int sinks, int recent, int32_t newest_position);

// The recent window a score-based policy keeps at a budget: `recent` when set (>= 0), else
// budget / 2, and never more than leaves room for the sinks.
int recent_window(int budget, int sinks, int recent);

}  // namespace squeezekv
