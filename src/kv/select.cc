#include "kv/select.h"

#include <algorithm>
#include <cstdint>

namespace squeezekv {

int recent_window(int budget, int sinks, int recent) {
  const int r = recent >= 0 ? recent : budget / 2;
  return std::max(0, std::min(r, budget - sinks));
}

EvictableRange evictable_range(int budget, int sinks, int recent, int32_t newest_position) {
  const int n_sink = std::min(sinks, budget);
  const int n_recent = std::min(recent, budget - n_sink);
  // the newest n_recent positions are all present (never evicted), so they sit at or above
  // newest - n_recent + 1; sinks are positions below n_sink
  return {n_sink, newest_position - n_recent + 1};
}

int select_sinks_recent_top(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                            std::vector<int>& evict) {
  const int n = s.count();
  const int n_evict = n - budget;
  if (n_evict <= 0) return 0;
  const int G = s.n_kv_heads();
  evict.resize(static_cast<size_t>(G) * n_evict);
  const EvictableRange range = evictable_range(budget, sinks, recent, s.newest_position());
  const int32_t n_sink = range.keep_below, recent_from = range.keep_from;
  thread_local std::vector<int> middle;
  for (int g = 0; g < G; ++g) {
    const float* sc = scores + g * stride;
    const int32_t* pos = s.positions(g);
    int* out = evict.data() + static_cast<size_t>(g) * n_evict;
    // the lowest scores go; between equal scores the newer goes, so ties keep the older position
    auto worse = [sc, pos](int a, int b) { return sc[a] < sc[b] || (sc[a] == sc[b] && pos[a] > pos[b]); };
    if (n_evict == 1) {  // a decode step: one scan
      int worst = -1;
      for (int j = 0; j < n; ++j) {
        if (pos[j] < n_sink || pos[j] >= recent_from) continue;
        if (worst < 0 || worse(j, worst)) worst = j;
      }
      out[0] = worst;
      continue;
    }
    middle.clear();
    for (int j = 0; j < n; ++j)
      if (pos[j] >= n_sink && pos[j] < recent_from) middle.push_back(j);
    std::nth_element(middle.begin(), middle.begin() + (n_evict - 1), middle.end(), worse);
    std::copy(middle.begin(), middle.begin() + n_evict, out);
    std::sort(out, out + n_evict);
  }
  return n_evict;
}

}  // namespace squeezekv
