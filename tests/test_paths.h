// Paths the tests read: the shared test models and data, the committed references, the default model.
#pragma once
#include <string>

namespace squeezekv::test {

inline std::string shared_dir() { return SQUEEZEKV_SHARED_DIR; }
inline std::string ref_dir() { return SQUEEZEKV_REF_DIR; }
inline std::string default_model() { return SQUEEZEKV_DEFAULT_MODEL; }
inline std::string stories260k() { return shared_dir() + "/models/stories260k/stories260K.bin"; }
inline std::string tok512() { return shared_dir() + "/models/stories260k/tok512.bin"; }
inline std::string tinystories() { return shared_dir() + "/models/tinystories-656k"; }

}  // namespace squeezekv::test
