#include "kv/select.h"

#include <algorithm>
#include <cstdint>

namespace squeezekv {

int recent_window(int budget, int sinks, int recent) {
  const int r = recent >= 0 ? recent : budget / 2;
  return std::max(0, std::min(r, budget - sinks));
}

int select_sinks_recent_top(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                            std::vector<int>& keep) {
  const int n = s.count();
  if (n <= budget) return n;
  const int G = s.n_kv_heads();
  const int n_sink = std::min(sinks, budget);
  const int n_recent = std::min(recent, budget - n_sink);
  const int n_evict = n - budget;
  keep.resize(static_cast<size_t>(G) * budget);
  thread_local std::vector<int> middle;
  thread_local std::vector<uint8_t> kept;
  kept.resize(static_cast<size_t>(n));
  // the newest n_recent positions are all present (never evicted), so they sit at or above
  // newest - n_recent + 1; sinks are positions below n_sink
  const int32_t recent_from = s.newest_position() - n_recent + 1;
  for (int g = 0; g < G; ++g) {
    const float* sc = scores + g * stride;
    const int32_t* pos = s.positions(g);
    middle.clear();
    for (int j = 0; j < n; ++j) {
      kept[j] = 1;
      if (pos[j] >= n_sink && pos[j] < recent_from) middle.push_back(j);
    }
    // evict the n_evict lowest scores among the middle; between equal scores the newer goes, so
    // ties keep the older position
    auto worse = [sc, pos](int a, int b) { return sc[a] < sc[b] || (sc[a] == sc[b] && pos[a] > pos[b]); };
    if (n_evict == 1) {  // the decode step: one linear scan
      kept[*std::min_element(middle.begin(), middle.end(), worse)] = 0;
    } else {
      std::nth_element(middle.begin(), middle.begin() + (n_evict - 1), middle.end(), worse);
      for (int i = 0; i < n_evict; ++i) kept[middle[i]] = 0;
    }
    // emit ascending without sorting
    int* out = keep.data() + static_cast<size_t>(g) * budget;
    int k = 0;
    for (int j = 0; j < n; ++j)
      if (kept[j]) out[k++] = j;
  }
  return budget;
}

}  // namespace squeezekv
