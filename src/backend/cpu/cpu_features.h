// Which optional instruction sets the CPU kernels use, decided once at run time: what the CPU
// runs (and the build compiled), capped by the environment variable SQUEEZEKV_CPU so that tests
// can run every path on one machine: "avx2" turns the AVX-512 and AMX kernels off, "avx512" the
// AMX kernels alone; unset or "native" uses all the CPU has. AVX2 + FMA + F16C is the baseline
// the build targets. SQUEEZEKV_CPU_HALF_ROWS=0 keeps BF16 and F16 decode rows on the exact f32
// dot where the 512-bit kernels would take them, and SQUEEZEKV_CPU_HALF_ROWS_AHEAD=N (0 to 65536)
// has those kernels ask for the rows N bytes ahead as the f32 dot asks for 4 KB; unset, 4096 on
// Intel CPUs and 0 elsewhere (on the GPU machine's Xeon asking 4 KB ahead read the rows 16-33%
// faster, on this project's AMD EPYC up to 44% slower; docs/PERFORMANCE.md, issue 32).
// Thread safety: read-only after the first call.
#pragma once

namespace squeezekv::cpu {

struct CpuFeatures {
  bool avx512f = false;     // the AVX-512 prompt tiles (gemm_avx512.cc)
  bool avx512vnni = false;  // AVX-512 VNNI (+VL) integer dots for the 8-row tiles (tile8_vnni.cc)
  bool avx512bf16 = false;  // AVX-512 BF16 products for BF16 weights' prompt chunks (gemm_bf16.cc)
  bool amx_bf16 = false;    // AMX tiles for BF16 weights' prompt chunks (gemm_amx.cc): the CPU has them
                            // and Linux let this process use them (arch_prctl XTILEDATA)
  bool half_rows = true;    // BF16 and F16 decode rows through dot_rows / dot_rows_f16 where the CPU has
                            // their instructions (SQUEEZEKV_CPU_HALF_ROWS=0: the exact f32 dot)
  int half_rows_ahead = 0;  // bytes of rows asked for (software prefetch) ahead of the row those kernels
                            // sum (0: the hardware prefetchers alone): SQUEEZEKV_CPU_HALF_ROWS_AHEAD=N,
                            // unset 4096 on Intel CPUs, 0 elsewhere
};

const CpuFeatures& cpu_features();

// Throws Error naming SQUEEZEKV_CPU when it is set to anything but native, avx512 or avx2,
// SQUEEZEKV_CPU_HALF_ROWS to anything but 0 or 1, or SQUEEZEKV_CPU_HALF_ROWS_AHEAD to anything but
// a whole number from 0 to 65536 (checked where a backend is made, before any kernel reads
// cpu_features()).
void check_cpu_cap();

}  // namespace squeezekv::cpu
