// Token ids must equal Hugging Face `tokenizers` on a corpus of 220 strings (unicode, emoji, code,
// digits, whitespace runs, real prose) for both tokenizer families, and decode(encode(s)) == s.
// References: tests/ref/tokenizer_*.json, written by scripts/make_reference.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "squeezekv/generate.h"
#include "squeezekv/model.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

nlohmann::json load_ref(const std::string& name) {
  std::ifstream in(test::ref_dir() + "/" + name);
  EXPECT_TRUE(in.good()) << name;
  return nlohmann::json::parse(in);
}

// decode(encode(s)) == s for every string the vocabulary can spell; at least min_spelled of them.
void check_parity(const Tokenizer& tok, const std::string& ref_name, int unk, size_t min_spelled) {
  const auto ref = load_ref(ref_name);
  ASSERT_GE(ref.size(), 200u);
  int mismatches = 0;
  size_t spelled = 0;
  for (const auto& row : ref) {
    const std::string text = row["text"];
    const std::vector<int> want = row["ids"];
    const std::vector<int> got = tok.encode(text, /*add_bos=*/false);
    if (got != want && ++mismatches <= 10) ADD_FAILURE() << ref_name << ": ids differ for " << nlohmann::json(text).dump();
    // a text with characters the vocabulary cannot spell (no byte fallback) maps them to <unk>
    const bool has_unk = std::find(got.begin(), got.end(), unk) != got.end();
    if (!has_unk) {
      EXPECT_EQ(tok.decode(got), text) << ref_name;
    }
    spelled += !has_unk;
  }
  EXPECT_EQ(mismatches, 0) << ref_name;
  EXPECT_GE(spelled, min_spelled) << ref_name;
}

TEST(Tokenizer, SmolLM2ByteLevelMatchesHuggingFace) {
  auto m = Model::load(test::default_model());
  EXPECT_EQ(m->tokenizer().kind(), TokenizerKind::kByteLevelBpe);
  check_parity(m->tokenizer(), "tokenizer_smollm2.json", -1, 220);  // byte-level spells everything
}

TEST(Tokenizer, TinyStoriesSentencePieceMatchesHuggingFace) {
  auto m = Model::load(test::tinystories());
  EXPECT_EQ(m->tokenizer().kind(), TokenizerKind::kSentencePieceBpe);
  // TinyStories has no byte tokens: non-ASCII scripts and emoji become <unk> (id 0), as in HF
  check_parity(m->tokenizer(), "tokenizer_tinystories.json", 0, 90);  // 94 of 220 are spellable
}

// Llama-3's and Qwen2's pre-tokenizer regexes (lookaheads, case-insensitive contractions, digit
// groups) over SmolLM2's vocabulary and merges, against tokenizers with the same Split patterns.
TEST(Tokenizer, Llama3AndQwen2PreTokenizersMatchHuggingFace) {
  const GgufFile f(test::default_model());
  TokenizerSpec base;
  base.kind = TokenizerKind::kByteLevelBpe;
  base.tokens = f.find("tokenizer.ggml.tokens")->strings;
  for (const std::string& m : f.find("tokenizer.ggml.merges")->strings) {
    const size_t sp = m.find(' ', 1);
    base.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  for (const auto& [pre, ref, ignore] : {std::tuple{"llama3", "tokenizer_llama3_pre.json", true},
                                         std::tuple{"qwen2", "tokenizer_qwen2_pre.json", false}}) {
    TokenizerSpec spec = base;
    spec.pre = pre;
    spec.ignore_merges = ignore;
    const Tokenizer tok(spec);
    check_parity(tok, ref, -1, 220);
  }
}

TEST(Tokenizer, SpecialTokensAndBos) {
  auto m = Model::load(test::default_model());
  const Tokenizer& t = m->tokenizer();
  EXPECT_EQ(t.bos(), 1);  // <|im_start|> per the GGUF; SmolLM2 adds no BOS by itself
  EXPECT_FALSE(t.add_bos());
  const auto ids = t.encode("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(ids.back(), 2);
  EXPECT_TRUE(t.is_end_of_generation(2));
  // parse_special = false: the markers are plain text
  const auto plain = t.encode("<|im_start|>", false, false);
  EXPECT_GT(plain.size(), 1u);
}

TEST(Tokenizer, Llama2cTokenizerAddsBosAndDummyPrefix) {
  auto m = Model::load(test::stories260k(), {test::tok512()});
  const Tokenizer& t = m->tokenizer();
  const auto ids = t.encode("Once upon a time", true);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(t.decode(ids), "Once upon a time");
  // byte fallback for characters outside the 512-token vocabulary
  const std::string odd = "ü😀";
  EXPECT_EQ(t.decode(t.encode(odd, false)), odd);
}

TEST(TextStream, EmitsWholeCharactersOnly) {
  auto m = Model::load(test::default_model());
  const Tokenizer& t = m->tokenizer();
  const std::string text = "héllo 😀 日本";
  const auto ids = t.encode(text, false);
  TextStream ts(t);
  std::string out;
  for (int id : ids) {
    const std::string piece = ts.push(id);
    // every emitted piece is valid UTF-8 on its own: it never ends inside a character
    if (!piece.empty()) {
      const unsigned char last = static_cast<unsigned char>(piece.back());
      size_t i = piece.size() - 1;
      while (i > 0 && (static_cast<unsigned char>(piece[i]) & 0xC0) == 0x80) --i;
      const unsigned char lead = static_cast<unsigned char>(piece[i]);
      const size_t need = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : 4;
      EXPECT_EQ(piece.size() - i, need) << "piece ends inside a character: " << int(last);
    }
    out += piece;
  }
  out += ts.flush();
  EXPECT_EQ(out, text);
}

}  // namespace
}  // namespace squeezekv
