// Assembles ModelWeights from any format's tensor lookup, checking every shape against the config.
#include "model/weights.h"

#include <cmath>

#include "core/quant.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

class Builder {
 public:
  Builder(const TensorLookup& lookup, const std::string& source) : lookup_(lookup), source_(source) {}

  std::optional<TensorRef> find(const std::string& name) const { return lookup_(name); }

  TensorRef need(const std::string& name) const {
    auto t = lookup_(name);
    if (!t) throw FormatError("load: " + source_ + ": missing tensor '" + name + "'");
    return *t;
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    return to_matrix(need(name), name, rows, cols);
  }

  WeightMatrix to_matrix(const TensorRef& t, const std::string& name, int64_t rows, int64_t cols) const {
    if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
      throw FormatError("load: " + source_ + ": tensor '" + name + "' has shape " + shape_str(t.shape) +
                        ", expected " + shape_str({rows, cols}));
    if (cols % dtype_info(t.type).block_values != 0)
      throw FormatError("load: " + source_ + ": tensor '" + name + "' rows are not whole blocks");
    WeightMatrix w;
    w.type = t.type;
    w.data = t.data;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = dtype_bytes(t.type, cols);
    w.file_backed = t.file_backed;
    return w;
  }

  std::vector<float> vec(const std::string& name, int64_t n, bool required = true) const {
    auto t = lookup_(name);
    if (!t) {
      if (required) throw FormatError("load: " + source_ + ": missing tensor '" + name + "'");
      return {};
    }
    int64_t count = 1;
    for (int64_t d : t->shape) count *= d;
    if (count != n)
      throw FormatError("load: " + source_ + ": tensor '" + name + "' has shape " + shape_str(t->shape) +
                        ", expected [" + std::to_string(n) + "]");
    if (n % dtype_info(t->type).block_values != 0)
      throw FormatError("load: " + source_ + ": tensor '" + name + "' is not whole blocks");
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row(t->type, t->data, out.data(), n);
    return out;
  }

 private:
  const TensorLookup& lookup_;
  const std::string& source_;
};

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& cfg) {
  const int D = cfg.head_dim;
  std::vector<float> inv(static_cast<size_t>(D / 2));
  for (int i = 0; i < D / 2; ++i)
    inv[i] = 1.0f / std::pow(cfg.rope_theta, static_cast<float>(2 * i) / static_cast<float>(D));
  const RopeScaling& rs = cfg.rope_scaling;
  if (rs.factor > 0.0f) {  // Llama 3.1 frequency scaling
    const float low_wavelen = static_cast<float>(rs.original_context) / rs.low_freq_factor;
    const float high_wavelen = static_cast<float>(rs.original_context) / rs.high_freq_factor;
    for (float& f : inv) {
      const float wavelen = 2.0f * static_cast<float>(M_PI) / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f /= rs.factor;
      } else {
        const float smooth = (static_cast<float>(rs.original_context) / wavelen - rs.low_freq_factor) /
                             (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0f - smooth) * f / rs.factor + smooth * f;
      }
    }
  }
  return inv;
}

std::unique_ptr<ModelWeights> build_weights(const ModelConfig& cfg, const TensorLookup& lookup,
                                            const std::string& source) {
  const Builder b(lookup, source);
  auto w = std::make_unique<ModelWeights>();
  const int64_t E = cfg.dim, V = cfg.vocab_size, F = cfg.ffn_dim;
  const int64_t QD = static_cast<int64_t>(cfg.n_heads) * cfg.head_dim;
  const int64_t KD = static_cast<int64_t>(cfg.n_kv_heads) * cfg.head_dim;
  w->tok_embd = b.matrix("token_embd.weight", V, E);
  w->out_norm = b.vec("output_norm.weight", E);
  auto out = b.find("output.weight");
  w->output = out ? b.to_matrix(*out, "output.weight", V, E) : w->tok_embd;
  w->inv_freq = rope_inv_freq(cfg);
  if (auto factors = b.find("rope_freqs.weight")) {  // GGUF llama3: per-frequency divisors
    auto f = b.vec("rope_freqs.weight", cfg.head_dim / 2);
    for (size_t i = 0; i < f.size(); ++i) w->inv_freq[i] /= f[i];
  }
  w->layers.resize(static_cast<size_t>(cfg.n_layers));
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = w->layers[l];
    L.attn_norm = b.vec(p + "attn_norm.weight", E);
    L.wq = b.matrix(p + "attn_q.weight", QD, E);
    L.wk = b.matrix(p + "attn_k.weight", KD, E);
    L.wv = b.matrix(p + "attn_v.weight", KD, E);
    L.wo = b.matrix(p + "attn_output.weight", E, QD);
    if (cfg.qkv_bias) {
      L.bq = b.vec(p + "attn_q.bias", QD);
      L.bk = b.vec(p + "attn_k.bias", KD);
      L.bv = b.vec(p + "attn_v.bias", KD);
    }
    L.ffn_norm = b.vec(p + "ffn_norm.weight", E);
    L.w_gate = b.matrix(p + "ffn_gate.weight", F, E);
    L.w_up = b.matrix(p + "ffn_up.weight", F, E);
    L.w_down = b.matrix(p + "ffn_down.weight", E, F);
  }
  return w;
}

}  // namespace squeezekv
