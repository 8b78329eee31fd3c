// H2O (Zhang et al. 2023): sinks + a recent window + the heavy hitters, the tokens with the most
// attention mass accumulated from the real queries (every query row of every step, the token's
// own attention included; per KV head the mean over its query group).
#include "kv/policy.h"
#include "kv/select.h"

namespace squeezekv {
namespace {

class H2OPolicy final : public EvictionPolicy {
 public:
  explicit H2OPolicy(const CacheConfig& c)
      : budget_(c.budget), sinks_(c.sinks), recent_(recent_window(c.budget, c.sinks, c.recent)),
        adaptive_(c.head_alloc == HeadAlloc::kAdaptive) {}
  bool needs_mass() const override { return true; }
  int budget() const override { return budget_; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator*) const override { return std::make_unique<H2OPolicy>(*this); }
  int max_head_rows() const override { return squeezekv::max_head_rows(adaptive_, budget_); }
  std::optional<MassRule> mass_rule() const override {
    if (adaptive_) return std::nullopt;
    return MassRule{sinks_, recent_, true};
  }
  bool select(const KvStorage& s, int, Eviction& out) override {
    return select_by_score(s, adaptive_, budget_, sinks_, recent_, s.mass(0), static_cast<size_t>(s.capacity()), out);
  }

 private:
  int budget_, sinks_, recent_;
  bool adaptive_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_h2o_policy(const PolicyContext& c) { return std::make_unique<H2OPolicy>(c.cfg); }

}  // namespace squeezekv
