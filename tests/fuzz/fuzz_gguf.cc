// Fuzz target: a GGUF file (header, metadata, tensor table, the tokenizer and config it carries)
// loaded as a model. Any input must end in a model or an Error, never a crash or a sanitizer report.
#include <cstdint>
#include <exception>
#include <string_view>

#include "fuzz_util.h"
#include "squeezekv/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      squeezekv::fuzz::write_file("model.gguf", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    auto m = squeezekv::Model::load(path);
    // a model that loads can also tokenize and describe itself
    (void)m->tokenizer().encode("Hello, world! 123", true);
    (void)m->weight_summary();
  } catch (const std::exception&) {
  }
  return 0;
}
