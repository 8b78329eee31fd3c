// Model::load dispatches on the path's format; validate_config guards every loader.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "model/gguf.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {

const char* arch_name(Arch a) { return a == Arch::kQwen2 ? "qwen2" : "llama"; }

Model::Model(ModelConfig config, std::unique_ptr<Tokenizer> tokenizer, std::string chat_template,
             std::unique_ptr<ModelWeights> weights)
    : config_(std::move(config)),
      tokenizer_(std::move(tokenizer)),
      chat_template_(std::move(chat_template)),
      weights_(std::move(weights)) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a 64
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  const ModelConfig& c = config_;
  const int64_t dims[] = {static_cast<int64_t>(c.arch), c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim,
                          c.vocab_size, c.qkv_bias, c.rope_adjacent_pairs};
  mix(dims, sizeof dims);
  mix(&c.rope_theta, sizeof c.rope_theta);
  mix(&c.norm_eps, sizeof c.norm_eps);
  mix(weights_->out_norm.data(), weights_->out_norm.size() * sizeof(float));
  for (const LayerWeights& l : weights_->layers) {
    mix(l.attn_norm.data(), l.attn_norm.size() * sizeof(float));
    mix(l.ffn_norm.data(), l.ffn_norm.size() * sizeof(float));
  }
  for (int i = 0; i < tokenizer_->vocab_size(); ++i) {
    const std::string& t = tokenizer_->token_text(i);
    mix(t.data(), t.size());
    mix("", 1);
  }
  const WeightMatrix& e = weights_->tok_embd;
  const size_t bytes = static_cast<size_t>(e.row_bytes) * e.rows, sample = std::min<size_t>(bytes, 4096);
  mix(&e.type, sizeof e.type);
  if (e.data != nullptr && sample > 0) {
    mix(e.data, sample);
    mix(e.data + bytes - sample, sample);
  }
  fingerprint_ = h;
}

Model::~Model() = default;

Model::WeightSummary Model::weight_summary() const {
  std::map<std::string, int64_t> by_type;
  WeightSummary s;
  auto add = [&](const WeightMatrix& m) {
    const int64_t b = static_cast<int64_t>(m.row_bytes) * m.rows;
    by_type[std::string(dtype_info(m.type).name)] += b;
    s.matrix_bytes += b;
  };
  for (const LayerWeights& L : weights_->layers)
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) add(*m);
  add(weights_->output);
  s.total_bytes = s.matrix_bytes;
  const WeightMatrix& e = weights_->tok_embd;
  if (e.data != weights_->output.data) s.total_bytes += static_cast<int64_t>(e.row_bytes) * e.rows;
  s.bytes_by_type.assign(by_type.begin(), by_type.end());
  std::sort(s.bytes_by_type.begin(), s.bytes_by_type.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  return s;
}

void validate_config(const ModelConfig& c, const std::string& source) {
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) throw FormatError("load: " + source + ": " + what);
  };
  constexpr int kMax = 1 << 20;
  check(c.n_layers > 0 && c.n_layers <= 4096, "layer count " + std::to_string(c.n_layers) + " out of range [1, 4096]");
  check(c.dim > 0 && c.dim <= kMax, "hidden size " + std::to_string(c.dim) + " out of range");
  check(c.n_heads > 0 && c.n_heads <= 1024, "head count " + std::to_string(c.n_heads) + " out of range");
  check(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0,
        "kv head count " + std::to_string(c.n_kv_heads) + " must divide head count " + std::to_string(c.n_heads));
  check(c.head_dim > 0 && c.head_dim % 2 == 0 && c.head_dim <= 1024,
        "head dim " + std::to_string(c.head_dim) + " must be even and at most 1024");
  check(c.ffn_dim > 0 && c.ffn_dim <= 4 * kMax, "ffn size " + std::to_string(c.ffn_dim) + " out of range");
  check(c.vocab_size > 0 && c.vocab_size <= 4 * kMax, "vocab size " + std::to_string(c.vocab_size) + " out of range");
  check(c.context_length > 0, "context length must be positive");
  check(c.norm_eps > 0.0f && c.rope_theta > 0.0f, "norm epsilon and rope theta must be positive");
}

std::unique_ptr<Model> Model::dummy(const std::string& config_json, uint64_t seed, const LoadOptions& options) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_json, ec))
    throw Error("--dummy: config file '" + config_json + "' does not exist (expected a Hugging Face config.json)");
  return make_dummy_model(config_json, seed, options.max_memory, options.dummy_type);
}

std::string mib(int64_t bytes) {
  char b[48];
  if (bytes < (int64_t{1} << 20)) std::snprintf(b, sizeof b, "%.1f KiB", static_cast<double>(bytes) / 1024.0);
  else std::snprintf(b, sizeof b, "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return b;
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error("load: model path '" + path + "' does not exist");
  std::unique_ptr<Model> m;
  if (fs::is_directory(path, ec)) {
    m = load_hf_dir(path);
  } else if (is_gguf_file(path)) {
    m = load_gguf(path);
  } else {
    if (options.tokenizer_path.empty())
      throw Error("load: '" + path +
                  "' is neither a GGUF file nor a Hugging Face directory; for a llama2.c checkpoint pass "
                  "its tokenizer (--tokenizer tok512.bin)");
    m = load_llama2c(path, options.tokenizer_path);
  }
  // the weights are mapped from the file, not read: the check comes before any of them is touched
  if (const int64_t w = m->weight_summary().total_bytes; options.max_memory > 0 && w > options.max_memory)
    throw Error("--max-memory: the weights of '" + path + "' take " + mib(w) + ", above the limit of " + mib(options.max_memory));
  return m;
}

}  // namespace squeezekv
