// Random ("dummy") weights of a real model's shape, from its Hugging Face config.json: for speed
// runs where the real weights cannot go (the GPU machine downloads nothing). BF16 matrices are
// uniform in [-a, a] with a = 0.02 * sqrt(3) (standard deviation 0.02, the usual initialiser);
// quantized presets (--dummy-type) write random blocks of each tensor's type (core/quant.h
// random_blocks) with the tensor-type mix llama.cpp's quantizer writes for that preset; the norms
// are 1, biases 0.02-scaled; every row is drawn from its own counter-based stream, so the weights
// depend on the seed only (not on threads or the device). The tokenizer has the 256 byte tokens
// only: enough for token ids, not for text.
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "core/half.h"
#include "core/quant.h"
#include "core/random.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

// n bf16 values uniform in [-a, a] from stream `stream` of `seed`.
void fill_bf16(uint16_t* out, int64_t n, float a, uint64_t seed, uint64_t stream) {
  uint64_t s = stream_state(seed, stream);
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
  DType type = DType::BF16;
};

// A --dummy-type preset: the matrices' type, and whether it mixes as llama.cpp's _M presets do.
struct Preset {
  const char* name;
  DType base;
  bool k_mix;  // attn_v and ffn_down in Q6_K on the layers llama.cpp gives more bits
};
constexpr Preset kPresets[] = {
    {"BF16", DType::BF16, false}, {"Q8_0", DType::Q8_0, false}, {"Q6_K", DType::Q6_K, false}, {"Q5_K_M", DType::Q5_K, true},
    {"Q4_K_M", DType::Q4_K, true}, {"Q5_1", DType::Q5_1, false}, {"Q5_0", DType::Q5_0, false}, {"Q4_1", DType::Q4_1, false},
    {"Q4_0", DType::Q4_0, false},
};

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const Preset& p : kPresets) {
    if (name == p.name) return p;
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  throw Error("--dummy-type: unknown preset '" + name + "' (expected one of " + names + ")");
}

// llama.cpp's use_more_bits (src/llama-quant.cpp): the first and last eighth of the layers and
// every third one between them.
bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The type preset p gives a matrix (name without "blk.N.", its layer or -1, its columns), as
// llama.cpp's quantizer (llama_tensor_get_type) picks it: output.weight, and token_embd.weight
// where the two are tied, Q6_K (Q8_0 stays Q8_0); with k_mix attn_v and ffn_down Q6_K where
// more_bits; a 70B-shaped llama (80 layers, grouped kv heads: is_70b) its other attn_v Q4_K ->
// Q5_K; a K type on columns that are not whole 256-blocks falls back as llama.cpp's does (Q4_K ->
// Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
DType preset_type(const Preset& p, const std::string& name, int layer, int n_layers, int64_t cols, bool tied, bool is_70b) {
  DType t = p.base;
  if (t == DType::BF16) return t;
  if ((name == "output.weight" || (tied && name == "token_embd.weight")) && t != DType::Q8_0) t = DType::Q6_K;
  if (p.k_mix && (name == "attn_v.weight" || name == "ffn_down.weight") && more_bits(layer, n_layers)) t = DType::Q6_K;
  if (is_70b && name == "attn_v.weight" && t == DType::Q4_K) t = DType::Q5_K;
  if (cols % 256 != 0) {
    if (t == DType::Q4_K) t = DType::Q5_0;
    if (t == DType::Q5_K) t = DType::Q5_1;
    if (t == DType::Q6_K) t = DType::Q8_0;
  }
  if (cols % 32 != 0) t = DType::BF16;  // no block type fits
  return t;
}

// The tensors of a dummy model of config c, with their shapes and types.
std::vector<Spec> dummy_specs(const ModelConfig& c, bool tied, const Preset& preset) {
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
  // as llama-quantize infers LLM_TYPE_70B, the one size its type choices look at
  const bool is_70b = c.arch == Arch::kLlama && c.n_layers == 80 && c.n_kv_heads != c.n_heads;
  for (Spec& s : specs) {
    if (s.norm || s.shape.size() != 2) continue;
    int layer = -1;
    std::string base = s.name;
    if (s.name.rfind("blk.", 0) == 0) {
      const size_t dot = s.name.find('.', 4);
      layer = std::stoi(s.name.substr(4, dot - 4));
      base = s.name.substr(dot + 1);
    }
    s.type = preset_type(preset, base, layer, c.n_layers, s.shape[1], tied, is_70b);
  }
  return specs;
}

int64_t bytes_of(const std::vector<Spec>& specs) {
  int64_t bytes = 0;  // validate_config bounds every size, so this stays far from overflow
  for (const Spec& sp : specs)
    bytes += static_cast<int64_t>(dtype_bytes(sp.type, sp.shape.back())) * (sp.shape.size() == 2 ? sp.shape[0] : 1);
  return bytes;
}

}  // namespace

int64_t dummy_weight_bytes(const ModelConfig& c, bool tied, const std::string& type) {
  return bytes_of(dummy_specs(c, tied, find_preset(type)));
}

std::unique_ptr<Model> make_dummy_model(const std::string& config_path, uint64_t seed, int64_t max_memory, const std::string& type) {
  const Preset& preset = find_preset(type);
  bool tied = false;
  ModelConfig c = read_hf_config(config_path, &tied);
  c.name = "dummy:" + config_path;
  const std::vector<Spec> specs = dummy_specs(c, tied, preset);
  // refuse a shape the limit or this machine cannot hold before allocating any of it
  const int64_t need = bytes_of(specs);
  if (max_memory > 0 && need > max_memory)
    throw Error("--max-memory: the dummy weights of '" + config_path + "' take " + mib(need) + ", above the limit of " + mib(max_memory));
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (have > 0 && static_cast<double>(need) > 0.9 * have)
    throw Error("--dummy: the weights of '" + config_path + "' take " + std::to_string(static_cast<int64_t>(need / 1e9)) +
                " GB as " + type + ", more than this machine's memory (" + std::to_string(static_cast<int64_t>(have / 1e9)) + " GB)");
  // one owned buffer per tensor, rows filled in parallel from per-row streams
  std::map<std::string, TensorRef> tensors;
  std::vector<std::shared_ptr<void>> keep;
  const float a = 0.02f * std::sqrt(3.0f);
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const Spec& s = specs[ti];
    const int64_t rows = s.shape.size() == 2 ? s.shape[0] : 1, cols = s.shape.back();
    const size_t row_bytes = dtype_bytes(s.type, cols);
    // 8-byte words: BF16 rows and every block type's fields stay aligned as their loaders expect
    auto buf = std::shared_ptr<uint64_t[]>(new uint64_t[(static_cast<size_t>(rows) * row_bytes + 7) / 8]);
    uint8_t* d = reinterpret_cast<uint8_t*>(buf.get());
    auto* d16 = reinterpret_cast<uint16_t*>(d);
    if (s.norm) {
      for (int64_t i = 0; i < cols; ++i) d16[i] = 0x3F80;  // 1.0
    } else if (s.type == DType::BF16) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) fill_bf16(d16 + r * cols, cols, a, seed, (static_cast<uint64_t>(ti) << 32) + r);
    } else {
      const int64_t blocks = cols / dtype_info(s.type).block_values;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        random_blocks(s.type, d + static_cast<size_t>(r) * row_bytes, blocks, a, seed, (static_cast<uint64_t>(ti) << 32) + r);
    }
    TensorRef t;
    t.type = s.type;
    t.data = d;
    t.shape = s.shape;
    t.bytes = static_cast<size_t>(rows) * row_bytes;
    tensors[s.name] = t;
    keep.push_back(std::static_pointer_cast<void>(std::shared_ptr<uint64_t>(buf, buf.get())));
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
