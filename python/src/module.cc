// squeezekv._core: the engine's C++ API as a Python extension (pybind11), under the pure-Python
// package in python/squeezekv/ that users import. One loaded model holds one Engine (the device
// weights once) that every generation and Sequence of that model steps; the GIL is released while
// the engine computes, and a model's engine is used by one thread at a time (a lock a model).
// Letters: V vocab, G kv heads, n held slots per head, D head dim.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "eval/eval.h"
#include "eval/record.h"
#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"
#include "squeezekv/kv_cache.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace py = pybind11;
using namespace squeezekv;

namespace {

using Clock = std::chrono::steady_clock;

// A Python ScorePolicy behind the C++ scorer seam: score(layer, positions [G][n] int32, mass [G][n]
// float32, keys [G][n][D] float32 | None) -> scores [G][n]. The arrays are copies (the cache's own
// rows move at the next step, so a view kept by Python would dangle).
class PyScorer final : public KvScorer {
 public:
  explicit PyScorer(py::object policy) : policy_(std::move(policy)) {
    wants_keys_ = py::bool_(policy_.attr("wants_keys"));
  }
  ~PyScorer() override {
    py::gil_scoped_acquire gil;
    policy_ = py::object();
  }
  bool wants_keys() const override { return wants_keys_; }
  void score(const KvScoreInput& in, float* scores) override {
    py::gil_scoped_acquire gil;
    const py::ssize_t G = in.n_kv_heads, n = in.rows, D = in.head_dim;
    py::array_t<int32_t> pos({G, n});
    py::array_t<float> mass({G, n});
    for (py::ssize_t g = 0; g < G; ++g) {
      std::memcpy(pos.mutable_data(g, 0), in.positions + g * in.stride, static_cast<size_t>(n) * sizeof(int32_t));
      std::memcpy(mass.mutable_data(g, 0), in.mass + g * in.stride, static_cast<size_t>(n) * sizeof(float));
    }
    py::object keys = py::none();
    if (in.keys != nullptr) {
      py::array_t<float> k({G, n, D});
      std::memcpy(k.mutable_data(), in.keys, static_cast<size_t>(G * n * D) * sizeof(float));
      keys = std::move(k);
    }
    py::object result;
    try {
      result = policy_.attr("score")(in.layer, pos, mass, keys);
    } catch (py::error_already_set& e) {
      throw Error("ScorePolicy.score (layer " + std::to_string(in.layer) + "): " + e.what());
    }
    py::array_t<float, py::array::c_style | py::array::forcecast> s;
    try {
      s = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(result);
    } catch (py::error_already_set& e) {
      throw Error(std::string("ScorePolicy.score: expected an array of float scores, got ") + e.what());
    }
    if (!s || s.ndim() != 2 || s.shape(0) != G || s.shape(1) != n)
      throw Error("ScorePolicy.score (layer " + std::to_string(in.layer) + "): expected scores of shape (" +
                  std::to_string(G) + ", " + std::to_string(n) + ") (kv heads, held rows), got " +
                  (s ? std::string(py::str(py::tuple(s.attr("shape")))) : std::string(py::str(py::type::of(result)))));
    std::memcpy(scores, s.data(), static_cast<size_t>(G * n) * sizeof(float));
  }

 private:
  py::object policy_;
  bool wants_keys_ = false;
};

// The Python KVConfig, turned into the engine's: `options` maps kv_options() keys to their text
// (what the CLI's flags take), `scorer` is a ScorePolicy or None.
CacheConfig cache_config(const py::dict& options, const py::object& scorer, int ctx) {
  CacheConfig c;
  for (const auto& [k, v] : options) {
    const std::string key = py::str(k);
    const KvOption* o = find_kv_option(key);
    if (o == nullptr) throw Error("KVConfig: unknown setting '" + key + "'");
    o->set(c, py::str(v));
  }
  if (!scorer.is_none()) {
    c.policy = KvPolicy::kCustom;
    c.scorer = std::make_shared<PyScorer>(scorer);
  }
  c.max_tokens = ctx;
  validate(c);
  return c;
}

SessionOptions session_options(const py::dict& d) {
  SessionOptions so;
  for (const auto& [k, v] : d) {
    const std::string key = py::str(k);
    if (key == "device") so.device = parse_device(py::str(v));
    else if (key == "threads") so.threads = v.cast<int>();
    else if (key == "prefill_chunk") so.prefill_chunk = v.cast<int>();
    else if (key == "decode_activations") so.decode_activations = parse_decode_activations(py::str(v));
    else if (key == "max_memory") so.max_memory = v.cast<int64_t>();
    else if (key == "kv_memory") so.kv_memory = v.cast<int64_t>();
    else if (key == "kv_memory_fraction") so.kv_memory_fraction = v.cast<double>();
    else if (key == "device_weights") so.device_weights = parse_device_weights(py::str(v));
    else if (key == "cuda_graphs") so.cuda_graphs = v.cast<bool>();
    else if (key == "batch_invariant") so.batch_invariant = v.cast<bool>();
    else throw Error("load: unknown run option '" + key + "'");
  }
  if (!device_available(so.device))
    throw Error("device 'cuda': this build of squeezekv has no CUDA backend (build with the CUDA toolkit present)");
  if (so.threads < 0) throw Error("threads: must be >= 0 (0: one per physical core), got " + std::to_string(so.threads));
  return so;
}

// A new array of x: [cols], or [rows][cols] when `matrix`.
py::array_t<float> to_array(std::span<const float> x, py::ssize_t rows, py::ssize_t cols, bool matrix = false) {
  py::array_t<float> a(matrix ? std::vector<py::ssize_t>{rows, cols} : std::vector<py::ssize_t>{cols});
  std::memcpy(a.mutable_data(), x.data(), x.size() * sizeof(float));
  return a;
}

std::vector<int> to_ids(const py::handle& ids, const char* what) {
  try {
    return ids.cast<std::vector<int>>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string(what) + ": expected a sequence of int token ids");
  }
}

py::dict layer_stats(const LayerStats& s) {
  py::dict d;
  d["layer"] = s.layer;
  d["tokens_seen"] = s.tokens_seen;
  d["tokens_kept"] = s.tokens_kept;
  d["budget"] = s.budget;
  d["capacity"] = s.capacity;
  d["concentration"] = s.concentration;
  d["kept_bytes"] = s.kept_bytes;
  d["full_bytes"] = s.full_bytes;
  d["compression_ratio"] = s.compression_ratio();
  return d;
}

// One loaded model and the engine that runs it (made at first use); shared by the Python Model,
// its Sequences and generations, so that a Sequence outlives neither.
struct ModelState {
  std::unique_ptr<Model> model;
  SessionOptions options;
  int max_batch = 16;
  std::unique_ptr<Engine> engine;
  std::mutex mu;  // one engine call at a time (taken with the GIL released)

  Model& get(const char* op) {
    if (!model) throw Error(std::string(op) + ": the model was closed");
    return *model;
  }
  Engine& eng(const char* op) {
    Model& m = get(op);
    if (!engine) engine = std::make_unique<Engine>(m, options, max_batch);
    return *engine;
  }
};
using State = std::shared_ptr<ModelState>;

// Runs f with the GIL released and the model's lock held.
template <class F>
auto locked(ModelState& st, F&& f) {
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(st.mu);
  return f();
}

// One sequence of a model's engine, stepped by hand (Python's Sequence).
class PySequence {
 public:
  PySequence(State st, const CacheConfig& cache) : st_(std::move(st)) {
    id_ = locked(*st_, [&] { return st_->eng("sequence").add_sequence(cache); });
  }
  PySequence(State st, SequenceId id, std::vector<int> run = {}) : st_(std::move(st)), id_(id), run_(std::move(run)) {}
  ~PySequence() { close(); }
  void close() {
    if (id_ < 0) return;
    locked(*st_, [&] {
      if (st_->engine) st_->engine->remove_sequence(id_);
    });
    id_ = -1;
  }
  Engine& eng(const char* op) {
    if (id_ < 0) throw Error(std::string(op) + ": the sequence was closed");
    if (!st_->model) throw Error(std::string(op) + ": the sequence's model was closed");
    return st_->eng(op);
  }
  // Prompt tokens in chunks; the logits of the last row [V], or of every row [n][V].
  py::array_t<float> prefill(const py::handle& ids_obj, bool all_logits) {
    const std::vector<int> ids = to_ids(ids_obj, "Sequence.prefill");
    if (ids.empty()) throw Error("Sequence.prefill: no tokens given");
    const int V = st_->get("Sequence.prefill").config().vocab_size;
    std::vector<float> all;
    std::vector<float> last;
    locked(*st_, [&] {
      Engine& e = eng("Sequence.prefill");
      const int chunk = e.prefill_chunk(), end = e.position(id_) + static_cast<int>(ids.size());
      if (end > e.max_tokens(id_))
        throw Error("Sequence.prefill: " + std::to_string(ids.size()) + " tokens after " + std::to_string(e.position(id_)) +
                    " exceed the sequence's context of " + std::to_string(e.max_tokens(id_)) + " tokens (KVConfig.ctx)");
      for (size_t s = 0; s < ids.size(); s += chunk) {
        const size_t T = std::min<size_t>(chunk, ids.size() - s);
        if (all_logits) {
          const auto l = e.prefill(id_, std::span<const int>(ids.data() + s, T), end, true);
          all.insert(all.end(), l.begin(), l.end());
        } else {
          const auto l = e.prefill(id_, std::span<const int>(ids.data() + s, T), end);
          if (s + T == ids.size()) last.assign(l.begin(), l.end());
        }
        run_.insert(run_.end(), ids.begin() + static_cast<ptrdiff_t>(s), ids.begin() + static_cast<ptrdiff_t>(s + T));
      }
    });
    if (all_logits) return to_array(all, static_cast<py::ssize_t>(ids.size()), V, true);
    return to_array(last, 1, V);
  }
  py::array_t<float> decode(int token) {
    const int V = st_->get("Sequence.decode").config().vocab_size;
    std::vector<float> out;
    locked(*st_, [&] {
      Engine& e = eng("Sequence.decode");
      if (e.position(id_) >= e.max_tokens(id_))
        throw Error("Sequence.decode: the sequence's context of " + std::to_string(e.max_tokens(id_)) +
                    " tokens is full (KVConfig.ctx)");
      const auto l = e.decode(std::span<const SequenceId>(&id_, 1), std::span<const int>(&token, 1));
      out.assign(l.begin(), l.end());
      run_.push_back(token);
    });
    return to_array(out, 1, V);
  }
  // A saved KV cache of this sequence (docs/kv_file.md), as bytes.
  py::bytes save() {
    const auto b = locked(*st_, [&] { return eng("Sequence.save").save_sequence(id_, run_); });
    return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
  }
  const std::vector<int>& tokens() const { return run_; }
  int position() {
    return locked(*st_, [&] { return eng("Sequence.position").position(id_); });
  }
  int max_tokens() {
    return locked(*st_, [&] { return eng("Sequence.max_tokens").max_tokens(id_); });
  }
  py::list kv_stats() {
    const auto stats = locked(*st_, [&] { return eng("Sequence.kv_stats").kv_stats(id_); });
    py::list out;
    for (const LayerStats& s : stats) out.append(layer_stats(s));
    return out;
  }
  py::array_t<int32_t> kv_positions(int layer, int kv_head) {
    const auto p = locked(*st_, [&] { return eng("Sequence.kv_positions").kv_positions(id_, layer, kv_head); });
    py::array_t<int32_t> a(std::vector<py::ssize_t>{static_cast<py::ssize_t>(p.size())});
    if (!p.empty()) std::memcpy(a.mutable_data(), p.data(), p.size() * sizeof(int32_t));
    return a;
  }
  std::unique_ptr<PySequence> copy() {
    const SequenceId c = locked(*st_, [&] { return eng("Sequence.copy").copy_sequence(id_); });
    return std::make_unique<PySequence>(st_, c, run_);
  }
  SequenceId id() const { return id_; }
  const State& state() const { return st_; }
  void ran(int token) { run_.push_back(token); }

 private:
  State st_;
  SequenceId id_ = -1;
  std::vector<int> run_;  // the token ids this sequence has run (what a saved cache covers)
};

// One decode step of several sequences of one model (Engine::decode): the weights read once for
// all of them; logits [n][V] in the order given.
py::array_t<float> decode_batch(const State& st, const std::vector<PySequence*>& seqs, const std::vector<int>& tokens) {
  if (seqs.empty()) throw Error("decode_batch: no sequences given");
  if (seqs.size() != tokens.size())
    throw Error("decode_batch: " + std::to_string(seqs.size()) + " sequences but " + std::to_string(tokens.size()) + " tokens");
  std::vector<SequenceId> ids;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i] == nullptr) throw Error("decode_batch: sequence " + std::to_string(i) + " is None");
    if (seqs[i]->state() != st) throw Error("decode_batch: sequence " + std::to_string(i) + " belongs to another model");
    if (seqs[i]->id() < 0) throw Error("decode_batch: sequence " + std::to_string(i) + " was closed");
    for (size_t j = 0; j < i; ++j)
      if (seqs[j]->id() == seqs[i]->id()) throw Error("decode_batch: sequence " + std::to_string(i) + " is listed twice");
    ids.push_back(seqs[i]->id());
  }
  const int V = st->get("decode_batch").config().vocab_size;
  std::vector<float> out;
  locked(*st, [&] {
    Engine& e = st->eng("decode_batch");
    if (static_cast<int>(ids.size()) > e.max_batch())
      throw Error("decode_batch: " + std::to_string(ids.size()) + " sequences, more than the model's max_batch of " +
                  std::to_string(e.max_batch()) + " (squeezekv.load(max_batch=...))");
    for (size_t i = 0; i < ids.size(); ++i)
      if (e.position(ids[i]) >= e.max_tokens(ids[i]))
        throw Error("decode_batch: sequence " + std::to_string(i) + "'s context of " + std::to_string(e.max_tokens(ids[i])) +
                    " tokens is full (KVConfig.ctx)");
    const auto l = e.decode(ids, tokens);
    out.assign(l.begin(), l.end());
  });
  for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->ran(tokens[i]);
  return to_array(out, static_cast<py::ssize_t>(ids.size()), V, true);
}

GenerateOptions generate_options(const py::dict& d) {
  GenerateOptions o;
  o.max_tokens = d["max_tokens"].cast<int>();
  o.sampler.temperature = d["temperature"].cast<float>();
  o.sampler.top_k = d["top_k"].cast<int>();
  o.sampler.top_p = d["top_p"].cast<float>();
  o.sampler.min_p = d["min_p"].cast<float>();
  o.sampler.seed = d["seed"].cast<uint64_t>();
  o.stop = d["stop"].cast<std::vector<std::string>>();
  if (o.max_tokens < 0) throw Error("max_tokens: must be >= 0, got " + std::to_string(o.max_tokens));
  validate(o.sampler);
  return o;
}

py::dict result_dict(const GenerateResult& r) {
  py::dict d;
  d["text"] = py::bytes(r.text);  // whole UTF-8 characters; decoded by the package
  d["tokens"] = r.tokens;
  d["prompt_tokens"] = r.prompt_tokens;
  d["prompt_seconds"] = r.prompt_seconds;
  d["generate_seconds"] = r.generate_seconds;
  d["stop_reason"] = r.stop_reason;
  return d;
}

// One generation on a model's engine, stepped from Python (stream) or run to its end (generate):
// the prompt in chunks, then one token a step, sampled and detokenized by the engine's Generation.
class PyRun {
 public:
  PyRun(State st, const py::handle& prompt, const py::dict& gen, const CacheConfig& cache)
      : st_(std::move(st)),
        prompt_(prompt_ids(prompt)),
        gen_(st_->get("generate").tokenizer(), prompt_, generate_options(gen),
             [this](std::string_view s) {
               pending_ += s;
               return true;
             }),
        seq_(st_, cache) {}
  // Runs until some text is out or the generation ends; returns the text (empty at the end).
  std::string step() {
    locked(*st_, [&] {
      while (pending_.empty() && !gen_.done()) one();
    });
    std::string s = std::move(pending_);
    pending_.clear();
    return s;
  }
  void run() {
    locked(*st_, [&] {
      while (!gen_.done()) one();
    });
  }
  bool done() const { return gen_.done() && pending_.empty(); }
  py::dict result() {
    GenerateResult r = gen_.result();
    r.prompt_seconds = prompt_seconds_;
    r.generate_seconds = generate_seconds_;
    py::dict d = result_dict(r);
    d["kv_stats"] = seq_.kv_stats();
    return d;
  }

 private:
  static std::vector<int> prompt_ids(const py::handle& prompt) {
    std::vector<int> ids = to_ids(prompt, "generate");
    if (ids.empty()) throw Error("generate: the prompt has no tokens");
    return ids;
  }
  // One engine call: the next prompt chunk, or one decode step.
  void one() {
    Engine& e = seq_.eng("generate");
    const auto t0 = Clock::now();
    if (fed_ < prompt_.size()) {
      const int end = static_cast<int>(prompt_.size());
      if (end > e.max_tokens(seq_.id()))
        throw Error("generate: the prompt's " + std::to_string(end) + " tokens exceed the sequence's context of " +
                    std::to_string(e.max_tokens(seq_.id())) + " tokens (KVConfig.ctx)");
      const size_t T = std::min<size_t>(e.prefill_chunk(), prompt_.size() - fed_);
      const auto l = e.prefill(seq_.id(), std::span<const int>(prompt_.data() + fed_, T), end);
      fed_ += T;
      prompt_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
      if (fed_ < prompt_.size()) return;
      next_ = gen_.next(l);
      return;
    }
    if (next_ < 0) return;
    if (e.position(seq_.id()) >= e.max_tokens(seq_.id())) {
      gen_.finish("length");
      return;
    }
    const SequenceId id = seq_.id();
    const auto l = e.decode(std::span<const SequenceId>(&id, 1), std::span<const int>(&next_, 1));
    next_ = gen_.next(l);
    generate_seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
  }

  State st_;
  std::vector<int> prompt_;
  std::string pending_;
  Generation gen_;
  PySequence seq_;
  size_t fed_ = 0;
  int next_ = -1;
  double prompt_seconds_ = 0, generate_seconds_ = 0;
};

// Many prompts at once through the engine's Scheduler: batched decode steps, each request with
// its own options and cache. Returns the results in the order given.
py::list generate_many(const State& st, const py::list& prompts, const py::dict& gen, const py::list& caches) {
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = to_ids(prompts[i], "generate_batch");
    if (r.prompt.empty()) throw Error("generate_batch: prompt " + std::to_string(i) + " has no tokens");
    r.options = generate_options(gen);
    r.cache = caches[i].cast<CacheConfig>();
    reqs.push_back(std::move(r));
  }
  std::vector<GenerateResult> results(reqs.size());
  locked(*st, [&] {
    Scheduler sched(st->eng("generate_batch"));
    for (size_t i = 0; i < reqs.size(); ++i) {
      reqs[i].on_done = [&results, i](const GenerateResult& r) { results[i] = r; };
      sched.submit(std::move(reqs[i]));
    }
    while (sched.step()) {
    }
  });
  py::list out;
  for (const GenerateResult& r : results) {
    if (r.stop_reason == "error") throw Error("generate_batch: " + r.error);
    out.append(result_dict(r));
  }
  return out;
}

py::dict config_dict(const ModelConfig& c) {
  py::dict d;
  d["arch"] = arch_name(c.arch);
  d["name"] = c.name;
  d["n_layers"] = c.n_layers;
  d["dim"] = c.dim;
  d["n_heads"] = c.n_heads;
  d["n_kv_heads"] = c.n_kv_heads;
  d["head_dim"] = c.head_dim;
  d["ffn_dim"] = c.ffn_dim;
  d["vocab_size"] = c.vocab_size;
  d["context_length"] = c.context_length;
  d["norm_eps"] = c.norm_eps;
  d["rope_theta"] = c.rope_theta;
  d["kv_bytes_per_token_f16"] = c.kv_bytes_per_token_f16();
  return d;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "squeezekv's C++ engine (use the squeezekv package, not this module)";
  static py::exception<Error> error(m, "Error", PyExc_ValueError);
  static py::exception<FormatError> format_error(m, "FormatError", error.ptr());
  static py::exception<MemoryLimitError> memory_error(m, "MemoryLimitError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const MemoryLimitError& e) {
      memory_error(e.what());
    } catch (const FormatError& e) {
      format_error(e.what());
    } catch (const Error& e) {
      error(e.what());
    }
  });

  py::class_<CacheConfig>(m, "CacheConfig")
      .def(py::init(&cache_config), py::arg("options"), py::arg("scorer"), py::arg("ctx"))
      .def_property_readonly("policy", [](const CacheConfig& c) { return kv_policy_name(c.policy); })
      .def_property_readonly("budget", [](const CacheConfig& c) { return c.budget; });

  py::class_<ModelState, State>(m, "Model")
      .def_static(
          "load",
          [](const std::string& path, const std::string& tokenizer, int64_t max_memory, const py::dict& run, int max_batch) {
            auto st = std::make_shared<ModelState>();
            st->options = session_options(run);
            st->max_batch = max_batch;
            LoadOptions lo;
            lo.tokenizer_path = tokenizer;
            lo.max_memory = max_memory;
            py::gil_scoped_release nogil;
            st->model = Model::load(path, lo);
            return st;
          },
          py::arg("path"), py::arg("tokenizer"), py::arg("max_memory"), py::arg("run"), py::arg("max_batch"))
      .def_static(
          "dummy",
          [](const std::string& config, uint64_t seed, int64_t max_memory, const py::dict& run, int max_batch,
             const std::string& dummy_type) {
            auto st = std::make_shared<ModelState>();
            st->options = session_options(run);
            st->max_batch = max_batch;
            LoadOptions lo;
            lo.max_memory = max_memory;
            lo.dummy_type = dummy_type;
            py::gil_scoped_release nogil;
            st->model = Model::dummy(config, seed, lo);
            return st;
          },
          py::arg("config"), py::arg("seed"), py::arg("max_memory"), py::arg("run"), py::arg("max_batch"),
          py::arg("dummy_type") = "BF16")
      .def("close",
           [](ModelState& st) {
             locked(st, [&] {
               st.engine.reset();
               st.model.reset();
             });
           })
      .def_property_readonly("closed", [](const ModelState& st) { return !st.model; })
      .def_property_readonly("config", [](ModelState& st) { return config_dict(st.get("config").config()); })
      .def_property_readonly("chat_template", [](ModelState& st) { return st.get("chat_template").chat_template(); })
      .def("tokenize",
           [](ModelState& st, const std::string& text, std::optional<bool> add_bos, bool special) {
             Model& m = st.get("tokenize");
             if (!add_bos) return encode_prompt(m, text);  // BOS as the model adds it (what generate does)
             return m.tokenizer().encode(text, *add_bos, special);
           },
           py::arg("text"), py::arg("add_bos"), py::arg("special"))
      .def("detokenize",
           [](ModelState& st, const py::handle& ids) {
             const std::vector<int> v = to_ids(ids, "detokenize");
             const int V = st.get("detokenize").tokenizer().vocab_size();
             for (int id : v)
               if (id < 0 || id >= V)
                 throw Error("detokenize: token id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(V) + ")");
             return py::bytes(st.get("detokenize").tokenizer().decode(v));
           })
      .def("token_text", [](ModelState& st, int id) {
        const Tokenizer& t = st.get("token_text").tokenizer();
        if (id < 0 || id >= t.vocab_size())
          throw Error("token_text: token id " + std::to_string(id) + " outside the vocabulary [0, " + std::to_string(t.vocab_size()) + ")");
        return py::bytes(t.token_bytes(id));
      })
      .def_property_readonly("bos", [](ModelState& st) { return st.get("bos").tokenizer().bos(); })
      .def_property_readonly("eos", [](ModelState& st) { return st.get("eos").tokenizer().eos(); })
      .def("is_end_of_generation", [](ModelState& st, int id) { return st.get("is_end_of_generation").tokenizer().is_end_of_generation(id); })
      .def("render_chat",
           [](ModelState& st, const std::vector<std::pair<std::string, std::string>>& messages) {
             Model& m = st.get("chat");
             std::vector<ChatMessage> msgs;
             for (const auto& [role, content] : messages) msgs.push_back({role, content});
             return render_chat(detect_chat_format(m.chat_template()), m.chat_template(), msgs);
           })
      .def("chat_format", [](ModelState& st) {
        switch (detect_chat_format(st.get("chat").chat_template())) {
          case ChatFormat::kChatML: return "chatml";
          case ChatFormat::kLlama3: return "llama3";
          default: return "plain";
        }
      })
      .def("weight_bytes", [](ModelState& st) { return st.get("weight_bytes").weight_summary().total_bytes; })
      .def("device_description",
           [](const State& st) { return locked(*st, [&] { return st->eng("device_description").device_description(); }); })
      .def("sequence", [](const State& st, const CacheConfig& c) { return std::make_unique<PySequence>(st, c); })
      .def("load_sequence",
           [](const State& st, const py::bytes& data, const std::string& source) {
             const std::string b = data;
             std::vector<int> covered;
             const SequenceId id = locked(*st, [&] {
               return st->eng("load_sequence")
                   .load_sequence(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size()), &covered, source);
             });
             return std::make_unique<PySequence>(st, id, covered);
           })
      .def("run",
           [](const State& st, const py::handle& prompt, const py::dict& gen, const CacheConfig& c) {
             return std::make_unique<PyRun>(st, prompt, gen, c);
           })
      .def("generate_many", &generate_many)
      .def("decode_batch", &decode_batch)
      .def("perplexity",
           [](const State& st, const py::dict& run, const CacheConfig& c, const std::string& text, int ctx, int prefix,
              int windows) {
             SessionOptions so = session_options(run);
             so.cache = c;
             eval::PplOptions o;
             o.text_file = text;
             o.ctx = ctx;
             o.prefix = prefix;
             o.windows = windows;
             o.progress = false;
             eval::validate(o);
             const std::string rec = locked(*st, [&] {
               const eval::PplResult r = eval::run_ppl(st->get("perplexity"), so, o);
               return eval::ppl_record(eval::run_settings("ppl", "", so, o.ctx), o, r).dump();
             });
             return rec;
           })
      .def("retrieval",
           [](const State& st, const py::dict& run, const CacheConfig& c, const std::string& task, int ctx,
              const std::vector<double>& depths, int samples, uint64_t seed, const std::string& haystack,
              int max_answer_tokens, bool question_aware, bool trace_needles) {
             SessionOptions so = session_options(run);
             so.cache = c;
             eval::RetrievalOptions o;
             o.task = eval::parse_task(task);
             o.ctx = ctx;
             o.depths = depths;
             o.samples = samples;
             o.seed = seed;
             o.haystack_file = haystack;
             o.max_answer_tokens = max_answer_tokens;
             o.question_aware = question_aware;
             o.trace_needles = trace_needles;
             o.progress = false;
             eval::validate(o);
             return locked(*st, [&] {
               const eval::RetrievalResult r = eval::run_retrieval(st->get("retrieval"), so, o);
               return eval::retrieval_record(eval::run_settings(eval::task_name(o.task), "", so, o.ctx), o, r, true).dump();
             });
           });

  py::class_<PySequence>(m, "Sequence")
      .def("prefill", &PySequence::prefill, py::arg("ids"), py::arg("all_logits") = false)
      .def("decode", &PySequence::decode, py::arg("token"))
      .def_property_readonly("position", &PySequence::position)
      .def_property_readonly("max_tokens", &PySequence::max_tokens)
      .def("kv_stats", &PySequence::kv_stats)
      .def("kv_positions", &PySequence::kv_positions, py::arg("layer"), py::arg("kv_head"))
      .def("copy", &PySequence::copy)
      .def("save", &PySequence::save)
      .def_property_readonly("tokens", &PySequence::tokens)
      .def("close", &PySequence::close);

  py::class_<PyRun>(m, "Run")
      .def("step", [](PyRun& r) { return py::bytes(r.step()); })
      .def("run", &PyRun::run)
      .def_property_readonly("done", &PyRun::done)
      .def("result", &PyRun::result);

  m.def("kv_policies", [] {
    std::vector<std::string> out;
    std::string names = kv_policy_names();
    size_t a = 0;
    while (a < names.size()) {
      size_t b = names.find(" | ", a);
      out.push_back(names.substr(a, b == std::string::npos ? std::string::npos : b - a));
      if (b == std::string::npos) break;
      a = b + 3;
    }
    return out;
  });
  m.def("device_available", [](const std::string& d) { return device_available(parse_device(d)); });
}
