// The policy registry: one row per --kv-policy value. A new policy is its own file plus a row here
// (and its KvPolicy value); names, help texts, validation and cache building all read this table.
#include <string>

#include "core/enum_table.h"
#include "kv/policy.h"
#include "squeezekv/error.h"

namespace squeezekv {

std::unique_ptr<EvictionPolicy> make_full_policy(const PolicyContext& c) { return std::make_unique<FullPolicy>(c.max_tokens); }

namespace {
const PolicyInfo kPolicies[] = {
    {KvPolicy::kFull, "full", "keep every token", false, false, false, make_full_policy, nullptr},
    {KvPolicy::kWindow, "window", "StreamingLLM: sinks + the most recent tokens", false, false, false, make_window_policy, nullptr},
    {KvPolicy::kH2O, "h2o", "H2O: sinks + recent window + heaviest accumulated attention", false, true, false, make_h2o_policy, nullptr},
    {KvPolicy::kSnapKV, "snapkv", "SnapKV: prompt scored by its last window of queries", false, true, true, make_snapkv_policy,
     validate_snapkv},
    {KvPolicy::kPyramidKV, "pyramidkv", "PyramidKV: snapkv scoring, budgets tapered over layers", false, true, false,
     make_pyramidkv_policy, validate_snapkv},
    {KvPolicy::kSqueeze, "squeeze", "SqueezeAttention: h2o per layer, budgets re-split across layers", true, true, false,
     make_squeeze_policy, validate_squeeze},
    {KvPolicy::kKvzip, "kvzip", "KVzip: prompt scored by reconstructing it (query-agnostic)", false, true, true, make_kvzip_policy,
     nullptr},
    {KvPolicy::kCustom, "custom", "a scoring function given through the API (Python: ScorePolicy): sinks + recent window + highest scores",
     false, true, false, make_custom_policy, validate_custom},
};
}  // namespace

std::span<const PolicyInfo> policy_registry() { return kPolicies; }

const PolicyInfo& policy_info(KvPolicy p) {
  for (const PolicyInfo& i : kPolicies)
    if (i.id == p) return i;
  throw Error("kv policy: no registry row for policy value " + std::to_string(static_cast<int>(p)));
}

KvPolicy parse_kv_policy(const std::string& name) { return find_named("--kv-policy", name, kPolicies).id; }

const char* kv_policy_name(KvPolicy p) {
  for (const PolicyInfo& i : kPolicies)
    if (i.id == p) return i.name;
  return "?";
}

const char* kv_policy_names() {
  static const std::string names = names_of(kPolicies, " | ");
  return names.c_str();
}

}  // namespace squeezekv
