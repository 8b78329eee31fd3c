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
  const int n_top = budget - n_sink - n_recent;
  keep.resize(static_cast<size_t>(G) * budget);
  thread_local std::vector<int> middle;
  thread_local std::vector<uint8_t> kept;
  kept.resize(static_cast<size_t>(n));
  for (int g = 0; g < G; ++g) {
    const float* sc = scores + g * stride;
    const int32_t* pos = s.positions(g);
    // the newest n_recent positions are all present (never evicted), so they sit at or above
    // newest - n_recent + 1; sinks are positions below n_sink
    const int32_t newest = *std::max_element(pos, pos + n);
    const int32_t recent_from = newest - n_recent + 1;
    middle.clear();
    for (int j = 0; j < n; ++j) {
      const bool protected_slot = pos[j] < n_sink || pos[j] >= recent_from;
      kept[j] = protected_slot;
      if (!protected_slot) middle.push_back(j);
    }
    // highest score first; ties to the older position
    auto better = [sc, pos](int a, int b) { return sc[a] > sc[b] || (sc[a] == sc[b] && pos[a] < pos[b]); };
    if (n_top > 0 && n_top < static_cast<int>(middle.size()))
      std::nth_element(middle.begin(), middle.begin() + n_top, middle.end(), better);
    for (int i = 0; i < std::min<int>(n_top, static_cast<int>(middle.size())); ++i) kept[middle[i]] = 1;
    // emit ascending without sorting
    int* out = keep.data() + static_cast<size_t>(g) * budget;
    int k = 0;
    for (int j = 0; j < n; ++j)
      if (kept[j]) out[k++] = j;
  }
  return budget;
}

}  // namespace squeezekv
