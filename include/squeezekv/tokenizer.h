// Text <-> token ids for the two tokenizer families of Llama-type models:
//  - byte-level BPE (GPT-2 style; SmolLM2, Llama-3, Qwen2): bytes mapped to printable characters,
//    a regex pre-tokenizer, merges by rank;
//  - SentencePiece-style BPE (Llama-2, Mistral, TinyStories, llama2.c): spaces as U+2581, merges by
//    rank (tokenizer.json) or by token score (GGUF "llama", llama2.c), byte fallback <0xNN>.
// Thread safety: immutable after construction; encode/decode may run concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace squeezekv {

enum class TokenizerKind : uint8_t { kByteLevelBpe, kSentencePieceBpe };
enum class TokenType : uint8_t { kNormal, kUnknown, kControl, kUserDefined, kUnused, kByte };

// Everything a loader reads from a model file; the Tokenizer validates it.
struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::kByteLevelBpe;
  std::vector<std::string> tokens;  // token text in the model's alphabet, by id
  std::vector<TokenType> types;     // empty: all normal
  std::vector<float> scores;        // used when merges is empty (SentencePiece scores)
  std::vector<std::pair<std::string, std::string>> merges;  // by rank, best first
  std::string pre = "gpt2";          // pre-tokenizer: gpt2 | smollm | llama3 | qwen2
  bool ignore_merges = false;        // a whole pre-token found in the vocab is taken as is
  bool fuse_unk = false;             // consecutive unknown pieces become one unk token
  int bos = -1, eos = -1, unk = -1;
  std::vector<int> end_of_generation;  // extra ids that end a turn (<|im_end|>, <|eot_id|>)
  bool add_bos = false;
  bool add_space_prefix = true;        // SentencePiece: U+2581 before the text
  bool space_prefix_per_segment = false;  // tokenizer.json Prepend normalizer: before every segment
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerSpec spec);  // throws FormatError on an inconsistent spec
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Special (control / user-defined) tokens written in the text are matched as such when
  // parse_special is true. BOS is prepended when add_bos is true and the model has one.
  std::vector<int> encode(std::string_view text, bool add_bos, bool parse_special = true) const;

  // Raw bytes a token stands for (may be part of a UTF-8 character); control tokens give "".
  std::string token_bytes(int id) const;
  // Whole sequence; control tokens skipped; SentencePiece's leading dummy space removed.
  std::string decode(std::span<const int> ids) const;

  int vocab_size() const;
  int bos() const;
  int eos() const;
  bool add_bos() const;
  bool adds_space_prefix() const;
  bool is_end_of_generation(int id) const;
  bool is_control(int id) const;
  TokenizerKind kind() const;
  int token_id(std::string_view text) const;  // -1 when absent
  const std::string& token_text(int id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The offset of the first byte from `from` that does not start a valid UTF-8 character (no
// overlong forms, no surrogates, at most U+10FFFF); s.size() when the rest is valid.
size_t first_invalid_utf8(std::string_view s, size_t from = 0);

// Turns a stream of token ids into text, emitting whole UTF-8 characters only.
class TextStream {
 public:
  // at_start: the next token opens the text (its SentencePiece dummy space is dropped).
  explicit TextStream(const Tokenizer& tok, bool at_start = true) : tok_(&tok), at_start_(at_start) {}
  std::string push(int id);  // complete characters available so far
  std::string flush();       // whatever remains (invalid bytes become U+FFFD)

 private:
  const Tokenizer* tok_;
  bool at_start_;
  std::string pending_;
};

}  // namespace squeezekv
