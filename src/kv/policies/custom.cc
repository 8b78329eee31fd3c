// custom: the caller's scoring rule (CacheConfig::scorer, a KvScorer; the Python package's
// ScorePolicy) in place of h2o's accumulated mass: sinks + recent window + the highest scores.
// The scorer is asked only when the layer holds more rows than its budget.
#include <cmath>
#include <string>

#include "kv/policy.h"
#include "kv/select.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

class CustomPolicy final : public EvictionPolicy {
 public:
  CustomPolicy(const CacheConfig& c, int layer)
      : scorer_(c.scorer), layer_(layer), budget_(c.budget), sinks_(c.sinks),
        recent_(recent_window(c.budget, c.sinks, c.recent)), adaptive_(c.head_alloc == HeadAlloc::kAdaptive) {}
  bool needs_mass() const override { return true; }
  int budget() const override { return budget_; }
  int max_head_rows() const override { return squeezekv::max_head_rows(adaptive_, budget_); }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator*) const override { return std::make_unique<CustomPolicy>(*this); }
  void before_compaction(const KvStorage&, const StepInfo& info) override { tokens_seen_ = info.tokens_seen; }
  void reset() override { tokens_seen_ = 0; }
  std::vector<double> state() const override { return {static_cast<double>(tokens_seen_)}; }
  bool set_state(std::span<const double> s) override {
    if (s.size() != 1 || !(s[0] >= 0 && s[0] <= 9e15) || s[0] != std::floor(s[0])) return false;
    tokens_seen_ = static_cast<int64_t>(s[0]);
    return true;
  }

  bool select(const KvStorage& s, int step_rows, Eviction& out) override {
    const int n = s.count(), G = s.n_kv_heads(), D = s.head_dim();
    if (n <= budget_) return false;
    KvScoreInput in;
    in.layer = layer_;
    in.n_kv_heads = G;
    in.rows = n;
    in.head_dim = D;
    in.stride = s.capacity();
    in.step_rows = step_rows;
    in.tokens_seen = tokens_seen_;
    in.positions = s.positions(0);
    in.mass = s.mass(0);
    if (scorer_->wants_keys()) {
      keys_.resize(static_cast<size_t>(G) * n * D);
      s.read_keys(keys_.data());
      in.keys = keys_.data();
    }
    scores_.assign(static_cast<size_t>(G) * n, 0.0f);
    scorer_->score(in, scores_.data());
    for (size_t i = 0; i < scores_.size(); ++i)
      if (!std::isfinite(scores_[i]))
        throw Error("kv policy custom: the scorer gave layer " + std::to_string(layer_) + ", kv head " +
                    std::to_string(i / n) + ", slot " + std::to_string(i % n) + " a score that is not finite");
    return select_by_score(s, adaptive_, budget_, sinks_, recent_, scores_.data(), static_cast<size_t>(n), out);
  }

 private:
  std::shared_ptr<KvScorer> scorer_;
  int layer_, budget_, sinks_, recent_;
  bool adaptive_;
  int64_t tokens_seen_ = 0;    // rows the layer was ever given (StepInfo, this step's included)
  std::vector<float> scores_;  // [G][n], reused
  std::vector<float> keys_;    // [G][n][D], reused
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_custom_policy(const PolicyContext& c) { return std::make_unique<CustomPolicy>(c.cfg, c.layer); }

void validate_custom(const CacheConfig& c) {
  if (!c.scorer)
    throw Error("--kv-policy custom: needs a scoring function, which only the library's API gives (CacheConfig::scorer; "
                "the Python package's ScorePolicy)");
}

}  // namespace squeezekv
