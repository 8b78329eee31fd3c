// Quality under eviction: long-context perplexity, synthetic retrieval (RULER-style), and sweeps
// over policies x budgets x tasks x lengths that write one JSON-lines record per run.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "squeezekv/kv_cache.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace squeezekv::eval {

// What every run reports about the cache and the time it took.
struct RunCost {
  int64_t kept_bytes = 0;   // mean over windows/samples of the KV bytes held at the end
  int64_t full_bytes = 0;   // the same with no eviction (f16)
  double seconds = 0.0;
  double tokens_per_second = 0.0;  // tokens run through the model per second
  std::vector<int> layer_budgets;  // per-layer budgets at the end of the last window/sample

  // Adds one window's/sample's end-of-run cache state; finish(n) turns the sums into means.
  void add(const std::vector<LayerStats>& layers);
  void finish(int64_t n);
};

struct PplOptions {
  std::string text_file;
  int ctx = 1024;     // tokens per window
  int prefix = 512;   // tokens prefilled before teacher-forced decoding
  int windows = 1;    // non-overlapping windows from the start of the file
  bool progress = true;
};

struct PplResult {
  double ppl = 0.0;                // exp(mean NLL over every scored token of every window)
  std::vector<double> window_ppl;  // per window
  int64_t tokens = 0;              // scored tokens
  RunCost cost;
};

// Validates the options without touching the model (file readable, sizes sane); throws Error.
void validate(const PplOptions& o);
// Prefills the first `prefix` tokens of each window, then feeds the rest one token per step
// (eviction active at every step) and scores every continuation token.
PplResult run_ppl(const Model& m, const SessionOptions& so, const PplOptions& o);

// kQa: a fact in a sentence of prose (a person's relation kept an animal with a name), asked as a
// question whose answer is the name: a word, not a number, in a needle that reads like its haystack.
enum class RetrievalTask { kPasskey, kMultiKey, kMultiValue, kQa };
RetrievalTask parse_task(const std::string& name);  // throws Error naming --task
const char* task_name(RetrievalTask t);

struct RetrievalOptions {
  RetrievalTask task = RetrievalTask::kPasskey;
  int ctx = 1024;                    // prompt tokens (haystack + needles + question)
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};
  int samples = 4;                   // per depth
  uint64_t seed = 1;
  std::string haystack_file;         // empty: filler sentences
  int max_answer_tokens = 24;
  // false: the context is prefilled (and compressed) before the question is seen, as a cache
  // reused across questions is; true: the question ends the prompt, so a policy that scores keys
  // by the prompt's last queries (snapkv, pyramidkv) can look for what it asks
  bool question_aware = false;
  // The reuse a user of a prompt cache gets: each context is compressed once and saved
  // (Session::save_kv), and every question about it starts from a restored copy
  // (Session::load_kv): the sample's own question again (its answer must equal the cold one) and,
  // for niah-multikey, the other three keys. Reports the time to first token of both paths.
  bool reuse = false;
  // Follow the answer's tokens in the needles through every compaction (Session::trace_evictions)
  // until the answer is generated: RetrievalSample::needle_trace.
  bool trace_needles = false;
  bool progress = true;
};

// Where one kv head of one layer left a sample's answer tokens (RetrievalOptions::trace_needles):
// how many survived until the answer, and where they ranked by the policy's score when it last
// decided about them (the median over the tokens of the share of the held rows that scored
// higher: 0 the top, near 1 the bottom; -1 where no compaction dropped rows while they were held).
struct NeedleFate {
  int kept = 0, tokens = 0;
  double rank = -1.0;
};

// A question asked from a restored copy of a sample's compressed context (RetrievalOptions::reuse).
struct RetrievalReask {
  std::string question;
  std::vector<std::string> expected;
  std::string answer;
  bool correct = false;
  double ttft_s = 0.0;  // the restore, the question's tokens and the first pick
};

struct RetrievalSample {
  double depth = 0.0;
  std::string question;
  std::vector<std::string> expected;  // every one must appear in the answer
  std::string answer;
  std::vector<int> prompt_ids;    // what was prefilled (and compressed) before generation
  std::vector<int> continue_ids;  // what generation started from (the question, or its last token)
  bool correct = false;
  bool needle_kept = false;  // every needle token still held by every layer and head after prefill
  double ttft_s = 0.0;       // time to first token: the context's prefill (and compression), the question's tokens, the pick
  // with RetrievalOptions::reuse: the same question from a restored copy, then the other keys'
  std::vector<RetrievalReask> reasked;
  std::vector<std::vector<NeedleFate>> needle_trace;  // [L][G] with RetrievalOptions::trace_needles
};

struct RetrievalResult {
  double accuracy = 0.0;
  std::vector<std::pair<double, double>> by_depth;  // (depth, accuracy)
  std::vector<RetrievalSample> samples;
  RunCost cost;
  double ttft_cold_s = 0.0;  // median over the samples of RetrievalSample::ttft_s
  // with reuse: over every question asked from a restored copy
  int reasked = 0, reasked_correct = 0;
  int reuse_equal = 0;       // samples whose own question gave the cold answer again from the copy
  double ttft_warm_s = 0.0;  // median of their RetrievalReask::ttft_s
};

void validate(const RetrievalOptions& o);
RetrievalResult run_retrieval(const Model& m, const SessionOptions& so, const RetrievalOptions& o);

// One layer's needle trace over a run's samples, answered (hit) and not (miss) apart: the share
// of (answer token, kv head) pairs held until the answer, and the median of NeedleFate::rank over
// the heads that ranked them (-1: none did).
struct NeedleLayerSummary {
  int layer = 0;
  double kept_hit = 0, kept_miss = 0;
  double rank_hit = -1, rank_miss = -1;
  int hits = 0, misses = 0;
};
std::vector<NeedleLayerSummary> summarize_needle_trace(const RetrievalResult& r);
// Exact match: every expected value occurs in the answer as a whole number (a value of digits)
// or a whole word in any case (qa's names).
bool answer_matches(const std::string& answer, const std::vector<std::string>& expected);

// Sweep: a grid from a JSON config, one JSON line per run appended to the output file;
// runs already recorded there are skipped (resume).
// One run of the grid, with everything it needs, checked.
struct SweepRun {
  std::string key;  // task label | ctx | policy label | budget fraction
  std::string task, task_label, policy_label;
  int ctx = 0;
  double fraction = 1.0;
  CacheConfig cache;  // the budget set (0 for full)
  int prefill_chunk = 512;
  bool is_ppl = false;
  PplOptions ppl;              // when is_ppl
  RetrievalOptions retrieval;  // otherwise
};
struct SweepPlan {
  std::string model, output;
  std::vector<std::string> done_records;  // other shards' outputs: their runs count as done
  std::vector<SweepRun> runs;
};
// Parses and checks a sweep config (source: its file name, for messages): every field's type and
// range, every run's KV settings and task options, before any model work; throws Error naming
// the field. check_files: the text and haystack files must be readable (the fuzz target says no).
SweepPlan plan_sweep(std::string_view config_text, const std::string& source, bool check_files = true);

struct SweepOptions {
  std::string config_file;
  bool progress = true;
};
void run_sweep(const SweepOptions& o, int threads);

std::string git_commit();

}  // namespace squeezekv::eval
