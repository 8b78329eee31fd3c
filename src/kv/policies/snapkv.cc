// SnapKV (Li et al. 2024) and PyramidKV (Cai et al. 2024).
// SnapKV: when a prompt step leaves more than the budget, prefix keys are scored by the attention
// of the step's last w query rows (summed over the window, averaged over each KV head's query
// group), smoothed with a same-padded average pool; the top budget - w - sinks prefix tokens, the
// sinks and the whole window are kept. Decode tokens are appended; once past the budget the layer
// evicts by the accumulated scores with the window as its recent part (h2o bookkeeping).
// PyramidKV: the same scoring with per-layer budgets on a linear taper, decided from the prompt.
// With --kv-layer-alloc squeeze (snapkv) the layers' budgets come from the sequence's squeeze
// coordinator (SqueezeAttention's split over SnapKV's scores): at the first step that would evict
// at the average budget (or the prompt's end) every layer reports the share of its pooled window
// scores that the average budget's highest hold, before any layer compacts.
#include <algorithm>
#include <cmath>
#include <string>

#include "kv/policy.h"
#include "kv/select.h"
#include "squeezekv/error.h"
#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {
namespace {

class SnapKVPolicy : public EvictionPolicy {
 public:
  SnapKVPolicy(const CacheConfig& c, int layer, SqueezeCoordinator* coord)
      : cfg_(c), budget_(c.budget), adaptive_(c.head_alloc == HeadAlloc::kAdaptive), layer_(layer), coord_(coord) {}
  bool needs_mass() const override { return true; }
  int mass_rows() const override { return cfg_.snapkv_window; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator* coordinator) const override {
    auto p = std::make_unique<SnapKVPolicy>(*this);
    p->coord_ = coord_ != nullptr ? coordinator : nullptr;
    return p;
  }
  // the coordinator's budget for this layer once every layer has reported, else the average
  int budget() const override {
    if (coord_ != nullptr)
      if (auto b = coord_->resolved_budget(layer_)) return *b;
    return budget_;
  }
  int max_head_rows() const override { return squeezekv::max_head_rows(adaptive_, budget()); }

  bool select(const KvStorage& s, int step_rows, Eviction& out) override {
    decide_budget(s);
    const int b = budget(), G = s.n_kv_heads();
    if (s.live_total() <= static_cast<int64_t>(G) * b) return false;
    const int w = window(b);
    if (step_rows <= 1)  // decode: h2o bookkeeping on the accumulated window scores
      return select_by_score(s, adaptive_, b, cfg_.sinks, w, s.mass(0), static_cast<size_t>(s.capacity()), out);
    pool(s, w);
    return select_by_score(s, adaptive_, b, cfg_.sinks, w, pooled_.data(), static_cast<size_t>(s.count()), out);
  }
  void before_compaction(const KvStorage& s, const StepInfo& step) override {
    if (coord_ == nullptr || reported_) return;
    // the first step that would evict at the average budget, or the input's end (a one-row step
    // ends it too): every layer holds the same rows then, so all report in the same step
    if (s.live_total() <= static_cast<int64_t>(s.n_kv_heads()) * cfg_.budget && !step.ends_input() && step.rows > 1) return;
    if (cfg_.squeeze_cap) coord_->set_token_cap(std::max(step.input_end, step.tokens_seen));
    reported_ = true;
    if (step.rows <= 1) {
      concentration_ = score_coverage(s, s.mass(0), static_cast<size_t>(s.capacity()), cfg_.budget, adaptive_);
    } else {
      pool(s, window(cfg_.budget));
      concentration_ = score_coverage(s, pooled_.data(), static_cast<size_t>(s.count()), cfg_.budget, adaptive_);
    }
    coord_->report_concentration(layer_, concentration_);
  }
  double concentration() const override { return concentration_; }
  void reset() override {
    reported_ = false;
    concentration_ = 0.0;
  }
  // coordinated: (reported, the coverage it reported); otherwise none
  std::vector<double> state() const override {
    if (coord_ == nullptr) return {};
    return {reported_ ? 1.0 : 0.0, concentration_};
  }
  bool set_state(std::span<const double> s) override {
    if (coord_ == nullptr) return s.empty();
    if (s.size() != 2 || (s[0] != 0 && s[0] != 1) || !std::isfinite(s[1])) return false;
    reported_ = s[0] == 1;
    concentration_ = s[1];
    return true;
  }
  const char* unsaveable() const override {
    return coord_ != nullptr && !reported_ ? "the layers' budgets are still being measured (save once the prompt has run)" : nullptr;
  }

 protected:
  virtual void decide_budget(const KvStorage&) {}
  // the window the prompt's scores come from and decode keeps as its recent part, at budget b
  int window(int b) const { return std::min(cfg_.snapkv_window, b - std::min(cfg_.sinks, b)); }
  // pooled_ [G][count]: each head's prefix scores pooled along positions (zero padding counted, as
  // avg_pool1d does by default); the window's own last w rows keep no score, they are kept as the
  // recent part
  void pool(const KvStorage& s, int w) {
    const int k = cfg_.pool_kernel, half = k / 2, n = s.count(), G = s.n_kv_heads();
    pooled_.assign(static_cast<size_t>(G) * n, 0.0f);
    order_.resize(static_cast<size_t>(n));
    for (int g = 0; g < G; ++g) {
      const float* m = s.mass(g);
      const int32_t* pos = s.positions(g);
      float* p = pooled_.data() + static_cast<size_t>(g) * n;
      const int prefix = s.live(g) - w;  // dead slots (head-adaptive) sort last and are not pooled
      for (int j = 0; j < n; ++j) order_[j] = j;
      std::sort(order_.begin(), order_.end(), [pos](int a, int b) { return pos[a] < pos[b]; });
      for (int r = 0; r < prefix; ++r) {  // r: rank by position among the prefix
        float acc = 0.0f;
        for (int d = -half; d <= half; ++d)
          if (r + d >= 0 && r + d < prefix) acc += m[order_[r + d]];
        p[order_[r]] = acc / static_cast<float>(k);
      }
    }
  }
  CacheConfig cfg_;
  int budget_;
  bool adaptive_;
  int layer_;
  SqueezeCoordinator* coord_;  // --kv-layer-alloc squeeze (snapkv only), else null
  bool reported_ = false;
  double concentration_ = 0.0;
  std::vector<float> pooled_;  // [G][n], reused
  std::vector<int> order_;     // [n] slots sorted by position, reused
};

class PyramidKVPolicy final : public SnapKVPolicy {
 public:
  PyramidKVPolicy(const CacheConfig& c, int layer, int n_layers) : SnapKVPolicy(c, layer, nullptr), n_layers_(n_layers) {}
  // Capacity planning: the tallest layer of the taper.
  int budget() const override { return decided_ ? budget_ : 2 * cfg_.budget; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator*) const override { return std::make_unique<PyramidKVPolicy>(*this); }
  void reset() override {
    decided_ = false;
    budget_ = cfg_.budget;
  }
  std::vector<double> state() const override { return {decided_ ? 1.0 : 0.0, static_cast<double>(budget_)}; }
  bool set_state(std::span<const double> s) override {
    if (s.size() != 2 || (s[0] != 0 && s[0] != 1) || !(s[1] >= 1 && s[1] <= 2.0 * cfg_.budget) || s[1] != std::floor(s[1]))
      return false;
    decided_ = s[0] == 1;
    budget_ = static_cast<int>(s[1]);
    return true;
  }

 private:
  void decide_budget(const KvStorage& s) override {
    if (decided_) return;
    decided_ = true;
    const int B = cfg_.budget, w = std::min(cfg_.snapkv_window, B - 1);
    const int prompt = s.count();
    budget_ = B;
    if (prompt < 2 * (B - w) || n_layers_ < 2) return;  // short prompt: uniform
    const double min_b = static_cast<double>(B - w) / cfg_.pyramid_beta;
    const double max_b = 2.0 * (B - w) - min_b;
    const double t = static_cast<double>(n_layers_ - 1 - layer_) / (n_layers_ - 1);
    budget_ = std::max(cfg_.sinks + w + 1, static_cast<int>(std::lround(min_b + (max_b - min_b) * t)) + w);
  }
  int n_layers_;
  bool decided_ = false;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_snapkv_policy(const PolicyContext& c) {
  return std::make_unique<SnapKVPolicy>(c.cfg, c.layer, c.coordinator);
}
std::unique_ptr<EvictionPolicy> make_pyramidkv_policy(const PolicyContext& c) {
  return std::make_unique<PyramidKVPolicy>(c.cfg, c.layer, c.n_layers);
}

void validate_snapkv(const CacheConfig& c) {
  if (c.snapkv_window < 1 || c.sinks + c.snapkv_window >= c.budget)
    throw Error("--snapkv-window: must be >= 1 and sinks + window below --kv-budget, got " + std::to_string(c.snapkv_window));
  if (c.pool_kernel < 1 || c.pool_kernel % 2 == 0) throw Error("--snapkv-kernel: must be odd and >= 1");
  if (!(c.pyramid_beta >= 1.0)) throw Error("--pyramid-beta: must be >= 1");
}

}  // namespace squeezekv
