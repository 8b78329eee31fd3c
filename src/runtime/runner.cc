// The forward pass of Llama-family models (llama, qwen2), as a flat recipe, one op per line, over
// the rows of one or more sequences (runner.h).
// Letters: T rows in this step, E hidden, H query heads, G kv heads, D head dim, F ffn, V vocab.
#include "runtime/runner.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <optional>
#include <string>

#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {

constexpr int kDefaultMaxTokens = 16384;

// The model's weights as the session's backend multiplies them (the CPU: the stored bytes as they
// are; a device: its own copies). Norm vectors and biases travel as 1 x n F32 matrices.
struct DeviceWeights {
  struct Layer {
    const float* attn_norm = nullptr;                   // [E]
    WeightMatrix wq, wk, wv, wo;                        // [H*D][E], [G*D][E] x2, [E][H*D]
    const float *bq = nullptr, *bk = nullptr, *bv = nullptr;  // [H*D], [G*D] x2 (qwen2 only)
    const float* ffn_norm = nullptr;                    // [E]
    WeightMatrix w_gate, w_up, w_down;                  // [F][E] x2, [E][F]
  };
  WeightMatrix tok_embd;  // [V][E] (host: rows are picked by host token ids)
  WeightMatrix output;    // [V][E]
  const float* out_norm = nullptr;  // [E]
  const float* inv_freq = nullptr;  // [D/2]
  std::vector<Layer> layers;
  std::vector<std::unique_ptr<Buffer>> keep;  // device copies, when the backend makes them

  DeviceWeights(Backend& b, const ModelWeights& w) {
    auto matrix = [&](const WeightMatrix& m, Backend::WeightUse use = Backend::WeightUse::kMatrix) {
      std::unique_ptr<Buffer> hold;
      WeightMatrix d = b.prepare_weight(m, use, hold);
      if (hold) keep.push_back(std::move(hold));
      return d;
    };
    auto vec = [&](const std::vector<float>& v) -> const float* {
      if (v.empty()) return nullptr;
      const WeightMatrix m{DType::F32, reinterpret_cast<const uint8_t*>(v.data()), 1, static_cast<int64_t>(v.size()),
                           v.size() * sizeof(float)};
      return reinterpret_cast<const float*>(matrix(m, Backend::WeightUse::kVector).data);
    };
    tok_embd = w.tok_embd;
    output = matrix(w.output);
    out_norm = vec(w.out_norm);
    inv_freq = vec(w.inv_freq);
    for (const LayerWeights& L : w.layers) {
      // q, k, v and gate, up each multiply one input: a device may lay each group out together
      // and run its products as one
      const WeightMatrix qkv[3] = {L.wq, L.wk, L.wv}, gate_up[2] = {L.w_gate, L.w_up};
      WeightMatrix dqkv[3], dgate_up[2];
      b.prepare_weights(qkv, 3, dqkv, keep);
      b.prepare_weights(gate_up, 2, dgate_up, keep);
      layers.push_back({vec(L.attn_norm), dqkv[0], dqkv[1], dqkv[2], matrix(L.wo), vec(L.bq), vec(L.bk), vec(L.bv),
                        vec(L.ffn_norm), dgate_up[0], dgate_up[1], matrix(L.w_down)});
    }
  }
};


int64_t Runner::scratch_bytes(const ModelConfig& c, int max_rows) {
  const int64_t T = max_rows, E = c.dim, QD = static_cast<int64_t>(c.n_heads) * c.head_dim,
                KD = static_cast<int64_t>(c.n_kv_heads) * c.head_dim, F = c.ffn_dim;
  // x, xn, tmp, x_in, xn_keep [T][E]; q, att [T][H*D]; k, v [T][G*D]; gate, up [T][F]; logits
  // [V] on the device and on the host
  return 4 * (T * (5 * E + 2 * QD + 2 * KD + 2 * F) + 2 * static_cast<int64_t>(c.vocab_size)) + 8 * T;
}

Runner::Runner(const Model& m, const SessionOptions& o, int max_rows) : model_(m), opt_(o), max_rows_(max_rows) {
  const ModelConfig& c = m.config();
  if (opt_.prefill_chunk < 1) throw Error("--prefill-chunk: must be at least 1, got " + std::to_string(opt_.prefill_chunk));
  if (max_rows_ < 1) throw Error("runner: a step must hold at least 1 row, got " + std::to_string(max_rows_));
  if (opt_.max_memory < 0) throw Error("--max-memory: must be positive, got " + std::to_string(opt_.max_memory));
  if (opt_.kv_memory < 0) throw Error("--kv-memory: must be positive, got " + std::to_string(opt_.kv_memory));
  if (!(opt_.kv_memory_fraction >= 0.0 && opt_.kv_memory_fraction <= 1.0))
    throw Error("--kv-memory: a share of the free memory must be in (0, 1], got " + std::to_string(opt_.kv_memory_fraction));
  const int64_t weights = m.weight_summary().total_bytes, scratch = scratch_bytes(c, max_rows_);
  base_bytes_ = weights + scratch;
  if (opt_.max_memory > 0 && base_bytes_ > opt_.max_memory)
    throw Error("--max-memory: the weights (" + mib(weights) + ") and a step's activations (" + mib(scratch) + ") take " +
                mib(base_bytes_) + ", above the limit of " + mib(opt_.max_memory) + "; lower --prefill-chunk or raise --max-memory");
  act_ = opt_.decode_activations == DecodeActivations::kInt8 ? Activations::kInt8 : Activations::kF32;
  backend_ = make_backend({opt_.device, opt_.threads, opt_.device_weights, act_, opt_.cuda_graphs, opt_.batch_invariant});
  dw_ = std::make_unique<DeviceWeights>(*backend_, m.weights());
  chunk_ = opt_.prefill_chunk;
  const size_t T = static_cast<size_t>(max_rows_), E = c.dim, QD = static_cast<size_t>(c.n_heads) * c.head_dim,
               KD = static_cast<size_t>(c.n_kv_heads) * c.head_dim, F = c.ffn_dim;
  auto floats = [&](size_t n) { return backend_->alloc(n * sizeof(float)); };
  x_ = floats(T * E);
  xn_ = floats(T * E);
  q_ = floats(T * QD);
  k_ = floats(T * KD);
  v_ = floats(T * KD);
  att_ = floats(T * QD);
  tmp_ = floats(T * E);
  gate_ = floats(T * F);
  up_ = floats(T * F);
  x_in_ = floats(T * E);
  rows_pos_ = backend_->alloc(T * sizeof(int32_t));
  logits_dev_ = floats(c.vocab_size);
  kv_pool_ = resolve_kv_pool();
  rows_pos_host_.resize(T);
  rows_tok_.resize(T);
}

Runner::~Runner() = default;

int64_t Runner::resolve_kv_pool() const {
  if (opt_.kv_memory > 0) return opt_.kv_memory;
  const bool device = !backend_->host_visible();
  if (!device && opt_.kv_memory_fraction == 0.0) return 0;  // the CPU: --max-memory alone
  const Backend::MemoryInfo m = backend_->memory();
  if (opt_.kv_memory_fraction > 0.0) return std::max<int64_t>(1, static_cast<int64_t>(opt_.kv_memory_fraction * static_cast<double>(m.free)));
  // a device's default: what is free, less room for the libraries' workspaces, the batch
  // kernels' scratch that grows with the batch, and one layer's re-layout when a squeeze schedule
  // is fixed (set_capacity holds the old and the new arrays at once)
  const int64_t reserve = std::max<int64_t>(int64_t{1} << 30, m.total / 20);
  return std::max<int64_t>(1, m.free - reserve);
}

int sequence_max_tokens(const ModelConfig& c, const CacheConfig& cache) {
  // default: the model's context, capped so a 128k-context model does not reserve tens of GB
  return cache.max_tokens > 0 ? cache.max_tokens : std::min(c.context_length, kDefaultMaxTokens);
}

void check_token_ids(std::span<const int> tokens, int V, const char* op) {
  for (int t : tokens)
    if (t < 0 || t >= V)
      throw Error(std::string(op) + ": token id " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) + ")");
}

CachePlan Runner::plan_sequence(const ModelConfig& c, const CacheConfig& cache_in, const SessionOptions& o) {
  CacheConfig cache = cache_in;
  cache.max_tokens = sequence_max_tokens(c, cache);
  const KvTypes types = kv_types(cache);
  if (o.device != Device::kCpu && types.recent_f16 > 0)
    throw Error("--kv-recent-f16 " + std::to_string(types.recent_f16) +
                ": the CUDA kernels read each row as stored; the f16 recent rows run on --device cpu");
  if (o.device != Device::kCpu && !cuda_kv_types(types, c.head_dim)) {
    // the side the device lacks: K's type (--kv-type) when the device stores no such rows at all,
    // else V's beside it (--kv-type-v)
    const bool values = cuda_kv_types(KvTypes(types.k), c.head_dim);
    const KvDType named = values ? kv_v_dtype(cache) : cache.dtype;
    throw Error(std::string(values ? "--kv-type-v " : "--kv-type ") + kv_dtype_name(named) +
                ": the CUDA backend stores K and V as one type, f16, f32 or q8_0, or q4_1 values (--kv-type-v q4_1) beside f16 or "
                "q8_0 keys (q8_0 for head dims that are multiples of 64; this model's is " + std::to_string(c.head_dim) +
                "); 4-bit keys, q4_0 and other K/V pairs run on --device cpu");
  }
  // the config is checked here, once (CachePlan holds only valid ones); a device keeps K and V in
  // its own memory, the policies' metadata mirrored on the host
  return CacheBuilder::plan(c, cache, std::min(o.prefill_chunk, cache.max_tokens), o.device != Device::kCpu);
}

SequenceState Runner::new_sequence(const CachePlan& plan, KvHeld other) const {
  const int64_t other_kv_bytes = other.bytes;
  const ModelConfig& c = model_.config();
  assert(plan.max_step_rows() == std::min(chunk_, plan.max_tokens()));  // a plan of this runner's options
  SequenceState s;
  s.max_tokens = plan.max_tokens();
  s.kv_bytes = plan.bytes();
  s.pool_bytes = plan.pool_bytes();
  if (kv_pool_ > 0 && other.pool + s.pool_bytes > kv_pool_)
    throw MemoryLimitError("--kv-memory: this sequence's KV cache (" + mib(s.pool_bytes) + " for " + std::to_string(s.max_tokens) +
                               " tokens)" + (other.pool > 0 ? " beside the other sequences' (" + mib(other.pool) + ")" : std::string()) +
                               " needs " + mib(other.pool + s.pool_bytes) + ", above the KV memory of " + mib(kv_pool_) +
                               (opt_.kv_memory > 0 ? std::string() : std::string(" (what the ") + (backend_->host_visible() ? "host" : "device") + " had free for it)") +
                               "; lower --ctx, use an eviction policy with --kv-budget, or raise --kv-memory",
                           s.pool_bytes > kv_pool_);
  if (opt_.max_memory > 0 && base_bytes_ + other_kv_bytes + s.kv_bytes > opt_.max_memory)
    throw MemoryLimitError("--max-memory: this sequence's KV cache (" + mib(s.kv_bytes) + " for " + std::to_string(s.max_tokens) +
                " tokens) beside the weights and activations (" + mib(base_bytes_) + ")" +
                (other_kv_bytes > 0 ? " and the other sequences' caches (" + mib(other_kv_bytes) + ")" : std::string()) +
                " needs " + mib(base_bytes_ + other_kv_bytes + s.kv_bytes) + ", above the limit of " + mib(opt_.max_memory) +
                "; lower --ctx, use an eviction policy with --kv-budget, or raise --max-memory",
                base_bytes_ + s.kv_bytes > opt_.max_memory);
  s.caches = CacheBuilder::build(c, plan, backend_.get());
  s.config = plan.config();
  return s;
}

SequenceState Runner::copy_sequence(const SequenceState& src, KvHeld other) const {
  SequenceState s = new_sequence(src.config, other);
  s.caches.copy_from(src.caches);
  s.pos = src.pos;
  s.context = src.context;
  return s;
}

void Runner::check(const Segment& s, const char* op) const {
  if (s.T < 1) throw Error(std::string(op) + ": no tokens");
  check_token_ids({s.tokens, static_cast<size_t>(s.T)}, model_.config().vocab_size, op);
  const SequenceState& q = *s.seq;
  if (static_cast<int64_t>(q.pos) + s.T > q.max_tokens)
    throw Error(std::string(op) + ": context full: " + std::to_string(static_cast<int64_t>(q.pos) + s.T) + " tokens exceed --ctx " +
                std::to_string(q.max_tokens));
  if (s.input_end > q.max_tokens)
    throw Error(std::string(op) + ": input end " + std::to_string(s.input_end) + " beyond --ctx " + std::to_string(q.max_tokens));
}

void Runner::step(std::span<const Segment> segments, const char* op) {
  int rows = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    check(segments[i], op);
    rows += segments[i].T;
    for (size_t j = 0; j < i; ++j)
      if (segments[j].seq == segments[i].seq) throw Error(std::string(op) + ": a sequence appears twice in one step");
  }
  if (segments.empty() || rows > max_rows_)
    throw Error(std::string(op) + ": a step of " + std::to_string(rows) + " rows (expected 1 to " + std::to_string(max_rows_) + ")");
  forward(segments, Pass::kStep);
  for (const Segment& s : segments) {
    SequenceState& q = *s.seq;
    if (q.caches.records_context()) q.context.insert(q.context.end(), s.tokens, s.tokens + s.T);
    q.pos += s.T;
    q.caches.end_step(s.input_end > q.pos ? s.input_end : q.pos);
  }
  for (const Segment& s : segments)
    if (s.seq->caches.wants_scoring()) score_context(*s.seq);
}

void Runner::score_context(SequenceState& seq) {
  const ModelConfig& c = model_.config();
  if (repeat_prefix_.empty()) repeat_prefix_ = model_.tokenizer().encode("\n\nRepeat the previous context exactly.\n", false);
  // the step's output stays where logits() reads it
  if (!xn_keep_) xn_keep_ = backend_->alloc(static_cast<size_t>(max_rows_) * c.dim * sizeof(float));
  std::swap(xn_, xn_keep_);
  for (LayerCache& l : seq.caches.layers) l.begin_scoring();
  const int rows = std::min({chunk_, max_rows_, seq.max_tokens});
  const int prefix = static_cast<int>(repeat_prefix_.size()) < rows ? static_cast<int>(repeat_prefix_.size()) : 0;
  const int per = rows - prefix;  // context rows per scoring step
  std::vector<int> tokens(static_cast<size_t>(rows));
  std::copy(repeat_prefix_.begin(), repeat_prefix_.begin() + prefix, tokens.begin());
  const int n = static_cast<int>(seq.context.size());
  for (int start = 0; start < n; start += per) {
    const int take = std::min(per, n - start);
    std::copy(seq.context.begin() + start, seq.context.begin() + start + take, tokens.begin() + prefix);
    const Segment seg{&seq, tokens.data(), prefix + take};
    forward({&seg, 1}, Pass::kScore);
  }
  seq.caches.end_scoring();
  seq.context.clear();
  seq.context.shrink_to_fit();
  std::swap(xn_, xn_keep_);
}

void Runner::forward(std::span<const Segment> segments, Pass pass) {
  const ModelConfig& c = model_.config();
  const bool scoring = pass == Pass::kScore;
  Backend& b = *backend_;
  const int E = c.dim, H = c.n_heads, G = c.n_kv_heads, D = c.head_dim;
  const int64_t QD = static_cast<int64_t>(H) * D, KD = static_cast<int64_t>(G) * D;
  const auto pairing = c.rope_adjacent_pairs ? RopePairing::kAdjacent : RopePairing::kHalves;
  int T = 0;
  bool independent = true;  // a decode batch: one row per sequence
  for (const Segment& s : segments) {
    for (int t = 0; t < s.T; ++t) {
      rows_pos_host_[T + t] = s.seq->pos + t;
      rows_tok_[T + t] = s.tokens[t];
    }
    T += s.T;
    independent = independent && s.T == 1;
  }
  const int64_t TE = static_cast<int64_t>(T) * E;
  float *x = x_->as<float>(), *xn = xn_->as<float>(), *q = q_->as<float>(), *k = k_->as<float>(), *v = v_->as<float>(),
        *att = att_->as<float>(), *tmp = tmp_->as<float>(), *gate = gate_->as<float>(), *up = up_->as<float>();
  const RowMode mode = independent ? RowMode::kIndependent : RowMode::kChunk;
  auto matmul = [&](float* out, const float* in, const WeightMatrix& w, const float* bias) {
    if (independent && T > 1) b.matmul_rows(out, in, w, T, bias, act_);
    else b.matmul(out, in, w, T, bias, act_);
  };
  b.upload(rows_pos_->data(), rows_pos_host_.data(), static_cast<size_t>(T) * sizeof(int32_t));
  const int32_t* rpos = rows_pos_->as<int32_t>();
  for (const Segment& s : segments) s.seq->caches.stage_step(s.T);  // a device's per-layer counts, one copy
  b.embed(x, dw_->tok_embd, rows_tok_.data(), T);
  b.rmsnorm(xn, x, dw_->layers[0].attn_norm, T, E, c.norm_eps);
  observers_.resize(segments.size());
  rows_.resize(segments.size());
  probes_.resize(segments.size());
  marks_.resize(segments.size());
  for (int l = 0; l < c.n_layers; ++l) {
    const DeviceWeights::Layer& L = dw_->layers[l];
    // attention block (xn: the normed input, from the step's start or the previous layer's end)
    // q, k, v from one pass over xn; q and k rotated to their positions
    const RopeSpec rope{rpos, dw_->inv_freq, D, pairing};
    const MatmulPart qkv[3] = {{q, &L.wq, L.bq, &rope}, {k, &L.wk, L.bk, &rope}, {v, &L.wv, L.bv, nullptr}};
    b.matmuls(qkv, 3, xn, T, act_, mode);
    // a layer whose cache watches the step (squeeze's metric while its schedule is pending) is
    // shown its rows at the points below (kv/observer.h); a scoring pass is watched by none
    bool keep_input = false;
    for (size_t i = 0; i < segments.size(); ++i) {
      observers_[i] = scoring ? nullptr : segments[i].seq->caches.layers[l].observer();
      keep_input = keep_input || (observers_[i] != nullptr && observers_[i]->wants_layer_input());
    }
    if (keep_input) b.copy(x_in_->data(), x, static_cast<size_t>(TE) * sizeof(float));
    // each sequence's rows join its own cache and attend over it (all sequences in one call; a
    // decode batch on a device writes its rows in that call too: one launch for all)
    const bool write_in_attention = independent && segments.size() > 1 && !b.host_visible();
    calls_.clear();
    for (int i = 0, r = 0; i < static_cast<int>(segments.size()); r += segments[i].T, ++i) {
      const Segment& s = segments[i];
      LayerCache& cache = s.seq->caches.layers[l];
      rows_[i] = LayerRows{&b, &scratch_, s.T, E, H, G, D, q + r * QD, k + r * KD, rpos + r, att + r * QD, s.input_end};
      if (observers_[i] != nullptr) observers_[i]->before_attention(rows_[i]);
      marks_[i] = cache.mark();
      cache.append(k + r * KD, v + r * KD, rows_pos_host_.data() + r, s.T, rpos + r, write_in_attention);
      AttentionProbe& probe = probes_[i];
      probe = AttentionProbe{};
      const KvView kv = cache.view();
      if (cache.wants_mass()) {  // attention adds straight into the cache's accumulated mass
        probe.mass = cache.mass_accumulator();
        probe.mass_stride = kv.capacity;
        if (cache.mass_rows() > 0 && !scoring) probe.mass_row_begin = std::max(0, s.T - cache.mass_rows());
        if (scoring) probe.reduce = MassReduce::kMax;
      }
      if (observers_[i] != nullptr) observers_[i]->ask(probe);
      const RowWrite write = write_in_attention ? RowWrite{&cache.storage().arrays(), k + r * KD, v + r * KD, rpos + r} : RowWrite{};
      calls_.push_back({att + r * QD, q + r * QD, rpos + r, s.T, H, kv, &probe, write});
    }
    if (calls_.size() == 1) b.attention(calls_[0].out, calls_[0].q, calls_[0].q_pos, calls_[0].T, H, calls_[0].kv, calls_[0].probe);
    else b.attention_batch(calls_.data(), static_cast<int>(calls_.size()));
    for (size_t i = 0; i < segments.size(); ++i) {
      LayerCache& cache = segments[i].seq->caches.layers[l];
      if (observers_[i] != nullptr) observers_[i]->after_attention(rows_[i], probes_[i], cache);
      if (scoring) cache.drop_since(marks_[i]);  // a scoring pass's rows leave the cache once they have attended
    }
    matmul(tmp, att, L.wo, nullptr);
    // x += attention output; xn = its norm for the feed-forward block (SwiGLU)
    b.add_rmsnorm(xn, x, tmp, L.ffn_norm, T, E, c.norm_eps);
    for (int i = 0, r = 0; i < static_cast<int>(segments.size()); r += segments[i].T, ++i)
      if (observers_[i] != nullptr && keep_input)
        observers_[i]->after_block(rows_[i], x_in_->as<float>() + static_cast<size_t>(r) * E, x + static_cast<size_t>(r) * E);
    b.matmul_swiglu(gate, up, xn, L.w_gate, L.w_up, T, act_, mode);  // gate = silu(gate) * up
    matmul(tmp, gate, L.w_down, nullptr);
    // x += feed-forward output; xn = its norm for the next layer (or the output head)
    b.add_rmsnorm(xn, x, tmp, l + 1 < c.n_layers ? dw_->layers[l + 1].attn_norm : dw_->out_norm, T, E, c.norm_eps);
    // the device may run this layer while the host prepares the next: for steps of several rows
    // (H200, 8B shape: 64 sequences 6,127-6,316 -> 7,280 tok/s); a lone decode step stays one
    // graph (234 against 236-237 tok/s issued by layer)
    if (T > 1) b.submit();
  }
}

// The output head over h [n][E] (the backend's memory) into logits_dev_ (grown once).
const float* Runner::head(const float* h, int n, bool independent_rows) {
  const size_t V = model_.config().vocab_size;
  if (logits_dev_->bytes() < n * V * sizeof(float)) logits_dev_ = backend_->alloc(n * V * sizeof(float));  // grows once
  if (independent_rows && n > 1) backend_->matmul_rows(logits_dev_->as<float>(), h, dw_->output, n, nullptr, act_);
  else backend_->matmul(logits_dev_->as<float>(), h, dw_->output, n, nullptr, act_);
  return logits_dev_->as<float>();
}

std::span<const float> Runner::logits_to_host(int n) {
  const size_t V = model_.config().vocab_size;
  if (!logits_host_ || logits_host_->bytes() < n * V * sizeof(float)) logits_host_ = backend_->alloc_host(n * V * sizeof(float));
  backend_->download(logits_host_->data(), logits_dev_->data(), n * V * sizeof(float));
  return {logits_host_->as<float>(), n * V};
}

const float* Runner::step_rows(int first_row) const { return xn_->as<float>() + static_cast<size_t>(first_row) * model_.config().dim; }

std::span<const float> Runner::logits(int first_row, int n, bool independent_rows) {
  head(step_rows(first_row), n, independent_rows);
  return logits_to_host(n);
}

std::span<const int> Runner::picks_of_rows(std::span<const int> rows, std::span<const SampleParams> params) {
  issue_picks(rows, params);
  return picks();
}

void Runner::issue_picks(std::span<const int> rows, std::span<const SampleParams> params) {
  const int n = static_cast<int>(params.size());
  assert(rows.size() == params.size());
  const float* logits = head(gather_rows(rows), n, true);
  if (!picks_dev_) {
    picks_dev_ = backend_->alloc(static_cast<size_t>(max_rows_) * sizeof(int32_t));
    params_dev_ = backend_->alloc(static_cast<size_t>(max_rows_) * sizeof(SampleParams));
    picks_host_ = backend_->alloc_host(static_cast<size_t>(max_rows_) * sizeof(int32_t));
  }
  backend_->upload(params_dev_->data(), params.data(), params.size_bytes());
  backend_->sample_rows(picks_dev_->as<int32_t>(), logits, params_dev_->as<SampleParams>(), n, model_.config().vocab_size);
  static_assert(sizeof(int) == sizeof(int32_t));
  backend_->download_later(picks_host_->data(), picks_dev_->data(), n * sizeof(int32_t));
  picks_n_ = n;
}

std::span<const int> Runner::picks() {
  backend_->wait();
  return {picks_host_->as<int>(), static_cast<size_t>(picks_n_)};
}

const float* Runner::gather_rows(std::span<const int> rows) {
  const int n = static_cast<int>(rows.size());
  bool contiguous = true;
  for (int i = 1; i < n; ++i) contiguous = contiguous && rows[i] == rows[0] + i;
  if (contiguous) return step_rows(rows[0]);
  const size_t row = model_.config().dim * sizeof(float);
  if (!rows_gathered_ || rows_gathered_->bytes() < n * row) rows_gathered_ = backend_->alloc(static_cast<size_t>(max_rows_) * row);
  unsigned char* dst = rows_gathered_->as<unsigned char>();
  for (int i = 0; i < n; ++i) backend_->copy(dst + i * row, step_rows(rows[i]), row);
  return rows_gathered_->as<float>();
}

std::span<const float> Runner::logits_of_rows(std::span<const int> rows) {
  // the rows gathered (where they are not consecutive), then one product over them
  head(gather_rows(rows), static_cast<int>(rows.size()), true);
  return logits_to_host(static_cast<int>(rows.size()));
}

int64_t Runner::matrix_bytes() const {
  const DeviceWeights& d = *dw_;
  int64_t b = static_cast<int64_t>(d.output.row_bytes) * d.output.rows;
  for (const DeviceWeights::Layer& L : d.layers)
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      b += static_cast<int64_t>(m->row_bytes) * m->rows;
  return b;
}

std::vector<int32_t> held_positions(const SequenceState& seq, int layer, int kv_head) {
  const auto& layers = seq.caches.layers;
  if (layer < 0 || layer >= static_cast<int>(layers.size())) throw Error("kv_positions: layer " + std::to_string(layer) + " out of range [0, " + std::to_string(layers.size()) + ")");
  const KvStorage& s = layers[layer].storage();
  s.sync_to_host();
  if (kv_head < 0 || kv_head >= s.n_kv_heads()) throw Error("kv_positions: kv head " + std::to_string(kv_head) + " out of range [0, " + std::to_string(s.n_kv_heads()) + ")");
  std::vector<int32_t> pos(s.positions(kv_head), s.positions(kv_head) + s.count());
  std::sort(pos.begin(), pos.end());  // slots are unordered after eviction
  pos.resize(static_cast<size_t>(s.live(kv_head)));  // dead slots (kDeadPos) sort last
  return pos;
}

}  // namespace squeezekv
