// Block sizes of the weight storage types (GGUF spec, ggml's docs/gguf.md).
#include "squeezekv/dtype.h"

namespace squeezekv {

const DTypeInfo& dtype_info(DType t) {
  static const DTypeInfo kInfo[] = {
      {"F32", 1, 4},      {"F16", 1, 2},     {"BF16", 1, 2},    {"Q8_0", 32, 34},
      {"Q4_0", 32, 18},   {"Q4_1", 32, 20},  {"Q4_K", 256, 144}, {"Q6_K", 256, 210},
  };
  return kInfo[static_cast<int>(t)];
}

}  // namespace squeezekv
