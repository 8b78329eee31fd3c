// SqueezeAttention (Wang et al. 2024) on top of H2O: inside the layer the h2o rule; the layer's
// budget comes from the sequence's shared coordinator once every layer has reported its
// concentration. A layer reports after its first step (--squeeze-resolve first-chunk, the default)
// or at the end of the prompt (prompt: the metric then covers every prompt chunk). The default
// metric, eviction_error, measures the layer's h2o cut at the average budget (EvictionCut) on the
// last rows of every step until then (LayerCache::cut_view). Reports are made for all
// layers before any layer compacts (before_compaction), so no layer ever evicts against the
// fallback average in the step that fixes the schedule. With --squeeze-cap the coordinator caps
// each budget at the prompt's length and hands the excess on (water_fill_budgets).
#include <algorithm>
#include <cmath>
#include <string>

#include "kv/policy.h"
#include "kv/select.h"
#include "squeezekv/error.h"
#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {
namespace {

class SqueezePolicy final : public EvictionPolicy {
 public:
  SqueezePolicy(const CacheConfig& c, int layer, SqueezeCoordinator* coord)
      : cfg_(c), layer_(layer), coord_(coord),
        meter_(c.squeeze_metric, c.snapkv_window,
               {c.budget, c.sinks, c.recent, c.head_alloc == HeadAlloc::kAdaptive}) {}
  bool needs_mass() const override { return true; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator* coordinator) const override {
    auto p = std::make_unique<SqueezePolicy>(*this);
    p->coord_ = coord_ != nullptr ? coordinator : nullptr;
    return p;
  }
  int budget() const override {
    if (coord_ != nullptr)
      if (auto b = coord_->resolved_budget(layer_)) return *b;
    return cfg_.budget;
  }
  int max_head_rows() const override { return squeezekv::max_head_rows(adaptive(), budget()); }
  std::optional<MassRule> mass_rule() const override {
    if (adaptive()) return std::nullopt;
    const int b = budget();
    return MassRule{cfg_.sinks, recent_window(b, cfg_.sinks, cfg_.recent), true};
  }
  bool select(const KvStorage& s, int, Eviction& out) override {
    const int b = budget();
    return select_by_score(s, adaptive(), b, cfg_.sinks, recent_window(b, cfg_.sinks, cfg_.recent), s.mass(0),
                           static_cast<size_t>(s.capacity()), out);
  }
  ConcentrationMeter* meter() override { return reported_ || coord_ == nullptr ? nullptr : &meter_; }
  void before_compaction(const KvStorage& s, const StepInfo& step) override {
    if (reported_ || coord_ == nullptr) return;
    const bool first_chunk = cfg_.squeeze_resolve == SqueezeResolve::kFirstChunk;
    // a one-row step also ends the prompt: a caller that never marked its end still gets a schedule
    if (!first_chunk && !step.ends_input() && step.rows > 1) return;
    // the cap: what each layer holds when the prompt has run (all layers see the same rows)
    if (cfg_.squeeze_cap) coord_->set_token_cap(std::max(step.input_end, step.tokens_seen));
    reported_ = true;
    if (meter_.metric() == SqueezeMetric::kMassCoverage) meter_.add_mass(s, cfg_.budget);
    concentration_ = meter_.value();
    coord_->report_concentration(layer_, concentration_);
  }
  double concentration() const override { return concentration_; }
  void reset() override {
    reported_ = false;
    concentration_ = 0.0;
    meter_.reset();
  }
  std::vector<double> state() const override { return {reported_ ? 1.0 : 0.0, concentration_}; }
  bool set_state(std::span<const double> s) override {
    if (s.size() != 2 || (s[0] != 0 && s[0] != 1) || !std::isfinite(s[1])) return false;
    reported_ = s[0] == 1;
    concentration_ = s[1];
    return true;
  }
  const char* unsaveable() const override {
    return coord_ != nullptr && !reported_ ? "the squeeze schedule is still being measured (save once the prompt has run)" : nullptr;
  }

 private:
  bool adaptive() const { return cfg_.head_alloc == HeadAlloc::kAdaptive; }
  CacheConfig cfg_;
  int layer_;
  SqueezeCoordinator* coord_;
  ConcentrationMeter meter_;
  bool reported_ = false;
  double concentration_ = 0.0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_squeeze_policy(const PolicyContext& c) {
  return std::make_unique<SqueezePolicy>(c.cfg, c.layer, c.coordinator);
}

void validate_squeeze(const CacheConfig& c) {
  if (!(c.squeeze_strength >= 0.0 && c.squeeze_strength <= 1.0))
    throw Error("--squeeze-strength: must be in [0, 1], got " + std::to_string(c.squeeze_strength));
  if (!(c.squeeze_p > 0.0 && c.squeeze_p <= 1.0)) throw Error("--squeeze-p: must be in (0, 1], got " + std::to_string(c.squeeze_p));
  if (c.squeeze_metric == SqueezeMetric::kEvictionError && c.snapkv_window < 1)
    throw Error("--snapkv-window: squeeze's eviction_error measures the last window prompt rows; must be >= 1, got " +
                std::to_string(c.snapkv_window));
}

}  // namespace squeezekv
