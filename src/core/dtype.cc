// Block sizes of the weight storage types (GGUF spec, ggml's docs/gguf.md; layouts in core/quant.h).
#include "squeezekv/dtype.h"

namespace squeezekv {

const DTypeInfo& dtype_info(DType t) {
  static const DTypeInfo kInfo[kDTypeCount] = {
      {"F32", 1, 4},        {"F16", 1, 2},       {"BF16", 1, 2},
      {"Q8_0", 32, 34},     {"Q4_0", 32, 18},    {"Q4_1", 32, 20},    {"Q5_0", 32, 22},    {"Q5_1", 32, 24},
      {"Q2_K", 256, 84},    {"Q3_K", 256, 110},  {"Q4_K", 256, 144},  {"Q5_K", 256, 176},  {"Q6_K", 256, 210},
      {"IQ4_NL", 32, 18},   {"IQ4_XS", 256, 136},
  };
  return kInfo[static_cast<int>(t)];
}

}  // namespace squeezekv
