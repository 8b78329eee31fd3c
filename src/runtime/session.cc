// The forward pass of Llama-family models (llama, qwen2), as a flat recipe, one op per line.
// Letters: T rows in this step, E hidden, H query heads, G kv heads, D head dim, F ffn, V vocab.
#include "squeezekv/session.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "kv/layer_cache.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {

namespace {

// The seed's concentration: mean over kv heads of the mean off-diagonal cosine similarity of the
// step's keys. Exact, via sum_{i != j} cos(k_i, k_j) = |sum_i k_i/|k_i||^2 - n.   k [T][G*D]
double key_cosine(const float* k, int T, int G, int D) {
  double total = 0.0;
  std::vector<double> sum(static_cast<size_t>(D));
  for (int g = 0; g < G; ++g) {
    std::fill(sum.begin(), sum.end(), 0.0);
    int n = 0;
    for (int t = 0; t < T; ++t) {
      const float* r = k + (static_cast<size_t>(t) * G + g) * D;
      double norm = 0.0;
      for (int d = 0; d < D; ++d) norm += static_cast<double>(r[d]) * r[d];
      if (norm <= 0.0) continue;
      norm = 1.0 / std::sqrt(norm);
      for (int d = 0; d < D; ++d) sum[d] += r[d] * norm;
      ++n;
    }
    if (n < 2) continue;
    double s2 = 0.0;
    for (double v : sum) s2 += v * v;
    total += (s2 - n) / (static_cast<double>(n) * (n - 1));
  }
  return total / G;
}

// The SqueezeAttention paper's layer importance: mean over rows of cos(x, x + attn(norm(x))).
double residual_cosine(const float* x, const float* y, int T, int E) {
  double total = 0.0;
  for (int t = 0; t < T; ++t) {
    const float* a = x + static_cast<size_t>(t) * E;
    const float* b = y + static_cast<size_t>(t) * E;
    double ab = 0.0, aa = 0.0, bb = 0.0;
    for (int i = 0; i < E; ++i) {
      ab += static_cast<double>(a[i]) * b[i];
      aa += static_cast<double>(a[i]) * a[i];
      bb += static_cast<double>(b[i]) * b[i];
    }
    total += aa > 0.0 && bb > 0.0 ? ab / std::sqrt(aa * bb) : 0.0;
  }
  return T > 0 ? total / T : 0.0;
}

}  // namespace

constexpr int kDefaultMaxTokens = 16384;

DecodeActivations parse_decode_activations(const std::string& s) {
  if (s == "f32") return DecodeActivations::kF32;
  if (s == "int8") return DecodeActivations::kInt8;
  throw Error("--decode-activations: unknown value '" + s + "' (expected f32 or int8)");
}

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
    for (const LayerWeights& L : w.layers)
      layers.push_back({vec(L.attn_norm), matrix(L.wq), matrix(L.wk), matrix(L.wv), matrix(L.wo), vec(L.bq), vec(L.bk),
                        vec(L.bv), vec(L.ffn_norm), matrix(L.w_gate), matrix(L.w_up), matrix(L.w_down)});
  }
};

struct Session::Impl {
  const Model& model;
  SessionOptions opt;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<DeviceWeights> dw;
  SequenceCache caches;
  int pos = 0;
  int max_tokens = 0;
  int chunk = 0;  // rows per step
  // activations in the backend's memory, sized for one chunk of T rows
  std::unique_ptr<Buffer> x, xn, q, k, v, att, tmp, gate, up;  // [T][E] x2, [T][H*D], [T][G*D] x2, [T][H*D], [T][E], [T][F] x2
  std::unique_ptr<Buffer> x_in;                                // [T][E] layer input (residual_cosine only)
  std::unique_ptr<Buffer> rows_pos;                            // [T] positions of the step's rows
  std::unique_ptr<Buffer> logits_dev;                          // [T][V]
  // host side
  std::vector<int32_t> rows_pos_host;                          // [T]
  std::vector<float> metric_a, metric_b;                       // squeeze metric inputs, copied down once per schedule
  std::vector<float> logits;                                   // [V] or [n][V]
  Activations act = Activations::kF32;                         // decode arithmetic

  Impl(const Model& m, const SessionOptions& o) : model(m), opt(o) {
    const ModelConfig& c = m.config();
    if (opt.prefill_chunk < 1) throw Error("session: prefill chunk must be at least 1, got " + std::to_string(opt.prefill_chunk));
    validate(opt.cache);
    backend = make_backend({opt.device, opt.threads, opt.f32_device_weights});
    dw = std::make_unique<DeviceWeights>(*backend, m.weights());
    act = opt.decode_activations == DecodeActivations::kInt8 ? Activations::kInt8 : Activations::kF32;
    // default: the model's context, capped so a 128k-context model does not reserve tens of GB
    max_tokens = opt.cache.max_tokens > 0 ? opt.cache.max_tokens : std::min(c.context_length, kDefaultMaxTokens);
    opt.cache.max_tokens = max_tokens;
    chunk = std::min(opt.prefill_chunk, max_tokens);
    caches = CacheBuilder::for_model(c, opt.cache, chunk, backend.get());
    const size_t T = static_cast<size_t>(chunk), E = c.dim, QD = static_cast<size_t>(c.n_heads) * c.head_dim,
                 KD = static_cast<size_t>(c.n_kv_heads) * c.head_dim, F = c.ffn_dim, V = c.vocab_size;
    auto floats = [&](size_t n) { return backend->alloc(n * sizeof(float)); };
    x = floats(T * E);
    xn = floats(T * E);
    q = floats(T * QD);
    k = floats(T * KD);
    v = floats(T * KD);
    att = floats(T * QD);
    tmp = floats(T * E);
    gate = floats(T * F);
    up = floats(T * F);
    x_in = floats(T * E);
    rows_pos = backend->alloc(T * sizeof(int32_t));
    logits_dev = floats(V);
    rows_pos_host.resize(T);
    logits.resize(V);
  }

  // One step over T rows; leaves the final hidden state (after the output norm) of the rows in
  // xn [T][E].
  void step(const int* tokens, int T) {
    const ModelConfig& c = model.config();
    Backend& b = *backend;
    const int E = c.dim, H = c.n_heads, G = c.n_kv_heads, D = c.head_dim, F = c.ffn_dim;
    const int64_t TE = static_cast<int64_t>(T) * E;
    const auto pairing = c.rope_adjacent_pairs ? RopePairing::kAdjacent : RopePairing::kHalves;
    float *x = this->x->as<float>(), *xn = this->xn->as<float>(), *q = this->q->as<float>(), *k = this->k->as<float>(),
          *v = this->v->as<float>(), *att = this->att->as<float>(), *tmp = this->tmp->as<float>(),
          *gate = this->gate->as<float>(), *up = this->up->as<float>();
    for (int t = 0; t < T; ++t) rows_pos_host[t] = pos + t;
    b.upload(rows_pos->data(), rows_pos_host.data(), static_cast<size_t>(T) * sizeof(int32_t));
    const int32_t* rpos = rows_pos->as<int32_t>();
    b.embed(x, dw->tok_embd, tokens, T);
    b.rmsnorm(xn, x, dw->layers[0].attn_norm, T, E, c.norm_eps);
    for (int l = 0; l < c.n_layers; ++l) {
      const DeviceWeights::Layer& L = dw->layers[l];
      LayerCache& cache = caches.layers[l];
      // attention block (xn: the normed input, from the step's start or the previous layer's end)
      b.matmul(q, xn, L.wq, T, L.bq, act);
      b.matmul(k, xn, L.wk, T, L.bk, act);
      b.matmul(v, xn, L.wv, T, L.bv, act);
      b.rope(q, rpos, T, H, D, dw->inv_freq, pairing);
      b.rope(k, rpos, T, G, D, dw->inv_freq, pairing);
      const std::optional<SqueezeMetric> metric = cache.pending_metric();
      if (metric == SqueezeMetric::kResidualCosine) b.copy(x_in->data(), x, static_cast<size_t>(TE) * sizeof(float));
      double concentration = 0.0;
      if (metric == SqueezeMetric::kKeyCosine) concentration = key_cosine(host_copy(metric_a, k, static_cast<size_t>(T) * G * D), T, G, D);
      cache.append(k, v, rows_pos_host.data(), T, rpos);
      const KvView kv = cache.view();
      AttentionProbe probe;
      if (cache.wants_mass()) {  // attention adds straight into the cache's accumulated mass
        probe.mass = cache.mass_accumulator();
        probe.mass_stride = kv.capacity;
        if (cache.mass_rows() > 0) probe.mass_row_begin = std::max(0, T - cache.mass_rows());
      }
      probe.entropy = metric == SqueezeMetric::kAttentionEntropy;
      b.attention(att, q, rpos, T, H, kv, &probe);
      b.matmul(tmp, att, L.wo, T, nullptr, act);
      if (metric == SqueezeMetric::kAttentionEntropy)
        concentration = probe.entropy_rows > 0 ? 1.0 - probe.entropy_sum / static_cast<double>(probe.entropy_rows) : 0.0;
      // x += attention output; xn = its norm for the feed-forward block (SwiGLU)
      b.add_rmsnorm(xn, x, tmp, L.ffn_norm, T, E, c.norm_eps);
      if (metric == SqueezeMetric::kResidualCosine)
        concentration = residual_cosine(host_copy(metric_a, x_in->as<float>(), static_cast<size_t>(TE)),
                                        host_copy(metric_b, x, static_cast<size_t>(TE)), T, E);
      if (metric) cache.report_concentration(concentration);
      b.matmul(gate, xn, L.w_gate, T, nullptr, act);
      b.matmul(up, xn, L.w_up, T, nullptr, act);
      b.silu_mul(gate, up, static_cast<int64_t>(T) * F);
      b.matmul(tmp, gate, L.w_down, T, nullptr, act);
      // x += feed-forward output; xn = its norm for the next layer (or the output head)
      b.add_rmsnorm(xn, x, tmp, l + 1 < c.n_layers ? dw->layers[l + 1].attn_norm : dw->out_norm, T, E, c.norm_eps);
    }
    for (LayerCache& cache : caches.layers) cache.end_step();
    pos += T;
  }

  // n floats of backend memory, copied into host (only while a squeeze metric is pending).
  const float* host_copy(std::vector<float>& host, const float* src, size_t n) {
    if (host.size() < n) host.resize(n);
    backend->download(host.data(), src, n * sizeof(float));
    return host.data();
  }
};

Session::Session(const Model& model, const SessionOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}
Session::~Session() = default;

std::span<const float> Session::forward(std::span<const int> tokens, bool all_logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.model.config();
  const int V = c.vocab_size, E = c.dim;
  if (tokens.empty()) throw Error("forward: no tokens");
  for (int t : tokens)
    if (t < 0 || t >= V) throw Error("forward: token id " + std::to_string(t) + " outside the vocabulary [0, " + std::to_string(V) + ")");
  if (m.pos + static_cast<int64_t>(tokens.size()) > m.max_tokens)
    throw Error("forward: context full: " + std::to_string(m.pos + tokens.size()) + " tokens exceed --ctx " +
                std::to_string(m.max_tokens));
  const int n = static_cast<int>(tokens.size());
  m.logits.resize(static_cast<size_t>(all_logits ? n : 1) * V);
  if (all_logits && m.logits_dev->bytes() < static_cast<size_t>(m.chunk) * V * sizeof(float))
    m.logits_dev = m.backend->alloc(static_cast<size_t>(m.chunk) * V * sizeof(float));  // once, on first use
  for (int s = 0; s < n; s += m.chunk) {
    const int T = std::min(m.chunk, n - s);
    m.step(tokens.data() + s, T);
    const float* h = m.xn->as<float>();
    if (all_logits) {
      m.backend->matmul(m.logits_dev->as<float>(), h, m.dw->output, T, nullptr, m.act);
      m.backend->download(m.logits.data() + static_cast<size_t>(s) * V, m.logits_dev->data(), static_cast<size_t>(T) * V * sizeof(float));
    } else if (s + T == n) {  // the last row only
      m.backend->matmul(m.logits_dev->as<float>(), h + static_cast<size_t>(T - 1) * E, m.dw->output, 1, nullptr, m.act);
      m.backend->download(m.logits.data(), m.logits_dev->data(), static_cast<size_t>(V) * sizeof(float));
    }
  }
  return {m.logits.data(), m.logits.size()};
}

void Session::reset() {
  impl_->pos = 0;
  impl_->caches.reset();
}

int Session::position() const { return impl_->pos; }
const Model& Session::model() const { return impl_->model; }
std::string Session::device_description() const { return impl_->backend->describe(); }
double Session::device_copy_bandwidth() { return impl_->backend->copy_bandwidth(); }
int64_t Session::device_matrix_bytes() const {
  const DeviceWeights& d = *impl_->dw;
  int64_t b = static_cast<int64_t>(d.output.row_bytes) * d.output.rows;
  for (const DeviceWeights::Layer& L : d.layers)
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      b += static_cast<int64_t>(m->row_bytes) * m->rows;
  return b;
}

std::vector<LayerStats> Session::kv_stats() const {
  std::vector<LayerStats> out;
  for (const LayerCache& c : impl_->caches.layers) out.push_back(c.stats());
  return out;
}

std::vector<int32_t> Session::kv_positions(int layer, int kv_head) const {
  const auto& layers = impl_->caches.layers;
  if (layer < 0 || layer >= static_cast<int>(layers.size())) throw Error("kv_positions: layer " + std::to_string(layer) + " out of range");
  const KvStorage& s = layers[layer].storage();
  s.sync_to_host();
  if (kv_head < 0 || kv_head >= s.n_kv_heads()) throw Error("kv_positions: kv head " + std::to_string(kv_head) + " out of range");
  std::vector<int32_t> pos(s.positions(kv_head), s.positions(kv_head) + s.count());
  std::sort(pos.begin(), pos.end());  // slots are unordered after eviction
  return pos;
}

const SqueezeCoordinator* Session::coordinator() const { return impl_->caches.coordinator.get(); }

}  // namespace squeezekv
