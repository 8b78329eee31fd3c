// Budget schedules for SqueezeAttention and the coordinator that freezes one per sequence.
#include "squeezekv/squeeze_coordinator.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace squeezekv {
namespace {

void check_common(int n_layers, int avg_budget, int n_sink, double strength) {
  if (n_layers < 1) throw std::invalid_argument("n_layers must be >= 1, got " + std::to_string(n_layers));
  if (n_sink < 0) throw std::invalid_argument("n_sink must be >= 0, got " + std::to_string(n_sink));
  if (avg_budget <= n_sink)
    throw std::invalid_argument("avg_budget must be > n_sink (" + std::to_string(n_sink) + "), got " +
                                std::to_string(avg_budget));
  if (!(strength >= 0.0 && strength <= 1.0))
    throw std::invalid_argument("strength must be in [0, 1], got " + std::to_string(strength));
}

// Raises budgets below `floor` to it and takes the excess from the largest budgets, lowering the
// top group level by level; among equal budgets the higher `order_key` gives first, so an order
// that was monotone in the key stays monotone.
void apply_floor(std::vector<int64_t>& b, int64_t floor, const std::vector<double>& order_key) {
  int64_t excess = 0;
  for (auto& x : b)
    if (x < floor) {
      excess += floor - x;
      x = floor;
    }
  if (excess == 0) return;
  std::vector<size_t> idx(b.size());
  std::iota(idx.begin(), idx.end(), 0);
  // largest budget first; ties: higher key (gives first), then higher index
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t c) {
    if (b[a] != b[c]) return b[a] > b[c];
    if (order_key[a] != order_key[c]) return order_key[a] > order_key[c];
    return a > c;
  });
  size_t k = 1;  // size of the top group, all lowered to the same level
  while (excess > 0) {
    const int64_t level = b[idx[0]];
    const int64_t next = k < idx.size() ? std::max(b[idx[k]], floor) : floor;
    const int64_t can = static_cast<int64_t>(k) * (level - next);
    if (can >= excess || k == idx.size()) {
      const int64_t q = excess / static_cast<int64_t>(k), r = excess % static_cast<int64_t>(k);
      for (size_t i = 0; i < k; ++i) b[idx[i]] = level - q;
      // remainder units from the members that give first (sorted: higher key first)
      std::vector<size_t> top(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k));
      std::sort(top.begin(), top.end(), [&](size_t a, size_t c) {
        if (order_key[a] != order_key[c]) return order_key[a] > order_key[c];
        return a > c;
      });
      for (int64_t i = 0; i < r; ++i) --b[top[static_cast<size_t>(i)]];
      excess = 0;
    } else {
      for (size_t i = 0; i < k; ++i) b[idx[i]] = next;
      excess -= can;
      while (k < idx.size() && b[idx[k]] >= next) ++k;
    }
  }
}

}  // namespace

std::vector<int> squeeze_budgets(std::span<const double> c, int avg_budget, int n_sink, double strength) {
  const int n = static_cast<int>(c.size());
  check_common(n, avg_budget, n_sink, strength);
  for (size_t i = 0; i < c.size(); ++i)
    if (!std::isfinite(c[i])) throw std::invalid_argument("concentration of layer " + std::to_string(i) + " is not finite");
  std::vector<double> w(c.size());
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += w[i] = 1.0 - std::clamp(c[i], 0.0, 1.0);
  if (sum <= 0.0) {
    std::fill(w.begin(), w.end(), 1.0);
  } else {
    for (double& x : w) x *= n / sum;
  }
  const int64_t total = static_cast<int64_t>(n) * avg_budget;
  std::vector<double> target(c.size());
  for (int i = 0; i < n; ++i) target[i] = avg_budget * ((1.0 - strength) + strength * w[i]);
  // largest remainder; ties to the higher weight (lower concentration), then the lower index
  std::vector<int64_t> b(c.size());
  int64_t assigned = 0;
  for (int i = 0; i < n; ++i) assigned += b[i] = static_cast<int64_t>(std::floor(target[i]));
  std::vector<int> idx(c.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int d) {
    const double ra = target[a] - std::floor(target[a]), rd = target[d] - std::floor(target[d]);
    if (ra != rd) return ra > rd;
    if (w[a] != w[d]) return w[a] > w[d];
    return a < d;
  });
  for (int64_t k = 0; assigned < total; ++k, ++assigned) ++b[idx[static_cast<size_t>(k % n)]];
  while (assigned > total) {  // floating error only: take back from the smallest remainders
    --b[idx[static_cast<size_t>(n - 1)]];
    --assigned;
  }
  std::vector<double> key(c.size());  // higher key gives first: the higher concentration
  for (int i = 0; i < n; ++i) key[i] = -w[i];
  apply_floor(b, n_sink + 1, key);
  return std::vector<int>(b.begin(), b.end());
}

std::vector<int> kmeans3_budgets(std::span<const double> s, int avg_budget, int n_sink, double p) {
  const int n = static_cast<int>(s.size());
  check_common(n, avg_budget, n_sink, 0.0);
  if (!(p > 0.0 && p <= 1.0)) throw std::invalid_argument("p must be in (0, 1], got " + std::to_string(p));
  for (size_t i = 0; i < s.size(); ++i)
    if (!std::isfinite(s[i])) throw std::invalid_argument("score of layer " + std::to_string(i) + " is not finite");
  std::vector<double> sorted(s.begin(), s.end());
  std::sort(sorted.begin(), sorted.end());
  const size_t distinct = static_cast<size_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
  std::vector<int> out(s.size(), avg_budget);
  if (distinct < 3) return out;
  std::vector<double> all(s.begin(), s.end());
  std::sort(all.begin(), all.end());
  double cen[3] = {all.front(), all[all.size() / 2], all.back()};
  std::vector<int> label(s.size(), 0);
  for (int iter = 0; iter < 100; ++iter) {
    bool changed = false;
    for (int i = 0; i < n; ++i) {
      int best = 0;
      for (int k = 1; k < 3; ++k)
        if (std::fabs(s[i] - cen[k]) < std::fabs(s[i] - cen[best])) best = k;
      changed |= best != label[i];
      label[i] = best;
    }
    double sum[3] = {0, 0, 0};
    int cnt[3] = {0, 0, 0};
    for (int i = 0; i < n; ++i) {
      sum[label[i]] += s[i];
      ++cnt[label[i]];
    }
    for (int k = 0; k < 3; ++k)
      if (cnt[k] > 0) cen[k] = sum[k] / cnt[k];
    if (!changed && iter > 0) break;
  }
  int top = 0;
  for (int k = 1; k < 3; ++k)
    if (cen[k] > cen[top]) top = k;
  std::vector<int> rest;
  for (int i = 0; i < n; ++i)
    if (label[i] != top) rest.push_back(i);
  const int n_top = n - static_cast<int>(rest.size());
  if (n_top == 0 || rest.empty()) return out;
  const int64_t total = static_cast<int64_t>(n) * avg_budget;
  const int64_t low = std::max<int64_t>(static_cast<int64_t>(std::floor(p * avg_budget)), n_sink + 1);
  const int64_t remain = total - low * n_top;
  const int64_t each = remain / static_cast<int64_t>(rest.size());
  int64_t extra = remain % static_cast<int64_t>(rest.size());
  std::sort(rest.begin(), rest.end(), [&](int a, int b) { return s[a] < s[b] || (s[a] == s[b] && a < b); });
  for (int i = 0; i < n; ++i)
    if (label[i] == top) out[i] = static_cast<int>(low);
  for (int i : rest) out[i] = static_cast<int>(each + (extra-- > 0 ? 1 : 0));
  return out;
}

std::vector<int> water_fill_budgets(std::span<const int> budgets, int64_t cap) {
  if (cap < 1) throw std::invalid_argument("cap must be >= 1, got " + std::to_string(cap));
  const size_t n = budgets.size();
  std::vector<int64_t> b(budgets.begin(), budgets.end());
  int64_t total = 0;
  for (int64_t x : b) total += x;
  if (static_cast<int64_t>(n) * cap <= total) return std::vector<int>(budgets.begin(), budgets.end());
  std::vector<bool> capped(n, false);
  std::vector<size_t> order(n);
  std::vector<double> share(n);
  for (;;) {
    int64_t excess = 0;
    for (size_t i = 0; i < n; ++i)
      if (!capped[i] && b[i] >= cap) {
        excess += b[i] - cap;
        b[i] = cap;
        capped[i] = true;
      }
    if (excess == 0) break;
    // hand the excess to the free layers in proportion to their budgets (largest remainder)
    int64_t weight = 0;
    for (size_t i = 0; i < n; ++i)
      if (!capped[i]) weight += b[i];
    if (weight <= 0) break;  // unreachable: n * cap > total leaves a free layer with a budget
    int64_t given = 0;
    order.clear();
    for (size_t i = 0; i < n; ++i) {
      if (capped[i]) continue;
      share[i] = static_cast<double>(excess) * static_cast<double>(b[i]) / static_cast<double>(weight);
      const int64_t whole = static_cast<int64_t>(std::floor(share[i]));
      share[i] -= static_cast<double>(whole);
      b[i] += whole;
      given += whole;
      order.push_back(i);
    }
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t c) { return share[a] > share[c]; });
    for (size_t k = 0; given < excess; ++k, ++given) ++b[order[k % order.size()]];
  }
  return std::vector<int>(b.begin(), b.end());
}

SqueezeCoordinator::SqueezeCoordinator(int n_layers, int avg_budget, int n_sink, double strength)
    : SqueezeCoordinator(n_layers, avg_budget, n_sink, strength, SqueezeAlloc::kInverse, 0.5) {}

SqueezeCoordinator::SqueezeCoordinator(int n_layers, int avg_budget, int n_sink, double strength, SqueezeAlloc alloc,
                                       double p)
    : n_layers_(n_layers), avg_budget_(avg_budget), n_sink_(n_sink), strength_(strength), alloc_(alloc), p_(p) {
  check_common(n_layers, avg_budget, n_sink, strength);
  if (alloc == SqueezeAlloc::kKmeans3 && !(p > 0.0 && p <= 1.0))
    throw std::invalid_argument("p must be in (0, 1], got " + std::to_string(p));
  reset();
}

void SqueezeCoordinator::reset() {
  reported_.assign(static_cast<size_t>(n_layers_), 0.0);
  has_report_.assign(static_cast<size_t>(n_layers_), false);
  n_reported_ = 0;
  budgets_.clear();
  cap_ = 0;
}

void SqueezeCoordinator::set_token_cap(int64_t tokens) { cap_ = tokens > 0 ? tokens : 0; }
int64_t SqueezeCoordinator::token_cap() const { return cap_; }

void SqueezeCoordinator::check_layer(int layer_id) const {
  if (layer_id < 0 || layer_id >= n_layers_)
    throw std::out_of_range("layer_id " + std::to_string(layer_id) + " outside [0, " + std::to_string(n_layers_) + ")");
}

void SqueezeCoordinator::report_concentration(int layer_id, double concentration) {
  check_layer(layer_id);
  if (!std::isfinite(concentration))
    throw std::invalid_argument("concentration for layer " + std::to_string(layer_id) + " is not finite");
  if (has_report_[layer_id]) return;  // first report wins; the schedule stays frozen
  has_report_[layer_id] = true;
  reported_[layer_id] = concentration;
  if (++n_reported_ == n_layers_) {
    budgets_ = alloc_ == SqueezeAlloc::kInverse ? squeeze_budgets(reported_, avg_budget_, n_sink_, strength_)
                                                : kmeans3_budgets(reported_, avg_budget_, n_sink_, p_);
    if (cap_ > 0) budgets_ = water_fill_budgets(budgets_, cap_);
  }
}

std::optional<int> SqueezeCoordinator::resolved_budget(int layer_id) const {
  check_layer(layer_id);
  if (budgets_.empty()) return std::nullopt;
  return budgets_[layer_id];
}

std::optional<double> SqueezeCoordinator::concentration(int layer_id) const {
  check_layer(layer_id);
  if (!has_report_[layer_id]) return std::nullopt;
  return reported_[layer_id];
}

bool SqueezeCoordinator::is_finalized() const { return !budgets_.empty(); }
int SqueezeCoordinator::n_layers() const { return n_layers_; }
int SqueezeCoordinator::avg_budget() const { return avg_budget_; }
double SqueezeCoordinator::strength() const { return strength_; }

}  // namespace squeezekv
