// The squeeze metrics (DESIGN.md "The algorithms"): how concentrated one layer's
// attention is over the rows the layer has seen, as running sums that merge across prompt chunks,
// so a schedule can be decided from the first chunk or from the whole prompt with the same code.
// The forward pass only shows the layer its rows (the meter is the layer's observer: the keys,
// attention entropy sums, residual stream before and after attention, the last rows' attention
// output with and without a cut); every formula lives here and in metric_observer.cc.
// Letters: T rows, G kv heads, D head dim, E hidden.
// Thread safety: none; one per layer cache of one sequence.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "kv/kv_storage.h"
#include "kv/observer.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

// eviction_error's cut: the layer's h2o rule at the average budget (sinks, recent window, the
// heaviest accumulated mass among the rest; per head, or over the heads with head-adaptive budgets).
// recent < 0: half the budget (h2o's default split).
struct EvictionCut {
  int budget = 0, sinks = 0, recent = -1;
  bool head_adaptive = false;
  // The budget scaled to the part of the input seen: when the first chunk of a long prompt is
  // measured, its cut keeps the share of its rows that the budget will be of the whole input
  // (budget x seen / input_end, at least sinks + 1), so the layers are told apart at the
  // compression they will run at, not at a cut of a few rows.
  int scaled_budget(int64_t seen, int64_t input_end) const;
  int recent_for(int scaled) const;
};

// The meter is the layer's observer while its metric is pending (LayerCache::observer()): the
// hooks (metric_observer.cc) copy what its metric reads from the forward pass and add it here.
class ConcentrationMeter final : public LayerObserver {
 public:
  // window: the last query rows of a step that eviction_error measures.
  explicit ConcentrationMeter(SqueezeMetric metric, int window = 32, EvictionCut cut = {})
      : metric_(metric), window_(window), cut_(cut) {}
  SqueezeMetric metric() const { return metric_; }
  int window() const { return window_; }
  const EvictionCut& cut() const { return cut_; }

  // key_cosine: k [T][G*D], rotated keys as stored. Mean over kv heads of the mean off-diagonal
  // cosine similarity, exact through sum_{i != j} cos(k_i, k_j) = |sum_i k_i/|k_i||^2 - n.
  void add_keys(const float* k, int T, int G, int D);
  // attention_entropy: sums over heads and rows of H(p) / log(visible keys) (rows with >= 2 keys).
  void add_entropy(double normalized_entropy_sum, int64_t rows);
  // residual_cosine (the SqueezeAttention paper's): x, y [T][E], the layer's input and
  // x + attn(norm(x)); the mean over rows of cos(x_t, y_t).
  void add_residual(const float* x, const float* y, int T, int E);
  // mass_coverage: per kv head, the share of the held rows' accumulated mass that the `budget`
  // heaviest rows hold; the mean over heads (1 when the layer holds at most budget rows).
  void add_mass(const KvStorage& s, int budget);

  // eviction_error: o, o_cut [n], a step's last rows' attention output over every held row and over
  // the rows the cut would keep (LayerCache::cut_view); sums |o - o_cut|^2 and |o|^2 over every
  // step until the report; value() = |o|^2 / (|o|^2 + |o - o_cut|^2), about 1 - the share of the
  // output's energy the cut changes when that share is small, and still ordered when it exceeds 1.
  void add_output_error(const float* o, const float* o_cut, int64_t n);

  // The forward pass's hooks (observer.h): each metric's inputs, from the backend's memory.
  // eviction_error's after_attention only keeps the step's last rows (their queries, positions
  // and output, copied within the backend); the step's end measures them (below).
  bool wants_layer_input() const override { return metric_ == SqueezeMetric::kResidualCosine; }
  void before_attention(const LayerRows& rows) override;
  void ask(AttentionProbe& probe) override { probe.entropy = metric_ == SqueezeMetric::kAttentionEntropy; }
  void after_attention(const LayerRows& rows, const AttentionProbe& probe, LayerCache& cache) override;
  void after_block(const LayerRows& rows, const float* x_in, const float* x) override;

  // eviction_error at the step's end (SequenceCache::end_step), in two rounds over the layers:
  // launch_cut runs the kept rows' attention over the layer's cut view (cache: the layer this
  // meter watches; its mass is final once the step's forward pass is done), then add_cut_error
  // adds the error and energy sums. On a device the cut is chosen there (LayerCache::cut_view)
  // and the sums formed there (Backend::error_energy) into sums_dev (two doubles in the backend's
  // memory; the sequence keeps every layer's in one array, read back in one copy), and
  // add_cut_error gets them back as sums_host; on the host both are null and the sums are formed
  // from the outputs. launch_cut returns whether it wrote sums_dev. Nothing kept: nothing done.
  bool launch_cut(LayerCache& cache, double* sums_dev);
  void add_cut_error(const double* sums_host);

  // Higher always means "needs fewer tokens"; 0 before any input.
  double value() const;
  void reset();

 private:
  SqueezeMetric metric_;
  std::vector<double> unit_sum_;  // key_cosine: [G][D] sum of unit keys
  std::vector<int64_t> keys_;     // key_cosine: [G] keys counted
  double sum_ = 0.0;              // entropy or residual: sum over rows; eviction_error: sum |o - o_cut|^2
  int64_t rows_ = 0;
  int window_;
  EvictionCut cut_;
  double energy_ = 0.0;           // eviction_error: sum |o|^2
  // eviction_error: the step's last w rows, kept from after_attention to the step's end (the
  // backend's memory). A copy of the meter (a copied sequence, between steps) keeps none.
  struct KeptRows {
    Backend* backend = nullptr;
    // q [w][H*D], o [w][H*D], o_cut [w][H*D], pos [w] (int32)
    std::unique_ptr<Buffer> buf;
    int w = 0, H = 0, D = 0;      // w = 0: nothing kept
    int64_t input_end = 0;
    bool cut = false;             // whether launch_cut found a cut (o_cut written)
    KeptRows() = default;
    KeptRows(const KeptRows&) {}
    KeptRows& operator=(const KeptRows&) {
      w = 0;
      return *this;
    }
  };
  KeptRows kept_;
};

}  // namespace squeezekv
