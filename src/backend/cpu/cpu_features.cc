// Run-time choice of the CPU kernels' instruction sets (cpu_features.h).
#include "backend/cpu/cpu_features.h"

#include "squeezekv/error.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace squeezekv::cpu {
namespace {

// AMX: CPUID leaf 7 EDX bits 22 (AMX-BF16) and 24 (AMX-TILE), and Linux's permission for this
// process to use the 8 KB tile state (asked once; the kernel refuses where the hypervisor or the
// OS does not enable it, and then no tile instruction runs).
bool amx_bf16_usable() {
#if defined(__linux__) && SQUEEZEKV_AMX_KERNEL
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if (((d >> 22) & 1) == 0 || ((d >> 24) & 1) == 0) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// SQUEEZEKV_CPU's values, each capping the kernels more than the one before it.
constexpr const char* kCaps[] = {"native", "avx512", "avx2"};

// SQUEEZEKV_CPU's index in kCaps (0 when unset), -1 for a value not there.
int cap_level() {
  const char* cap = std::getenv("SQUEEZEKV_CPU");
  if (cap == nullptr) return 0;
  for (int i = 0; i < 3; ++i)
    if (std::strcmp(cap, kCaps[i]) == 0) return i;
  return -1;
}

// SQUEEZEKV_CPU_HALF_ROWS: 1 (unset) or 0; -1 for anything else.
int half_rows_setting() {
  const char* e = std::getenv("SQUEEZEKV_CPU_HALF_ROWS");
  if (e == nullptr || std::strcmp(e, "1") == 0) return 1;
  return std::strcmp(e, "0") == 0 ? 0 : -1;
}

// SQUEEZEKV_CPU_HALF_ROWS_AHEAD: bytes from 0 to 65536; kAheadUnset when unset, kAheadBad for anything else.
constexpr int kAheadUnset = -2, kAheadBad = -1;
int half_rows_ahead_setting() {
  const char* e = std::getenv("SQUEEZEKV_CPU_HALF_ROWS_AHEAD");
  if (e == nullptr) return kAheadUnset;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  return end == e || *end != '\0' || v < 0 || v > 65536 ? kAheadBad : static_cast<int>(v);
}

// CPUID leaf 0's vendor string is "GenuineIntel".
bool intel_cpu() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  char v[12];
  std::memcpy(v, &b, 4), std::memcpy(v + 4, &d, 4), std::memcpy(v + 8, &c, 4);
  return std::memcmp(v, "GenuineIntel", 12) == 0;
}

// The 16-bit decode rows' software prefetch where SQUEEZEKV_CPU_HALF_ROWS_AHEAD is unset: 4 KB
// ahead on Intel CPUs, none elsewhere. Measured 2026-12-08 beside llama.cpp
// (bench/cpu_half_rows_device.sh, docs/PERFORMANCE.md issue 32): on the GPU machine's 16-core Xeon
// 4 KB ahead read BF16 rows 20-25% and F16 rows 16-33% faster than none at 1, 4 and 16 threads; on
// this project's AMD EPYC (family 26) instances it moved BF16 by -15% to +7% and F16 by -44% to -5%
// at one thread (2026-12-07).
int default_half_rows_ahead() { return intel_cpu() ? 4096 : 0; }

}  // namespace

void check_cpu_cap() {
  if (cap_level() < 0)
    throw Error(std::string("SQUEEZEKV_CPU: expected native, avx512 or avx2, got '") + std::getenv("SQUEEZEKV_CPU") + "'");
  if (half_rows_setting() < 0)
    throw Error(std::string("SQUEEZEKV_CPU_HALF_ROWS: expected 0 or 1, got '") + std::getenv("SQUEEZEKV_CPU_HALF_ROWS") + "'");
  if (half_rows_ahead_setting() == kAheadBad)
    throw Error(std::string("SQUEEZEKV_CPU_HALF_ROWS_AHEAD: expected bytes from 0 to 65536, got '") +
                std::getenv("SQUEEZEKV_CPU_HALF_ROWS_AHEAD") + "'");
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    const int level = cap_level();  // a value check_cpu_cap refuses caps nothing here
    const bool avx2_only = level == 2, no_amx = level >= 1;
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
    // the AVX-512 BF16 kernel rounds the activations, packs the panels and takes matrices whose
    // column pairs are not whole tiles
    c.amx_bf16 = !no_amx && c.avx512bf16 && amx_bf16_usable();
    c.half_rows = half_rows_setting() != 0;
    const int ahead = half_rows_ahead_setting();
    c.half_rows_ahead = ahead == kAheadUnset ? default_half_rows_ahead() : std::max(0, ahead);  // a value check_cpu_cap refuses asks nothing
    (void)avx2_only;
    return c;
  }();
  return f;
}

}  // namespace squeezekv::cpu
