// llama2.c checkpoint -> Model (format as read by llama2.c's run.c: a 7-int32 header, then f32
// weights in a fixed order) with its tokenizer file (max token length, then score/len/bytes per id).
#include <cstring>
#include <fstream>
#include <map>
#include <memory>

#include "core/mapped_file.h"
#include "model/loaders.h"
#include "model/weights.h"
#include "squeezekv/error.h"

namespace squeezekv {
namespace {

TokenizerSpec read_llama2c_tokenizer(const std::string& path, int vocab_size) {
  const std::string src = "load: tokenizer " + path + ": ";
  MappedFile f(path);
  const uint8_t* p = f.data();
  const uint8_t* end = p + f.size();
  auto need = [&](size_t n) {
    if (static_cast<size_t>(end - p) < n) throw FormatError(src + "truncated file");
  };
  need(4);
  int32_t max_len;
  std::memcpy(&max_len, p, 4);
  p += 4;
  if (max_len <= 0 || max_len > 1 << 16) throw FormatError(src + "bad max token length " + std::to_string(max_len));
  TokenizerSpec s;
  s.kind = TokenizerKind::kSentencePieceBpe;
  for (int i = 0; i < vocab_size; ++i) {
    need(8);
    float score;
    int32_t len;
    std::memcpy(&score, p, 4);
    std::memcpy(&len, p + 4, 4);
    p += 8;
    if (len < 0 || len > max_len) throw FormatError(src + "token " + std::to_string(i) + " has bad length " + std::to_string(len));
    need(static_cast<size_t>(len));
    std::string t(reinterpret_cast<const char*>(p), static_cast<size_t>(len));
    p += len;
    // the exporter wrote SentencePiece's U+2581 as ' '; restore it
    std::string u;
    for (char c : t) u += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    s.tokens.push_back(u);
    s.scores.push_back(score);
    TokenType type = TokenType::kNormal;
    if (i == 0) type = TokenType::kUnknown;
    if (i == 1 || i == 2) type = TokenType::kControl;
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') type = TokenType::kByte;
    s.types.push_back(type);
  }
  s.unk = 0;
  s.bos = 1;
  s.eos = 2;
  s.add_bos = true;
  s.add_space_prefix = true;
  return s;
}

}  // namespace

std::unique_ptr<Model> load_llama2c(const std::string& path, const std::string& tokenizer_path) {
  auto file = std::make_shared<MappedFile>(path);
  const std::string src = "load: llama2.c checkpoint " + path + ": ";
  if (file->size() < 28) throw FormatError(src + "truncated file (no 28-byte header)");
  int32_t h[7];
  std::memcpy(h, file->data(), sizeof h);
  ModelConfig c;
  c.name = path;
  c.arch = Arch::kLlama;
  c.dim = h[0];
  c.ffn_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  const bool shared = h[5] > 0;
  c.vocab_size = h[5] > 0 ? h[5] : (h[5] < -(1 << 24) ? 0 : -h[5]);  // negative: untied head
  c.context_length = h[6];
  c.head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.rope_adjacent_pairs = true;
  validate_config(c, path);
  if (c.dim % c.n_heads != 0) throw FormatError(src + "dim is not a multiple of the head count");

  const int64_t E = c.dim, F = c.ffn_dim, L = c.n_layers, V = c.vocab_size;
  const int64_t QD = E, KD = static_cast<int64_t>(c.n_kv_heads) * c.head_dim, D = c.head_dim;
  // offsets (in floats) of each block, in file order
  std::map<std::string, std::pair<int64_t, std::vector<int64_t>>> at;  // name -> (offset, shape)
  int64_t off = 7;  // header = 7 int32 = 7 floats
  auto add = [&](const std::string& name, std::vector<int64_t> shape, int64_t count) {
    at[name] = {off, std::move(shape)};
    off += count;
  };
  add("token_embd.weight", {V, E}, V * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".attn_norm.weight", {E}, E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".attn_q.weight", {QD, E}, QD * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".attn_k.weight", {KD, E}, KD * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".attn_v.weight", {KD, E}, KD * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".attn_output.weight", {E, QD}, QD * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".ffn_norm.weight", {E}, E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".ffn_gate.weight", {F, E}, F * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".ffn_down.weight", {E, F}, F * E);
  for (int64_t l = 0; l < L; ++l) add("blk." + std::to_string(l) + ".ffn_up.weight", {F, E}, F * E);
  add("output_norm.weight", {E}, E);
  off += static_cast<int64_t>(c.context_length) * D;  // legacy freq_cis_real + freq_cis_imag
  if (!shared) add("output.weight", {V, E}, V * E);
  if (static_cast<uint64_t>(off) * 4 > file->size())
    throw FormatError(src + "file has " + std::to_string(file->size()) + " bytes, the header implies at least " +
                      std::to_string(off * 4));
  const uint8_t* base = file->data();
  TensorLookup lookup = [&](const std::string& name) -> std::optional<TensorRef> {
    auto it = at.find(name);
    if (it == at.end()) return std::nullopt;
    TensorRef r;
    r.type = DType::F32;
    r.data = base + it->second.first * 4;
    r.shape = it->second.second;
    int64_t n = 1;
    for (int64_t d : r.shape) n *= d;
    r.bytes = static_cast<size_t>(n) * 4;
    return r;
  };
  auto w = build_weights(c, lookup, path);
  w->keep_alive.push_back(file);
  auto tok = std::make_unique<Tokenizer>(read_llama2c_tokenizer(tokenizer_path, c.vocab_size));
  return std::make_unique<Model>(c, std::move(tok), std::string(), std::move(w));
}

}  // namespace squeezekv
