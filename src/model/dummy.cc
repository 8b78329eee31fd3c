// Random ("dummy") weights of a real model's shape, from its Hugging Face config.json: for speed
// runs where the real weights cannot go (the GPU machine downloads nothing). Matrices are BF16,
// uniform in [-a, a] with a = 0.02 * sqrt(3) (standard deviation 0.02, the usual initialiser), the
// norms 1, biases 0.02-scaled; every row is drawn from its own counter-based stream, so the
// weights depend on the seed only (not on threads or the device). The tokenizer has the 256 byte
// tokens only: enough for token ids, not for text.
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "core/half.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// n bf16 values uniform in [-a, a] from stream `stream` of `seed`.
void fill_bf16(uint16_t* out, int64_t n, float a, uint64_t seed, uint64_t stream) {
  uint64_t s = seed * 0x632BE59BD9B4E019ULL + stream * 0x9E3779B97F4A7C15ULL + 1;
  for (int64_t i = 0; i < n; i += 2) {
    const uint64_t r = splitmix64(s);
    for (int k = 0; k < 2 && i + k < n; ++k) {
      const float u = static_cast<float>((r >> (32 * k)) & 0xFFFFFFu) / 16777216.0f;  // [0, 1)
      out[i + k] = f32_to_bf16((2.0f * u - 1.0f) * a);
    }
  }
}

struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  bool norm = false;
};

// The tensors of a dummy model of config c, with their shapes.
std::vector<Spec> dummy_specs(const ModelConfig& c, bool tied) {
  const int64_t E = c.dim, V = c.vocab_size, F = c.ffn_dim;
  const int64_t QD = static_cast<int64_t>(c.n_heads) * c.head_dim, KD = static_cast<int64_t>(c.n_kv_heads) * c.head_dim;
  std::vector<Spec> specs = {{"token_embd.weight", {V, E}}, {"output_norm.weight", {E}, true}};
  if (!tied) specs.push_back({"output.weight", {V, E}});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    specs.push_back({p + "attn_norm.weight", {E}, true});
    specs.push_back({p + "attn_q.weight", {QD, E}});
    specs.push_back({p + "attn_k.weight", {KD, E}});
    specs.push_back({p + "attn_v.weight", {KD, E}});
    specs.push_back({p + "attn_output.weight", {E, QD}});
    if (c.qkv_bias) {
      specs.push_back({p + "attn_q.bias", {QD}});
      specs.push_back({p + "attn_k.bias", {KD}});
      specs.push_back({p + "attn_v.bias", {KD}});
    }
    specs.push_back({p + "ffn_norm.weight", {E}, true});
    specs.push_back({p + "ffn_gate.weight", {F, E}});
    specs.push_back({p + "ffn_up.weight", {F, E}});
    specs.push_back({p + "ffn_down.weight", {E, F}});
  }
  return specs;
}

int64_t bytes_of(const std::vector<Spec>& specs) {
  int64_t values = 0;  // validate_config bounds every size, so this stays far from overflow
  for (const Spec& sp : specs) values += sp.shape.size() == 2 ? sp.shape[0] * sp.shape[1] : sp.shape[0];
  return 2 * values;  // BF16 throughout
}

}  // namespace

int64_t dummy_weight_bytes(const ModelConfig& c, bool tied) { return bytes_of(dummy_specs(c, tied)); }

std::unique_ptr<Model> make_dummy_model(const std::string& config_path, uint64_t seed, int64_t max_memory) {
  bool tied = false;
  ModelConfig c = read_hf_config(config_path, &tied);
  c.name = "dummy:" + config_path;
  const std::vector<Spec> specs = dummy_specs(c, tied);
  // refuse a shape the limit or this machine cannot hold before allocating any of it
  const int64_t need = bytes_of(specs);
  if (max_memory > 0 && need > max_memory)
    throw Error("--max-memory: the dummy weights of '" + config_path + "' take " + mib(need) + ", above the limit of " + mib(max_memory));
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && static_cast<double>(need) > 0.9 * have)
    throw Error("--dummy: the weights of '" + config_path + "' take " + std::to_string(static_cast<int64_t>(need / 1e9)) +
                " GB as BF16, more than this machine's memory (" + std::to_string(static_cast<int64_t>(have / 1e9)) + " GB)");
  // one owned BF16 buffer per tensor, rows filled in parallel from per-row streams
  std::map<std::string, TensorRef> tensors;
  std::vector<std::shared_ptr<void>> keep;
  const float a = 0.02f * std::sqrt(3.0f);
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const Spec& s = specs[ti];
    const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1, cols = s.shape.back();
    auto buf = std::shared_ptr<uint16_t[]>(new uint16_t[static_cast<size_t>(rows * cols)]);
    uint16_t* d = buf.get();
    if (s.norm) {
      for (int64_t i = 0; i < cols; ++i) d[i] = 0x3F80;  // 1.0
    } else {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) fill_bf16(d + r * cols, cols, a, seed, (static_cast<uint64_t>(ti) << 32) + r);
    }
    TensorRef t;
    t.type = DType::BF16;
    t.data = reinterpret_cast<const uint8_t*>(d);
    t.shape = s.shape;
    t.bytes = static_cast<size_t>(rows * cols) * 2;
    tensors[s.name] = t;
    keep.push_back(std::static_pointer_cast<void>(std::shared_ptr<uint16_t>(buf, d)));
  }
  TensorLookup lookup = [&](const std::string& name) -> std::optional<TensorRef> {
    auto it = tensors.find(name);
    if (it == tensors.end()) return std::nullopt;
    return it->second;
  };
  auto w = build_weights(c, lookup, c.name);
  w->keep_alive = std::move(keep);
  TokenizerSpec ts;
  ts.kind = TokenizerKind::kSentencePieceBpe;
  for (int b = 0; b < 256 && b < c.vocab_size; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    ts.tokens.push_back(name);
    ts.types.push_back(TokenType::kByte);
    ts.scores.push_back(0.0f);
  }
  return std::make_unique<Model>(c, std::make_unique<Tokenizer>(std::move(ts)), std::string(), std::move(w));
}

}  // namespace squeezekv
