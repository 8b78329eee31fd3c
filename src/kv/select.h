// The survivor rule shared by the score-based policies (h2o, squeeze, snapkv, pyramidkv):
// the first `sinks` slots, the last `recent` slots, and the `budget - sinks - recent` highest
// scores among the rest (ties to the older position), written ascending per head.
#pragma once
#include <cstddef>
#include <vector>

#include "kv/kv_storage.h"

namespace squeezekv {

// scores: per head g, scores + g * stride gives one score per slot [count].
// Returns the number kept per head (count when count <= budget: nothing written).
int select_sinks_recent_top(const KvStorage& s, int budget, int sinks, int recent, const float* scores,
                            size_t stride, std::vector<int>& keep);

// The recent window a score-based policy keeps at a budget: `recent` when set (>= 0), else
// budget / 2, and never more than leaves room for the sinks.
int recent_window(int budget, int sinks, int recent);

}  // namespace squeezekv
