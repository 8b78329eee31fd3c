// KVzip (Kim et al. 2025): query-agnostic compression by context reconstruction. The prompt is
// kept whole while it runs; once it has ended, the runtime teacher-forces the model to repeat it
// (a short instruction, then the prompt again, one chunk per step so the extra rows stay bounded)
// and every cached pair is scored by the largest attention probability it receives from those
// queries (max over the repeat rows and over the query heads of its kv head). The layer then keeps
// the sinks and its budget's highest scores, whatever question comes next. Decode rows are
// appended; past the budget the layer evicts with h2o bookkeeping (sinks, recent window, highest
// mass, the reconstruction scores included).
// With --kv-layer-alloc squeeze the layers' budgets come from the sequence's squeeze coordinator
// (SqueezeAttention's split over KVzip's scores): at the end of the scoring pass every layer
// reports the share of its scores that its average budget's highest hold (per kv head, or over the
// layer's heads when they share one ranking), before any layer compacts.
// Memory: the whole prompt is held until it is scored (peak = prompt + one scoring chunk rows
// per layer), unlike the other policies' budget + chunk.
#include <algorithm>
#include <cmath>

#include "kv/policy.h"
#include "kv/select.h"
#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {
namespace {

class KvzipPolicy final : public EvictionPolicy, public ScoringPass {
 public:
  KvzipPolicy(const CacheConfig& c, int layer, int max_tokens, int n_kv_heads, SqueezeCoordinator* coord)
      : cfg_(c), layer_(layer), max_tokens_(max_tokens), G_(n_kv_heads), adaptive_(c.head_alloc == HeadAlloc::kAdaptive),
        coord_(coord) {}
  bool needs_mass() const override { return phase_ != Phase::kPrompt; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator* coordinator) const override {
    auto p = std::make_unique<KvzipPolicy>(*this);
    p->coord_ = coord_ != nullptr ? coordinator : nullptr;
    return p;
  }
  int budget() const override { return phase_ == Phase::kDecode ? layer_budget() : max_tokens_; }
  // head-adaptive: one head may take the whole layer's rows (KVzip's bottom-k over the heads)
  int max_head_rows() const override { return adaptive_ && phase_ == Phase::kDecode ? G_ * layer_budget() : budget(); }
  double concentration() const override { return concentration_; }
  bool select(const KvStorage& s, int, Eviction& out) override {
    if (phase_ != Phase::kDecode) return false;
    const int b = layer_budget();
    // right after scoring: the scores alone (no recent window), then h2o bookkeeping
    const int recent = just_scored_ ? 0 : recent_window(b, cfg_.sinks, cfg_.recent);
    const bool scored = just_scored_;
    just_scored_ = false;
    const size_t stride = static_cast<size_t>(s.capacity());
    if (adaptive_)  // KVzip's own selection: one ranking over the heads, no per-head floor at scoring
      return select_head_adaptive(s, b, cfg_.sinks, recent, s.mass(0), stride, G_ * b, out, scored ? 0.0 : 0.2);
    return select_uniform(s, b, cfg_.sinks, recent, s.mass(0), stride, out);
  }
  // decode steps only: right after scoring, select() keeps no recent window
  std::optional<MassRule> mass_rule() const override {
    if (phase_ != Phase::kDecode || adaptive_) return std::nullopt;
    const int b = layer_budget();
    return MassRule{cfg_.sinks, recent_window(b, cfg_.sinks, cfg_.recent), false};
  }
  void before_compaction(const KvStorage&, const StepInfo& step) override {
    if (phase_ != Phase::kPrompt || (!step.ends_input() && step.rows > 1)) return;
    seen_ = step.tokens_seen;
    // a prompt within the budget is kept whole: nothing to score
    phase_ = step.tokens_seen > cfg_.budget ? Phase::kScoring : Phase::kDecode;
  }
  ScoringPass* scoring() override { return this; }
  bool wants_scoring() const override { return phase_ == Phase::kScoring; }
  bool records_context() const override { return phase_ != Phase::kDecode; }
  void end_scoring(const KvStorage& s) override {
    phase_ = Phase::kDecode;
    just_scored_ = true;
    if (coord_ == nullptr) return;
    concentration_ = score_coverage(s, s.mass(0), static_cast<size_t>(s.capacity()), cfg_.budget, adaptive_);
    if (cfg_.squeeze_cap) coord_->set_token_cap(seen_);  // no layer's budget past the prompt it holds
    coord_->report_concentration(layer_, concentration_);
  }
  int scratch_rows(int max_step_rows) const override { return max_step_rows; }
  void reset() override {
    phase_ = Phase::kPrompt;
    just_scored_ = false;
    concentration_ = 0.0;
    seen_ = 0;
  }
  // (phase, just scored, the coverage it reported; files of 2026-12-03 and before hold the first two)
  std::vector<double> state() const override { return {static_cast<double>(phase_), just_scored_ ? 1.0 : 0.0, concentration_}; }
  bool set_state(std::span<const double> s) override {
    if ((s.size() != 2 && s.size() != 3) || (s[0] != 0 && s[0] != 2) || (s[1] != 0 && s[1] != 1)) return false;  // never mid-scoring
    if (s.size() == 3 && !std::isfinite(s[2])) return false;
    phase_ = static_cast<Phase>(static_cast<int>(s[0]));
    just_scored_ = s[1] == 1;
    concentration_ = s.size() == 3 ? s[2] : 0.0;
    return true;
  }
  const char* unsaveable() const override {
    return phase_ == Phase::kScoring ? "kvzip has not scored the prompt yet (save once the prompt has run)" : nullptr;
  }

 private:
  enum class Phase { kPrompt = 0, kScoring = 1, kDecode = 2 };  // (the numbers a saved cache holds)
  // the layer's budget after scoring: the coordinator's once it has every layer's report
  int layer_budget() const {
    if (coord_ != nullptr)
      if (auto b = coord_->resolved_budget(layer_)) return *b;
    return cfg_.budget;
  }
  CacheConfig cfg_;
  int layer_, max_tokens_, G_;
  bool adaptive_;
  SqueezeCoordinator* coord_;
  double concentration_ = 0.0;
  int64_t seen_ = 0;  // tokens the layer had seen when the prompt ended
  Phase phase_ = Phase::kPrompt;
  bool just_scored_ = false;
};

}  // namespace

std::unique_ptr<EvictionPolicy> make_kvzip_policy(const PolicyContext& c) {
  return std::make_unique<KvzipPolicy>(c.cfg, c.layer, c.max_tokens, c.n_kv_heads, c.coordinator);
}

}  // namespace squeezekv
