// What each squeeze metric reads from the forward pass (ConcentrationMeter's LayerObserver hooks,
// observer.h): the rows it needs, copied from the backend's memory into the runner's scratch,
// and for eviction_error the last rows kept until the step's end, when they attend once more
// over the layer's cut view.
#include <algorithm>

#include "kv/concentration.h"
#include "kv/layer_cache.h"

namespace squeezekv {

void ConcentrationMeter::before_attention(const LayerRows& r) {
  if (metric_ != SqueezeMetric::kKeyCosine) return;
  const size_t n = static_cast<size_t>(r.T) * r.G * r.D;
  add_keys(r.scratch->host(*r.backend, r.scratch->a, r.k, n), r.T, r.G, r.D);
}

void ConcentrationMeter::after_attention(const LayerRows& r, const AttentionProbe& probe, LayerCache&) {
  if (probe.entropy) add_entropy(probe.entropy_sum, probe.entropy_rows);
  if (metric_ != SqueezeMetric::kEvictionError) return;
  // the step's last rows, kept for the step's end (launch_cut): their queries, positions and
  // output over every held row, copied within the backend (the runner reuses its buffers)
  const int64_t QD = static_cast<int64_t>(r.H) * r.D;
  const int w = std::min(r.T, window_), first = r.T - w;
  const size_t n = static_cast<size_t>(w) * QD, bytes = (3 * n + static_cast<size_t>(w)) * sizeof(float);
  KeptRows& k = kept_;
  if (!k.buf || k.buf->bytes() < bytes) k.buf = r.backend->alloc(bytes);
  k.backend = r.backend, k.w = w, k.H = r.H, k.D = r.D, k.input_end = r.input_end, k.cut = false;
  float* base = k.buf->as<float>();
  r.backend->copy(base, r.q + first * QD, n * sizeof(float));
  r.backend->copy(base + n, r.att + first * QD, n * sizeof(float));
  r.backend->copy(base + 3 * n, r.q_pos + first, static_cast<size_t>(w) * sizeof(int32_t));
}

bool ConcentrationMeter::launch_cut(LayerCache& cache, double* sums_dev) {
  KeptRows& k = kept_;
  if (k.w == 0) return false;
  // the kept rows attend once more, over what the average budget's h2o cut would keep
  const size_t n = static_cast<size_t>(k.w) * k.H * k.D;
  float* base = k.buf->as<float>();
  if (const std::optional<KvView> cut = cache.cut_view(k.input_end)) {
    k.backend->attention(base + 2 * n, base, reinterpret_cast<const int32_t*>(base + 3 * n), k.w, k.H, *cut, nullptr);
    k.cut = true;
  }
  // on a device the sums are formed where the outputs are: two numbers come back, not 2 x w x H x D
  if (k.backend->host_visible()) return false;
  k.backend->error_energy(sums_dev, base + n, k.cut ? base + 2 * n : base + n, static_cast<int64_t>(n));
  return true;
}

void ConcentrationMeter::add_cut_error(const double* sums_host) {
  KeptRows& k = kept_;
  if (k.w == 0) return;
  const size_t n = static_cast<size_t>(k.w) * k.H * k.D;
  if (k.backend->host_visible()) {
    const float* o = k.buf->as<float>() + n;
    add_output_error(o, k.cut ? o + n : o, static_cast<int64_t>(n));  // no cut: the output unchanged
  } else {
    sum_ += sums_host[0];
    energy_ += sums_host[1];
  }
  k.w = 0;
}

void ConcentrationMeter::after_block(const LayerRows& r, const float* x_in, const float* x) {
  if (metric_ != SqueezeMetric::kResidualCosine) return;
  const size_t n = static_cast<size_t>(r.T) * r.E;
  add_residual(r.scratch->host(*r.backend, r.scratch->a, x_in, n), r.scratch->host(*r.backend, r.scratch->b, x, n), r.T, r.E);
}

}  // namespace squeezekv
