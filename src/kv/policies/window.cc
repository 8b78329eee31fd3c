// StreamingLLM (Xiao et al. 2023): the first `sinks` tokens plus the most recent budget - sinks.
#include "kv/policy.h"
#include "kv/select.h"

namespace squeezekv {
namespace {

class WindowPolicy final : public EvictionPolicy {
 public:
  explicit WindowPolicy(const CacheConfig& c) : budget_(c.budget), sinks_(c.sinks) {}
  int budget() const override { return budget_; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator*) const override { return std::make_unique<WindowPolicy>(*this); }
  // (any mass: sinks and the recent window are all it keeps)
  std::optional<MassRule> mass_rule() const override { return MassRule{sinks_, budget_ - sinks_, true}; }
  bool select(const KvStorage& s, int, Eviction& out) override {
    // no scores needed: everything outside sinks and recent is evicted
    return select_uniform(s, budget_, sinks_, budget_ - sinks_, s.mass(0), 0, out);
  }

 private:
  int budget_, sinks_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_window_policy(const PolicyContext& c) { return std::make_unique<WindowPolicy>(c.cfg); }

}  // namespace squeezekv
