// SqueezeAttention (Wang et al. 2024) on top of H2O: inside the layer the h2o rule; the layer's
// budget comes from the sequence's shared coordinator once every layer has reported its
// concentration during the first step. Compaction happens only at the end of a step, after all
// layers ran, so no layer ever evicts against the fallback average while the schedule is pending.
#include "kv/policy.h"
#include "kv/select.h"
#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {
namespace {

class SqueezePolicy final : public EvictionPolicy {
 public:
  SqueezePolicy(const CacheConfig& c, int layer, SqueezeCoordinator* coord)
      : cfg_(c), layer_(layer), coord_(coord) {}
  bool needs_mass() const override { return true; }
  int budget() const override {
    if (coord_ != nullptr)
      if (auto b = coord_->resolved_budget(layer_)) return *b;
    return cfg_.budget;
  }
  std::optional<DecodeRule> decode_rule() const override {
    const int b = budget();
    return DecodeRule{cfg_.sinks, recent_window(b, cfg_.sinks, cfg_.recent)};
  }
  int select(const KvStorage& s, int, std::vector<int>& evict) override {
    const int b = budget();
    return select_sinks_recent_top(s, b, cfg_.sinks, recent_window(b, cfg_.sinks, cfg_.recent), s.mass(0),
                                   static_cast<size_t>(s.capacity()), evict);
  }
  std::optional<SqueezeMetric> pending_metric() const override {
    if (reported_ || coord_ == nullptr) return std::nullopt;
    return cfg_.squeeze_metric;
  }
  void report_concentration(double v) override {
    reported_ = true;
    concentration_ = v;
    coord_->report_concentration(layer_, v);
  }
  double concentration() const override { return concentration_; }
  void reset() override {
    reported_ = false;
    concentration_ = 0.0;
  }

 private:
  CacheConfig cfg_;
  int layer_;
  SqueezeCoordinator* coord_;
  bool reported_ = false;
  double concentration_ = 0.0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_squeeze_policy(const CacheConfig& cfg, int layer, SqueezeCoordinator* coordinator) {
  return std::make_unique<SqueezePolicy>(cfg, layer, coordinator);
}

}  // namespace squeezekv
