// Paths the tests read: the shared test models and data, the committed references, the default model.
#pragma once
#include <cstdlib>
#include <string>

namespace squeezekv::test {

// The environment may move them (a test binary run on another machine, e.g. the GPU machine).
inline std::string env_or(const char* name, const char* fallback) {
  const char* e = std::getenv(name);
  return e != nullptr && *e != 0 ? e : fallback;
}
inline std::string shared_dir() { return env_or("SQUEEZEKV_TEST_SHARED", SQUEEZEKV_SHARED_DIR); }
inline std::string ref_dir() { return env_or("SQUEEZEKV_TEST_REF", SQUEEZEKV_REF_DIR); }
inline std::string default_model() { return env_or("SQUEEZEKV_TEST_DEFAULT_MODEL", SQUEEZEKV_DEFAULT_MODEL); }
inline std::string stories260k() { return shared_dir() + "/models/stories260k/stories260K.bin"; }
inline std::string tok512() { return shared_dir() + "/models/stories260k/tok512.bin"; }
inline std::string tinystories() { return shared_dir() + "/models/tinystories-656k"; }

}  // namespace squeezekv::test
