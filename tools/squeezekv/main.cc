// The squeezekv command line: generate text, or chat interactively.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "eval/eval.h"
#include "eval/record.h"
#include "server/server.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace {

using namespace squeezekv;
namespace fs = std::filesystem;

constexpr const char* kDefaultModel = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

struct CommonArgs {
  std::string device = "cpu";
  std::string device_weights = "native";
  std::string cuda_graphs = "on";
  std::string batch_invariant = "off";
  std::string max_memory;
  std::string kv_memory;
  std::string model;
  std::string dummy;
  std::string dummy_type;
  std::string tokenizer;
  int threads = 0;
  int ctx = 0;
  int prefill_chunk = 512;
  std::string decode_activations = "int8";
  std::map<std::string, std::string> kv;  // KV flag -> value as given (kv_options() rows)
  bool kv_stats = false;
  std::string kv_stats_json;
};

struct GenArgs {
  std::string prompt;
  std::string prompt_file;
  std::string system;
  int n = 128;
  bool chat = false;
  std::vector<std::string> stop;
  SamplerConfig sampler;
  std::string save_kv, load_kv;  // saved KV caches (docs/kv_file.md)
  bool save_kv_after = false;
};

// -m omitted: $SQUEEZEKV_MODEL, then ./models/..., then <exe>/../models/... (the build tree).
std::string default_model_path() {
  if (const char* env = std::getenv("SQUEEZEKV_MODEL")) return env;
  if (fs::exists(kDefaultModel)) return kDefaultModel;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
      const fs::path p = dir / kDefaultModel;
      if (fs::exists(p)) return p.string();
    }
  }
  throw Error("-m: no model given and the default model was not found (" + std::string(kDefaultModel) +
              "); run scripts/fetch-default-model or pass -m PATH");
}

void add_common(CLI::App* app, CommonArgs& a, bool with_ctx = true, bool with_threads = true) {
  app->add_option("-m,--model", a.model, "GGUF file, Hugging Face directory or llama2.c checkpoint (default: SmolLM2-135M-Instruct)");
  app->add_option("--tokenizer", a.tokenizer, "tokenizer file for a llama2.c checkpoint (tok512.bin)");
  app->add_option("--dummy", a.dummy,
                  "random weights of the shape a Hugging Face config.json gives (speed runs; e.g. bench/configs/*.json)");
  app->add_option("--dummy-type", a.dummy_type,
                  "--dummy's weights: BF16 (default) | Q8_0 | Q6_K | Q5_K_M | Q4_K_M | Q5_1 | Q5_0 | Q4_1 | Q4_0, the "
                  "tensor types mixed as llama.cpp's quantizer mixes them (output.weight Q6_K except in Q8_0; the _M "
                  "presets' attn_v and ffn_down Q6_K on the first and last eighth of the layers and every third between)");
  if (with_threads) app->add_option("-t,--threads", a.threads, "CPU threads (default: one per physical core this process may use)")->check(CLI::Range(1, 1024));
  app->add_option("--device", a.device,
                  "cpu | cuda (an NVIDIA GPU; needs a build with the CUDA toolkit)");
  app->add_option("--device-weights", a.device_weights,
                  "--device cuda: native (default: every GGUF block type kept as stored, decode by integer products "
                  "against 8-bit activations, prompts through bf16 tiles; BF16/F16/F32 matrices as bf16) | bf16 "
                  "(every matrix dequantized to bf16 on load) | f32 (exact, for tests)");
  app->add_option("--max-memory", a.max_memory,
                  "most memory the run may hold: weights, activations and every KV cache, checked before allocating "
                  "(bytes, or with K, M, G: 8G); default no limit");
  app->add_option("--kv-memory", a.kv_memory,
                  "memory every sequence's K and V together may take (the KV pool; a sequence waits or is refused when "
                  "its caches do not fit): a size (40G) or a share of what is free once the weights are in (0.9); "
                  "default on a GPU: what is free less the larger of 1 GiB and 5%, on the CPU no limit beyond --max-memory");
  app->add_option("--cuda-graphs", a.cuda_graphs, "--device cuda: on (default: a decode step replays as one CUDA graph) | off");
  app->add_option("--batch-invariant", a.batch_invariant,
                  "--device cuda: off (default: a decode batch of more than 4 sequences multiplies through cuBLAS and "
                  "splits its attention's keys by the batch, each sequence's logits within bf16 rounding of its lone ones) | "
                  "on (the same bits as alone: every decode row on one tensor-core kernel, each sequence's keys split as alone, "
                  "0.65-0.77x the default's speed; the CPU always is; serve prefills one prompt's chunk a step)");
  if (with_ctx)
    app->add_option("--ctx", a.ctx, "most tokens a sequence may hold (default: the model's context length, at most 16384)")->check(CLI::Range(1, 1 << 24));
  app->add_option("--prefill-chunk", a.prefill_chunk, "prompt rows per prefill step")->check(CLI::Range(1, 1 << 20));
  app->add_option("--decode-activations", a.decode_activations,
                  "decode arithmetic: int8 (8-bit activations, integer dots, also for prompt chunks over every quantized type, and bf16 activations for BF16 weights' prompt chunks on AVX-512 BF16 CPUs; default for generate/chat) | f32 (exact; default for eval)");
  for (const KvOption& o : kv_options()) app->add_option(o.flag, a.kv[o.flag], o.help);
  app->add_flag("--kv-stats", a.kv_stats, "print per-layer KV accounting at the end");
  app->add_option("--kv-stats-json", a.kv_stats_json, "write per-layer KV accounting as JSON to FILE");
}

void report_kv(const CommonArgs& a, const Session& s) {
  const auto stats = s.kv_stats();
  if (a.kv_stats) std::fprintf(stderr, "%s", kv_stats_table(stats).c_str());
  if (!a.kv_stats_json.empty()) {
    std::ofstream out(a.kv_stats_json);
    out << kv_stats_json(stats) << "\n";
    if (!out) throw Error("--kv-stats-json: cannot write '" + a.kv_stats_json + "'");
  }
}

void add_generation(CLI::App* app, GenArgs& g) {
  app->add_option("-n,--n-predict", g.n, "tokens to generate")->check(CLI::Range(0, 1 << 24));
  app->add_option("--temp", g.sampler.temperature, "sampling temperature (0: greedy)");
  app->add_option("--top-k", g.sampler.top_k, "top-k (0: off)");
  app->add_option("--top-p", g.sampler.top_p, "top-p nucleus (1: off)");
  app->add_option("--min-p", g.sampler.min_p, "min-p (0: off)");
  app->add_option("--seed", g.sampler.seed, "random seed");
  app->add_option("--stop", g.stop, "stop string (repeatable)");
  app->add_option("--system", g.system, "system message (chat)");
}

void add_kv_files(CLI::App* app, GenArgs& g) {
  app->add_option("--save-kv", g.save_kv, "write the KV cache to FILE once the prompt has run (docs/kv_file.md)");
  app->add_flag("--save-kv-after", g.save_kv_after, "--save-kv: write it after the generation instead (prompt and generated tokens)");
  app->add_option("--load-kv", g.load_kv,
                  "start from a saved KV cache: the prompt must begin with the tokens it covers, and only the rest is run "
                  "(the same model and KV flags as when it was saved)");
}

// "8G", "512M", "64k", "1000000": bytes (K, M, G, T: powers of 1024); Error naming the flag.
int64_t parse_size(const std::string& flag, const std::string& text) {
  const auto bad = [&] { return Error(flag + ": '" + text + "' is not a size (expected bytes, or a number with K, M, G or T: 8G)"); };
  if (text.empty()) throw bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw bad();
  }
  const std::string unit = text.substr(used);
  int shift = 0;
  if (unit == "K" || unit == "k" || unit == "KiB") shift = 10;
  else if (unit == "M" || unit == "MiB") shift = 20;
  else if (unit == "G" || unit == "GiB") shift = 30;
  else if (unit == "T" || unit == "TiB") shift = 40;
  else if (!unit.empty()) throw bad();
  const double bytes = v * static_cast<double>(int64_t{1} << shift);
  if (!(bytes >= 1.0 && bytes < 9e18)) throw Error(flag + ": '" + text + "' is out of range (at least 1 byte)");
  return static_cast<int64_t>(bytes);
}

std::unique_ptr<Model> load(const CommonArgs& a) {
  LoadOptions lo;
  if (!a.max_memory.empty()) lo.max_memory = parse_size("--max-memory", a.max_memory);
  if (!a.dummy_type.empty() && a.dummy.empty()) throw Error("--dummy-type: only with --dummy CONFIG");
  if (!a.dummy.empty()) {
    if (!a.model.empty()) throw Error("--dummy: give either -m MODEL or --dummy CONFIG, not both");
    if (!a.dummy_type.empty()) lo.dummy_type = a.dummy_type;
    return Model::dummy(a.dummy, 1, lo);
  }
  lo.tokenizer_path = a.tokenizer;
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  if (!a.tokenizer.empty() && !fs::exists(a.tokenizer)) throw Error("--tokenizer: file '" + a.tokenizer + "' does not exist");
  return Model::load(path, lo);
}

SessionOptions session_options(const CommonArgs& a) {
  SessionOptions so;
  so.device = parse_device(a.device);
  so.device_weights = parse_device_weights(a.device_weights);
  so.cuda_graphs = parse_on_off("--cuda-graphs", a.cuda_graphs);
  so.batch_invariant = parse_on_off("--batch-invariant", a.batch_invariant);
  if (!a.max_memory.empty()) so.max_memory = parse_size("--max-memory", a.max_memory);
  if (!a.kv_memory.empty()) {
    // a plain number up to 1 is a share of the free memory, anything else a size
    size_t used = 0;
    double share = 0;
    try {
      share = std::stod(a.kv_memory, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == a.kv_memory.size() && share <= 1.0) {
      if (!(share > 0.0))
        throw Error("--kv-memory: '" + a.kv_memory + "' is not a size or a share of the free memory (expected 40G, or 0 < share <= 1)");
      so.kv_memory_fraction = share;
    } else {
      so.kv_memory = parse_size("--kv-memory", a.kv_memory);
    }
  }
  if (!device_available(so.device))
    throw Error("--device cuda: this build of squeezekv has no CUDA backend (configure with -DSQUEEZEKV_CUDA=ON on a "
                "machine with the CUDA toolkit)");
  so.threads = a.threads > 0 ? a.threads : default_cpu_threads();
  so.prefill_chunk = a.prefill_chunk;
  so.decode_activations = parse_decode_activations(a.decode_activations);
  so.cache.max_tokens = a.ctx;
  for (const KvOption& o : kv_options()) {
    const auto it = a.kv.find(o.flag);
    if (it != a.kv.end() && !it->second.empty()) o.set(so.cache, it->second);
  }
  validate(so.cache);
  return so;
}

void print_stats(const GenerateResult& r) {
  const double pps = r.prompt_seconds > 0 ? r.prompt_tokens / r.prompt_seconds : 0.0;
  const double gps = r.generate_seconds > 0 ? r.tokens.size() / r.generate_seconds : 0.0;
  std::fprintf(stderr, "\nprompt: %d tokens, %.1f tokens/s | generated: %zu tokens, %.1f tokens/s\n", r.prompt_tokens,
               pps, r.tokens.size(), gps);
}

int run_generate(const CommonArgs& a, GenArgs& g) {
  validate(g.sampler);
  const SessionOptions so = session_options(a);  // refuse bad flags before any work
  if (!g.prompt_file.empty()) {
    std::ifstream in(g.prompt_file);
    if (!in) throw Error("-f: cannot read prompt file '" + g.prompt_file + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    g.prompt = ss.str();
  }
  auto model = load(a);
  Session session(*model, so);
  std::string text = g.prompt;
  if (g.chat) {
    const ChatFormat f = detect_chat_format(model->chat_template());
    if (f == ChatFormat::kPlain) std::fprintf(stderr, "warning: --chat: unknown or missing chat template, using plain text\n");
    std::vector<ChatMessage> msgs;
    if (!g.system.empty()) msgs.push_back({"system", g.system});
    msgs.push_back({"user", g.prompt});
    text = render_chat(f, model->chat_template(), msgs);
  }
  std::vector<int> prompt = encode_prompt(*model, text);
  if (prompt.empty()) {
    if (model->tokenizer().bos() < 0) throw Error("-p: empty prompt and the model has no BOS token to start from");
    prompt.push_back(model->tokenizer().bos());
  }
  GenerateOptions go;
  go.max_tokens = g.n;
  go.sampler = g.sampler;
  go.stop = g.stop;
  // a saved cache: the prompt must extend the tokens it covers; only the rest runs
  size_t cached = 0;
  if (!g.load_kv.empty()) {
    const std::vector<int> have = session.load_kv_file(g.load_kv);
    const size_t same = std::mismatch(have.begin(), have.end(), prompt.begin(), prompt.end()).first - have.begin();
    if (same < have.size())
      throw Error("--load-kv: the prompt differs from the " + std::to_string(have.size()) + " tokens the cache covers at token " +
                  std::to_string(same) + (same < prompt.size() ? "" : " (the prompt ends there)"));
    if (prompt.size() == have.size())
      throw Error("--load-kv: the prompt adds nothing to the " + std::to_string(have.size()) +
                  " tokens the cache covers; give at least one more (the cache holds no logits)");
    cached = have.size();
    std::fprintf(stderr, "load-kv: %zu cached tokens from %s, %zu to run\n", cached, g.load_kv.c_str(), prompt.size() - cached);
  }
  if (!g.save_kv.empty()) {  // writable: checked before the run, not after it
    if (!std::ofstream(g.save_kv + ".tmp", std::ios::app)) throw Error("--save-kv: cannot write '" + g.save_kv + "'");
    std::filesystem::remove(g.save_kv + ".tmp");
  }
  auto save = [&](std::span<const int> run) {
    session.save_kv_file(g.save_kv, run.first(static_cast<size_t>(session.position())));
    std::fprintf(stderr, "save-kv: %d tokens to %s\n", session.position(), g.save_kv.c_str());
  };
  if (!g.chat) std::fwrite(g.prompt.data(), 1, g.prompt.size(), stdout);
  const GenerateResult r = generate(
      session, std::span<const int>(prompt).subspan(cached), go,
      [](std::string_view s) {
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
      },
      [&] {
        if (!g.save_kv.empty() && !g.save_kv_after) save(prompt);
      });
  if (!g.save_kv.empty() && g.save_kv_after) {
    std::vector<int> run = prompt;
    run.insert(run.end(), r.tokens.begin(), r.tokens.end());
    save(run);
  }
  std::fputc('\n', stdout);
  std::fflush(stdout);
  print_stats(r);
  report_kv(a, session);
  return 0;
}

int run_chat(const CommonArgs& a, GenArgs& g) {
  validate(g.sampler);
  const SessionOptions so = session_options(a);
  auto model = load(a);
  Session session(*model, so);
  const ChatFormat f = detect_chat_format(model->chat_template());
  if (f == ChatFormat::kPlain) std::fprintf(stderr, "warning: chat: unknown or missing chat template, using plain text\n");
  std::vector<ChatMessage> msgs;
  if (!g.system.empty()) msgs.push_back({"system", g.system});
  std::vector<int> history;  // tokens the session holds
  const bool tty = isatty(STDIN_FILENO);
  std::string line;
  while (true) {
    if (tty) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line == "/exit") break;
    if (line == "/reset") {
      msgs.resize(g.system.empty() ? 0 : 1);
      session.reset();
      history.clear();
      continue;
    }
    if (line.empty()) continue;
    msgs.push_back({"user", line});
    const std::vector<int> all = encode_prompt(*model, render_chat(f, model->chat_template(), msgs));
    // reuse the cached prefix when the conversation re-tokenizes the same way
    size_t common = 0;
    while (common < history.size() && common < all.size() && history[common] == all[common]) ++common;
    if (common < history.size() || common == all.size()) {
      session.reset();
      history.clear();
      common = 0;
    }
    GenerateOptions go;
    go.max_tokens = g.n;
    go.sampler = g.sampler;
    go.stop = g.stop;
    const std::span<const int> fresh(all.data() + common, all.size() - common);
    const GenerateResult r = generate(session, fresh, go, [](std::string_view s) {
      std::fwrite(s.data(), 1, s.size(), stdout);
      std::fflush(stdout);
    });
    std::fputc('\n', stdout);
    std::fflush(stdout);
    history = all;
    const size_t used = static_cast<size_t>(session.position()) - history.size();
    history.insert(history.end(), r.tokens.begin(), r.tokens.begin() + static_cast<std::ptrdiff_t>(used));
    msgs.push_back({"assistant", r.text});
    if (tty) print_stats(r);
  }
  report_kv(a, session);
  return 0;
}

struct EvalArgs {
  eval::PplOptions ppl;
  std::string task = "passkey";
  eval::RetrievalOptions ret;
  std::string json_out;
  eval::SweepOptions sweep;
};

int run_eval_ppl(const CommonArgs& a, EvalArgs& e) {
  eval::validate(e.ppl);  // before any model work
  const SessionOptions so = session_options(a);
  auto model = load(a);
  const eval::PplResult r = eval::run_ppl(*model, so, e.ppl);
  double mean = 0.0, var = 0.0;
  for (double w : r.window_ppl) mean += w / r.window_ppl.size();
  for (double w : r.window_ppl) var += (w - mean) * (w - mean) / r.window_ppl.size();
  std::fprintf(stderr, "windows: mean ppl %.4f, std %.4f, min %.4f, max %.4f; %.1f tokens/s\n", mean, std::sqrt(var),
               *std::min_element(r.window_ppl.begin(), r.window_ppl.end()),
               *std::max_element(r.window_ppl.begin(), r.window_ppl.end()), r.cost.tokens_per_second);
  std::printf("ppl=%.4f windows=%d tokens=%lld kept_bytes=%lld full_bytes=%lld\n", r.ppl, e.ppl.windows,
              static_cast<long long>(r.tokens), static_cast<long long>(r.cost.kept_bytes),
              static_cast<long long>(r.cost.full_bytes));
  if (!e.json_out.empty())
    eval::write_record(e.json_out, eval::ppl_record(eval::run_settings("ppl", "", so, e.ppl.ctx), e.ppl, r), false, "--json");
  return 0;
}

int run_eval_retrieval(const CommonArgs& a, EvalArgs& e) {
  e.ret.task = eval::parse_task(e.task);
  eval::validate(e.ret);
  const SessionOptions so = session_options(a);
  auto model = load(a);
  const eval::RetrievalResult r = eval::run_retrieval(*model, so, e.ret);
  for (const auto& smp : r.samples)
    std::fprintf(stderr, "depth %.2f %s needle_kept=%d expected=%s answer=%s\n", smp.depth, smp.correct ? "HIT " : "MISS",
                 smp.needle_kept, smp.expected.empty() ? "" : smp.expected[0].c_str(), smp.answer.c_str());
  std::string depths;
  for (const auto& [d, acc] : r.by_depth) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.2f:%.3f", depths.empty() ? "" : ",", d, acc);
    depths += buf;
  }
  std::printf("task=%s ctx=%d accuracy=%.4f by_depth=%s kept_bytes=%lld full_bytes=%lld ttft_cold_ms=%.1f\n", eval::task_name(e.ret.task),
              e.ret.ctx, r.accuracy, depths.c_str(), static_cast<long long>(r.cost.kept_bytes),
              static_cast<long long>(r.cost.full_bytes), r.ttft_cold_s * 1e3);
  if (e.ret.trace_needles) {
    std::printf("needle trace: the answer's tokens in the needles, every kv head: share held until the answer, and median rank by\n"
                "the policy's score when it last decided (0 top, 1 bottom, - never ranked); answered | missed samples\n");
    std::printf("| layer | held, answered | held, missed | rank, answered | rank, missed |\n|---|---:|---:|---:|---:|\n");
    auto rank = [](double v) {
      char buf[16];
      if (v < 0) return std::string("-");
      std::snprintf(buf, sizeof buf, "%.3f", v);
      return std::string(buf);
    };
    for (const auto& l : eval::summarize_needle_trace(r))
      std::printf("| %d | %.2f | %.2f | %s | %s |\n", l.layer, l.hits ? l.kept_hit : 0.0, l.misses ? l.kept_miss : 0.0,
                  l.hits ? rank(l.rank_hit).c_str() : "-", l.misses ? rank(l.rank_miss).c_str() : "-");
  }
  if (e.ret.reuse)
    std::printf("reused: %d questions from restored contexts, %d correct, %d of %zu samples' own answers equal to cold, ttft_warm_ms=%.1f\n",
                r.reasked, r.reasked_correct, r.reuse_equal, r.samples.size(), r.ttft_warm_s * 1e3);
  if (!e.json_out.empty())  // with every sample's token ids, so a peer can run exactly these prompts
    eval::write_record(e.json_out,
                       eval::retrieval_record(eval::run_settings(eval::task_name(e.ret.task), "", so, e.ret.ctx), e.ret, r, true), false,
                       "--json");
  return 0;
}

struct BenchArgs {
  bench::BenchOptions opt;
  std::vector<int> threads;  // -t: each thread count's tests in turn (empty: one per physical core)
  std::string json_out;
  bool no_warmup = false;
};

int run_bench(CommonArgs a, BenchArgs& b) {
  bench::validate(b.opt);
  if (a.kv_stats || !a.kv_stats_json.empty())
    throw Error("--kv-stats: not available in bench (its table and --json give the KV bytes of every test)");
  const int need = *std::max_element(b.opt.depths.begin(), b.opt.depths.end()) +
                   std::max(*std::max_element(b.opt.prompt_tokens.begin(), b.opt.prompt_tokens.end()),
                            *std::max_element(b.opt.gen_tokens.begin(), b.opt.gen_tokens.end()));
  if (a.ctx == 0) a.ctx = need;
  if (a.ctx < need)
    throw Error("--ctx: " + std::to_string(a.ctx) + " is less than the largest depth plus test length (" +
                std::to_string(need) + ")");
  if (b.threads.empty()) b.threads.push_back(a.threads);
  std::vector<SessionOptions> runs;  // one a thread count, every flag refused before the model loads
  for (int t : b.threads) {
    a.threads = t;
    runs.push_back(session_options(a));
  }
  b.opt.warmup = !b.no_warmup;
  if (!b.json_out.empty() && !std::ofstream(b.json_out, std::ios::app))  // before the run, not after it
    throw Error("--json: cannot write '" + b.json_out + "'");
  auto model = load(a);
  std::string json;  // one object a thread count, one a line
  for (size_t i = 0; i < runs.size(); ++i) {
    const bench::BenchReport r = bench::run(*model, runs[i], b.opt);
    std::printf("%s%s", i > 0 ? "\n" : "", bench::report_table(*model, runs[i], r).c_str());
    std::fflush(stdout);
    json += bench::report_json(*model, runs[i], b.opt, r) + "\n";
  }
  if (!b.json_out.empty()) {
    std::ofstream out(b.json_out);
    out << json;
    if (!out) throw Error("--json: cannot write '" + b.json_out + "'");
  }
  return 0;
}

}  // namespace

int run_serve(const CommonArgs& a, server::ServeOptions o) {
  if (a.kv_stats || !a.kv_stats_json.empty())
    throw Error("--kv-stats: not available in serve (GET /metrics reports the KV bytes held)");
  o.session = session_options(a);  // refuse bad flags before loading
  auto model = load(a);
  o.model_name = a.dummy.empty() ? fs::path(a.model.empty() ? default_model_path() : a.model).stem().string()
                                 : fs::path(a.dummy).stem().string();
  return server::serve(*model, o);
}

int main(int argc, char** argv) {
  CLI::App app{"squeezekv: LLM inference with a KV cache held to a fixed memory budget"};
  app.require_subcommand(1);
  CommonArgs common;
  GenArgs gen;
  CLI::App* g = app.add_subcommand("generate", "generate text from a prompt");
  add_common(g, common);
  add_generation(g, gen);
  add_kv_files(g, gen);
  g->add_option("-p,--prompt", gen.prompt, "prompt text");
  g->add_option("-f,--file", gen.prompt_file, "read the prompt from a file");
  g->add_flag("--chat", gen.chat, "wrap the prompt in the model's chat template");
  CLI::App* c = app.add_subcommand("chat", "interactive chat (one user message per line; /reset, /exit)");
  add_common(c, common);
  add_generation(c, gen);
  EvalArgs ev;
  CLI::App* e = app.add_subcommand("eval", "quality under eviction: ppl, retrieval, sweep");
  e->require_subcommand(1);
  CLI::App* ep = e->add_subcommand("ppl", "long-context perplexity under eviction (prefill P, then teacher-forced steps)");
  add_common(ep, common, false);
  ep->add_option("--text", ev.ppl.text_file, "text file")->required();
  ep->add_option("--ctx", ev.ppl.ctx, "tokens per window")->capture_default_str();
  ep->add_option("--prefix", ev.ppl.prefix, "tokens prefilled before scoring")->capture_default_str();
  ep->add_option("--windows", ev.ppl.windows, "non-overlapping windows")->capture_default_str();
  ep->add_option("--json", ev.json_out, "write the result as a JSON record");
  CLI::App* er = e->add_subcommand("retrieval", "synthetic retrieval (passkey, multi-key, multi-value needles)");
  add_common(er, common, false);
  er->add_option("--task", ev.task, "passkey | niah-multikey | niah-multivalue | qa")->capture_default_str();
  er->add_option("--ctx", ev.ret.ctx, "prompt tokens")->capture_default_str();
  er->add_option("--depths", ev.ret.depths, "needle depths in [0, 1]")->delimiter(',');
  er->add_option("--samples", ev.ret.samples, "samples per depth")->capture_default_str();
  er->add_option("--seed", ev.ret.seed, "seed for keys and haystack")->capture_default_str();
  er->add_option("--haystack", ev.ret.haystack_file, "real text for the haystack (default: filler sentences)");
  er->add_option("--answer-tokens", ev.ret.max_answer_tokens, "most tokens of an answer")->capture_default_str();
  er->add_flag("--question-aware", ev.ret.question_aware,
               "prefill the question with the context (compression sees it); default: the context is compressed first");
  er->add_flag("--reuse", ev.ret.reuse,
               "compress each context once and ask every question from a restored copy (the sample's own again, and "
               "niah-multikey's other keys), as a prompt cache serves them; reports the time to first token of both paths");
  er->add_flag("--trace-needles", ev.ret.trace_needles,
               "follow the answer's tokens in the needles through every eviction: per layer, the share held until the answer "
               "and their rank by the policy's score (a table; every sample's layers and heads in the --json record)");
  er->add_option("--json", ev.json_out, "write the result as a JSON record");
  CLI::App* es = e->add_subcommand("sweep", "run a grid from a JSON config; JSON lines out; resumes");
  es->add_option("--config", ev.sweep.config_file, "sweep config (JSON)")->required();
  es->add_option("-t,--threads", common.threads, "CPU threads")->check(CLI::Range(1, 1024));
  BenchArgs bench_args;
  CLI::App* b = app.add_subcommand("bench", "prompt and generation tokens/s at given cache depths (llama-bench style)");
  add_common(b, common, true, false);
  b->add_option("-t,--threads", bench_args.threads,
                "CPU threads (comma list: every test at each count in turn, a table each; default: one per physical core this process may use)")
      ->delimiter(',')->check(CLI::Range(1, 1024));
  b->add_option("-p,--n-prompt", bench_args.opt.prompt_tokens, "prompt tokens per pp test (comma list; 0: none)")
      ->delimiter(',')->capture_default_str();
  b->add_option("-n,--n-gen", bench_args.opt.gen_tokens, "decode steps per tg test (comma list; 0: none)")
      ->delimiter(',')->capture_default_str();
  b->add_option("-d,--depth", bench_args.opt.depths, "tokens already in the cache (comma list)")
      ->delimiter(',')->capture_default_str();
  b->add_option("-b,--batch", bench_args.opt.batches,
                "sequences together in each pp and tg test (comma list; default 1): aggregate tok/s; pp: their prompts' "
                "chunks run as the server runs them, one chunk's worth of tokens a step; tg: ms a step, each step's greedy "
                "tokens picked on the device, as the server does (no logits copied back)")
      ->delimiter(',');
  b->add_option("-r,--repetitions", bench_args.opt.repetitions, "runs per test (median, stddev, min, max reported)")
      ->capture_default_str();
  b->add_flag("--no-warmup", bench_args.no_warmup, "skip the untimed warm-up run");
  b->add_option("--json", bench_args.json_out, "also write the results as JSON to FILE (one object a thread count, one a line)");
  server::ServeOptions serve_opt;
  CLI::App* sv = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat and completions, streamed or not; KV per request)");
  add_common(sv, common);
  sv->add_option("--host", serve_opt.host, "address to listen on")->capture_default_str();
  sv->add_option("--port", serve_opt.port, "port (0: any free port, printed at start)")->capture_default_str();
  sv->add_option("--parallel", serve_opt.parallel, "sequences decoded together (one batch per step)")->capture_default_str();
  sv->add_option("--queue", serve_opt.queue, "requests waiting for a slot; beyond it, 503 with Retry-After")->capture_default_str();
  sv->add_option("--max-prompt-tokens", serve_opt.max_prompt_tokens, "longest prompt accepted (0: the context less one)");
  sv->add_option("--api-key", serve_opt.api_key, "require Authorization: Bearer KEY (default: no key)");
  std::string prompt_cache = "0";
  sv->add_option("--prompt-cache", prompt_cache,
                 "host memory for compressed prompt prefixes kept for reuse (SIZE: 1G, 512M; 0: none, the default). A chat's "
                 "messages before its last (or the request's kv.cache_prefix tokens) are compressed as a prompt of their own, "
                 "kept, and later requests with the same prefix and KV settings start from a copy of it")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // evaluations measure eviction on the exact arithmetic unless asked otherwise
  for (CLI::App* sub : {ep, er})
    if (sub->parsed() && sub->count("--decode-activations") == 0) common.decode_activations = "f32";
  try {
    if (g->parsed()) return run_generate(common, gen);
    if (b->parsed()) return run_bench(common, bench_args);
    if (sv->parsed()) {
      if (prompt_cache != "0") serve_opt.prompt_cache_bytes = parse_size("--prompt-cache", prompt_cache);
      return run_serve(common, serve_opt);
    }
    if (ep->parsed()) return run_eval_ppl(common, ev);
    if (er->parsed()) return run_eval_retrieval(common, ev);
    if (es->parsed()) {
      eval::run_sweep(ev.sweep, common.threads > 0 ? common.threads : default_cpu_threads());
      return 0;
    }
    return run_chat(common, gen);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
