// Evaluation run records (record.h).
#include "eval/record.h"

#include <fstream>

#include "squeezekv/error.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv::eval {

using nlohmann::json;

namespace {
void add_cost(json& r, const RunCost& c) {
  r["kept_bytes"] = c.kept_bytes;
  r["full_bytes"] = c.full_bytes;
  r["seconds"] = c.seconds;
  r["tokens_per_s"] = c.tokens_per_second;
  r["layer_budgets"] = c.layer_budgets;
}
}  // namespace

json run_settings(const std::string& task, const std::string& policy, const SessionOptions& so, int ctx) {
  return {{"task", task},
          {"policy", policy.empty() ? kv_policy_name(so.cache.policy) : policy},
          {"kv_policy", kv_policy_name(so.cache.policy)},
          {"budget", so.cache.budget},
          {"kv_type", kv_dtype_name(so.cache.dtype)},
          {"kv_type_v", kv_dtype_name(kv_v_dtype(so.cache))},
          {"kv_recent_f16", so.cache.recent_f16},
          {"ctx", ctx},
          {"threads", so.threads},
          {"prefill_chunk", so.prefill_chunk}};
}

json ppl_record(json r, const PplOptions& o, const PplResult& res) {
  r["metric"] = "ppl";
  r["value"] = res.ppl;
  r["ppl"] = res.ppl;
  r["prefix"] = o.prefix;
  r["windows"] = o.windows;
  r["window_ppl"] = res.window_ppl;
  r["tokens"] = res.tokens;
  add_cost(r, res.cost);
  return r;
}

json retrieval_record(json r, const RetrievalOptions& o, const RetrievalResult& res, bool with_samples) {
  r["metric"] = "accuracy";
  r["value"] = res.accuracy;
  r["accuracy"] = res.accuracy;
  r["question_aware"] = o.question_aware;
  json by_depth = json::array();
  for (const auto& [d, a] : res.by_depth) by_depth.push_back({{"depth", d}, {"accuracy", a}});
  r["by_depth"] = by_depth;
  int correct = 0;
  for (const RetrievalSample& s : res.samples) correct += s.correct;
  r["n_samples"] = res.samples.size();  // for a report's 95% interval
  r["n_correct"] = correct;
  r["ttft_cold_s"] = res.ttft_cold_s;
  r["reuse"] = o.reuse;
  if (o.reuse)
    r["reused"] = {{"questions", res.reasked}, {"correct", res.reasked_correct}, {"same_as_cold", res.reuse_equal},
                   {"ttft_warm_s", res.ttft_warm_s}};
  if (with_samples) {
    json samples = json::array();
    for (const RetrievalSample& s : res.samples) {
      json one = {{"depth", s.depth},         {"expected", s.expected},     {"answer", s.answer},
                  {"correct", s.correct},     {"needle_kept", s.needle_kept}, {"prompt_ids", s.prompt_ids},
                  {"continue_ids", s.continue_ids}, {"ttft_s", s.ttft_s}};
      if (!s.needle_trace.empty()) {  // [L][G] of [kept, tokens, rank]
        json tr = json::array();
        for (const auto& layer : s.needle_trace) {
          json heads = json::array();
          for (const NeedleFate& f : layer) heads.push_back({f.kept, f.tokens, f.rank});
          tr.push_back(heads);
        }
        one["needle_trace"] = tr;
      }
      if (!s.reasked.empty()) {
        json re = json::array();
        for (const RetrievalReask& q : s.reasked)
          re.push_back({{"question", q.question}, {"expected", q.expected}, {"answer", q.answer}, {"correct", q.correct}, {"ttft_s", q.ttft_s}});
        one["reasked"] = re;
      }
      samples.push_back(one);
    }
    r["samples"] = samples;
  }
  add_cost(r, res.cost);
  return r;
}

void write_record(const std::string& path, const json& record, bool append, const std::string& what) {
  std::ofstream out(path, append ? std::ios::app : std::ios::trunc);
  out << record.dump(-1, ' ', false, json::error_handler_t::replace) << "\n";
  if (!out) throw Error(what + ": cannot write '" + path + "'");
}

}  // namespace squeezekv::eval
