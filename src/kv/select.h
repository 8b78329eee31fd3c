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

// The rows a step evicts: head g's slots are slots[offsets[g] .. offsets[g + 1]), ascending.
// Heads may lose different numbers of rows (head-adaptive budgets).
struct Eviction {
  std::vector<int> slots;
  std::vector<int> offsets;  // [G + 1]
  // slots holds [G][n] (select_sinks_recent_top's layout): every head loses n rows
  void set_uniform(int G, int n) {
    offsets.resize(static_cast<size_t>(G) + 1);
    for (int g = 0; g <= G; ++g) offsets[g] = g * n;
  }
  bool any() const { return !offsets.empty() && offsets.back() > 0; }
};

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

// select_sinks_recent_top into an Eviction; false when nothing is evicted.
bool select_uniform(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                    Eviction& out);

// Head-adaptive budgets (Ada-KV, Feng et al. 2024): the layer keeps G x budget rows in all. Every
// head keeps its sinks and recent window (as select_sinks_recent_top's); the other rows compete
// across heads by score (ties to the older position, then the lower head), every head keeping at
// least floor_share of its uniform share of them (Ada-KV's safeguard; 0: none, as KVzip) and at
// most max_rows rows in all. Dead slots (KvStorage::kDeadPos) are always evicted. False when
// nothing is evicted.
bool select_head_adaptive(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                          int max_rows, Eviction& out, double floor_share = 0.2);

// The rule of a score-based policy (h2o, snapkv, squeeze): uniform per head, or head-adaptive
// (--kv-head-alloc adaptive; one head then holds at most 2 x budget rows).
bool select_by_score(const KvStorage& s, bool adaptive, int budget, int sinks, int recent, const float* scores,
                     size_t stride, Eviction& out);
inline int max_head_rows(bool adaptive, int budget) { return adaptive ? 2 * budget : budget; }

// What a layer reports to a squeeze coordinator over a scorer's rows (--kv-layer-alloc squeeze):
// the share of the held rows' scores that the `budget` highest of each kv head hold, the mean over
// heads; pooled (head-adaptive): of all the layer's rows, the G x budget highest. 1 when they all
// fit or nothing scored. Dead slots are skipped. Lower: the scores are spread wider, the layer
// needs more rows.
double score_coverage(const KvStorage& s, const float* scores, size_t stride, int budget, bool pooled);

// The recent window a score-based policy keeps at a budget: `recent` when set (>= 0), else
// budget / 2, and never more than leaves room for the sinks.
int recent_window(int budget, int sinks, int recent);

}  // namespace squeezekv
