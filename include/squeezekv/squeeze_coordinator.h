// SqueezeAttention's cross-layer coordinator (the user's specification: seed/squeeze_coordinator.txt;
// contract: DESIGN.md). One coordinator per sequence is shared by all its layer caches. During the
// first step (the prompt) every layer reports how concentrated its attention is; once all n_layers
// distinct layers have reported, the per-layer budget schedule is computed and frozen. Decode runs
// against that schedule; later reports are ignored.
// Thread safety: none needed — only the owning sequence's forward pass touches it.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace squeezekv {

// How a finalised schedule splits the total budget.
enum class SqueezeAlloc {
  kInverse,  // the seed's squeeze_budgets (weights 1 - concentration, with strength)
  kKmeans3,  // SqueezeAttention's: 3 clusters of the scores; the highest gets p x avg per layer
};

class SqueezeCoordinator {
 public:
  // Throws std::invalid_argument for n_layers < 1, avg_budget <= n_sink, strength outside [0, 1]
  // (and, for kmeans3, p outside (0, 1]).
  SqueezeCoordinator(int n_layers, int avg_budget, int n_sink, double strength);
  SqueezeCoordinator(int n_layers, int avg_budget, int n_sink, double strength, SqueezeAlloc alloc, double p);

  void reset();  // clear reported + resolved state
  // First report per layer wins. Throws std::out_of_range for layer_id outside [0, n_layers) and
  // std::invalid_argument for a non-finite concentration.
  void report_concentration(int layer_id, double concentration);
  std::optional<int> resolved_budget(int layer_id) const;  // nullopt until finalised
  bool is_finalized() const;
  int n_layers() const;
  int avg_budget() const;
  double strength() const;

  // Caps every layer's budget at `tokens` (the tokens each layer holds when the schedule is
  // decided) by water_fill_budgets when the schedule is computed; <= 0: no cap. Must come before
  // the last report to count; reset() clears it. Not part of the seed's contract: an extra step
  // after its allocation (--squeeze-cap).
  void set_token_cap(int64_t tokens);
  int64_t token_cap() const;  // 0: none
  // Reported concentration of a layer (nullopt before its report).
  std::optional<double> concentration(int layer_id) const;
  int n_sink() const { return n_sink_; }
  SqueezeAlloc alloc() const { return alloc_; }

 private:
  void check_layer(int layer_id) const;
  int n_layers_, avg_budget_, n_sink_;
  double strength_;
  SqueezeAlloc alloc_;
  double p_;
  std::vector<double> reported_;  // [n_layers]
  std::vector<bool> has_report_;  // [n_layers]
  int n_reported_ = 0;
  std::vector<int> budgets_;      // empty until finalised
  int64_t cap_ = 0;               // 0: none
};

// The seed's allocation: weight_i = 1 - clamp(c_i, 0, 1), scaled to average 1 (all zero: uniform);
// target_i = avg * ((1 - s) + s * weight_i); every budget at least n_sink + 1; integers summing to
// exactly n * avg (largest remainder; excess from floors taken from the largest budgets).
// Throws std::invalid_argument naming the bad argument.
std::vector<int> squeeze_budgets(std::span<const double> concentrations, int avg_budget, int n_sink, double strength);

// SqueezeAttention's allocation: 1-D k-means with 3 clusters (start: min, median, max); layers of
// the highest-centroid cluster get max(floor(p * avg), n_sink + 1); the others share the rest
// equally (lower scores first for the remainder); fewer than 3 distinct scores: uniform.
std::vector<int> kmeans3_budgets(std::span<const double> scores, int avg_budget, int n_sink, double p);

// Water-filling: budgets above `cap` are lowered to it and the excess is handed to the layers
// below the cap in proportion to their budgets (integers by largest remainder, ties to the lower
// layer), repeated until no layer is over the cap; the total stays exactly sum(budgets). When
// every layer can hold its whole context (n * cap <= the total), nothing would be evicted at the
// cap, so the budgets are returned unchanged (their headroom still serves decode steps).
// Throws std::invalid_argument for cap < 1.
std::vector<int> water_fill_budgets(std::span<const int> budgets, int64_t cap);

}  // namespace squeezekv
