#include "kv/select.h"

#include <algorithm>

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
  for (int g = 0; g < G; ++g) {
    const float* sc = scores + g * stride;
    int* out = keep.data() + static_cast<size_t>(g) * budget;
    middle.clear();
    for (int j = n_sink; j < n - n_recent; ++j) middle.push_back(j);
    // highest score first; ties to the older (lower) slot
    auto better = [sc](int a, int b) { return sc[a] > sc[b] || (sc[a] == sc[b] && a < b); };
    if (n_top > 0) {
      std::nth_element(middle.begin(), middle.begin() + n_top, middle.end(), better);
      std::sort(middle.begin(), middle.begin() + n_top);
    }
    int k = 0;
    for (int j = 0; j < n_sink; ++j) out[k++] = j;
    for (int i = 0; i < n_top; ++i) out[k++] = middle[i];
    for (int j = n - n_recent; j < n; ++j) out[k++] = j;
  }
  return budget;
}

}  // namespace squeezekv
