// GGUF -> Model: hyper-parameters from "<arch>.*" keys, tokenizer from "tokenizer.ggml.*".
#include <cmath>
#include <memory>

#include "model/gguf.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

std::vector<int> end_of_generation_ids(const std::vector<std::string>& tokens) {
  std::vector<int> ids;
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>"})
    for (size_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] == name) ids.push_back(static_cast<int>(i));
  return ids;
}

TokenizerSpec gguf_tokenizer(const GgufFile& f) {
  const std::string src = "gguf: " + f.path() + ": ";
  TokenizerSpec s;
  const auto model = f.get_string("tokenizer.ggml.model");
  if (!model) throw FormatError(src + "missing tokenizer.ggml.model");
  if (*model == "gpt2") {
    s.kind = TokenizerKind::kByteLevelBpe;
  } else if (*model == "llama") {
    s.kind = TokenizerKind::kSentencePieceBpe;
  } else {
    throw FormatError(src + "unsupported tokenizer model '" + *model + "' (expected gpt2 or llama)");
  }
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->kind != GgufValue::Kind::kArray || tokens->strings.empty())
    throw FormatError(src + "missing or empty tokenizer.ggml.tokens");
  s.tokens = tokens->strings;
  if (const GgufValue* types = f.find("tokenizer.ggml.token_type")) {
    for (double t : types->numbers) {
      const int v = t >= 0.0 && t <= 6.0 ? static_cast<int>(t) : 0;  // a value out of range would be a bad cast (fuzz_gguf)
      s.types.push_back(v == 2   ? TokenType::kUnknown
                        : v == 3 ? TokenType::kControl
                        : v == 4 ? TokenType::kUserDefined
                        : v == 5 ? TokenType::kUnused
                        : v == 6 ? TokenType::kByte
                                 : TokenType::kNormal);
    }
  }
  if (const GgufValue* scores = f.find("tokenizer.ggml.scores"))
    for (double x : scores->numbers) s.scores.push_back(static_cast<float>(x));
  if (const GgufValue* merges = f.find("tokenizer.ggml.merges")) {
    for (const std::string& m : merges->strings) {
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) throw FormatError(src + "malformed merge '" + m + "'");
      s.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
  }
  if (s.kind == TokenizerKind::kByteLevelBpe && s.merges.empty())
    throw FormatError(src + "byte-level BPE tokenizer without tokenizer.ggml.merges");
  std::string pre = f.get_string("tokenizer.ggml.pre").value_or("gpt2");
  if (pre == "default" || pre == "gpt-2") pre = "gpt2";
  if (pre == "llama-bpe") pre = "llama3";
  s.pre = pre;
  s.ignore_merges = pre == "llama3";
  s.bos = static_cast<int>(f.get_int("tokenizer.ggml.bos_token_id").value_or(-1));
  s.eos = static_cast<int>(f.get_int("tokenizer.ggml.eos_token_id").value_or(-1));
  s.unk = static_cast<int>(f.get_int("tokenizer.ggml.unknown_token_id").value_or(-1));
  s.add_bos = f.get_bool("tokenizer.ggml.add_bos_token").value_or(s.kind == TokenizerKind::kSentencePieceBpe);
  s.add_space_prefix = f.get_bool("tokenizer.ggml.add_space_prefix").value_or(true);
  s.end_of_generation = end_of_generation_ids(s.tokens);
  if (auto eot = f.get_int("tokenizer.ggml.eot_token_id")) s.end_of_generation.push_back(static_cast<int>(*eot));
  return s;
}

}  // namespace

std::unique_ptr<Model> load_gguf(const std::string& path) {
  auto file = std::make_shared<GgufFile>(path);
  const GgufFile& f = *file;
  const std::string src = "gguf: " + path + ": ";
  const std::string arch = f.get_string("general.architecture").value_or("");
  ModelConfig c;
  c.name = path;
  if (arch == "llama") {
    c.arch = Arch::kLlama;
    c.rope_adjacent_pairs = true;  // the converter permutes Q/K rows for llama
  } else if (arch == "qwen2") {
    c.arch = Arch::kQwen2;
    c.qkv_bias = true;
  } else {
    throw FormatError(src + "unsupported architecture '" + arch + "' (expected llama or qwen2)");
  }
  auto need_int = [&](const std::string& key) {
    auto v = f.get_int(arch + "." + key);
    if (!v) throw FormatError(src + "missing key '" + arch + "." + key + "'");
    if (*v <= 0 || *v > (int64_t{1} << 30)) throw FormatError(src + "key '" + arch + "." + key + "' out of range");
    return static_cast<int>(*v);
  };
  c.n_layers = need_int("block_count");
  c.dim = need_int("embedding_length");
  c.ffn_dim = need_int("feed_forward_length");
  c.n_heads = need_int("attention.head_count");
  c.n_kv_heads = f.get_int(arch + ".attention.head_count_kv") ? need_int("attention.head_count_kv") : c.n_heads;
  c.head_dim = f.get_int(arch + ".attention.key_length") ? need_int("attention.key_length") : c.dim / c.n_heads;
  c.context_length = need_int("context_length");
  auto need_float = [&](const std::string& key, double fallback) {
    const double v = f.get_float(arch + "." + key).value_or(fallback);
    if (!std::isfinite(v) || std::fabs(v) > 1e30) throw FormatError(src + "key '" + arch + "." + key + "' out of range");
    return static_cast<float>(v);
  };
  c.norm_eps = need_float("attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = need_float("rope.freq_base", 10000.0);
  const GgufTensor* embd = f.tensor("token_embd.weight");
  if (embd == nullptr || embd->dims.size() != 2) throw FormatError(src + "missing 2-D tensor 'token_embd.weight'");
  c.vocab_size = static_cast<int>(embd->dims[1]);
  validate_config(c, path);

  auto tok = std::make_unique<Tokenizer>(gguf_tokenizer(f));
  if (tok->vocab_size() != c.vocab_size)
    throw FormatError(src + "tokenizer has " + std::to_string(tok->vocab_size()) + " tokens but token_embd has " +
                      std::to_string(c.vocab_size) + " rows");
  TensorLookup lookup = [&f](const std::string& name) -> std::optional<TensorRef> {
    const GgufTensor* t = f.tensor(name);
    if (t == nullptr) return std::nullopt;
    TensorRef r;
    r.type = t->type;
    r.data = t->data;
    r.file_backed = true;  // the mmap of the file
    r.shape.assign(t->dims.rbegin(), t->dims.rend());  // PyTorch order
    r.bytes = t->bytes;
    return r;
  };
  auto w = build_weights(c, lookup, path);
  w->keep_alive.push_back(file);
  std::string tmpl = f.get_string("tokenizer.chat_template").value_or("");
  return std::make_unique<Model>(c, std::move(tok), std::move(tmpl), std::move(w));
}

}  // namespace squeezekv
