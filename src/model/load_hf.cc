// Hugging Face directory -> Model: config.json, model.safetensors (or a sharded index) and
// tokenizer.json (+ tokenizer_config.json for BOS and the chat template).
#include <cfloat>
#include <climits>
#include <cmath>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "core/json_fields.h"
#include "core/mapped_file.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

using nlohmann::json;

// Checked reads of v (core/json_fields.h): failures are FormatErrors that start with src.
JsonFields fields(const json& v, const std::string& src) {
  return JsonFields(v, src, [](const std::string&, const std::string& message) { throw FormatError(message); });
}
int as_int(const json& v, const std::string& src, const std::string& what) {
  return static_cast<int>(fields(v, src).int64_of(v, what, INT_MIN, INT_MAX));
}

namespace fs = std::filesystem;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw Error("load: cannot open '" + p.string() + "'");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw FormatError("load: '" + p.string() + "' is not valid JSON: " + e.what());
  }
}

// One safetensors file: 8-byte header length, JSON header, data.
class Safetensors {
 public:
  explicit Safetensors(const fs::path& p) : file_(std::make_shared<MappedFile>(p.string())) {
    const std::string src = "safetensors: " + p.string() + ": ";
    const uint8_t* d = file_->data();
    const size_t size = file_->size();
    if (size < 8) throw FormatError(src + "truncated file (no header length)");
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | d[i];
    if (n > size - 8) throw FormatError(src + "header length " + std::to_string(n) + " runs past the end of the file");
    json h;
    try {
      h = json::parse(d + 8, d + 8 + n);
    } catch (const json::exception& e) {
      throw FormatError(src + "header is not valid JSON: " + e.what());
    }
    if (!h.is_object()) throw FormatError(src + "header is not a JSON object");
    const size_t data_size = size - 8 - n;
    const uint8_t* data = d + 8 + n;
    for (auto& [name, info] : h.items()) {
      if (name == "__metadata__") continue;
      try {
        const std::string dt = info.at("dtype").get<std::string>();
        TensorRef t;
        if (dt == "F32") t.type = DType::F32;
        else if (dt == "F16") t.type = DType::F16;
        else if (dt == "BF16") t.type = DType::BF16;
        else throw FormatError(src + "tensor '" + name + "' has unsupported dtype " + dt + " (expected F32, F16 or BF16)");
        int64_t count = 1;
        for (const auto& s : info.at("shape")) {
          const int64_t v = fields(s, src).int64_of(s, "tensor '" + name + "' shape");
          if (v <= 0 || v > (int64_t{1} << 40) || count > (int64_t{1} << 42) / v)
            throw FormatError(src + "tensor '" + name + "' has absurd dimension " + std::to_string(v));
          count *= v;
          t.shape.push_back(v);
        }
        const auto off = info.at("data_offsets");
        const int64_t bi = fields(off.at(0), src).int64_of(off.at(0), "tensor '" + name + "' offsets"),
                      ei = fields(off.at(1), src).int64_of(off.at(1), "tensor '" + name + "' offsets");
        if (bi < 0 || ei < 0) throw FormatError(src + "tensor '" + name + "' has negative data offsets");
        const uint64_t b = static_cast<uint64_t>(bi), e = static_cast<uint64_t>(ei);
        t.bytes = dtype_bytes(t.type, count);
        if (b > e || e > data_size || e - b != t.bytes)
          throw FormatError(src + "tensor '" + name + "' data offsets [" + std::to_string(b) + ", " +
                            std::to_string(e) + ") do not fit its shape or the file");
        t.data = data + b;
        tensors_[name] = t;
      } catch (const json::exception& e) {
        throw FormatError(src + "tensor '" + name + "' has a malformed entry: " + e.what());
      }
    }
  }
  const TensorRef* find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
  }
  std::shared_ptr<MappedFile> file() const { return file_; }

 private:
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, TensorRef> tensors_;
};

// GGUF tensor name -> Hugging Face name.
std::string hf_name(const std::string& g) {
  if (g == "token_embd.weight") return "model.embed_tokens.weight";
  if (g == "output_norm.weight") return "model.norm.weight";
  if (g == "output.weight") return "lm_head.weight";
  if (g.rfind("blk.", 0) != 0) return "";
  const size_t dot = g.find('.', 4);
  const std::string layer = g.substr(4, dot - 4), rest = g.substr(dot + 1);
  static const std::map<std::string, std::string> kMap = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  auto it = kMap.find(rest);
  return it == kMap.end() ? "" : "model.layers." + layer + "." + it->second;
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content")) return j["content"].get<std::string>();
  return "";
}

bool contains_type(const json& node, const std::string& type) {
  if (!node.is_object()) return false;
  if (node.value("type", "") == type) return true;
  for (const char* key : {"pretokenizers", "normalizers", "decoders"})
    if (node.contains(key))
      for (const auto& n : node[key])
        if (contains_type(n, type)) return true;
  return false;
}

std::string split_pattern(const json& node) {
  if (!node.is_object()) return "";
  if (node.value("type", "") == "Split" && node.contains("pattern")) {
    const auto& p = node["pattern"];
    if (p.contains("Regex")) return p["Regex"].get<std::string>();
  }
  if (node.contains("pretokenizers"))
    for (const auto& n : node["pretokenizers"]) {
      std::string s = split_pattern(n);
      if (!s.empty()) return s;
    }
  return "";
}

TokenizerSpec hf_tokenizer(const fs::path& dir, std::string* chat_template) {
  const fs::path tp = dir / "tokenizer.json";
  const json tj = read_json(tp);
  const std::string src = "load: " + tp.string() + ": ";
  TokenizerSpec s;
  try {
    const json& m = tj.at("model");
    if (m.value("type", "") != "BPE") throw FormatError(src + "unsupported tokenizer model '" + m.value("type", "") + "' (expected BPE)");
    const json& vocab = m.at("vocab");
    // every id in [0, 2^22) before anything is indexed by it (a negative added-token id wrote
    // before the vector; found by fuzz_hf)
    constexpr int kMaxVocab = 1 << 22;
    auto token_id = [&](const json& v, const std::string& what) {
      return static_cast<int>(fields(v, src).int64_of(v, what, 0, kMaxVocab - 1));
    };
    int n = 0;
    for (auto& [tok, id] : vocab.items()) n = std::max(n, token_id(id, "vocab id of '" + tok + "'") + 1);
    for (const auto& a : tj.value("added_tokens", json::array())) n = std::max(n, token_id(a.at("id"), "added token id") + 1);
    if (n <= 0) throw FormatError(src + "empty vocabulary");
    s.tokens.assign(static_cast<size_t>(n), "");
    s.types.assign(static_cast<size_t>(n), TokenType::kUnused);
    for (auto& [tok, id] : vocab.items()) {
      const int i = token_id(id, "vocab id of '" + tok + "'");
      s.tokens[i] = tok;
      s.types[i] = TokenType::kNormal;
    }
    for (const auto& a : tj.value("added_tokens", json::array())) {
      const int i = token_id(a.at("id"), "added token id");
      s.tokens[i] = a.at("content").get<std::string>();
      s.types[i] = a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
    }
    for (const auto& mg : m.value("merges", json::array())) {
      if (mg.is_string()) {
        const std::string t = mg.get<std::string>();
        const size_t sp = t.find(' ', 1);
        if (sp == std::string::npos) throw FormatError(src + "malformed merge '" + t + "'");
        s.merges.emplace_back(t.substr(0, sp), t.substr(sp + 1));
      } else {
        s.merges.emplace_back(mg.at(0).get<std::string>(), mg.at(1).get<std::string>());
      }
    }
    s.ignore_merges = m.value("ignore_merges", false);
    s.fuse_unk = m.value("fuse_unk", false);
    const json pre = tj.value("pre_tokenizer", json());
    const json norm = tj.value("normalizer", json());
    if (contains_type(pre, "ByteLevel") || contains_type(tj.value("decoder", json()), "ByteLevel")) {
      s.kind = TokenizerKind::kByteLevelBpe;
      const std::string pat = split_pattern(pre);
      if (contains_type(pre, "Digits")) s.pre = "smollm";
      else if (pat.find("\\p{N}{1,3}") != std::string::npos) s.pre = "llama3";
      else if (pat.find("(?i:") != std::string::npos) s.pre = "qwen2";
      else s.pre = "gpt2";
    } else {
      s.kind = TokenizerKind::kSentencePieceBpe;
      s.add_space_prefix = contains_type(norm, "Prepend") || contains_type(pre, "Metaspace");
      s.space_prefix_per_segment = contains_type(norm, "Prepend");
      if (s.merges.empty()) throw FormatError(src + "BPE model without merges");
    }
    if (m.contains("unk_token") && m["unk_token"].is_string()) {
      auto it = vocab.find(m["unk_token"].get<std::string>());
      if (it != vocab.end()) s.unk = as_int(*it, src, "unk id");
    }
  } catch (const json::exception& e) {
    throw FormatError(src + "malformed tokenizer: " + e.what());
  }
  auto id_of = [&](const std::string& t) {
    for (size_t i = 0; i < s.tokens.size(); ++i)
      if (s.tokens[i] == t) return static_cast<int>(i);
    return -1;
  };
  const fs::path tcp = dir / "tokenizer_config.json";
  json tc = fs::exists(tcp) ? read_json(tcp) : json::object();
  const json config = read_json(dir / "config.json");
  if (tc.contains("bos_token")) s.bos = id_of(token_content(tc["bos_token"]));
  if (s.bos < 0 && config.contains("bos_token_id") && config["bos_token_id"].is_number()) s.bos = as_int(config["bos_token_id"], "config.json: ", "bos_token_id");
  if (tc.contains("eos_token")) s.eos = id_of(token_content(tc["eos_token"]));
  if (s.eos < 0 && config.contains("eos_token_id") && config["eos_token_id"].is_number()) s.eos = as_int(config["eos_token_id"], "config.json: ", "eos_token_id");
  s.add_bos = tc.value("add_bos_token", false);
  if (!tc.contains("add_bos_token") && tj.contains("post_processor") && tj["post_processor"].is_object()) {
    const json& pp = tj["post_processor"];
    s.add_bos = pp.value("type", "") == "TemplateProcessing" && pp.contains("single") &&
                !pp["single"].empty() && pp["single"][0].contains("SpecialToken");
  }
  for (const char* name : {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>"}) {
    const int id = id_of(name);
    if (id >= 0) s.end_of_generation.push_back(id);
  }
  if (tc.contains("chat_template") && tc["chat_template"].is_string()) *chat_template = tc["chat_template"].get<std::string>();
  return s;
}

}  // namespace

ModelConfig parse_hf_config(const json& cj, const std::string& name, const std::string& src, bool* tied_out) {
  ModelConfig c;
  c.name = name;
  bool tied = false;
  try {
    const std::string mt = cj.value("model_type", "");
    if (mt == "llama" || mt == "mistral") {
      c.arch = Arch::kLlama;
    } else if (mt == "qwen2") {
      c.arch = Arch::kQwen2;
      c.qkv_bias = true;
    } else {
      throw FormatError(src + "unsupported model_type '" + mt + "' (expected llama, mistral or qwen2)");
    }
    const JsonFields f = fields(cj, src);
    c.n_layers = f.required_integer("num_hidden_layers");
    c.dim = f.required_integer("hidden_size");
    c.ffn_dim = f.required_integer("intermediate_size");
    c.n_heads = f.required_integer("num_attention_heads");
    c.n_kv_heads = f.integer("num_key_value_heads", c.n_heads);
    c.head_dim = f.integer("head_dim", c.n_heads > 0 ? c.dim / c.n_heads : 0);
    c.vocab_size = f.required_integer("vocab_size");
    c.context_length = f.integer("max_position_embeddings", 2048);
    c.norm_eps = f.real("rms_norm_eps", 1e-6f);
    c.rope_theta = f.real("rope_theta", 10000.0f);
    if (c.arch == Arch::kLlama) c.qkv_bias = cj.value("attention_bias", false);
    tied = cj.value("tie_word_embeddings", false);
    // Mistral v0.1 attends over a sliding window; within the window that is full attention, so
    // the context is limited to it rather than computed differently (qwen2 marks its window unused)
    if (mt == "mistral" && cj.contains("sliding_window") && cj["sliding_window"].is_number() &&
        cj.value("use_sliding_window", true))
      c.context_length = std::min(c.context_length, f.integer("sliding_window", c.context_length));
    // transformers 5 writes {"rope_parameters": {"rope_theta", "rope_type", ...}}; older files
    // a top-level rope_theta and an optional rope_scaling object
    const json* rs = nullptr;
    if (cj.contains("rope_parameters") && cj["rope_parameters"].is_object()) {
      rs = &cj["rope_parameters"];
      c.rope_theta = fields(*rs, src + "rope_parameters: ").real("rope_theta", c.rope_theta);
    } else if (cj.contains("rope_scaling") && cj["rope_scaling"].is_object()) {
      rs = &cj["rope_scaling"];
    }
    const std::string rope_type = rs ? rs->value("rope_type", rs->value("type", std::string("default"))) : "default";
    if (rope_type != "default" && rope_type != "llama3")
      throw FormatError(src + "unsupported rope type '" + rope_type + "' (expected default or llama3)");
    if (rope_type == "llama3") {
      const JsonFields r = fields(*rs, src + "rope scaling: ");
      c.rope_scaling.factor = r.required_real("factor");
      c.rope_scaling.low_freq_factor = r.real("low_freq_factor", 1.0f);
      c.rope_scaling.high_freq_factor = r.real("high_freq_factor", 4.0f);
      c.rope_scaling.original_context = r.integer("original_max_position_embeddings", 8192);
    }
  } catch (const json::exception& e) {
    throw FormatError(src + "malformed config: " + e.what());
  }
  validate_config(c, name);
  if (tied_out != nullptr) *tied_out = tied;
  return c;
}

ModelConfig read_hf_config(const std::string& config_path, bool* tied) {
  const json cj = read_json(config_path);
  return parse_hf_config(cj, config_path, "load: " + config_path + ": ", tied);
}

std::unique_ptr<Model> load_hf_dir(const std::string& dir_str) {
  const fs::path dir(dir_str);
  const json cj = read_json(dir / "config.json");
  const std::string src = "load: " + (dir / "config.json").string() + ": ";
  bool tied = false;
  const ModelConfig c = parse_hf_config(cj, dir_str, src, &tied);

  std::string chat_template;
  auto tok = std::make_unique<Tokenizer>(hf_tokenizer(dir, &chat_template));
  if (tok->vocab_size() > c.vocab_size)
    throw FormatError(src + "tokenizer has " + std::to_string(tok->vocab_size()) + " tokens, more than vocab_size " +
                      std::to_string(c.vocab_size));

  // shards: model.safetensors, or model.safetensors.index.json's weight_map
  std::map<std::string, std::shared_ptr<Safetensors>> shards;
  std::map<std::string, std::string> where;  // tensor -> shard file
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const json idx = read_json(dir / "model.safetensors.index.json");
    try {
      for (auto& [name, file] : idx.at("weight_map").items()) where[name] = file.get<std::string>();
    } catch (const json::exception& e) {
      throw FormatError("load: model.safetensors.index.json: malformed weight_map: " + std::string(e.what()));
    }
  } else if (!fs::exists(dir / "model.safetensors")) {
    throw Error("load: " + dir_str + ": no model.safetensors or model.safetensors.index.json");
  }
  auto shard = [&](const std::string& file) {
    auto& s = shards[file];
    if (!s) {
      if (file.find('/') != std::string::npos) throw FormatError("load: shard name '" + file + "' must be a plain file name");
      s = std::make_shared<Safetensors>(dir / file);
    }
    return s;
  };
  auto find_hf = [&](const std::string& name) -> const TensorRef* {
    std::string file = "model.safetensors";
    if (!where.empty()) {
      auto it = where.find(name);
      if (it == where.end()) return nullptr;
      file = it->second;
    }
    return shard(file)->find(name);
  };
  TensorLookup lookup = [&](const std::string& gname) -> std::optional<TensorRef> {
    if (gname == "output.weight" && tied) return std::nullopt;
    const std::string name = hf_name(gname);
    if (name.empty()) return std::nullopt;
    const TensorRef* t = find_hf(name);
    // tied checkpoints may store the shared matrix only as lm_head.weight
    if (t == nullptr && gname == "token_embd.weight" && tied) t = find_hf("lm_head.weight");
    if (t == nullptr) return std::nullopt;
    return *t;
  };

  auto w = build_weights(c, lookup, dir_str);
  for (auto& [f, s] : shards) w->keep_alive.push_back(s->file());
  return std::make_unique<Model>(c, std::move(tok), std::move(chat_template), std::move(w));
}

}  // namespace squeezekv
