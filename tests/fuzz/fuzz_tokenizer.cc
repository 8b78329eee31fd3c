// Fuzz target: encode any bytes with a real model's tokenizer (never throws, ids in range), and
// for valid UTF-8 decode(encode(s)) == s, and streaming the ids gives the same text. The model: $SQUEEZEKV_FUZZ_MODEL,
// else the default model of the build tree.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "squeezekv/model.h"
#include "squeezekv/tokenizer.h"

namespace {

const squeezekv::Tokenizer& tokenizer() {
  static std::unique_ptr<squeezekv::Model> m = [] {
    const char* p = std::getenv("SQUEEZEKV_FUZZ_MODEL");
    return squeezekv::Model::load(p != nullptr ? p : SQUEEZEKV_DEFAULT_MODEL);
  }();
  return m->tokenizer();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view s(reinterpret_cast<const char*>(data), size);
  const squeezekv::Tokenizer& tok = tokenizer();
  const auto ids = tok.encode(s, false, /*parse_special=*/false);  // must not throw on any bytes
  for (int id : ids)
    if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
  // A character the vocabulary lacks becomes the model's unk token (SmolLM2: <|endoftext|>, a
  // control token that decodes to nothing; found by this target with the byte 0x13), so the round
  // trip is promised for text whose characters are all in the vocabulary.
  bool has_unk = false;
  for (int id : ids) has_unk = has_unk || tok.is_control(id);
  if (squeezekv::first_invalid_utf8(s) == s.size() && !has_unk) {
    if (tok.decode(ids) != s) __builtin_trap();
    squeezekv::TextStream stream(tok, true);
    std::string streamed;
    for (int id : ids) streamed += stream.push(id);
    streamed += stream.flush();
    if (streamed != s) __builtin_trap();
  }
  return 0;
}
