#include "kv/concentration.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "kv/select.h"

namespace squeezekv {

int EvictionCut::scaled_budget(int64_t seen, int64_t input_end) const {
  if (input_end <= seen || seen <= 0) return budget;
  const int64_t scaled = (static_cast<int64_t>(budget) * seen + input_end / 2) / input_end;
  return static_cast<int>(std::max<int64_t>(scaled, sinks + 1));
}

int EvictionCut::recent_for(int scaled) const { return recent_window(scaled, sinks, recent); }

void ConcentrationMeter::add_keys(const float* k, int T, int G, int D) {
  if (unit_sum_.empty()) {
    unit_sum_.assign(static_cast<size_t>(G) * D, 0.0);
    keys_.assign(static_cast<size_t>(G), 0);
  }
  for (int g = 0; g < G; ++g) {
    double* sum = unit_sum_.data() + static_cast<size_t>(g) * D;
    for (int t = 0; t < T; ++t) {
      const float* r = k + (static_cast<size_t>(t) * G + g) * D;
      double norm = 0.0;
      for (int d = 0; d < D; ++d) norm += static_cast<double>(r[d]) * r[d];
      if (norm <= 0.0) continue;
      norm = 1.0 / std::sqrt(norm);
      for (int d = 0; d < D; ++d) sum[d] += r[d] * norm;
      ++keys_[g];
    }
  }
}

void ConcentrationMeter::add_entropy(double normalized_entropy_sum, int64_t rows) {
  sum_ += normalized_entropy_sum;
  rows_ += rows;
}

void ConcentrationMeter::add_residual(const float* x, const float* y, int T, int E) {
  for (int t = 0; t < T; ++t) {
    const float* a = x + static_cast<size_t>(t) * E;
    const float* b = y + static_cast<size_t>(t) * E;
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < E; ++i) {
      ab += static_cast<double>(a[i]) * b[i];
      aa += static_cast<double>(a[i]) * a[i];
      bb += static_cast<double>(b[i]) * b[i];
    }
    sum_ += aa > 0.0 && bb > 0.0 ? ab / std::sqrt(aa * bb) : 0.0;
  }
  rows_ += T;
}

void ConcentrationMeter::add_mass(const KvStorage& s, int budget) {
  const int n = s.count();
  std::vector<float> m;
  for (int g = 0; g < s.n_kv_heads(); ++g) {
    m.clear();
    for (int j = 0; j < n; ++j)
      if (s.positions(g)[j] != KvStorage::kDeadPos) m.push_back(s.mass(g)[j]);
    double total = 0.0, top = 0.0;
    for (float x : m) total += x;
    const int k = std::min(budget, static_cast<int>(m.size()));
    std::nth_element(m.begin(), m.begin() + (k > 0 ? k - 1 : 0), m.end(), std::greater<float>());
    for (int i = 0; i < k; ++i) top += m[i];
    sum_ += total > 0.0 ? top / total : 1.0;
    ++rows_;
  }
}

void ConcentrationMeter::add_output_error(const float* o, const float* o_cut, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double a = o[i], d = a - o_cut[i];
    sum_ += d * d;
    energy_ += a * a;
  }
}

double ConcentrationMeter::value() const {
  switch (metric_) {
    case SqueezeMetric::kKeyCosine: {
      if (keys_.empty()) return 0.0;
      const int G = static_cast<int>(keys_.size());
      const size_t D = unit_sum_.size() / keys_.size();
      double total = 0.0;
      for (int g = 0; g < G; ++g) {
        const int64_t n = keys_[g];
        if (n < 2) continue;
        double s2 = 0.0;
        for (size_t d = 0; d < D; ++d) s2 += unit_sum_[g * D + d] * unit_sum_[g * D + d];
        total += (s2 - static_cast<double>(n)) / (static_cast<double>(n) * static_cast<double>(n - 1));
      }
      return total / G;
    }
    case SqueezeMetric::kAttentionEntropy:
      return rows_ > 0 ? 1.0 - sum_ / static_cast<double>(rows_) : 0.0;
    case SqueezeMetric::kEvictionError:
      // |o|^2 / (|o|^2 + |o - o'|^2): 1 - err/energy while the error is small, and no clamp at 0
      // when a first chunk's harsh cut changes more than the output's own energy
      return energy_ > 0.0 ? energy_ / (energy_ + sum_) : 0.0;
    case SqueezeMetric::kResidualCosine:
    case SqueezeMetric::kMassCoverage:
      return rows_ > 0 ? sum_ / static_cast<double>(rows_) : 0.0;
  }
  return 0.0;
}

void ConcentrationMeter::reset() {
  unit_sum_.clear();
  keys_.clear();
  sum_ = 0.0;
  rows_ = 0;
  energy_ = 0.0;
  kept_.w = 0;
}

}  // namespace squeezekv
