// `squeezekv bench`: prompt and generation throughput at given cache depths, as llama-bench
// measures them: for each depth d, "pp P @ d" times one P-token prompt on top of d tokens already
// in the cache, and "tg N @ d" times N one-token decode steps on top of d tokens; each test is
// repeated, and the cache is refilled (untimed) before every repetition. Token ids are a fixed
// sequence, so every engine can be fed the same ones (bench/compare_llamacpp.py does).
// With batch sizes (-b), "pp P @ d x B" times B sequences' P-token prompts on top of d tokens,
// their chunks run together as the server's scheduler runs them (each step up to one prefill
// chunk's worth of tokens in all, the first sequence with prompt left first): aggregate tok/s
// = B x P / time, as llama-batched-bench's S_PP. "tg N @ d x B" times N decode steps of B sequences together (the Engine:
// one step runs every sequence's row through each weight matrix), filled to depth d untimed: one
// sequence by chunked prefill, the others deep copies of it (Engine::copy_sequence), after one
// untimed warm-up round of two steps for each batch size (--no-warmup: none): aggregate
// tok/s = B x N / time, the time a step takes, and on a
// device the roofline of that mix (the matrices once plus every sequence's held KV a step).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace squeezekv::bench {

struct BenchOptions {
  std::vector<int> prompt_tokens = {512};  // P per pp test (0: no pp test)
  std::vector<int> gen_tokens = {128};     // N per tg test (0: no tg test)
  std::vector<int> depths = {0};           // d: tokens in the cache before the timed part
  std::vector<int> batches = {1};          // B: sequences prefilling or decoding together (1: a Session)
  int repetitions = 5;
  bool warmup = true;                      // one short untimed pp + tg first
};

struct TestResult {
  std::string kind;           // "pp" or "tg"
  int tokens = 0;             // P or N
  int depth = 0;              // d
  int batch = 1;              // B: sequences prefilling or decoding together; tok_s is their aggregate
  double step_ms = 0.0;       // tg: median time of one decode step of all B sequences
  std::vector<double> tok_s;  // one per repetition, in run order
  double median = 0.0, mean = 0.0, stddev = 0.0;
  int64_t kv_kept_bytes = 0;  // KV bytes held after the last repetition's timed part (all B sequences)
  int64_t kv_full_bytes = 0;  // the same with no eviction (f16)
  double roofline = 0.0;      // tg: median / (B x bandwidth / (matrix + KV bytes a step))
};

struct BenchReport {
  std::string device;  // the session's device description
  // bytes/s that bound a decode step, measured by the bench: a GPU's copy (read + written) or the
  // CPU threads' read stream (bandwidth_kind "copy" or "read")
  double bandwidth = 0.0;
  const char* bandwidth_kind = "copy";
  int64_t device_matrix_bytes = 0; // matrix bytes a decode step reads, as the device stores them
  std::vector<TestResult> tests;
  int64_t peak_rss_bytes = 0;  // of the whole process, after every test
};

// The i-th token id of the fixed input sequence for a vocabulary of V ids.
int bench_token(int64_t i, int V);

// Refuses bad options (naming the flag) before any model work.
void validate(const BenchOptions& o);
// Session options must allow depth + max(P, N) tokens (--ctx); `progress` gets one line per test.
BenchReport run(const Model& model, const SessionOptions& so, const BenchOptions& o, bool progress = true);

// The markdown table and the JSON document on one line (with the model, the settings and the machine).
std::string report_table(const Model& model, const SessionOptions& so, const BenchReport& r);
std::string report_json(const Model& model, const SessionOptions& so, const BenchOptions& o, const BenchReport& r);

}  // namespace squeezekv::bench
