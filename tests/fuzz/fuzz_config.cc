// Fuzz target: a Hugging Face config.json on its own (what --dummy reads, and the first file a
// Hugging Face directory is read by): read_hf_config + validate_config, then the bytes a dummy
// model of that shape would allocate, computed without allocating. It must end in a valid config
// or an Error naming the file; any other exception or a sanitizer report is a finding.
#include <cstdint>
#include <string_view>

#include "fuzz_util.h"
#include "model/loaders.h"
#include "squeezekv/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = squeezekv::fuzz::write_file("config.json", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    bool tied = false;
    const squeezekv::ModelConfig c = squeezekv::read_hf_config(path, &tied);
    squeezekv::validate_config(c, path);
    if (squeezekv::dummy_weight_bytes(c, tied) <= 0) __builtin_trap();  // a valid shape has weights
  } catch (const squeezekv::Error&) {
  }
  return 0;
}
