// Eviction policies: small objects that see a layer's host-side metadata (positions, mass) and
// name the survivors. They never touch K/V memory; LayerCache applies their choice in one pass.
// Thread safety: none; each belongs to one layer cache of one sequence.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "kv/kv_storage.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // Whether attention must report the mass each retained key received this step.
  virtual bool needs_mass() const { return false; }
  // Only the last mass_rows() query rows of a step add to the mass (0: every row).
  virtual int mass_rows() const { return 0; }
  // Most rows the layer may hold after a step (may change once, when a schedule is fixed).
  virtual int budget() const = 0;
  // Writes the rows to evict as [G][n_evict] (ascending slots per head) and returns n_evict;
  // returns 0 and leaves evict alone when nothing is evicted. step_rows: rows appended this step
  // (> 1 for a prefill chunk).
  virtual int select(const KvStorage& s, int step_rows, std::vector<int>& evict) = 0;
  // When a decode step (one new row, one row over the budget) evicts exactly as
  // select_sinks_recent_top(budget, sinks, recent) on the accumulated mass, that rule: a device
  // backend then runs it where the mass lives (docs/DESIGN.md, "Where selection runs").
  struct DecodeRule {
    int sinks = 0, recent = 0;
  };
  virtual std::optional<DecodeRule> decode_rule() const { return std::nullopt; }
  // squeeze: the metric the layer must still report in this step (nullopt when none).
  virtual std::optional<SqueezeMetric> pending_metric() const { return std::nullopt; }
  virtual void report_concentration(double /*value*/) {}
  virtual double concentration() const { return 0.0; }
  virtual void reset() {}
};

// Keeps everything: the reference every other policy must match when its budget does not bind.
class FullPolicy final : public EvictionPolicy {
 public:
  explicit FullPolicy(int capacity) : capacity_(capacity) {}
  int budget() const override { return capacity_; }
  int select(const KvStorage&, int, std::vector<int>&) override { return 0; }

 private:
  int capacity_;
};

class SqueezeCoordinator;
std::unique_ptr<EvictionPolicy> make_window_policy(const CacheConfig& cfg);
std::unique_ptr<EvictionPolicy> make_h2o_policy(const CacheConfig& cfg);
std::unique_ptr<EvictionPolicy> make_snapkv_policy(const CacheConfig& cfg);
std::unique_ptr<EvictionPolicy> make_pyramidkv_policy(const CacheConfig& cfg, int layer, int n_layers);
// coordinator may be null: the layer then behaves as uniform h2o at the average budget.
std::unique_ptr<EvictionPolicy> make_squeeze_policy(const CacheConfig& cfg, int layer, SqueezeCoordinator* coordinator);

}  // namespace squeezekv
