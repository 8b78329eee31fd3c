#include "kv/select.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <functional>

namespace squeezekv {

bool select_uniform(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                    Eviction& out) {
  const int n = select_sinks_recent_top(s, budget, sinks, recent, scores, stride, out.slots);
  out.set_uniform(s.n_kv_heads(), n);
  return n > 0;
}

bool select_head_adaptive(const KvStorage& s, int budget, int sinks, int recent, const float* scores, size_t stride,
                          int max_rows, Eviction& out, double floor_share) {
  const int G = s.n_kv_heads(), n = s.count();
  if (s.live_total() <= static_cast<int64_t>(G) * budget) return false;
  const EvictableRange range = evictable_range(budget, sinks, recent, s.newest_position());
  struct Cand {
    float score;
    int32_t pos;
    int g, slot;
  };
  thread_local std::vector<Cand> cand;
  thread_local std::vector<uint8_t> keep;  // [G][n]
  thread_local std::vector<int> protected_rows, taken, first;
  cand.clear();
  keep.assign(static_cast<size_t>(G) * n, 0);
  protected_rows.assign(G, 0);
  taken.assign(G, 0);
  first.assign(static_cast<size_t>(G) + 1, 0);
  for (int g = 0; g < G; ++g) {
    const int32_t* pos = s.positions(g);
    const float* sc = scores + g * stride;
    first[g] = static_cast<int>(cand.size());
    for (int j = 0; j < n; ++j) {
      if (pos[j] == KvStorage::kDeadPos) continue;
      if (pos[j] < range.keep_below || pos[j] >= range.keep_from) {
        keep[static_cast<size_t>(g) * n + j] = 1;
        ++protected_rows[g];
      } else {
        cand.push_back({sc[j], pos[j], g, j});
      }
    }
  }
  first[G] = static_cast<int>(cand.size());
  auto better = [](const Cand& a, const Cand& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.pos != b.pos) return a.pos < b.pos;
    return a.g < b.g;
  };
  int64_t heavy = static_cast<int64_t>(G) * budget;
  for (int g = 0; g < G; ++g) heavy -= protected_rows[g];
  // the floor: each head's best fifth of its uniform share of the heavy rows
  const int floor_rows = std::max(0, static_cast<int>(floor_share * (budget - std::min(budget, sinks + recent))));
  for (int g = 0; g < G; ++g) {
    std::sort(cand.begin() + first[g], cand.begin() + first[g + 1], better);
    const int f = std::min({floor_rows, first[g + 1] - first[g], std::max(0, max_rows - protected_rows[g])});
    for (int i = 0; i < f && heavy > 0; ++i, --heavy) {
      const Cand& c = cand[first[g] + i];
      keep[static_cast<size_t>(c.g) * n + c.slot] = 1;
      ++taken[g];
    }
  }
  // the rest by score over every head, within each head's max_rows
  thread_local std::vector<Cand> rest;
  rest.clear();
  for (int g = 0; g < G; ++g) rest.insert(rest.end(), cand.begin() + first[g] + taken[g], cand.begin() + first[g + 1]);
  std::sort(rest.begin(), rest.end(), better);
  for (const Cand& c : rest) {
    if (heavy <= 0) break;
    if (protected_rows[c.g] + taken[c.g] >= max_rows) continue;
    keep[static_cast<size_t>(c.g) * n + c.slot] = 1;
    ++taken[c.g];
    --heavy;
  }
  out.slots.clear();
  out.offsets.assign(1, 0);
  for (int g = 0; g < G; ++g) {
    for (int j = 0; j < n; ++j)
      if (!keep[static_cast<size_t>(g) * n + j]) out.slots.push_back(j);
    out.offsets.push_back(static_cast<int>(out.slots.size()));
  }
  return out.any();
}

bool select_by_score(const KvStorage& s, bool adaptive, int budget, int sinks, int recent, const float* scores,
                     size_t stride, Eviction& out) {
  if (adaptive) return select_head_adaptive(s, budget, sinks, recent, scores, stride, max_head_rows(true, budget), out);
  return select_uniform(s, budget, sinks, recent, scores, stride, out);
}

double score_coverage(const KvStorage& s, const float* scores, size_t stride, int budget, bool pooled) {
  const int G = s.n_kv_heads(), n = s.count();
  std::vector<float> m;
  auto share = [&m](int k) {
    double total = 0.0, top = 0.0;
    for (float x : m) total += x;
    k = std::min(k, static_cast<int>(m.size()));
    if (k <= 0 || total <= 0.0) return 1.0;
    std::nth_element(m.begin(), m.begin() + (k - 1), m.end(), std::greater<float>());
    for (int i = 0; i < k; ++i) top += m[i];
    return top / total;
  };
  double sum = 0.0;
  for (int g = 0; g < G; ++g) {
    if (!pooled) m.clear();
    const float* sc = scores + static_cast<size_t>(g) * stride;
    for (int j = 0; j < n; ++j)
      if (s.positions(g)[j] != KvStorage::kDeadPos) m.push_back(sc[j]);
    if (!pooled) sum += share(budget);
  }
  return pooled ? share(G * budget) : sum / G;
}

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
  assert(s.live_total() == static_cast<int64_t>(n) * s.n_kv_heads());  // no dead slots: head-adaptive storage uses select_head_adaptive
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
