// KV cache configuration and per-layer accounting (DESIGN.md "The cache contract").
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "squeezekv/squeeze_coordinator.h"

namespace squeezekv {

// kCustom: sinks + recent window + the highest scores of a caller's KvScorer (CacheConfig::scorer;
// the Python package's ScorePolicy); only the library's API can give one.
enum class KvPolicy : uint8_t { kFull, kWindow, kH2O, kSnapKV, kPyramidKV, kSqueeze, kKvzip, kCustom };
// How K and V rows are stored: f16, f32, or blocks of 32 values along the head dim with their own
// scales (q8_0: 8.5 bits a value; q4_0, q4_1: 4.5 and 5; GGUF's layouts; the CPU only for now).
enum class KvDType : uint8_t { kF16, kF32, kQ8_0, kQ4_0, kQ4_1 };
// How a layer's budget is shared by its kv heads: equally, or by their scores (Ada-KV, Feng et al.
// 2024: one top-k over every head's candidates, each head keeping a floor; for h2o, snapkv,
// pyramidkv, squeeze, and kvzip at its scoring without a floor, as KVzip ranks).
enum class HeadAlloc : uint8_t { kUniform, kAdaptive };
// How a scoring policy's total budget is shared by the layers (kvzip): the average budget each,
// or re-split across layers by the squeeze coordinator (SqueezeAttention's split over another
// method's scores; --squeeze-strength, --squeeze-alloc and --squeeze-cap apply). A layer reports
// the share of its scores that its average budget's highest hold (as squeeze's mass_coverage), so
// budgets move to the layers whose scores are spread widest. squeeze itself always re-splits.
enum class LayerAlloc : uint8_t { kUniform, kSqueeze };
// What a squeeze layer reports; higher always means "needs fewer tokens".
// kMassCoverage: the share of the layer's accumulated attention mass that its average budget's
// heaviest tokens hold (what uniform h2o would keep), so budgets move to the layers that would lose
// the most attention.
// kEvictionError (the default): for the last prompt rows (the observation window), how much of their
// attention output would change if the layer kept only what its h2o rule keeps at the average
// budget's share of the input seen (the budget on a whole prompt; budget x 512 / 2048 on the first
// 512-row chunk of a 2048-token prompt): |o|^2 / (|o|^2 + |o - o'|^2), pooled over the prompt
// chunks until the schedule is decided, so budgets move to the layers whose output the eviction
// would change the most.
enum class SqueezeMetric : uint8_t { kKeyCosine, kAttentionEntropy, kResidualCosine, kMassCoverage, kEvictionError };
// When a squeeze schedule is decided: from the prompt's first chunk (the default: each layer's
// metric over the rows of the first step; no layer evicts before the schedule exists), or once the
// whole prompt has run (the metric over every prompt chunk; until then each layer compacts to the
// average budget, so a layer given more has lost what the average evicted; 0.3-0.5% better
// perplexity at 4k tokens: docs/DESIGN.md).
enum class SqueezeResolve : uint8_t { kFirstChunk, kPrompt };

// What a caller's scoring rule sees of one layer when the layer holds more rows than its budget at
// a step's end (the only time it is asked). Letters: G kv heads, n slots held per head, D head dim.
// The arrays are the cache's own, valid during the call only.
struct KvScoreInput {
  int layer = 0;
  int n_kv_heads = 0;              // G
  int rows = 0;                    // n: slots per head (a head-adaptive layer's dead slots hold position INT32_MAX)
  int head_dim = 0;                // D
  int64_t stride = 0;              // elements from one head's positions (and mass) to the next
  int step_rows = 0;               // rows this step appended (> 1 for a prompt chunk)
  int64_t tokens_seen = 0;         // rows the layer was ever given, this step's included
  const int32_t* positions = nullptr;  // [G][stride], the first n of each head: absolute positions
  const float* mass = nullptr;         // [G][stride]: attention mass accumulated as h2o's (DESIGN.md)
  const float* keys = nullptr;         // [G][n][D] f32 keys after RoPE when KvScorer::wants_keys(), else null
};

// A scoring rule given through the API (KvPolicy::kCustom): higher keeps. The policy keeps the
// sinks and the recent window as h2o does and, of the other rows, the highest scores (ties to the
// older position); a scorer that returns the mass keeps exactly what h2o keeps.
// Thread safety: called by the thread that steps the sequence; one scorer may serve many sequences
// only when its score() may run for them at once (an Engine steps its sequences on one thread).
class KvScorer {
 public:
  virtual ~KvScorer() = default;
  // Whether score() wants the keys (a copy into f32 on every call: the CPU, and row types f16,
  // f32 and q8_0, only; 4-bit keys are stored rotated).
  virtual bool wants_keys() const { return false; }
  // Writes scores [G][n] (finite; the policy refuses others). May throw (the step fails with it).
  virtual void score(const KvScoreInput& in, float* scores) = 0;
};

// The most rows --kv-recent-f16 keeps in f16 (a layer's ring is allocated whole).
constexpr int kMaxRecentF16 = 4096;

struct CacheConfig {
  KvPolicy policy = KvPolicy::kFull;
  KvDType dtype = KvDType::kF16;  // --kv-type (K and V), --kv-type-k (K alone)
  std::optional<KvDType> dtype_v; // --kv-type-v: V's type when it differs from dtype (unset: dtype)
  // --kv-recent-f16: the newest rows also kept in f16 beside their quantized rows (KIVI's
  // full-precision residual), read by attention in their place; quantized types only, the CPU only
  int recent_f16 = 0;
  int max_tokens = 0;   // most tokens one sequence may see (0: the model's context length, at most 16384)
  int budget = 0;       // average retained tokens per layer (0: unbounded; required by evicting policies)
  int sinks = 4;        // first tokens never evicted
  int recent = -1;      // recent window never evicted (-1: budget / 2)
  int snapkv_window = 32;  // --snapkv-window: snapkv / pyramidkv observation window (last prompt queries); eviction_error's rows
  int pool_kernel = 5;  // snapkv score smoothing
  double pyramid_beta = 20.0;
  double squeeze_strength = 0.5;  // the best measured (docs/RESULTS.md); the seed's reference uses 1
  SqueezeMetric squeeze_metric = SqueezeMetric::kEvictionError;  // the best measured (docs/RESULTS.md)
  SqueezeAlloc squeeze_alloc = SqueezeAlloc::kInverse;
  double squeeze_p = 0.5;
  // Cap each layer's budget at the tokens it holds when the schedule is decided (the prompt), the
  // excess handed to the other layers in proportion to their budgets (water-filling; total kept).
  bool squeeze_cap = true;
  HeadAlloc head_alloc = HeadAlloc::kUniform;
  LayerAlloc layer_alloc = LayerAlloc::kUniform;  // --kv-layer-alloc
  SqueezeResolve squeeze_resolve = SqueezeResolve::kFirstChunk;  // docs/DESIGN.md: why not prompt
  // KvPolicy::kCustom's scoring rule (required there, unused by the other policies); shared by
  // copies of this config and by copied sequences.
  std::shared_ptr<KvScorer> scorer;
};

// Refuses invalid combinations before any work, naming the flag (throws Error).
void validate(const CacheConfig& c);

// One layer's accounting after the last step.
struct LayerStats {
  int layer = 0;
  int64_t tokens_seen = 0;   // rows ever appended
  int tokens_kept = 0;       // rows held now
  int budget = 0;            // most rows the layer may hold after a step
  int capacity = 0;          // rows allocated (budget + one prefill chunk, at most --ctx)
  double concentration = 0;  // the squeeze metric this layer reported (0 when none)
  int64_t kept_bytes = 0;    // bytes actually held (K and V)
  int64_t full_bytes = 0;    // f16 bytes with no eviction
  double compression_ratio() const { return kept_bytes > 0 ? static_cast<double>(full_bytes) / kept_bytes : 0.0; }
};

// One compaction of one layer that dropped rows, as a trace sees it (Session::trace_evictions):
// for each kv head the rows it held just before, by absolute position, with the score the policy
// ranked them by where that is the held mass (h2o, squeeze, kvzip and their decode steps; snapkv
// and pyramidkv rank a prompt by the mass pooled along positions), and whether each survived.
struct EvictionEvent {
  int layer = 0;
  int64_t tokens_seen = 0;                      // rows the layer had seen at the compaction
  std::vector<std::vector<int32_t>> positions;  // [G][rows held before]
  std::vector<std::vector<float>> scores;       // [G][rows held before]
  std::vector<std::vector<uint8_t>> kept;       // [G][rows held before]: 1 where the row survived
};
using EvictionTrace = std::function<void(const EvictionEvent&)>;

// Typed names at the edge (CLI, files). Each throws Error naming the flag and the valid values.
KvPolicy parse_kv_policy(const std::string& name);
KvDType parse_kv_dtype(const std::string& name, const char* flag = "--kv-type");
SqueezeMetric parse_squeeze_metric(const std::string& name);
SqueezeAlloc parse_squeeze_alloc(const std::string& name);
SqueezeResolve parse_squeeze_resolve(const std::string& name);
HeadAlloc parse_head_alloc(const std::string& name);
LayerAlloc parse_layer_alloc(const std::string& name);
bool parse_on_off(const std::string& flag, const std::string& name);  // "on" | "off"
// The names the parses take (the first of a value's names), from the same tables.
const char* kv_policy_name(KvPolicy p);
const char* kv_policy_names();  // "full | window | ..." in registry order
const char* kv_dtype_name(KvDType t);
const char* kv_dtype_names();  // "f16 | f32 | q8_0 | q4_0 | q4_1"
// V's row type: dtype_v where set, else dtype.
inline KvDType kv_v_dtype(const CacheConfig& c) { return c.dtype_v.value_or(c.dtype); }
const char* squeeze_metric_name(SqueezeMetric m);
const char* squeeze_alloc_name(SqueezeAlloc a);
const char* squeeze_resolve_name(SqueezeResolve r);
const char* head_alloc_name(HeadAlloc h);
const char* layer_alloc_name(LayerAlloc a);
const char* on_off_name(bool on);

// The KV settings a user can give, one row each: the CLI's flags, the server's per-request "kv"
// object and the eval sweep config all read this table (no edge has its own copy).
struct KvOption {
  enum class Kind : uint8_t { kInt, kReal, kName };
  const char* key;   // request key ("budget"); a sweep config uses the flag's name ("kv_budget")
  const char* flag;  // CLI flag ("--kv-budget"); error messages name it
  Kind kind;
  const char* help;
  void (*set)(CacheConfig& c, const std::string& text);  // parses text (Error naming the flag)
  std::string (*get)(const CacheConfig& c);              // the value as text
  // A saved cache (runtime/kv_file.cc) written before the setting existed lacks it: the default.
  bool may_be_absent = false;
};
std::span<const KvOption> kv_options();
// The row whose key or flag (with or without the dashes, '-' or '_') is `name`; null if none.
const KvOption* find_kv_option(std::string_view name);

// The --kv-stats table and the --kv-stats-json document.
std::string kv_stats_table(const std::vector<LayerStats>& layers);
std::string kv_stats_json(const std::vector<LayerStats>& layers);

}  // namespace squeezekv
