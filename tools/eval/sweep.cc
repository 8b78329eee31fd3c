// A grid of runs (tasks x lengths x policies x budgets) from a JSON config; one JSON line per run
// is appended to the output file as soon as the run ends, so a killed sweep resumes where it
// stopped: runs whose key is already in the output are skipped.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "eval/eval.h"
#include "eval/progress.h"
#include "common/kv_json.h"
#include "squeezekv/error.h"

namespace squeezekv::eval {
namespace {

using nlohmann::json;

struct PolicySpec {
  std::string label;
  CacheConfig cache;  // budget filled per run
};

struct TaskSpec {
  std::string task;   // ppl | passkey | niah-multikey | niah-multivalue
  std::string label;  // the task's name in keys and records (default: task)
  std::vector<int> ctx;
  json raw;
};

struct Run {
  std::string key;
  const TaskSpec* task;
  int ctx;
  const PolicySpec* policy;
  double fraction;  // 1.0 for full
};

PolicySpec parse_policy(const json& j) {
  PolicySpec p;
  if (!j.is_object() || !j.contains("kv_policy")) throw Error("sweep config: every policy needs \"kv_policy\"");
  // the KV keys are the table's (kv_options(); flag names such as kv_sinks, snapkv_window);
  // the budget comes from budget_fractions
  if (j.contains("kv_budget") || j.contains("budget")) throw Error("sweep config: a policy's budget comes from budget_fractions");
  tools::kv_from_json(j, p.cache, "sweep config policy", {"label"}, false);  // validated per run
  p.label = j.value("label", std::string(kv_policy_name(p.cache.policy)));
  return p;
}

std::string fraction_str(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", f);
  return b;
}

}  // namespace

std::string git_commit() {
  // a binary copied away from its checkout (a long sweep while work goes on) is told its commit
  if (const char* c = std::getenv("SQUEEZEKV_COMMIT")) return c;
  std::string out;
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    pclose(p);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out.empty() ? "unknown" : out;
}

void run_sweep(const SweepOptions& o, int threads) {
  std::ifstream in(o.config_file);
  if (!in) throw Error("--config: cannot read '" + o.config_file + "'");
  json cfg;
  try {
    cfg = json::parse(in);
  } catch (const json::exception& e) {
    throw Error("--config: '" + o.config_file + "' is not valid JSON: " + e.what());
  }
  std::vector<PolicySpec> policies;
  std::vector<TaskSpec> tasks;
  std::vector<double> fractions;
  std::string model_path, output;
  try {
    model_path = cfg.at("model").get<std::string>();
    output = cfg.at("output").get<std::string>();
    for (const auto& p : cfg.at("policies")) policies.push_back(parse_policy(p));
    fractions = cfg.at("budget_fractions").get<std::vector<double>>();
    for (const auto& t : cfg.at("tasks")) {
      TaskSpec ts;
      ts.task = t.at("task").get<std::string>();
      ts.label = t.value("label", ts.task);
      ts.ctx = t.at("ctx").get<std::vector<int>>();
      ts.raw = t;
      if (ts.task != "ppl") parse_task(ts.task);
      tasks.push_back(ts);
    }
  } catch (const json::exception& e) {
    throw Error("--config: '" + o.config_file + "': " + e.what());
  }
  auto check_fraction = [](double f, const std::string& where) {
    if (!(f > 0.0 && f <= 1.0)) throw Error("--config: " + where + "budget fraction " + std::to_string(f) + " outside (0, 1]");
  };
  for (double f : fractions) check_fraction(f, "");
  std::set<std::string> labels;
  for (const TaskSpec& t : tasks) {
    if (!labels.insert(t.label).second)
      throw Error("--config: two tasks are labelled '" + t.label + "'; give each a distinct \"label\"");
    const json& chunk = t.raw.contains("prefill_chunk") ? t.raw.at("prefill_chunk") : json(1);
    if (!chunk.is_number_integer() || chunk.get<int64_t>() < 1)
      throw Error("--config: task '" + t.label + "': prefill_chunk must be a positive integer");
    if (t.raw.contains("question_aware") && !t.raw.at("question_aware").is_boolean())
      throw Error("--config: task '" + t.label + "': question_aware must be true or false");
  }
  // the grid, every option checked before any model work
  std::vector<Run> runs;
  PolicySpec full{"full", CacheConfig{}};
  const bool include_full = cfg.value("include_full", true);
  for (const TaskSpec& t : tasks)
    for (int ctx : t.ctx) {
      if (include_full) runs.push_back({t.label + "|" + std::to_string(ctx) + "|full|1", &t, ctx, &full, 1.0});
      // a task may run a subset of the budgets ("budget_fractions" of its own)
      std::vector<double> task_fractions = fractions;
      if (t.raw.contains("budget_fractions")) {
        try {
          task_fractions = t.raw.at("budget_fractions").get<std::vector<double>>();
        } catch (const json::exception& e) {
          throw Error("--config: task '" + t.label + "': budget_fractions must be a list of numbers: " + e.what());
        }
        for (double f : task_fractions) check_fraction(f, "task '" + t.label + "': ");
        // within the config's budgets (a shard of a split sweep holds a part of them)
        std::erase_if(task_fractions, [&](double f) { return std::find(fractions.begin(), fractions.end(), f) == fractions.end(); });
      }
      for (const PolicySpec& p : policies)
        for (double f : task_fractions) {
          CacheConfig c = p.cache;
          c.budget = static_cast<int>(std::lround(f * ctx));
          validate(c);
          runs.push_back({t.label + "|" + std::to_string(ctx) + "|" + p.label + "|" + fraction_str(f), &t, ctx, &p, f});
        }
      if (t.task == "ppl") {
        PplOptions po;
        po.text_file = t.raw.at("text").get<std::string>();
        po.ctx = ctx;
        po.prefix = static_cast<int>(ctx * t.raw.value("prefix_fraction", 0.5));
        po.windows = t.raw.value("windows", 1);
        validate(po);
      } else {
        RetrievalOptions ro;
        ro.task = parse_task(t.task);
        ro.ctx = ctx;
        ro.depths = t.raw.value("depths", ro.depths);
        ro.samples = t.raw.value("samples", ro.samples);
        ro.haystack_file = t.raw.value("haystack", std::string());
        validate(ro);
      }
    }
  // runs already recorded: in the output itself, or in the records files the config names as
  // done (the other shards of a split sweep)
  std::vector<std::string> records{output};
  try {
    for (const auto& f : cfg.value("done_records", json::array())) records.push_back(f.get<std::string>());
  } catch (const json::exception& e) {
    throw Error("--config: '" + o.config_file + "': done_records must be a list of file names: " + e.what());
  }
  std::set<std::string> done;
  for (size_t i = 0; i < records.size(); ++i) {
    std::ifstream prev{records[i]};
    if (!prev) {
      if (i == 0) continue;  // no output yet: a fresh sweep
      throw Error("--config: done_records file '" + records[i] + "' cannot be read");
    }
    std::string line;
    while (std::getline(prev, line)) {
      if (line.empty()) continue;
      try {
        done.insert(json::parse(line).at("key").get<std::string>());
      } catch (const json::exception&) {
        throw Error("sweep: '" + records[i] + "' has a malformed line; fix or remove it to resume");
      }
    }
  }
  int64_t todo = 0;
  for (const Run& r : runs) todo += !done.count(r.key);
  std::fprintf(stderr, "sweep: %zu runs, %zu already recorded, %lld to run (output %s)\n", runs.size(),
               runs.size() - todo, static_cast<long long>(todo), output.c_str());
  if (todo == 0) return;
  auto model = Model::load(model_path);
  const std::string commit = git_commit();
  if (!std::filesystem::path(output).parent_path().empty()) std::filesystem::create_directories(std::filesystem::path(output).parent_path());
  Progress bar("sweep", todo, o.progress);
  int64_t n = 0;
  for (const Run& r : runs) {
    if (done.count(r.key)) continue;
    SessionOptions so;
    so.threads = threads;
    so.cache = r.policy->cache;
    so.cache.budget = r.policy->cache.policy == KvPolicy::kFull ? 0 : static_cast<int>(std::lround(r.fraction * r.ctx));
    so.prefill_chunk = r.task->raw.value("prefill_chunk", so.prefill_chunk);
    json rec;
    rec["key"] = r.key;
    rec["model"] = model_path;
    rec["task"] = r.task->label;
    rec["policy"] = r.policy->label;
    rec["kv_policy"] = kv_policy_name(so.cache.policy);
    rec["budget"] = so.cache.budget;
    rec["budget_fraction"] = r.fraction;
    rec["ctx"] = r.ctx;
    rec["git_commit"] = commit;
    rec["threads"] = threads;
    rec["prefill_chunk"] = so.prefill_chunk;
    RunCost cost;
    if (r.task->task == "ppl") {
      PplOptions po;
      po.text_file = r.task->raw.at("text").get<std::string>();
      po.ctx = r.ctx;
      po.prefix = static_cast<int>(r.ctx * r.task->raw.value("prefix_fraction", 0.5));
      po.windows = r.task->raw.value("windows", 1);
      po.progress = false;
      const PplResult pr = run_ppl(*model, so, po);
      rec["metric"] = "ppl";
      rec["value"] = pr.ppl;
      rec["window_ppl"] = pr.window_ppl;
      rec["tokens"] = pr.tokens;
      cost = pr.cost;
    } else {
      RetrievalOptions ro;
      ro.task = parse_task(r.task->task);
      ro.ctx = r.ctx;
      ro.depths = r.task->raw.value("depths", ro.depths);
      ro.samples = r.task->raw.value("samples", ro.samples);
      ro.seed = r.task->raw.value("seed", ro.seed);
      ro.haystack_file = r.task->raw.value("haystack", std::string());
      ro.question_aware = r.task->raw.value("question_aware", false);
      ro.progress = false;
      rec["question_aware"] = ro.question_aware;
      const RetrievalResult rr = run_retrieval(*model, so, ro);
      rec["metric"] = "accuracy";
      rec["value"] = rr.accuracy;
      json bd = json::array();
      for (const auto& [d, a] : rr.by_depth) bd.push_back({{"depth", d}, {"accuracy", a}});
      rec["by_depth"] = bd;
      int correct = 0;
      for (const auto& smp : rr.samples) correct += smp.correct;
      rec["n_samples"] = rr.samples.size();  // for the report's 95% interval
      rec["n_correct"] = correct;
      cost = rr.cost;
    }
    rec["kept_bytes"] = cost.kept_bytes;
    rec["full_bytes"] = cost.full_bytes;
    rec["tokens_per_s"] = cost.tokens_per_second;
    rec["seconds"] = cost.seconds;
    rec["layer_budgets"] = cost.layer_budgets;
    std::ofstream out(output, std::ios::app);
    out << rec.dump() << "\n";
    if (!out) throw Error("sweep: cannot append to '" + output + "'");
    bar.update(++n);
  }
}

}  // namespace squeezekv::eval
