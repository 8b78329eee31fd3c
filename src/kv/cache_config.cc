// A sequence's cache config at the edge: its validation, the names of its enums (one table each,
// read both ways: core/enum_table.h) and the --kv-stats texts.
#include <cstdio>
#include <sstream>

#include "core/enum_table.h"
#include "core/kv_view.h"
#include "kv/policy.h"
#include "squeezekv/error.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

static_assert(kMaxRecentF16 == kMaxRingRows, "--kv-recent-f16's limit is the ring's");

void validate(const CacheConfig& c) {
  auto fail = [](const std::string& m) { throw Error(m); };
  if (c.max_tokens < 0) fail("--ctx: must be positive, got " + std::to_string(c.max_tokens));
  if (c.sinks < 0) fail("--kv-sinks: must be >= 0, got " + std::to_string(c.sinks));
  if (c.recent_f16 < 0 || c.recent_f16 > kMaxRecentF16)
    fail("--kv-recent-f16: expected 0 to " + std::to_string(kMaxRecentF16) + " rows, got " + std::to_string(c.recent_f16));
  if (c.recent_f16 > 0 && c.dtype != KvDType::kQ8_0 && c.dtype != KvDType::kQ4_0 && c.dtype != KvDType::kQ4_1 &&
      kv_v_dtype(c) != KvDType::kQ8_0 && kv_v_dtype(c) != KvDType::kQ4_0 && kv_v_dtype(c) != KvDType::kQ4_1)
    fail("--kv-recent-f16: keeps quantized rows' newest tokens in f16; with --kv-type " + std::string(kv_dtype_name(c.dtype)) +
         " there are none (use q8_0, q4_0 or q4_1)");
  if (c.head_alloc == HeadAlloc::kAdaptive && !policy_info(c.policy).head_adaptive)
    fail(std::string("--kv-head-alloc: adaptive is for h2o, snapkv, pyramidkv, squeeze and kvzip, not ") + kv_policy_name(c.policy));
  if (c.layer_alloc == LayerAlloc::kSqueeze && !policy_info(c.policy).layer_squeeze)
    fail(std::string("--kv-layer-alloc: squeeze re-splits kvzip's and snapkv's layer budgets (the squeeze policy always does), not ") +
         kv_policy_name(c.policy) + "'s");
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
  if (c.layer_alloc == LayerAlloc::kSqueeze) validate_squeeze(c);  // its strength, allocation and cap
}

namespace {
const EnumName<KvDType> kDTypes[] = {{"f16", KvDType::kF16},
                                     {"f32", KvDType::kF32},
                                     {"q8_0", KvDType::kQ8_0},
                                     {"q4_0", KvDType::kQ4_0},
                                     {"q4_1", KvDType::kQ4_1}};
const EnumName<SqueezeMetric> kMetrics[] = {{"key_cosine", SqueezeMetric::kKeyCosine},
                                            {"attention_entropy", SqueezeMetric::kAttentionEntropy},
                                            {"residual_cosine", SqueezeMetric::kResidualCosine},
                                            {"mass_coverage", SqueezeMetric::kMassCoverage},
                                            {"eviction_error", SqueezeMetric::kEvictionError}};
const EnumName<SqueezeAlloc> kAllocs[] = {{"inverse", SqueezeAlloc::kInverse}, {"kmeans3", SqueezeAlloc::kKmeans3}};
const EnumName<SqueezeResolve> kResolves[] = {
    {"first-chunk", SqueezeResolve::kFirstChunk}, {"prompt", SqueezeResolve::kPrompt}, {"first_chunk", SqueezeResolve::kFirstChunk}};
const EnumName<HeadAlloc> kHeadAllocs[] = {{"uniform", HeadAlloc::kUniform}, {"adaptive", HeadAlloc::kAdaptive}};
const EnumName<LayerAlloc> kLayerAllocs[] = {{"uniform", LayerAlloc::kUniform}, {"squeeze", LayerAlloc::kSqueeze}};
const EnumName<bool> kOnOff[] = {{"on", true}, {"off", false}};
}  // namespace

KvDType parse_kv_dtype(const std::string& name, const char* flag) { return parse_enum(flag, name, kDTypes); }
SqueezeMetric parse_squeeze_metric(const std::string& name) { return parse_enum("--squeeze-metric", name, kMetrics); }
SqueezeAlloc parse_squeeze_alloc(const std::string& name) { return parse_enum("--squeeze-alloc", name, kAllocs); }
SqueezeResolve parse_squeeze_resolve(const std::string& name) { return parse_enum("--squeeze-resolve", name, kResolves); }
HeadAlloc parse_head_alloc(const std::string& name) { return parse_enum("--kv-head-alloc", name, kHeadAllocs); }
LayerAlloc parse_layer_alloc(const std::string& name) { return parse_enum("--kv-layer-alloc", name, kLayerAllocs); }
bool parse_on_off(const std::string& flag, const std::string& name) { return parse_enum(flag, name, kOnOff); }
const char* kv_dtype_name(KvDType t) { return enum_name(t, kDTypes); }
const char* kv_dtype_names() {
  static const std::string names = names_of(kDTypes, " | ");
  return names.c_str();
}
const char* squeeze_metric_name(SqueezeMetric m) { return enum_name(m, kMetrics); }
const char* squeeze_alloc_name(SqueezeAlloc a) { return enum_name(a, kAllocs); }
const char* squeeze_resolve_name(SqueezeResolve r) { return enum_name(r, kResolves); }
const char* head_alloc_name(HeadAlloc h) { return enum_name(h, kHeadAllocs); }
const char* layer_alloc_name(LayerAlloc a) { return enum_name(a, kLayerAllocs); }
const char* on_off_name(bool on) { return enum_name(on, kOnOff); }

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
