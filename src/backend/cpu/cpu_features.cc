// Run-time choice of the CPU kernels' instruction sets (cpu_features.h).
#include "backend/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace squeezekv::cpu {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    const char* cap = std::getenv("SQUEEZEKV_CPU");
    const bool avx2_only = cap != nullptr && std::strcmp(cap, "avx2") == 0;
#if SQUEEZEKV_AVX512_KERNEL
    c.avx512f = !avx2_only && __builtin_cpu_supports("avx512f");
#endif
#if SQUEEZEKV_VNNI_KERNEL
    c.avx512vnni = !avx2_only && __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512bw");
#endif
#if SQUEEZEKV_BF16_KERNEL
    c.avx512bf16 = !avx2_only && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
    (void)avx2_only;
    return c;
  }();
  return f;
}

}  // namespace squeezekv::cpu
