// Fuzz target: a Hugging Face model directory: config.json, tokenizer.json, model.safetensors and
// model.safetensors.index.json (the shard index: when present, the loader reads the shards it
// names), cut from one input at the separator "\n#--file--#\n" (missing parts are missing files).
#include <cstdint>
#include <exception>
#include <filesystem>
#include <string_view>

#include "fuzz_util.h"
#include "squeezekv/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size), sep = "\n#--file--#\n";
  const char* names[] = {"config.json", "tokenizer.json", "model.safetensors", "model.safetensors.index.json"};
  const auto dir = squeezekv::fuzz::work_dir() / "hf";
  std::filesystem::create_directories(dir);
  size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    std::filesystem::remove(dir / names[i]);
    if (at > in.size()) continue;
    const size_t end = std::min(in.find(sep, at), in.size());
    squeezekv::fuzz::write_file(std::string("hf/") + names[i], in.substr(at, end - at));
    at = end + sep.size();
  }
  try {
    auto m = squeezekv::Model::load(dir.string());
    (void)m->tokenizer().encode("Hello, world! 123", true);
  } catch (const std::exception&) {
  }
  return 0;
}
