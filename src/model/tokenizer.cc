// BPE tokenizers (see include/squeezekv/tokenizer.h). One merge engine serves both families:
// a symbol list merged pair by pair in priority order (lowest merge rank, or highest score of the
// merged token), ties to the leftmost pair, as Hugging Face tokenizers and SentencePiece do.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "squeezekv/tokenizer.h"

#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <queue>
#include <unordered_map>

#include "squeezekv/error.h"

namespace squeezekv {

size_t first_invalid_utf8(std::string_view s, size_t from) {
  size_t i = from;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return i;
    uint32_t cp = n == 1 ? c : c & (0x7Fu >> n);
    for (int k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3Fu);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return i;
    i += n;
  }
  return s.size();
}


namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

// GPT-2's reversible map from bytes to printable code points.
std::array<std::string, 256> byte_to_unicode() {
  std::array<std::string, 256> out;
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    out[b] = s;
  }
  return out;
}

size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;  // invalid lead byte: treat as one unit
}

class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &off, nullptr);
    if (code_ == nullptr) throw Error("tokenizer: bad pre-tokenizer pattern");
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Splits s into matches and the gaps between them (Hugging Face "isolated" split). PCRE2 runs
  // with PCRE2_NO_UTF_CHECK, so it must only see valid UTF-8: each invalid byte is a piece of its
  // own (matching invalid UTF-8 crashed inside PCRE2's JIT code; found by fuzz_tokenizer).
  void split(std::string_view s, std::vector<std::string_view>& out) const {
    size_t i = 0;
    while (i < s.size()) {
      const size_t bad = first_invalid_utf8(s, i);
      if (bad > i) split_valid(s.substr(i, bad - i), out);
      if (bad >= s.size()) break;
      out.push_back(s.substr(bad, 1));
      i = bad + 1;
    }
  }

 private:
  void split_valid(std::string_view s, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, gap = 0;
    while (pos < s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty match: step one character
        pos = ov[0] + utf8_len(static_cast<unsigned char>(s[ov[0]]));
        continue;
      }
      if (ov[0] > gap) out.push_back(s.substr(gap, ov[0] - gap));
      out.push_back(s.substr(ov[0], ov[1] - ov[0]));
      pos = gap = ov[1];
    }
    if (gap < s.size()) out.push_back(s.substr(gap));
    pcre2_match_data_free(md);
  }

  pcre2_code* code_ = nullptr;
};

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string> pre_tokenizer_patterns(const std::string& pre) {
  if (pre == "gpt2" || pre == "default" || pre.empty()) return {kGpt2Pattern};
  if (pre == "smollm") return {R"(\p{N})", kGpt2Pattern};  // every digit alone, then GPT-2
  if (pre == "llama3" || pre == "llama-bpe") return {kLlama3Pattern};
  if (pre == "qwen2") return {kQwen2Pattern};
  throw FormatError("tokenizer: unsupported pre-tokenizer '" + pre +
                    "' (expected gpt2, smollm, llama3 or qwen2)");
}

}  // namespace

struct Tokenizer::Impl {
  TokenizerSpec spec;
  Vocab vocab;
  std::unordered_map<uint64_t, int> merge_rank;  // (left id, right id) -> rank
  std::vector<std::unique_ptr<Regex>> pre;
  std::vector<std::pair<std::string, int>> specials;  // matched in text, longest first
  std::array<int, 256> byte_token{};                  // SentencePiece byte fallback ids (-1: none)
  std::array<std::string, 256> b2u;                   // byte-level alphabet
  Vocab u2b;                                          // byte-level alphabet, reversed

  static uint64_t pair_key(int a, int b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  int find(std::string_view s) const {
    auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  }

  // Merge priority of two adjacent symbols: lower is better; nullopt when they do not merge.
  bool priority(std::string_view left, std::string_view right, int left_id, int right_id,
                std::string& tmp, double* prio) const {
    if (!spec.merges.empty()) {
      if (left_id < 0 || right_id < 0) return false;
      auto it = merge_rank.find(pair_key(left_id, right_id));
      if (it == merge_rank.end()) return false;
      *prio = it->second;
      return true;
    }
    tmp.assign(left);
    tmp.append(right);
    const int id = find(tmp);
    if (id < 0) return false;
    *prio = -static_cast<double>(spec.scores[id]);
    return true;
  }

  // BPE over one pre-token whose initial symbols are its UTF-8 characters.
  void bpe(std::string_view word, std::vector<int>& out) const {
    if (word.empty()) return;
    if (spec.ignore_merges) {
      const int id = find(word);
      if (id >= 0) {
        out.push_back(id);
        return;
      }
    }
    struct Sym {
      size_t start, len;
      int prev, next, id;
    };
    std::vector<Sym> sym;
    for (size_t i = 0; i < word.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
      sym.push_back({i, n, static_cast<int>(sym.size()) - 1, static_cast<int>(sym.size()) + 1,
                     find(word.substr(i, n))});
      i += n;
    }
    sym.back().next = -1;
    struct Cand {
      double prio;
      int left, right;
      size_t len;  // combined length when queued, to detect stale entries
      bool operator<(const Cand& o) const {  // max-heap: invert
        if (prio != o.prio) return prio > o.prio;
        return left > o.left;
      }
    };
    std::priority_queue<Cand> heap;
    std::string tmp;
    auto push = [&](int l) {
      if (l < 0 || sym[l].next < 0) return;
      const int r = sym[l].next;
      double p;
      if (priority(word.substr(sym[l].start, sym[l].len), word.substr(sym[r].start, sym[r].len),
                   sym[l].id, sym[r].id, tmp, &p))
        heap.push({p, l, r, sym[l].len + sym[r].len});
    };
    for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) push(i);
    while (!heap.empty()) {
      const Cand c = heap.top();
      heap.pop();
      Sym& l = sym[c.left];
      if (l.len == 0 || l.next != c.right || l.len + sym[c.right].len != c.len) continue;
      Sym& r = sym[c.right];
      l.len += r.len;
      l.id = find(word.substr(l.start, l.len));
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      r.len = 0;
      push(l.prev);
      push(c.left);
    }
    bool prev_unk = false;
    for (int i = 0; i >= 0; i = sym[i].next) {
      if (sym[i].id >= 0) {
        out.push_back(sym[i].id);
        prev_unk = false;
        continue;
      }
      bool bytes_ok = spec.kind == TokenizerKind::kSentencePieceBpe;
      for (size_t k = 0; bytes_ok && k < sym[i].len; ++k)
        bytes_ok = byte_token[static_cast<unsigned char>(word[sym[i].start + k])] >= 0;
      if (bytes_ok) {
        for (size_t k = 0; k < sym[i].len; ++k)
          out.push_back(byte_token[static_cast<unsigned char>(word[sym[i].start + k])]);
        prev_unk = false;
      } else if (spec.unk >= 0) {
        const bool fuse = spec.fuse_unk && prev_unk;
        if (!fuse) out.push_back(spec.unk);
        prev_unk = true;
        continue;
      }
    }
  }

  void encode_segment(std::string_view text, bool first_segment, std::vector<int>& out) const {
    if (text.empty()) return;
    if (spec.kind == TokenizerKind::kSentencePieceBpe) {
      std::string norm;
      if (spec.add_space_prefix && (first_segment || spec.space_prefix_per_segment)) norm += kSpace;
      for (char c : text) {
        if (c == ' ')
          norm += kSpace;
        else
          norm += c;
      }
      bpe(norm, out);
      return;
    }
    std::vector<std::string_view> pieces{text}, next;
    for (const auto& re : pre) {
      next.clear();
      for (std::string_view p : pieces) re->split(p, next);
      pieces.swap(next);
    }
    std::string mapped;
    for (std::string_view p : pieces) {
      mapped.clear();
      for (char c : p) mapped += b2u[static_cast<unsigned char>(c)];
      bpe(mapped, out);
    }
  }
};

Tokenizer::Tokenizer(TokenizerSpec spec) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.spec = std::move(spec);
  TokenizerSpec& s = m.spec;
  const int n = static_cast<int>(s.tokens.size());
  if (n == 0) throw FormatError("tokenizer: empty vocabulary");
  if (!s.types.empty() && static_cast<int>(s.types.size()) != n)
    throw FormatError("tokenizer: token_type has " + std::to_string(s.types.size()) +
                      " entries, expected " + std::to_string(n));
  if (s.types.empty()) s.types.assign(static_cast<size_t>(n), TokenType::kNormal);
  if (s.merges.empty() && static_cast<int>(s.scores.size()) != n)
    throw FormatError("tokenizer: needs merges or one score per token (" +
                      std::to_string(s.scores.size()) + " scores for " + std::to_string(n) +
                      " tokens)");
  for (int id : {s.bos, s.eos, s.unk})
    if (id >= n) throw FormatError("tokenizer: special token id " + std::to_string(id) + " >= vocab size");
  for (int i = 0; i < n; ++i) m.vocab.emplace(s.tokens[i], i);  // first id wins on duplicates
  for (size_t r = 0; r < s.merges.size(); ++r) {
    const int a = m.find(s.merges[r].first), b = m.find(s.merges[r].second);
    if (a < 0 || b < 0) continue;  // merges of unknown parts can never apply
    m.merge_rank.emplace(Impl::pair_key(a, b), static_cast<int>(r));
  }
  m.byte_token.fill(-1);
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    m.byte_token[b] = m.find(buf);
  }
  if (s.kind == TokenizerKind::kByteLevelBpe) {
    m.b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) m.u2b.emplace(m.b2u[b], b);
    for (const std::string& p : pre_tokenizer_patterns(s.pre)) m.pre.push_back(std::make_unique<Regex>(p));
  }
  for (int i = 0; i < n; ++i) {
    if ((s.types[i] == TokenType::kControl || s.types[i] == TokenType::kUserDefined) && !s.tokens[i].empty())
      m.specials.emplace_back(s.tokens[i], i);
  }
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int> out;
  if (add_bos && m.spec.bos >= 0) out.push_back(m.spec.bos);
  size_t seg = 0, i = 0;
  bool first = true;
  while (parse_special && i < text.size()) {
    int hit = -1;
    size_t hit_len = 0;
    for (const auto& [str, id] : m.specials) {
      if (text.compare(i, str.size(), str) == 0) {
        hit = id;
        hit_len = str.size();
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    m.encode_segment(text.substr(seg, i - seg), first, out);
    first = false;
    out.push_back(hit);
    i += hit_len;
    seg = i;
  }
  m.encode_segment(text.substr(seg), first, out);
  return out;
}

std::string Tokenizer::token_bytes(int id) const {
  const Impl& m = *impl_;
  if (id < 0 || id >= vocab_size()) return {};
  const TokenType t = m.spec.types[id];
  if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) return {};
  const std::string& s = m.spec.tokens[id];
  if (t == TokenType::kUserDefined) return s;
  std::string out;
  if (m.spec.kind == TokenizerKind::kByteLevelBpe) {
    for (size_t i = 0; i < s.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(s[i])), s.size() - i);
      auto it = m.u2b.find(std::string_view(s).substr(i, n));
      if (it != m.u2b.end())
        out += static_cast<char>(it->second);
      else
        out.append(s, i, n);
      i += n;
    }
    return out;
  }
  if (s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
      m.byte_token[std::stoi(s.substr(3, 2), nullptr, 16)] == id)
    return std::string(1, static_cast<char>(std::stoi(s.substr(3, 2), nullptr, 16)));
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kSpace.size(), kSpace) == 0) {
      out += ' ';
      i += kSpace.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int> ids) const {
  std::string out;
  TextStream ts(*this, true);
  for (int id : ids) out += ts.push(id);
  out += ts.flush();
  return out;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->spec.tokens.size()); }
int Tokenizer::bos() const { return impl_->spec.bos; }
int Tokenizer::eos() const { return impl_->spec.eos; }
bool Tokenizer::add_bos() const { return impl_->spec.add_bos; }
bool Tokenizer::adds_space_prefix() const {
  return impl_->spec.kind == TokenizerKind::kSentencePieceBpe && impl_->spec.add_space_prefix;
}
TokenizerKind Tokenizer::kind() const { return impl_->spec.kind; }
bool Tokenizer::is_control(int id) const {
  return id >= 0 && id < vocab_size() && impl_->spec.types[id] == TokenType::kControl;
}
bool Tokenizer::is_end_of_generation(int id) const {
  const auto& s = impl_->spec;
  return id == s.eos || std::find(s.end_of_generation.begin(), s.end_of_generation.end(), id) !=
                            s.end_of_generation.end();
}
int Tokenizer::token_id(std::string_view text) const { return impl_->find(text); }
const std::string& Tokenizer::token_text(int id) const { return impl_->spec.tokens.at(static_cast<size_t>(id)); }

std::string TextStream::push(int id) {
  std::string piece = tok_->token_bytes(id);
  if (piece.empty()) return {};
  if (at_start_) {
    if (tok_->adds_space_prefix() && piece[0] == ' ') piece.erase(0, 1);
    at_start_ = false;
  }
  pending_ += piece;
  // emit the longest prefix made of complete characters
  size_t i = 0, cut = 0;
  while (i < pending_.size()) {
    const unsigned char c = static_cast<unsigned char>(pending_[i]);
    size_t n = utf8_len(c);
    if ((c & 0xC0) == 0x80) n = 1;  // stray continuation byte: pass through
    if (i + n > pending_.size()) break;
    i += n;
    cut = i;
  }
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string TextStream::flush() {
  std::string out;
  if (!pending_.empty()) out = "\xEF\xBF\xBD";  // an incomplete character at the very end
  pending_.clear();
  return out;
}

}  // namespace squeezekv
