// The table of user-facing KV settings (kv_cache.h): one row per setting, read by every edge.
#include <charconv>
#include <cmath>
#include <string>

#include "squeezekv/error.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv {

namespace {

int parse_int(const char* flag, const std::string& t) {
  int v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (t.empty() || ec != std::errc() || end != t.data() + t.size())
    throw Error(std::string(flag) + ": expected an integer, got '" + t + "'");
  return v;
}

double parse_real(const char* flag, const std::string& t) {
  size_t used = 0;
  double v = 0.0;
  try {
    v = std::stod(t, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (t.empty() || used != t.size() || !std::isfinite(v)) throw Error(std::string(flag) + ": expected a number, got '" + t + "'");
  return v;
}

std::string real_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}


using K = KvOption::Kind;
const KvOption kOptions[] = {
    {"policy", "--kv-policy", K::kName, kv_policy_names(),
     [](CacheConfig& c, const std::string& t) { c.policy = parse_kv_policy(t); },
     [](const CacheConfig& c) { return std::string(kv_policy_name(c.policy)); }},
    {"budget", "--kv-budget", K::kInt, "average retained tokens per layer (evicting policies)",
     [](CacheConfig& c, const std::string& t) { c.budget = parse_int("--kv-budget", t); },
     [](const CacheConfig& c) { return std::to_string(c.budget); }},
    {"type", "--kv-type", K::kName,
     "how K and V rows are stored: f16 (default) | f32 | q8_0 | q4_0 | q4_1 (blocks of 32 along the head dim with "
     "their own scales, as GGUF's; CUDA: f16, f32, q8_0, K and V alike, or --kv-type-v q4_1 beside f16 or q8_0 keys)",
     [](CacheConfig& c, const std::string& t) { c.dtype = parse_kv_dtype(t), c.dtype_v.reset(); },
     [](const CacheConfig& c) {
       return kv_v_dtype(c) == c.dtype ? std::string(kv_dtype_name(c.dtype))
                                       : std::string(kv_dtype_name(c.dtype)) + "/" + kv_dtype_name(kv_v_dtype(c));
     }},
    {"type_k", "--kv-type-k", K::kName, "K rows' type alone (after --kv-type)",
     [](CacheConfig& c, const std::string& t) {
       const KvDType k = parse_kv_dtype(t, "--kv-type-k");
       if (!c.dtype_v) c.dtype_v = c.dtype;
       c.dtype = k;
     },
     [](const CacheConfig& c) { return std::string(kv_dtype_name(c.dtype)); }},
    {"type_v", "--kv-type-v", K::kName, "V rows' type alone (after --kv-type)",
     [](CacheConfig& c, const std::string& t) { c.dtype_v = parse_kv_dtype(t, "--kv-type-v"); },
     [](const CacheConfig& c) { return std::string(kv_dtype_name(kv_v_dtype(c))); }},
    {"recent_f16", "--kv-recent-f16", K::kInt,
     "the newest N rows also kept in f16 and read in place of their quantized rows (KIVI's residual; with a quantized "
     "--kv-type, on the CPU; default 0)",
     [](CacheConfig& c, const std::string& t) { c.recent_f16 = parse_int("--kv-recent-f16", t); },
     [](const CacheConfig& c) { return std::to_string(c.recent_f16); }, true},
    {"sinks", "--kv-sinks", K::kInt, "first tokens never evicted (default 4)",
     [](CacheConfig& c, const std::string& t) { c.sinks = parse_int("--kv-sinks", t); },
     [](const CacheConfig& c) { return std::to_string(c.sinks); }},
    {"recent", "--kv-recent", K::kInt, "recent tokens never evicted (default: budget / 2)",
     [](CacheConfig& c, const std::string& t) {
       c.recent = parse_int("--kv-recent", t);
       if (c.recent < 0) throw Error("--kv-recent: must be >= 0, got " + t);
     },
     [](const CacheConfig& c) { return std::to_string(c.recent); }},
    {"snapkv_window", "--snapkv-window", K::kInt, "snapkv/pyramidkv observation window, and the last prompt rows squeeze's eviction_error measures (default 32)",
     [](CacheConfig& c, const std::string& t) { c.snapkv_window = parse_int("--snapkv-window", t); },
     [](const CacheConfig& c) { return std::to_string(c.snapkv_window); }},
    {"pyramid_beta", "--pyramid-beta", K::kReal, "pyramidkv taper: last layer gets (budget - window) / beta",
     [](CacheConfig& c, const std::string& t) { c.pyramid_beta = parse_real("--pyramid-beta", t); },
     [](const CacheConfig& c) { return real_text(c.pyramid_beta); }},
    {"squeeze_strength", "--squeeze-strength", K::kReal, "squeeze re-allocation strength in [0, 1] (default 0.5)",
     [](CacheConfig& c, const std::string& t) { c.squeeze_strength = parse_real("--squeeze-strength", t); },
     [](const CacheConfig& c) { return real_text(c.squeeze_strength); }},
    {"squeeze_metric", "--squeeze-metric", K::kName, "eviction_error (default) | key_cosine (the seed's) | attention_entropy | residual_cosine (the paper's) | mass_coverage",
     [](CacheConfig& c, const std::string& t) { c.squeeze_metric = parse_squeeze_metric(t); },
     [](const CacheConfig& c) { return std::string(squeeze_metric_name(c.squeeze_metric)); }},
    {"squeeze_alloc", "--squeeze-alloc", K::kName, "inverse (the seed's) | kmeans3 (the paper's)",
     [](CacheConfig& c, const std::string& t) { c.squeeze_alloc = parse_squeeze_alloc(t); },
     [](const CacheConfig& c) { return std::string(squeeze_alloc_name(c.squeeze_alloc)); }},
    {"squeeze_p", "--squeeze-p", K::kReal, "kmeans3: share of the average budget for the least important cluster",
     [](CacheConfig& c, const std::string& t) { c.squeeze_p = parse_real("--squeeze-p", t); },
     [](const CacheConfig& c) { return real_text(c.squeeze_p); }},
    {"head_alloc", "--kv-head-alloc", K::kName,
     "uniform | adaptive: a layer's budget split equally over its kv heads, or by their scores (Ada-KV; h2o, snapkv, pyramidkv, squeeze, kvzip)",
     [](CacheConfig& c, const std::string& t) { c.head_alloc = parse_head_alloc(t); },
     [](const CacheConfig& c) { return std::string(head_alloc_name(c.head_alloc)); }},
    {"layer_alloc", "--kv-layer-alloc", K::kName,
     "uniform | squeeze: kvzip's or snapkv's layers keep the average budget each, or the squeeze coordinator re-splits the total "
     "over them from how much of each layer's scores its average budget holds (--squeeze-strength, --squeeze-alloc, --squeeze-cap apply)",
     [](CacheConfig& c, const std::string& t) { c.layer_alloc = parse_layer_alloc(t); },
     [](const CacheConfig& c) { return std::string(layer_alloc_name(c.layer_alloc)); }, true},
    {"squeeze_cap", "--squeeze-cap", K::kName,
     "on | off: cap each layer's budget at the prompt's length, the excess to the other layers (default on)",
     [](CacheConfig& c, const std::string& t) { c.squeeze_cap = parse_on_off("--squeeze-cap", t); },
     [](const CacheConfig& c) { return std::string(on_off_name(c.squeeze_cap)); }},
    {"squeeze_resolve", "--squeeze-resolve", K::kName,
     "first-chunk (default) | prompt: decide the squeeze schedule from the first prompt chunk or at the prompt's end (from every prompt chunk)",
     [](CacheConfig& c, const std::string& t) { c.squeeze_resolve = parse_squeeze_resolve(t); },
     [](const CacheConfig& c) { return std::string(squeeze_resolve_name(c.squeeze_resolve)); }},
};

std::string normalized(std::string_view s) {
  while (!s.empty() && s.front() == '-') s.remove_prefix(1);
  std::string out(s);
  for (char& ch : out)
    if (ch == '-') ch = '_';
  return out;
}

}  // namespace

std::span<const KvOption> kv_options() { return kOptions; }

const KvOption* find_kv_option(std::string_view name) {
  const std::string n = normalized(name);
  for (const KvOption& o : kOptions)
    if (n == o.key || n == normalized(o.flag)) return &o;
  return nullptr;
}

}  // namespace squeezekv
