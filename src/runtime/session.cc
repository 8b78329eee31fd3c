// The forward pass of Llama-family models (llama, qwen2), as a flat recipe, one op per line.
// Letters: T rows in this step, E hidden, H query heads, G kv heads, D head dim, F ffn, V vocab.
#include "squeezekv/session.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "backend/cpu/ops.h"
#include "core/quant.h"
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

struct Session::Impl {
  const Model& model;
  SessionOptions opt;
  SequenceCache caches;
  int pos = 0;
  int max_tokens = 0;
  // scratch, sized for one chunk of T rows
  std::vector<float> x, xn, q, k, v, att, tmp, gate, up;  // [T][E], [T][E], [T][H*D], [T][G*D] x2, [T][H*D], [T][E], [T][F] x2
  std::vector<float> x_in;                                // [T][E] layer input (residual_cosine only)
  std::vector<int32_t> rows_pos;                          // [T]
  std::vector<float> att_scratch;                         // attention_scratch_floats
  std::vector<float> logits;                              // [V] or [n][V]
  std::vector<float> last;                                // [E]
  cpu::Activations act = cpu::Activations::kF32;          // decode arithmetic

  Impl(const Model& m, const SessionOptions& o) : model(m), opt(o) {
    const ModelConfig& c = m.config();
    if (opt.prefill_chunk < 1) throw Error("session: prefill chunk must be at least 1, got " + std::to_string(opt.prefill_chunk));
    validate(opt.cache);
    if (opt.threads > 0) cpu::set_threads(opt.threads);
    act = opt.decode_activations == DecodeActivations::kInt8 ? cpu::Activations::kInt8 : cpu::Activations::kF32;
    // default: the model's context, capped so a 128k-context model does not reserve tens of GB
    max_tokens = opt.cache.max_tokens > 0 ? opt.cache.max_tokens : std::min(c.context_length, kDefaultMaxTokens);
    opt.cache.max_tokens = max_tokens;
    const size_t T = static_cast<size_t>(std::min(opt.prefill_chunk, max_tokens));
    caches = CacheBuilder::for_model(c, opt.cache, static_cast<int>(T));
    const size_t E = c.dim, QD = static_cast<size_t>(c.n_heads) * c.head_dim,
                 KD = static_cast<size_t>(c.n_kv_heads) * c.head_dim, F = c.ffn_dim;
    x.resize(T * E);
    xn.resize(T * E);
    q.resize(T * QD);
    k.resize(T * KD);
    v.resize(T * KD);
    att.resize(T * QD);
    tmp.resize(T * E);
    gate.resize(T * F);
    up.resize(T * F);
    x_in.resize(T * E);
    rows_pos.resize(T);
    size_scratch();
    logits.resize(static_cast<size_t>(c.vocab_size));
    last.resize(E);
  }

  // Attention scratch follows the largest layer capacity; it grows only when
  // a capacity grows (once, when a squeeze schedule is fixed), never per step.
  void size_scratch() {
    const ModelConfig& c = model.config();
    int cap = 0;
    for (const LayerCache& l : caches.layers) cap = std::max(cap, l.storage().capacity());
    const size_t need = static_cast<size_t>(cpu::attention_scratch_floats(static_cast<int64_t>(rows_pos.size()), c.n_heads, cap));
    if (att_scratch.size() < need) att_scratch.resize(need);
  }

  // One step over T rows; writes the final hidden state (after the output norm) of the rows.
  void step(const int* tokens, int T, float* hidden_out /*[T][E]*/) {
    const ModelConfig& c = model.config();
    const ModelWeights& w = model.weights();
    const cpu::Activations act = this->act;
    const int E = c.dim, H = c.n_heads, G = c.n_kv_heads, D = c.head_dim, F = c.ffn_dim;
    const auto pairing = c.rope_adjacent_pairs ? cpu::RopePairing::kAdjacent : cpu::RopePairing::kHalves;
    for (int t = 0; t < T; ++t) {
      rows_pos[t] = pos + t;
      dequantize_row(w.tok_embd.type, w.tok_embd.row(tokens[t]), x.data() + static_cast<size_t>(t) * E, E);
    }
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights& L = w.layers[l];
      LayerCache& cache = caches.layers[l];
      // attention block
      cpu::rmsnorm(xn.data(), x.data(), L.attn_norm.data(), T, E, c.norm_eps);
      cpu::matmul(q.data(), xn.data(), L.wq, T, L.bq.empty() ? nullptr : L.bq.data(), act);
      cpu::matmul(k.data(), xn.data(), L.wk, T, L.bk.empty() ? nullptr : L.bk.data(), act);
      cpu::matmul(v.data(), xn.data(), L.wv, T, L.bv.empty() ? nullptr : L.bv.data(), act);
      cpu::rope(q.data(), rows_pos.data(), T, H, D, w.inv_freq.data(), pairing);
      cpu::rope(k.data(), rows_pos.data(), T, G, D, w.inv_freq.data(), pairing);
      const std::optional<SqueezeMetric> metric = cache.pending_metric();
      if (metric == SqueezeMetric::kResidualCosine) std::copy(x.begin(), x.begin() + static_cast<size_t>(T) * E, x_in.begin());
      double concentration = 0.0;
      if (metric == SqueezeMetric::kKeyCosine) concentration = key_cosine(k.data(), T, G, D);
      cache.append(k.data(), v.data(), rows_pos.data(), T);
      const cpu::KvView kv = cache.view();
      cpu::AttentionProbe probe;
      if (cache.wants_mass()) {  // attention adds straight into the cache's accumulated mass
        probe.mass = cache.mass_accumulator();
        probe.mass_stride = kv.capacity;
        if (cache.mass_rows() > 0) probe.mass_row_begin = std::max(0, T - cache.mass_rows());
      }
      probe.entropy = metric == SqueezeMetric::kAttentionEntropy;
      cpu::attention(att.data(), q.data(), rows_pos.data(), T, H, kv, &probe, att_scratch.data());
      cpu::matmul(tmp.data(), att.data(), L.wo, T, nullptr, act);
      for (size_t i = 0; i < static_cast<size_t>(T) * E; ++i) x[i] += tmp[i];
      if (metric == SqueezeMetric::kAttentionEntropy)
        concentration = probe.entropy_rows > 0 ? 1.0 - probe.entropy_sum / static_cast<double>(probe.entropy_rows) : 0.0;
      if (metric == SqueezeMetric::kResidualCosine) concentration = residual_cosine(x_in.data(), x.data(), T, E);
      if (metric) cache.report_concentration(concentration);
      // feed-forward block (SwiGLU)
      cpu::rmsnorm(xn.data(), x.data(), L.ffn_norm.data(), T, E, c.norm_eps);
      cpu::matmul(gate.data(), xn.data(), L.w_gate, T, nullptr, act);
      cpu::matmul(up.data(), xn.data(), L.w_up, T, nullptr, act);
      cpu::silu_mul(gate.data(), up.data(), static_cast<int64_t>(T) * F);
      cpu::matmul(tmp.data(), gate.data(), L.w_down, T, nullptr, act);
      for (size_t i = 0; i < static_cast<size_t>(T) * E; ++i) x[i] += tmp[i];
    }
    for (LayerCache& cache : caches.layers) cache.end_step();
    size_scratch();
    pos += T;
    cpu::rmsnorm(hidden_out, x.data(), w.out_norm.data(), T, E, c.norm_eps);
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
  const int chunk = static_cast<int>(m.rows_pos.size());
  if (all_logits) m.logits.resize(static_cast<size_t>(n) * V);
  std::vector<float> hidden;  // only for all_logits
  if (all_logits) hidden.resize(static_cast<size_t>(chunk) * E);
  for (int s = 0; s < n; s += chunk) {
    const int T = std::min(chunk, n - s);
    float* h = all_logits ? hidden.data() : m.xn.data();
    m.step(tokens.data() + s, T, h);
    if (all_logits) {
      cpu::matmul(m.logits.data() + static_cast<size_t>(s) * V, h, m.model.weights().output, T, nullptr, m.act);
    } else if (s + T == n) {
      std::copy(h + static_cast<size_t>(T - 1) * E, h + static_cast<size_t>(T) * E, m.last.begin());
    }
  }
  if (all_logits) return {m.logits.data(), static_cast<size_t>(n) * V};
  m.logits.resize(static_cast<size_t>(V));
  cpu::matmul(m.logits.data(), m.last.data(), m.model.weights().output, 1, nullptr, m.act);
  return {m.logits.data(), static_cast<size_t>(V)};
}

void Session::reset() {
  impl_->pos = 0;
  impl_->caches.reset();
}

int Session::position() const { return impl_->pos; }
const Model& Session::model() const { return impl_->model; }

std::vector<LayerStats> Session::kv_stats() const {
  std::vector<LayerStats> out;
  for (const LayerCache& c : impl_->caches.layers) out.push_back(c.stats());
  return out;
}

std::vector<int32_t> Session::kv_positions(int layer, int kv_head) const {
  const auto& layers = impl_->caches.layers;
  if (layer < 0 || layer >= static_cast<int>(layers.size())) throw Error("kv_positions: layer " + std::to_string(layer) + " out of range");
  const KvStorage& s = layers[layer].storage();
  if (kv_head < 0 || kv_head >= s.n_kv_heads()) throw Error("kv_positions: kv head " + std::to_string(kv_head) + " out of range");
  std::vector<int32_t> pos(s.positions(kv_head), s.positions(kv_head) + s.count());
  std::sort(pos.begin(), pos.end());  // slots are unordered after eviction
  return pos;
}

const SqueezeCoordinator* Session::coordinator() const { return impl_->caches.coordinator.get(); }

}  // namespace squeezekv
