// Eviction policies: small objects that see a layer's host-side metadata (positions, mass) and
// name the survivors. They never touch K/V memory; LayerCache applies their choice in one pass.
// A policy is one file under policies/ plus one row of the registry (policies/registry.cc).
// Thread safety: none; each belongs to one layer cache of one sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kv/concentration.h"
#include "kv/kv_storage.h"
#include "kv/select.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

class SqueezeCoordinator;

// What the end of a step tells every layer's policy (before any layer compacts).
struct StepInfo {
  int rows = 0;              // rows appended this step (> 1 for a prefill chunk)
  int64_t tokens_seen = 0;   // rows the layer was ever given, this step's included
  int64_t input_end = 0;     // tokens the layer will have seen when the caller's current input
                             // (a prompt given at once) ends: tokens_seen when this step ends it
  bool ends_input() const { return tokens_seen >= input_end; }
};

// What a policy that scores its rows in a pass of its own (kvzip) tells the runtime.
class ScoringPass {
 public:
  virtual ~ScoringPass() = default;
  // True from the end of the prompt until end_scoring(): the runtime then runs the pass (the
  // input's token ids again, after an instruction), whose attention adds each retained key's
  // largest probability into the mass (MassReduce::kMax), and calls end_scoring() for every layer
  // (s: the layer's rows and their scores) before any layer compacts.
  virtual bool wants_scoring() const = 0;
  // Whether the runtime must keep the input's token ids until scoring (the pass repeats them).
  virtual bool records_context() const = 0;
  virtual void end_scoring(const KvStorage& s) = 0;
  // Rows of room beyond max_tokens the storage needs (one scoring chunk).
  virtual int scratch_rows(int max_step_rows) const = 0;
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Whether attention must report the mass each retained key received this step.
  virtual bool needs_mass() const { return false; }
  // Only the last mass_rows() query rows of a step add to the mass (0: every row).
  virtual int mass_rows() const { return 0; }
  // Most rows the layer may hold per kv head on average after a step (may change once, when a
  // schedule is fixed); with head-adaptive budgets one head may hold up to max_head_rows().
  virtual int budget() const = 0;
  virtual int max_head_rows() const { return budget(); }
  // Names the rows to evict (per head, ascending slots); false when nothing is evicted.
  // step_rows: rows appended this step (> 1 for a prefill chunk).
  virtual bool select(const KvStorage& s, int step_rows, Eviction& out) = 0;
  // When select() evicts exactly as select_sinks_recent_top(budget(), sinks, recent) on the
  // accumulated mass in a decode step (one new row, one row over the budget), and in every step
  // when any_step (a prompt chunk's end too), that rule: a device backend then runs it where the
  // mass lives (docs/DESIGN.md, "Eviction runs where the mass lives").
  struct MassRule {
    int sinks = 0, recent = 0;
    bool any_step = false;
  };
  virtual std::optional<MassRule> mass_rule() const { return std::nullopt; }

  // squeeze: the meter the forward pass hands this step's metric inputs to (null when none is
  // wanted this step).
  virtual ConcentrationMeter* meter() { return nullptr; }
  // Called for every layer of the sequence before any layer compacts (a coordinator hears its
  // reports here, so no layer evicts against a schedule that is still pending).
  virtual void before_compaction(const KvStorage&, const StepInfo&) {}
  virtual double concentration() const { return 0.0; }

  // A pass over the input once it has ended, which the runtime runs for the policy (kvzip's
  // context reconstruction; kvpress keeps such a phase inside the press): null for the others.
  virtual ScoringPass* scoring() { return nullptr; }
  const ScoringPass* scoring() const { return const_cast<EvictionPolicy*>(this)->scoring(); }

  virtual void reset() {}
  // For a saved cache (runtime/kv_file.cc): the policy's state beyond the rows and the coordinator
  // (a budget decided, a phase), as numbers; set_state takes what state() gave on a policy made from
  // the same config and returns false when the numbers cannot be its state (a damaged file).
  virtual std::vector<double> state() const { return {}; }
  virtual bool set_state(std::span<const double> s) { return s.empty(); }
  // Why this policy's state cannot be saved now (a measurement under way), or null when it can.
  virtual const char* unsaveable() const { return nullptr; }
  // A copy of this policy with all its state, for a copied sequence (Engine::copy_sequence); a
  // coordinated policy reports to `coordinator` (the copy's own) instead of the original's.
  virtual std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator* coordinator) const = 0;
};

// Keeps everything: the reference every other policy must match when its budget does not bind.
class FullPolicy final : public EvictionPolicy {
 public:
  explicit FullPolicy(int capacity) : capacity_(capacity) {}
  int budget() const override { return capacity_; }
  bool select(const KvStorage&, int, Eviction&) override { return false; }
  std::unique_ptr<EvictionPolicy> clone(SqueezeCoordinator*) const override { return std::make_unique<FullPolicy>(*this); }

 private:
  int capacity_;
};

class SqueezeCoordinator;

// What a policy factory gets: the sequence's config, the layer, and the shared coordinator when
// the policy's row asks for one.
struct PolicyContext {
  const CacheConfig& cfg;
  int layer = 0, n_layers = 0;
  int max_tokens = 0;                         // most rows the sequence may see
  int n_kv_heads = 0;
  // null unless PolicyInfo::coordinated or --kv-layer-alloc squeeze
  SqueezeCoordinator* coordinator = nullptr;
};

// One row of the policy registry.
struct PolicyInfo {
  KvPolicy id;
  const char* name;     // --kv-policy value
  const char* summary;  // one line for help texts
  bool coordinated;     // the sequence's layers share one SqueezeCoordinator
  bool head_adaptive;   // supports --kv-head-alloc adaptive
  bool layer_squeeze;   // supports --kv-layer-alloc squeeze (its layers then share a coordinator too)
  std::unique_ptr<EvictionPolicy> (*make)(const PolicyContext&);
  void (*validate)(const CacheConfig&);  // checks beyond the common ones (Error naming the flag); may be null
};
std::span<const PolicyInfo> policy_registry();
const PolicyInfo& policy_info(KvPolicy p);
// Whether a sequence of this config has a squeeze coordinator (squeeze, or --kv-layer-alloc squeeze).
inline bool has_coordinator(const CacheConfig& c) {
  return policy_info(c.policy).coordinated || c.layer_alloc == LayerAlloc::kSqueeze;
}

std::unique_ptr<EvictionPolicy> make_full_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_window_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_h2o_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_snapkv_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_pyramidkv_policy(const PolicyContext& c);
// Without a coordinator the layer behaves as uniform h2o at the average budget.
std::unique_ptr<EvictionPolicy> make_squeeze_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_kvzip_policy(const PolicyContext& c);
std::unique_ptr<EvictionPolicy> make_custom_policy(const PolicyContext& c);
void validate_custom(const CacheConfig& c);
void validate_snapkv(const CacheConfig& c);
void validate_squeeze(const CacheConfig& c);

}  // namespace squeezekv
