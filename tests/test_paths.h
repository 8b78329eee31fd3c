// Paths the tests read: the shared test models and data, the committed references, the default model.
#pragma once
#include <cstdlib>
#include <string>

namespace squeezekv::test {

// Built with AddressSanitizer (scripts/test's second pass, 10-25x slower): the tests that take
// longest there run fewer repeats or smaller inputs, never fewer checks.
#if defined(__SANITIZE_ADDRESS__)  // GCC
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)  // Clang
inline constexpr bool kSanitized = __has_feature(address_sanitizer);
#else
inline constexpr bool kSanitized = false;
#endif

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
