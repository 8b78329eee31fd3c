#include "kv/layer_cache.h"

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <sstream>

#include "squeezekv/error.h"
#include "squeezekv/model_config.h"

namespace squeezekv {

LayerCache::LayerCache(int layer, int n_kv_heads, int head_dim, KvType type,
                       std::unique_ptr<EvictionPolicy> policy, int max_step_rows, int max_tokens, Backend* backend)
    : layer_(layer),
      policy_(std::move(policy)),
      max_step_rows_(max_step_rows),
      max_tokens_(max_tokens),
      storage_(n_kv_heads, head_dim, capacity_for(), type, backend) {
  evict_.slots.reserve(static_cast<size_t>(n_kv_heads) * storage_.capacity());
}

int LayerCache::capacity_for(const EvictionPolicy& policy, int max_step_rows, int max_tokens) {
  const int64_t want = static_cast<int64_t>(policy.max_head_rows()) + max_step_rows;
  return static_cast<int>(std::min<int64_t>(want, static_cast<int64_t>(max_tokens) + policy.scratch_rows(max_step_rows)));
}

void LayerCache::append(const float* k, const float* v, const int32_t* pos, int T, const int32_t* pos_dev) {
  storage_.append(k, v, pos, T, pos_dev);
  tokens_seen_ += T;
  last_step_rows_ = T;
}

void LayerCache::end_step() {
  // a decode step one row over the budget, on a device: the policy's decode rule runs where the
  // mass lives, with no copy to the host (docs/DESIGN.md, "Where selection runs")
  if (!storage_.host_visible() && last_step_rows_ == 1 && storage_.count() == policy_->budget() + 1 &&
      storage_.capacity() == capacity_for()) {
    if (const auto rule = policy_->decode_rule()) {
      storage_.evict_one_on_backend(policy_->budget(), rule->sinks, rule->recent);
      check_held();
      return;
    }
  }
  compact();
  check_held();
}

void LayerCache::check_held() const {
  // builds with assertions (the sanitizer build of the test suite among them): the rows actually
  // held after a step against the policy's promise for now, budget() (which is what a layer may
  // hold while a schedule or a scoring pass is pending too), in all and per kv head
  [[maybe_unused]] const int64_t G = storage_.n_kv_heads();
  assert(storage_.live_total() <= G * policy_->budget());
  for ([[maybe_unused]] int g = 0; g < G; ++g) assert(storage_.live(g) <= policy_->max_head_rows());
}

void LayerCache::compact() {
  // (a policy reads the host metadata through positions()/mass(), which copy from a device only
  // what it changed, and only when read)
  if (policy_->select(storage_, last_step_rows_, evict_)) storage_.evict(evict_);
  const int cap = capacity_for();
  if (cap != storage_.capacity() && cap >= storage_.count()) storage_.set_capacity(cap);
}

void LayerCache::end_scoring() {
  policy_->end_scoring();
  compact();
  check_held();
}

void LayerCache::reset() {
  storage_.clear();
  policy_->reset();
  tokens_seen_ = 0;
  last_step_rows_ = 0;
}

LayerStats LayerCache::stats() const {
  LayerStats s;
  s.layer = layer_;
  s.tokens_seen = tokens_seen_;
  const int64_t G = storage_.n_kv_heads();
  s.tokens_kept = static_cast<int>((storage_.live_total() + G - 1) / G);  // per kv head (the mean, when heads differ)
  s.budget = policy_->budget();
  s.capacity = storage_.capacity();
  s.concentration = policy_->concentration();
  s.kept_bytes = storage_.live_total() * storage_.bytes_per_token() / G;
  s.full_bytes = tokens_seen_ * static_cast<int64_t>(storage_.n_kv_heads()) * storage_.head_dim() * 2 * 2;
  return s;
}

void SequenceCache::reset() {
  for (LayerCache& l : layers) l.reset();
  if (coordinator) coordinator->reset();
}

std::optional<KvView> LayerCache::cut_view(int64_t input_end) {
  const ConcentrationMeter* m = policy_->meter();
  if (m == nullptr || m->metric() != SqueezeMetric::kEvictionError) return std::nullopt;
  const EvictionCut& c = m->cut();
  const int budget = c.scaled_budget(tokens_seen_, input_end);
  if (!select_by_score(storage_, c.head_adaptive, budget, c.sinks, c.recent_for(budget), storage_.mass(0),
                       static_cast<size_t>(storage_.capacity()), cut_evict_))
    return std::nullopt;
  return storage_.view_without(cut_evict_);
}

void LayerCache::before_compaction(int64_t input_end) {
  // mass_coverage reads the accumulated mass when it reports (a copy only on a device)
  if (const ConcentrationMeter* m = policy_->meter(); m != nullptr && m->metric() == SqueezeMetric::kMassCoverage)
    storage_.sync_to_host();
  policy_->before_compaction(storage_, {last_step_rows_, tokens_seen_, input_end});
}

void SequenceCache::stage_step(int T) {
  if (!counts_dev) return;  // host-visible backends read the count from the view
  for (size_t l = 0; l < layers.size(); ++l) counts_host[l] = layers[l].storage().count() + T;
  backend->upload(counts_dev->data(), counts_host.data(), counts_host.size() * sizeof(int32_t));
}

void SequenceCache::end_step(int64_t input_end) {
  for (LayerCache& l : layers) l.before_compaction(input_end);
  for (LayerCache& l : layers) l.end_step();
}

bool SequenceCache::wants_scoring() const {
  for (const LayerCache& l : layers)
    if (l.wants_scoring()) return true;
  return false;
}

bool SequenceCache::records_context() const {
  for (const LayerCache& l : layers)
    if (l.records_context()) return true;
  return false;
}

void validate(const CacheConfig& c) {
  auto fail = [](const std::string& m) { throw Error(m); };
  if (c.max_tokens < 0) fail("--ctx: must be positive, got " + std::to_string(c.max_tokens));
  if (c.sinks < 0) fail("--kv-sinks: must be >= 0, got " + std::to_string(c.sinks));
  if (c.head_alloc == HeadAlloc::kAdaptive && !policy_info(c.policy).head_adaptive)
    fail(std::string("--kv-head-alloc: adaptive is for h2o, snapkv, pyramidkv, squeeze and kvzip, not ") + kv_policy_name(c.policy));
  if (c.policy == KvPolicy::kFull) return;
  if (c.budget < 1)
    fail(std::string("--kv-budget: policy ") + kv_policy_name(c.policy) + " needs a budget >= 1, got " +
         std::to_string(c.budget));
  if (c.sinks >= c.budget)
    fail("--kv-sinks: " + std::to_string(c.sinks) + " sinks leave no room in --kv-budget " + std::to_string(c.budget));
  if (c.recent >= 0 && c.sinks + c.recent >= c.budget)
    fail("--kv-recent: sinks + recent (" + std::to_string(c.sinks + c.recent) + ") must be below --kv-budget " +
         std::to_string(c.budget));
  if (const auto check = policy_info(c.policy).validate) check(c);
}

SequenceCache CacheBuilder::for_model(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows,
                                      Backend* backend) {
  validate(cfg);
  SequenceCache sc;
  const int max_tokens = cfg.max_tokens > 0 ? cfg.max_tokens : model.context_length;
  const KvType t = cfg.dtype == KvDType::kF16 ? KvType::kF16 : KvType::kF32;
  const PolicyInfo& info = policy_info(cfg.policy);
  if (info.coordinated)
    sc.coordinator = std::make_unique<SqueezeCoordinator>(model.n_layers, cfg.budget, cfg.sinks, cfg.squeeze_strength,
                                                          cfg.squeeze_alloc, cfg.squeeze_p);
  sc.layers.reserve(static_cast<size_t>(model.n_layers));
  for (int l = 0; l < model.n_layers; ++l) {
    const PolicyContext ctx{cfg, l, model.n_layers, max_tokens, model.n_kv_heads, sc.coordinator.get()};
    sc.layers.emplace_back(l, model.n_kv_heads, model.head_dim, t, info.make(ctx), max_step_rows, max_tokens, backend);
  }
  if (backend != nullptr && !backend->host_visible()) {
    sc.backend = backend;
    sc.counts_dev = backend->alloc(static_cast<size_t>(model.n_layers) * sizeof(int32_t));
    sc.counts_host.assign(static_cast<size_t>(model.n_layers), 0);
    for (int l = 0; l < model.n_layers; ++l) sc.layers[l].bind_device_count(sc.counts_dev->as<int32_t>() + l);
  }
  return sc;
}

int64_t CacheBuilder::planned_bytes(const ModelConfig& model, const CacheConfig& cfg, int max_step_rows, bool host_mirror) {
  validate(cfg);
  const int max_tokens = cfg.max_tokens > 0 ? cfg.max_tokens : model.context_length;
  const KvType t = cfg.dtype == KvDType::kF16 ? KvType::kF16 : KvType::kF32;
  const PolicyInfo& info = policy_info(cfg.policy);
  int64_t total = 0;
  for (int l = 0; l < model.n_layers; ++l) {
    const PolicyContext ctx{cfg, l, model.n_layers, max_tokens, model.n_kv_heads, nullptr};
    const auto policy = info.make(ctx);
    const int cap = LayerCache::capacity_for(*policy, max_step_rows, max_tokens);
    total += KvStorage::bytes_for(model.n_kv_heads, model.head_dim, cap, t, host_mirror);
  }
  return total;
}

namespace {
template <typename E, size_t N>
E parse_enum(const std::string& flag, const std::string& name, const std::pair<const char*, E> (&table)[N]) {
  std::string valid;
  for (const auto& [n, e] : table) {
    if (name == n) return e;
    valid += (valid.empty() ? "" : ", ") + std::string(n);
  }
  throw Error(flag + ": unknown value '" + name + "' (expected one of: " + valid + ")");
}
const std::pair<const char*, SqueezeMetric> kMetrics[] = {{"key_cosine", SqueezeMetric::kKeyCosine},
                                                          {"attention_entropy", SqueezeMetric::kAttentionEntropy},
                                                          {"residual_cosine", SqueezeMetric::kResidualCosine},
                                                          {"mass_coverage", SqueezeMetric::kMassCoverage},
                                                          {"eviction_error", SqueezeMetric::kEvictionError}};
}  // namespace

KvDType parse_kv_dtype(const std::string& name) {
  const std::pair<const char*, KvDType> t[] = {{"f16", KvDType::kF16}, {"f32", KvDType::kF32}};
  return parse_enum("--kv-type", name, t);
}
SqueezeMetric parse_squeeze_metric(const std::string& name) { return parse_enum("--squeeze-metric", name, kMetrics); }
SqueezeAlloc parse_squeeze_alloc(const std::string& name) {
  const std::pair<const char*, SqueezeAlloc> t[] = {{"inverse", SqueezeAlloc::kInverse}, {"kmeans3", SqueezeAlloc::kKmeans3}};
  return parse_enum("--squeeze-alloc", name, t);
}
SqueezeResolve parse_squeeze_resolve(const std::string& name) {
  const std::pair<const char*, SqueezeResolve> t[] = {
      {"first-chunk", SqueezeResolve::kFirstChunk}, {"first_chunk", SqueezeResolve::kFirstChunk}, {"prompt", SqueezeResolve::kPrompt}};
  return parse_enum("--squeeze-resolve", name, t);
}
HeadAlloc parse_head_alloc(const std::string& name) {
  const std::pair<const char*, HeadAlloc> t[] = {{"uniform", HeadAlloc::kUniform}, {"adaptive", HeadAlloc::kAdaptive}};
  return parse_enum("--kv-head-alloc", name, t);
}
bool parse_on_off(const std::string& flag, const std::string& name) {
  const std::pair<const char*, bool> t[] = {{"on", true}, {"off", false}};
  return parse_enum(flag, name, t);
}
const char* squeeze_metric_name(SqueezeMetric m) {
  for (const auto& [n, e] : kMetrics)
    if (e == m) return n;
  return "?";
}

std::string kv_stats_table(const std::vector<LayerStats>& layers) {
  std::ostringstream o;
  char line[256];
  std::snprintf(line, sizeof line, "%5s %11s %11s %7s %13s %12s %12s %8s\n", "layer", "tokens_seen", "tokens_kept",
                "budget", "concentration", "kept_bytes", "full_bytes", "ratio");
  o << line;
  int64_t kept = 0, full = 0;
  for (const LayerStats& s : layers) {
    std::snprintf(line, sizeof line, "%5d %11lld %11d %7d %13.4f %12lld %12lld %8.2f\n", s.layer,
                  static_cast<long long>(s.tokens_seen), s.tokens_kept, s.budget, s.concentration,
                  static_cast<long long>(s.kept_bytes), static_cast<long long>(s.full_bytes), s.compression_ratio());
    o << line;
    kept += s.kept_bytes;
    full += s.full_bytes;
  }
  std::snprintf(line, sizeof line, "total kept_bytes=%lld full_bytes=%lld compression_ratio=%.2f\n",
                static_cast<long long>(kept), static_cast<long long>(full), kept > 0 ? double(full) / kept : 0.0);
  o << line;
  return o.str();
}

std::string kv_stats_json(const std::vector<LayerStats>& layers) {
  std::ostringstream o;
  o.precision(17);
  int64_t kept = 0, full = 0;
  o << "{\"layers\":[";
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerStats& s = layers[i];
    o << (i ? "," : "") << "{\"layer\":" << s.layer << ",\"tokens_seen\":" << s.tokens_seen
      << ",\"tokens_kept\":" << s.tokens_kept << ",\"budget\":" << s.budget << ",\"concentration\":" << s.concentration
      << ",\"kept_bytes\":" << s.kept_bytes << ",\"full_bytes\":" << s.full_bytes
      << ",\"compression_ratio\":" << s.compression_ratio() << "}";
    kept += s.kept_bytes;
    full += s.full_bytes;
  }
  o << "],\"total_kept_bytes\":" << kept << ",\"total_full_bytes\":" << full << "}";
  return o.str();
}

}  // namespace squeezekv
