// sample_row: the sampler's definition (sample.h), without sorting the vocabulary.
#include "core/sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/argmax.h"

namespace squeezekv {

namespace {

// order (q descending, id ascending)
bool before(const std::pair<float, int>& a, const std::pair<float, int>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

int sample_row(std::span<const float> logits, const SampleParams& p, SampleScratch& s, SampleCut* cut_out) {
  const int V = static_cast<int>(logits.size());
  SampleCut cut;
  if (p.temperature <= 0.0f) {
    if (cut_out != nullptr) *cut_out = cut;
    return argmax(logits);
  }
  std::vector<std::pair<float, int>>& cand = s.cand;
  cand.resize(static_cast<size_t>(V));
  for (int i = 0; i < V; ++i) cand[i] = {logits[i], i};
  size_t n = cand.size();  // cand[0, n): the tokens top-k leaves, in id order, as (q, id)
  float mx = -INFINITY;
  if (p.top_k > 0 && p.top_k < V) {  // the k largest logits, then back in id order
    n = static_cast<size_t>(p.top_k);
    std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), cand.end(), before);
    cut.top_k = true;
    cut.l_k = cand[n - 1].first;
    cut.id_k = cand[n - 1].second;
    mx = cand[0].first / p.temperature;
    std::sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(n), [](const auto& a, const auto& b) { return a.second < b.second; });
  } else {
    for (const auto& c : cand) mx = std::max(mx, c.first / p.temperature);
  }
  for (size_t i = 0; i < n; ++i) cand[i].first = std::exp(cand[i].first / p.temperature - mx);
  const std::span<const std::pair<float, int>> left(cand.data(), n);
  // min-p keeps q >= min_p (x the top probability, 1); top-p's cut (tau, id_tau) is found from a
  // histogram of the mass over q's float bits (q's order is its bits' order), the bucket where the
  // target is reached alone sorted
  cut.cut = p.min_p > 0.0f || p.top_p < 1.0f;
  cut.tau = p.min_p;
  cut.id_tau = V;
  auto kept = [&](const std::pair<float, int>& c) { return cut.in_q_cut(c.first, c.second); };  // cand[0, n): what top-k left
  double sum = 0.0;
  for (const auto& c : left)
    if (kept(c)) sum += c.first;
  if (p.top_p < 1.0f) {
    constexpr int kShift = 19, kBuckets = 1 << (31 - kShift);  // q >= 0: the sign bit is 0
    s.bucket_mass.assign(kBuckets, 0.0);
    auto bucket = [](float q) {
      uint32_t b;
      std::memcpy(&b, &q, sizeof b);
      return static_cast<int>(b >> kShift);
    };
    for (const auto& c : left)
      if (kept(c)) s.bucket_mass[static_cast<size_t>(bucket(c.first))] += c.first;
    const double target = p.top_p * sum;
    double acc = 0.0;
    int b = kBuckets - 1;
    for (; b > 0 && acc + s.bucket_mass[static_cast<size_t>(b)] < target; --b) acc += s.bucket_mass[static_cast<size_t>(b)];
    s.edge.clear();
    for (const auto& c : left)
      if (kept(c) && bucket(c.first) == b) s.edge.push_back(c);
    std::sort(s.edge.begin(), s.edge.end(), before);
    if (!s.edge.empty()) {
      size_t k = 0;
      while (k + 1 < s.edge.size() && acc + s.edge[k].first < target) acc += s.edge[k++].first;
      cut.tau = s.edge[k].first;
      cut.id_tau = s.edge[k].second;
    }
    sum = 0.0;
    for (const auto& c : left)
      if (kept(c)) sum += c.first;
  }
  // the draw, in id order
  double r = p.draw * sum;
  if (cut_out != nullptr) {
    *cut_out = cut;
    cut_out->kept_mass = sum;
    cut_out->r = r;
  }
  int last = 0;
  for (const auto& c : left) {
    if (!kept(c)) continue;
    last = c.second;
    r -= c.first;
    if (r <= 0.0) return c.second;
  }
  return last;
}

}  // namespace squeezekv
