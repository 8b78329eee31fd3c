// The caches of one sequence (layer_cache.h: SequenceCache) and how they are planned and built
// (CacheBuilder): the config validated once, into a CachePlan, which the builder trusts.
#include <algorithm>
#include <cassert>

#include "kv/concentration.h"
#include "kv/layer_cache.h"
#include "squeezekv/error.h"
#include "squeezekv/model_config.h"

namespace squeezekv {

void SequenceCache::set_trace(const EvictionTrace* trace) {
  for (LayerCache& l : layers) l.set_trace(trace);
}

void SequenceCache::reset() {
  for (LayerCache& l : layers) l.reset();
  if (coordinator) coordinator->reset();
}

void SequenceCache::copy_from(const SequenceCache& src) {
  assert(src.layers.size() == layers.size() && (src.coordinator == nullptr) == (coordinator == nullptr));
  if (coordinator) *coordinator = *src.coordinator;
  for (size_t l = 0; l < layers.size(); ++l) layers[l].copy_from(src.layers[l], coordinator.get());
}

void SequenceCache::stage_step(int T) {
  if (!counts_dev) return;  // host-visible backends read the count from the view
  for (size_t l = 0; l < layers.size(); ++l) counts_host[l] = layers[l].storage().count() + T;
  backend->upload(counts_dev->data(), counts_host.data(), counts_host.size() * sizeof(int32_t));
}

void SequenceCache::end_step(int64_t input_end) {
  // squeeze's eviction_error: every layer's cut attention issued before any layer's is read; on
  // a device their sums land in one array, read back in one copy (one wait for the device a
  // step, not one a layer)
  const size_t L = layers.size();
  double* sums_dev = nullptr;
  if (backend != nullptr && std::any_of(layers.begin(), layers.end(), [](LayerCache& l) { return l.meter() != nullptr; })) {
    if (!cut_sums_dev) cut_sums_dev = backend->alloc(L * 2 * sizeof(double));
    sums_dev = cut_sums_dev->as<double>();
  }
  bool wrote = false;
  for (size_t i = 0; i < L; ++i)
    if (ConcentrationMeter* m = layers[i].meter()) wrote = m->launch_cut(layers[i], sums_dev != nullptr ? sums_dev + 2 * i : nullptr) || wrote;
  if (wrote) {
    cut_sums_host.resize(L * 2);
    backend->download(cut_sums_host.data(), sums_dev, L * 2 * sizeof(double));
  }
  for (size_t i = 0; i < L; ++i)
    if (ConcentrationMeter* m = layers[i].meter()) m->add_cut_error(wrote ? cut_sums_host.data() + 2 * i : nullptr);
  for (LayerCache& l : layers) l.before_compaction(input_end);
  for (LayerCache& l : layers) l.end_step();
}

void SequenceCache::end_scoring() {
  for (LayerCache& l : layers) l.end_scoring();
  for (LayerCache& l : layers) l.compact_scored();
}

bool SequenceCache::wants_scoring() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerCache& l) { return l.wants_scoring(); });
}

bool SequenceCache::records_context() const {
  return std::any_of(layers.begin(), layers.end(), [](const LayerCache& l) { return l.records_context(); });
}

KvType kv_type_of(KvDType d) {
  switch (d) {
    case KvDType::kF16: return KvType::kF16;
    case KvDType::kF32: return KvType::kF32;
    case KvDType::kQ8_0: return KvType::kQ8_0;
    case KvDType::kQ4_0: return KvType::kQ4_0;
    case KvDType::kQ4_1: return KvType::kQ4_1;
  }
  return KvType::kF16;
}

CachePlan CacheBuilder::plan(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows, bool host_mirror) {
  validate(cfg);  // the one check: a CachePlan holds a valid config
  CachePlan p;
  p.cfg_ = cfg;
  p.max_tokens_ = cfg.max_tokens > 0 ? cfg.max_tokens : model.context_length;
  p.max_step_rows_ = max_step_rows;
  const KvTypes t = kv_types(cfg);
  for (KvDType d : {cfg.dtype, kv_v_dtype(cfg)})
    if (kv_quantized(kv_type_of(d)) && model.head_dim % 32 != 0)
      throw Error(std::string(cfg.dtype == d ? "--kv-type" : "--kv-type-v") + " " + kv_dtype_name(d) +
                  ": blocks of 32 along the head dim need a head dim that is a multiple of 32 (the model's is " +
                  std::to_string(model.head_dim) + ")");
  const PolicyInfo& info = policy_info(cfg.policy);
  for (int l = 0; l < model.n_layers; ++l) {
    const PolicyContext ctx{cfg, l, model.n_layers, p.max_tokens_, model.n_kv_heads, nullptr};
    const auto policy = info.make(ctx);
    const int cap = LayerCache::capacity_for(*policy, max_step_rows, p.max_tokens_);
    // on a device, the layer's slab as its allocator takes it
    const int64_t slab = KvStorage::bytes_for(model.n_kv_heads, model.head_dim, cap, t, false);
    const int64_t pool = host_mirror ? device_alloc_bytes(slab) : slab;
    p.pool_bytes_ += pool;
    p.bytes_ += KvStorage::bytes_for(model.n_kv_heads, model.head_dim, cap, t, host_mirror) - slab + pool;
  }
  return p;
}

SequenceCache CacheBuilder::build(const ModelConfig& model, const CachePlan& plan, Backend* backend) {
  const CacheConfig& cfg = plan.config();
  SequenceCache sc;
  const KvTypes t = kv_types(cfg);
  const PolicyInfo& info = policy_info(cfg.policy);
  if (has_coordinator(cfg))
    sc.coordinator = std::make_unique<SqueezeCoordinator>(model.n_layers, cfg.budget, cfg.sinks, cfg.squeeze_strength,
                                                          cfg.squeeze_alloc, cfg.squeeze_p);
  sc.layers.reserve(static_cast<size_t>(model.n_layers));
  for (int l = 0; l < model.n_layers; ++l) {
    const PolicyContext ctx{cfg, l, model.n_layers, plan.max_tokens(), model.n_kv_heads, sc.coordinator.get()};
    sc.layers.emplace_back(l, model.n_kv_heads, model.head_dim, t, info.make(ctx), plan.max_step_rows(), plan.max_tokens(), backend);
  }
  if (backend != nullptr && !backend->host_visible()) {
    sc.backend = backend;
    sc.counts_dev = backend->alloc(static_cast<size_t>(model.n_layers) * sizeof(int32_t));
    sc.counts_host.assign(static_cast<size_t>(model.n_layers), 0);
    for (int l = 0; l < model.n_layers; ++l) sc.layers[l].bind_device_count(sc.counts_dev->as<int32_t>() + l);
  }
  return sc;
}

SequenceCache CacheBuilder::for_model(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows, Backend* backend) {
  return build(model, plan(model, cfg, max_step_rows, backend != nullptr && !backend->host_visible()), backend);
}

}  // namespace squeezekv
