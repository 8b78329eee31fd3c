// A grid of runs (tasks x lengths x policies x budgets) from a JSON config; one JSON line per run
// is appended to the output file as soon as the run ends, so a killed sweep resumes where it
// stopped: runs whose key is already in the output are skipped.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "eval/eval.h"
#include "eval/progress.h"
#include "eval/record.h"
#include "common/kv_json.h"
#include "core/json_fields.h"
#include "squeezekv/error.h"

namespace squeezekv::eval {
namespace {

using nlohmann::json;

// Checked reads of a config's fields (core/json_fields.h): an Error that names the field.
JsonFields fields(const json& j, const std::string& where) {
  return JsonFields(j, where, [](const std::string&, const std::string& message) { throw Error(message); });
}

struct PolicySpec {
  std::string label;
  CacheConfig cache;  // budget filled per run
};

PolicySpec parse_policy(const json& j) {
  PolicySpec p;
  if (!j.is_object() || !j.contains("kv_policy")) throw Error("sweep config: every policy needs \"kv_policy\"");
  // the KV keys are the table's (kv_options(); flag names such as kv_sinks, snapkv_window);
  // the budget comes from budget_fractions
  if (j.contains("kv_budget") || j.contains("budget")) throw Error("sweep config: a policy's budget comes from budget_fractions");
  tools::kv_from_json(j, p.cache, "sweep config policy", {"label"}, false);  // validated per run
  p.label = fields(j, "sweep config policy: ").text("label", kv_policy_name(p.cache.policy));
  return p;
}

std::string fraction_str(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", f);
  return b;
}

constexpr int kMaxCtx = 1 << 24;  // as --ctx

}  // namespace

SweepPlan plan_sweep(std::string_view config_text, const std::string& source, bool check_files) {
  const std::string where = "--config: '" + source + "': ";
  json cfg;
  try {
    cfg = json::parse(config_text);
  } catch (const json::exception& e) {
    throw Error("--config: '" + source + "' is not valid JSON: " + e.what());
  }
  if (!cfg.is_object()) throw Error(where + "expected a JSON object");
  const JsonFields top = fields(cfg, where);
  SweepPlan plan;
  plan.model = top.required_text("model");
  plan.output = top.required_text("output");
  if (plan.output.empty()) throw Error(where + "output must name a file");
  if (!cfg.contains("policies") || !cfg.at("policies").is_array()) top.fail("policies", "a list of policies");
  if (!cfg.contains("tasks") || !cfg.at("tasks").is_array()) top.fail("tasks", "a list of tasks");
  std::vector<PolicySpec> policies;
  for (const json& p : cfg.at("policies")) policies.push_back(parse_policy(p));
  const std::vector<double> fractions = top.numbers("budget_fractions", 0.0, 1.0, true);
  auto check_fraction = [&](double f, const std::string& at) {
    if (!(f > 0.0 && f <= 1.0)) throw Error(where + at + "budget fraction " + std::to_string(f) + " outside (0, 1]");
  };
  for (double f : fractions) check_fraction(f, "");
  const bool include_full = top.boolean("include_full", true);
  // the KV row types axis: every run (the full cache's too) once per type, "K" or "K/V" ("q8_0",
  // "q8_0/q4_1"), with "+rN" for the newest N rows also kept in f16 ("q4_1+r128":
  // --kv-recent-f16 N); its label gains "@type" unless the type is f16 for both (so a config
  // without the axis keeps its labels and keys)
  struct TypeSpec {
    std::string suffix;
    KvDType k = KvDType::kF16, v = KvDType::kF16;
    int recent_f16 = 0;
  };
  std::vector<TypeSpec> kv_types{TypeSpec{}};
  if (cfg.contains("kv_types")) {
    const json& kt = cfg.at("kv_types");
    const char* expected = "a list of KV row types (\"f16\", \"q8_0\", \"q8_0/q4_1\", \"q4_1+r128\", ...)";
    if (!kt.is_array() || kt.empty()) top.fail("kv_types", expected);
    kv_types.clear();
    for (const json& e : kt) {
      if (!e.is_string()) top.fail("kv_types", expected);
      const std::string name = e.get<std::string>();
      const size_t plus = name.find("+r");
      const std::string types = name.substr(0, plus);
      const size_t slash = types.find('/');
      TypeSpec t;
      t.k = parse_kv_dtype(types.substr(0, slash), "sweep config kv_types");
      t.v = slash == std::string::npos ? t.k : parse_kv_dtype(types.substr(slash + 1), "sweep config kv_types");
      if (plus != std::string::npos) {
        const std::string n = name.substr(plus + 2);
        char* end = nullptr;
        const long r = std::strtol(n.c_str(), &end, 10);
        if (n.empty() || *end != '\0' || r < 1 || r > kMaxRecentF16)
          throw Error(where + "kv_types: '" + name + "': expected +r and 1 to " + std::to_string(kMaxRecentF16) +
                      " rows after the type (\"q4_1+r128\")");
        auto quantized = [](KvDType d) { return d != KvDType::kF16 && d != KvDType::kF32; };
        if (!quantized(t.k) && !quantized(t.v))
          throw Error(where + "kv_types: '" + name + "': the f16 recent rows need a quantized type (q8_0, q4_0, q4_1)");
        t.recent_f16 = static_cast<int>(r);
      }
      t.suffix = t.k == KvDType::kF16 && t.v == KvDType::kF16 ? "" : "@" + name;
      for (const TypeSpec& o : kv_types)
        if (o.k == t.k && o.v == t.v && o.recent_f16 == t.recent_f16) throw Error(where + "kv_types names " + name + " twice");
      kv_types.push_back(t);
    }
  }
  auto with_type = [](CacheConfig c, const TypeSpec& t) {
    c.dtype = t.k;
    c.dtype_v = t.v;
    c.recent_f16 = t.recent_f16;
    return c;
  };
  if (cfg.contains("done_records")) {
    const json& d = cfg.at("done_records");
    if (!d.is_array()) throw Error(where + "done_records must be a list of file names");
    for (const json& f : d) {
      if (!f.is_string()) throw Error(where + "done_records must be a list of file names, got " + f.dump());
      plan.done_records.push_back(f.get<std::string>());
    }
  }
  std::set<std::string> labels;
  const SessionOptions defaults;
  for (const json& t : cfg.at("tasks")) {
    if (!t.is_object()) throw Error(where + "every task must be an object, got " + t.dump());
    const std::string task = fields(t, where + "task: ").required_text("task");
    const std::string label = fields(t, where + "task: ").text("label", task);
    const JsonFields f = fields(t, where + "task '" + label + "': ");
    if (!labels.insert(label).second)
      throw Error(where + "two tasks are labelled '" + label + "'; give each a distinct \"label\"");
    const bool ppl = task == "ppl";
    RetrievalTask rtask = RetrievalTask::kPasskey;
    if (!ppl) rtask = parse_task(task);
    const std::vector<int> ctxs = f.integers("ctx", 2, kMaxCtx);
    const int chunk = f.has("prefill_chunk") ? f.integer("prefill_chunk", 1, 1, kMaxCtx) : defaults.prefill_chunk;
    const bool question_aware = f.boolean("question_aware", false);
    // a task may run a subset of the budgets ("budget_fractions" of its own), within the config's
    // (a shard of a split sweep holds a part of them)
    std::vector<double> task_fractions = fractions;
    if (f.has("budget_fractions")) {
      if (!t.at("budget_fractions").is_array()) f.fail("budget_fractions", "a list of numbers");
      task_fractions.clear();
      for (const json& e : t.at("budget_fractions")) {
        if (!e.is_number()) f.fail("budget_fractions", "a list of numbers");
        check_fraction(e.get<double>(), "task '" + label + "': ");
        task_fractions.push_back(e.get<double>());
      }
      std::erase_if(task_fractions, [&](double x) { return std::find(fractions.begin(), fractions.end(), x) == fractions.end(); });
    }
    PplOptions po;
    RetrievalOptions ro;
    if (ppl) {
      po.text_file = f.required_text("text");
      po.windows = f.integer("windows", 1, 1, 1 << 20);
      po.progress = false;
    } else {
      ro.task = rtask;
      ro.depths = f.has("depths") ? f.numbers("depths", 0.0, 1.0, true) : ro.depths;
      ro.samples = f.integer("samples", ro.samples, 1, 1 << 20);
      ro.seed = static_cast<uint64_t>(f.integer("seed", static_cast<int>(ro.seed), 0, std::numeric_limits<int>::max()));
      ro.haystack_file = f.text("haystack", "");
      ro.question_aware = question_aware;
      ro.progress = false;
    }
    const double prefix_fraction = ppl ? f.number("prefix_fraction", 0.5, 0.0, 1.0) : 0.5;
    for (int ctx : ctxs) {
      SweepRun base;
      base.task = task;
      base.task_label = label;
      base.ctx = ctx;
      base.prefill_chunk = chunk;
      base.is_ppl = ppl;
      if (ppl) {
        base.ppl = po;
        base.ppl.ctx = ctx;
        base.ppl.prefix = static_cast<int>(ctx * prefix_fraction);
        if (check_files) {
          validate(base.ppl);
        } else if (base.ppl.prefix < 1 || base.ppl.prefix >= ctx) {
          throw Error("--prefix: must be in [1, ctx - 1] = [1, " + std::to_string(ctx - 1) + "], got " + std::to_string(base.ppl.prefix));
        }
      } else {
        base.retrieval = ro;
        base.retrieval.ctx = ctx;
        RetrievalOptions check = base.retrieval;
        if (!check_files) check.haystack_file.clear();
        validate(check);
      }
      for (const TypeSpec& ty : kv_types) {
        if (include_full) {
          SweepRun r = base;
          r.policy_label = "full" + ty.suffix;
          r.cache = with_type(r.cache, ty);
          r.key = label + "|" + std::to_string(ctx) + "|" + r.policy_label + "|1";
          plan.runs.push_back(r);
        }
        for (const PolicySpec& p : policies)
          for (double fr : task_fractions) {
            SweepRun r = base;
            r.policy_label = p.label + ty.suffix;
            r.cache = kv_types.size() == 1 && ty.suffix.empty() ? p.cache : with_type(p.cache, ty);
            r.cache.budget = r.cache.policy == KvPolicy::kFull ? 0 : static_cast<int>(std::lround(fr * ctx));
            r.fraction = fr;
            if (r.cache.policy != KvPolicy::kFull) validate(r.cache);
            r.key = label + "|" + std::to_string(ctx) + "|" + r.policy_label + "|" + fraction_str(fr);
            plan.runs.push_back(r);
          }
      }
    }
  }
  return plan;
}

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
  std::ifstream in(o.config_file, std::ios::binary);
  if (!in) throw Error("--config: cannot read '" + o.config_file + "'");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const SweepPlan plan = plan_sweep(text, o.config_file, true);
  const std::string& output = plan.output;
  const std::vector<SweepRun>& runs = plan.runs;
  // runs already recorded: in the output itself, or in the records files the config names as
  // done (the other shards of a split sweep)
  std::vector<std::string> records{output};
  records.insert(records.end(), plan.done_records.begin(), plan.done_records.end());
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
  for (const SweepRun& r : runs) todo += !done.count(r.key);
  std::fprintf(stderr, "sweep: %zu runs, %zu already recorded, %lld to run (output %s)\n", runs.size(),
               runs.size() - todo, static_cast<long long>(todo), output.c_str());
  if (todo == 0) return;
  auto model = Model::load(plan.model);
  const std::string commit = git_commit();
  if (!std::filesystem::path(output).parent_path().empty()) std::filesystem::create_directories(std::filesystem::path(output).parent_path());
  Progress bar("sweep", todo, o.progress);
  int64_t n = 0;
  for (const SweepRun& r : runs) {
    if (done.count(r.key)) continue;
    SessionOptions so;
    so.threads = threads;
    so.cache = r.cache;
    so.prefill_chunk = r.prefill_chunk;
    json settings = run_settings(r.task_label, r.policy_label, so, r.ctx);
    settings["key"] = r.key;
    settings["model"] = plan.model;
    settings["budget_fraction"] = r.fraction;
    settings["git_commit"] = commit;
    const json rec = r.is_ppl ? ppl_record(settings, r.ppl, run_ppl(*model, so, r.ppl))
                              : retrieval_record(settings, r.retrieval, run_retrieval(*model, so, r.retrieval), false);
    write_record(output, rec, true, "sweep");
    bar.update(++n);
  }
}

}  // namespace squeezekv::eval
