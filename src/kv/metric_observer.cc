// What each squeeze metric reads from the forward pass (ConcentrationMeter's LayerObserver hooks,
// observer.h): the rows it needs, copied from the backend's memory into the runner's scratch,
// and for eviction_error one more attention of the last rows over the layer's cut view.
#include <algorithm>

#include "kv/concentration.h"
#include "kv/layer_cache.h"

namespace squeezekv {

void ConcentrationMeter::before_attention(const LayerRows& r) {
  if (metric_ != SqueezeMetric::kKeyCosine) return;
  const size_t n = static_cast<size_t>(r.T) * r.G * r.D;
  add_keys(r.scratch->host(*r.backend, r.scratch->a, r.k, n), r.T, r.G, r.D);
}

void ConcentrationMeter::after_attention(const LayerRows& r, const AttentionProbe& probe, LayerCache& cache) {
  if (probe.entropy) add_entropy(probe.entropy_sum, probe.entropy_rows);
  if (metric_ != SqueezeMetric::kEvictionError) return;
  // the step's last rows attend once more, over what the average budget's h2o cut would keep
  const int64_t QD = static_cast<int64_t>(r.H) * r.D;
  const int w = std::min(r.T, window_), first = r.T - w;
  const size_t n = static_cast<size_t>(w) * QD;
  const float* o = r.scratch->host(*r.backend, r.scratch->a, r.att + first * QD, n);
  if (const std::optional<KvView> cut = cache.cut_view(r.input_end)) {
    float* out = r.scratch->device(*r.backend, n);
    r.backend->attention(out, r.q + first * QD, r.q_pos + first, w, r.H, *cut, nullptr);
    add_output_error(o, r.scratch->host(*r.backend, r.scratch->b, out, n), static_cast<int64_t>(n));
  } else {
    add_output_error(o, o, static_cast<int64_t>(n));
  }
}

void ConcentrationMeter::after_block(const LayerRows& r, const float* x_in, const float* x) {
  if (metric_ != SqueezeMetric::kResidualCosine) return;
  const size_t n = static_cast<size_t>(r.T) * r.E;
  add_residual(r.scratch->host(*r.backend, r.scratch->a, x_in, n), r.scratch->host(*r.backend, r.scratch->b, x, n), r.T, r.E);
}

}  // namespace squeezekv
