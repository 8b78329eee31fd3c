// Fuzz target: a llama2.c checkpoint and its tokenizer file (tok*.bin). The first input byte
// picks which file the rest of the input is; the other one is a small valid file made here, so
// either loader is reached with the other side intact. Any input must end in a model or an Error,
// never a crash or a sanitizer report.
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "squeezekv/model.h"

namespace {

// dim 8, ffn 16, 1 layer, 2 heads, 2 kv heads, vocab 8, seq 4: header then f32 weights (shared head)
std::string tiny_checkpoint() {
  const int32_t h[7] = {8, 16, 1, 2, 2, 8, 4};
  const int64_t E = 8, F = 16, V = 8, D = 4, seq = 4;
  const int64_t floats = V * E + E + 4 * E * E + E + 3 * F * E + E + seq * D;
  std::string s(reinterpret_cast<const char*>(h), sizeof h);
  std::vector<float> w(static_cast<size_t>(floats));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(static_cast<int>(i % 17) - 8);
  s.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  return s;
}

// 8 tokens: <unk>, <s>, </s>, then "a", "b", " ", "ab", "<0x41>"
std::string tiny_tokenizer() {
  const char* tokens[] = {"<unk>", "<s>", "</s>", "a", "b", " ", "ab", "<0x41>"};
  std::string s;
  const int32_t max_len = 6;
  s.append(reinterpret_cast<const char*>(&max_len), 4);
  for (int i = 0; i < 8; ++i) {
    const float score = -static_cast<float>(i);
    const int32_t len = static_cast<int32_t>(std::strlen(tokens[i]));
    s.append(reinterpret_cast<const char*>(&score), 4);
    s.append(reinterpret_cast<const char*>(&len), 4);
    s.append(tokens[i], static_cast<size_t>(len));
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const std::string checkpoint = tiny_checkpoint(), tokenizer = tiny_tokenizer();
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool fuzz_tokenizer = data[0] & 1;
  const std::string ckpt = squeezekv::fuzz::write_file("model.bin", fuzz_tokenizer ? std::string_view(checkpoint) : rest);
  const std::string tok = squeezekv::fuzz::write_file("tok.bin", fuzz_tokenizer ? rest : std::string_view(tokenizer));
  try {
    auto m = squeezekv::Model::load(ckpt, squeezekv::LoadOptions{tok});
    const auto ids = m->tokenizer().encode("ab a\xF0\x9F\x99\x82 b", true);
    (void)m->tokenizer().decode(ids);
  } catch (const std::exception&) {
  }
  return 0;
}
