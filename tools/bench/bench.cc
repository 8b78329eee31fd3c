// `squeezekv bench` (bench.h): the timing loop and its two reports.
#include "bench/bench.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "squeezekv/engine.h"
#include "squeezekv/error.h"

namespace squeezekv::bench {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> token_range(int64_t from, int64_t n, int V) {
  std::vector<int> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = bench_token(from + i, V);
  return t;
}

void finish(TestResult& r, const std::vector<LayerStats>& layers) {
  std::vector<double> s = r.tok_s;
  std::sort(s.begin(), s.end());
  r.median = s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  for (double v : s) r.mean += v / static_cast<double>(s.size());
  for (double v : s) r.stddev += (v - r.mean) * (v - r.mean);
  r.stddev = s.size() > 1 ? std::sqrt(r.stddev / static_cast<double>(s.size() - 1)) : 0.0;
  for (const LayerStats& l : layers) r.kv_kept_bytes += l.kept_bytes, r.kv_full_bytes += l.full_bytes;
}

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

std::string test_name(const TestResult& t) {
  return t.kind + std::to_string(t.tokens) + " @ d" + std::to_string(t.depth) + (t.batch > 1 ? " x" + std::to_string(t.batch) : "");
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

std::string kv_desc(const SessionOptions& so) {
  std::string s = kv_policy_name(so.cache.policy);
  if (so.cache.policy != KvPolicy::kFull) s += " budget " + std::to_string(so.cache.budget);
  const KvDType v = kv_v_dtype(so.cache);
  return s + " (" + kv_dtype_name(so.cache.dtype) + (v != so.cache.dtype ? std::string("/") + kv_dtype_name(v) : std::string()) + ")";
}

}  // namespace

int bench_token(int64_t i, int V) {
  // ids away from the special tokens at both ends of the vocabulary, as bench/compare_llamacpp.py
  if (V <= 300) return static_cast<int>(i % V);
  return 100 + static_cast<int>((i * 7919) % (V - 200));
}

void validate(const BenchOptions& o) {
  auto all_in = [](const std::vector<int>& v, int lo, int hi) {
    return !v.empty() && std::all_of(v.begin(), v.end(), [&](int x) { return x >= lo && x <= hi; });
  };
  if (!all_in(o.prompt_tokens, 0, 1 << 20)) throw Error("-p: prompt lengths must be in [0, 1048576]");
  if (!all_in(o.gen_tokens, 0, 1 << 20)) throw Error("-n: generation lengths must be in [0, 1048576]");
  if (!all_in(o.depths, 0, 1 << 24)) throw Error("-d: depths must be in [0, 16777216]");
  if (o.repetitions < 1 || o.repetitions > 1000) throw Error("-r: repetitions must be in [1, 1000]");
  if (!all_in(o.batches, 1, 4096)) throw Error("-b: batch sizes must be in [1, 4096]");
  if (*std::max_element(o.prompt_tokens.begin(), o.prompt_tokens.end()) == 0 &&
      *std::max_element(o.gen_tokens.begin(), o.gen_tokens.end()) == 0)
    throw Error("-p/-n: nothing to measure (both are 0)");
}

BenchReport run(const Model& model, const SessionOptions& so, const BenchOptions& o, bool progress) {
  validate(o);
  const int V = model.config().vocab_size;
  auto session = std::make_unique<Session>(model, so);
  auto fill = [&](int depth) {
    session->reset();
    if (depth > 0) session->forward(token_range(0, depth, V));
  };
  if (o.warmup) {  // a short prompt and 4 decode steps, within the context the caller allowed
    const int room = so.cache.max_tokens > 0 ? so.cache.max_tokens : 20;
    const int steps = std::min(4, room / 2), prompt = std::min(16, room - steps);
    fill(0);
    session->forward(token_range(0, prompt, V));
    for (int i = 0; i < steps; ++i) session->forward(token_range(prompt + i, 1, V));
  }
  BenchReport report;
  report.device = session->device_description();
  // a GPU's copy is timed before the tests fill its memory; the CPU's read stream after them, once
  // the peak RSS is read, so that its 1 GiB buffer is not counted as the model's
  const bool host = so.device == Device::kCpu;
  if (!host) report.bandwidth = session->device_copy_bandwidth();
  report.device_matrix_bytes = session->device_matrix_bytes();
  auto roofline = [&](TestResult& r) {
    if (r.kind == "tg" && report.bandwidth > 0)  // the bytes a step reads: every matrix once and the held KV
      r.roofline = r.median / (r.batch * report.bandwidth / static_cast<double>(report.device_matrix_bytes + r.kv_kept_bytes));
  };
  auto done = [&](TestResult& r, const std::vector<LayerStats>& kv) {
    finish(r, kv);
    roofline(r);
    if (progress) std::fprintf(stderr, "%-22s %10.1f tok/s\n", test_name(r).c_str(), r.median);
    report.tests.push_back(std::move(r));
  };
  // one test: `repetitions` times, refill the cache to depth d (untimed), then time `timed`
  auto measure = [&](const char* kind, int n, int d, const auto& timed) {
    TestResult r;
    r.kind = kind, r.tokens = n, r.depth = d;
    std::vector<double> ms;
    for (int rep = 0; rep < o.repetitions; ++rep) {
      fill(d);
      const auto t0 = Clock::now();
      timed();
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      r.tok_s.push_back(n / s);
      ms.push_back(1e3 * s / n);
    }
    std::sort(ms.begin(), ms.end());
    if (r.kind == "tg") r.step_ms = ms[ms.size() / 2];
    done(r, session->kv_stats());
  };
  const bool lone = std::find(o.batches.begin(), o.batches.end(), 1) != o.batches.end();  // B = 1 listed
  for (int d : o.depths) {
    for (int P : o.prompt_tokens) {
      if (P == 0 || !lone) continue;
      const std::vector<int> prompt = token_range(d, P, V);
      measure("pp", P, d, [&] { session->forward(prompt); });
    }
    for (int N : o.gen_tokens) {
      if (N == 0 || !lone) continue;
      const std::vector<int> gen = token_range(d, N, V);
      measure("tg", N, d, [&] {
        for (int i = 0; i < N; ++i) session->forward(std::span<const int>(gen.data() + i, 1));
      });
    }
  }
  // B > 1: the Engine (the session goes first, so the weights are on the device once)
  const int most = *std::max_element(o.batches.begin(), o.batches.end());
  if (most > 1) {
    session.reset();
    Engine engine(model, so, most);
    // B sequences filled to depth d, untimed: one by chunked prefill, the others deep copies of it
    // (the same tokens: a 32k x 128 fill costs one prefill instead of 128)
    auto fill_batch = [&](int B, int d, const std::vector<int>& fill_ids) {
      std::vector<SequenceId> ids = {engine.add_sequence(so.cache)};
      for (int at = 0; at < d; at += engine.prefill_chunk()) {
        const int n = std::min(engine.prefill_chunk(), d - at);
        engine.prefill(ids[0], std::span<const int>(fill_ids.data() + at, static_cast<size_t>(n)), d);
      }
      for (int b = 1; b < B; ++b) ids.push_back(engine.copy_sequence(ids[0]));
      return ids;
    };
    auto release = [&](const std::vector<SequenceId>& ids, std::vector<LayerStats>& kv) {
      kv.clear();
      for (SequenceId id : ids) {
        const std::vector<LayerStats> one = engine.kv_stats(id);
        kv.insert(kv.end(), one.begin(), one.end());
        engine.remove_sequence(id);
      }
    };
    for (int d : o.depths)
      for (int P : o.prompt_tokens)
        for (int B : o.batches) {
          if (P == 0 || B == 1) continue;
          TestResult r;
          r.kind = "pp", r.tokens = P, r.depth = d, r.batch = B;
          std::vector<LayerStats> kv;
          const std::vector<int> fill_ids = token_range(0, d, V), prompt = token_range(d, P, V);
          std::vector<Engine::PrefillPart> parts;
          std::vector<int> given(static_cast<size_t>(B));  // prompt tokens each sequence has run
          for (int rep = o.warmup ? -1 : 0; rep < o.repetitions; ++rep) {
            const std::vector<SequenceId> ids = fill_batch(B, d, fill_ids);
            std::fill(given.begin(), given.end(), 0);
            const auto t0 = Clock::now();
            // the prompts' chunks as the server's scheduler runs them: each step up to one chunk's
            // worth of tokens in all, the first sequence with prompt left first, each sequence's
            // chunk what it gets alone
            for (int first = 0; first < B;) {
              parts.clear();
              int left = engine.prefill_chunk();
              for (int b = first; b < B; ++b) {
                const int n = std::min(P - given[b], engine.prefill_chunk());
                if (n > left) break;
                left -= n;
                parts.push_back({ids[b], std::span<const int>(prompt.data() + given[b], static_cast<size_t>(n)), d + P});
                given[b] += n;
              }
              engine.prefill(parts);
              while (first < B && given[first] == P) ++first;
            }
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (rep >= 0) r.tok_s.push_back(static_cast<double>(B) * P / s);
            release(ids, kv);
          }
          done(r, kv);
        }
    for (int d : o.depths)
      for (int N : o.gen_tokens)
        for (int B : o.batches) {
          if (N == 0 || B == 1) continue;
          TestResult r;
          r.kind = "tg", r.tokens = N, r.depth = d, r.batch = B;
          std::vector<double> ms;
          std::vector<LayerStats> kv;
          const std::vector<int> fill_ids = token_range(0, d, V), gen = token_range(d, N, V);
          // repetition -1 is a warm-up of two steps, untimed (the products' algorithms for this
          // batch size are chosen and its step's graph captured there)
          for (int rep = o.warmup ? -1 : 0; rep < o.repetitions; ++rep) {
            const std::vector<SequenceId> ids = fill_batch(B, d, fill_ids);
            std::vector<int> step(static_cast<size_t>(B));
            const std::vector<SampleParams> greedy(static_cast<size_t>(B));  // picked where the logits are, as the server does
            const int steps = rep < 0 ? std::min(N, 2) : N;
            const auto t0 = Clock::now();
            for (int i = 0; i < steps; ++i) {
              std::fill(step.begin(), step.end(), gen[static_cast<size_t>(i)]);
              engine.decode_sampled(ids, step, greedy);
            }
            const double s = std::chrono::duration<double>(Clock::now() - t0).count();
            if (rep >= 0) {
              r.tok_s.push_back(static_cast<double>(B) * N / s);
              ms.push_back(1e3 * s / N);
            }
            release(ids, kv);
          }
          std::sort(ms.begin(), ms.end());
          r.step_ms = ms[ms.size() / 2];
          done(r, kv);
        }
  }
  report.peak_rss_bytes = peak_rss_bytes();
  if (host) {
    report.bandwidth = host_read_bandwidth(so.threads), report.bandwidth_kind = "read";
    for (TestResult& r : report.tests) roofline(r);
  }
  return report;
}

std::string report_table(const Model& model, const SessionOptions& so, const BenchReport& r) {
  const Model::WeightSummary w = model.weight_summary();
  const ModelConfig& c = model.config();
  std::string types;
  for (const auto& [name, bytes] : w.bytes_by_type) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f", types.empty() ? "" : ", ", name.c_str(), mib(bytes));
    types += buf;
  }
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "model: %s (%s, %d layers, dim %d, %d/%d heads); matrices %.1f MiB (%s)\n",
                c.name.c_str(), arch_name(c.arch), c.n_layers, c.dim, c.n_heads, c.n_kv_heads, mib(w.matrix_bytes),
                types.c_str());
  out += line;
  std::snprintf(line, sizeof line, "device: %s (host: %s; kernels %s) | decode: %s | kv: %s\n\n", r.device.c_str(),
                cpu_name().c_str(), cpu_kernels().c_str(), decode_activations_name(so.decode_activations), kv_desc(so).c_str());
  out += line;
  if (r.bandwidth > 0) {
    if (r.bandwidth >= 1e12)
      std::snprintf(line, sizeof line, "%s bandwidth %.2f TB/s (measured); matrices on the device %.2f GB\n\n", r.bandwidth_kind,
                    r.bandwidth / 1e12, static_cast<double>(r.device_matrix_bytes) / 1e9);
    else
      std::snprintf(line, sizeof line, "%s bandwidth %.1f GB/s (measured, %s); matrices %.3f GB\n\n", r.bandwidth_kind,
                    r.bandwidth / 1e9, r.device.c_str(), static_cast<double>(r.device_matrix_bytes) / 1e9);
    out += line;
  }
  const bool roof = r.bandwidth > 0;
  out += std::string("| test | tok/s (median) | stddev | min | max | runs | KV held MiB | KV full MiB | ms/step |") +
         (roof ? " roofline |" : "") + "\n";
  out += std::string("|---|---:|---:|---:|---:|---:|---:|---:|---:|") + (roof ? "---:|" : "") + "\n";
  for (const TestResult& t : r.tests) {
    const auto [mn, mx] = std::minmax_element(t.tok_s.begin(), t.tok_s.end());
    std::snprintf(line, sizeof line, "| %s | %.1f | %.1f | %.1f | %.1f | %zu | %.2f | %.2f |", test_name(t).c_str(),
                  t.median, t.stddev, *mn, *mx, t.tok_s.size(), mib(t.kv_kept_bytes), mib(t.kv_full_bytes));
    out += line;
    std::snprintf(line, sizeof line, t.kind == "tg" ? " %.2f |" : " |", t.step_ms);
    out += line;
    if (roof) {
      std::snprintf(line, sizeof line, t.kind == "tg" ? " %.0f%% |" : " |", 100.0 * t.roofline);
      out += line;
    }
    out += "\n";
  }
  std::snprintf(line, sizeof line, "\npeak RSS: %.1f MiB\n", mib(r.peak_rss_bytes));
  return out + line;
}

std::string report_json(const Model& model, const SessionOptions& so, const BenchOptions& o, const BenchReport& r) {
  const Model::WeightSummary w = model.weight_summary();
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [name, bytes] : w.bytes_by_type) types[name] = bytes;
  nlohmann::json tests = nlohmann::json::array();
  for (const TestResult& t : r.tests)
    tests.push_back({{"test", t.kind}, {"tokens", t.tokens}, {"depth", t.depth}, {"batch", t.batch}, {"step_ms", t.step_ms}, {"tok_s", t.tok_s},
                     {"median", t.median}, {"mean", t.mean}, {"stddev", t.stddev},
                     {"kv_kept_bytes", t.kv_kept_bytes}, {"kv_full_bytes", t.kv_full_bytes},
                     {"roofline_fraction", t.roofline}});
  nlohmann::json j = {
      {"model", model.config().name},
      {"matrix_bytes", w.matrix_bytes},
      {"matrix_bytes_by_type", types},
      {"device", device_name(so.device)},
      {"device_description", r.device},
      {"cpu", cpu_name()},
      {"cpu_kernels", cpu_kernels()},
      {"threads", so.threads},
      {"decode_activations", decode_activations_name(so.decode_activations)},
      {"kv_policy", kv_policy_name(so.cache.policy)},
      {"kv_budget", so.cache.budget},
      {"kv_type", kv_dtype_name(so.cache.dtype)},
      {"kv_type_v", kv_dtype_name(kv_v_dtype(so.cache))},
      {"kv_recent_f16", so.cache.recent_f16},
      {"prefill_chunk", so.prefill_chunk},
      {"repetitions", o.repetitions},
      {"peak_rss_bytes", r.peak_rss_bytes},
      {std::string(r.bandwidth_kind) + "_bandwidth_bytes_s", r.bandwidth},
      {"device_matrix_bytes", r.device_matrix_bytes},
      {"tests", tests},
  };
  return j.dump();  // one line: a list of thread counts writes one a line
}

}  // namespace squeezekv::bench
