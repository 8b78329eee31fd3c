// Element-wise kernels of the forward pass: RoPE, SwiGLU's gate, residual adds, bias, bf16
// and f16 conversion, the split of a joined product into its parts and eviction_error's sums.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// x[T][n_heads][D] rotated in place at positions pos[T]; adjacent: pairs (2i, 2i+1), else (i, i + D/2)
void launch_rope(Launcher& L, float* x, const int32_t* pos, int64_t T, int n_heads, int D, const float* inv_freq, bool adjacent);
// g[n] = silu(g) * u
void launch_silu_mul(Launcher& L, float* g, const float* u, int64_t n);
// x[n] += y
void launch_add(Launcher& L, float* x, const float* y, int64_t n);
// out[n / R][R] += bias[R]
void launch_add_bias(Launcher& L, float* out, const float* bias, int64_t n, int R);
// out[n] = bf16(x)
void launch_to_bf16(Launcher& L, __nv_bfloat16* out, const float* x, int64_t n);
// out[n] = f16(x) (round to nearest; magnitudes past 65504 become infinite)
void launch_to_f16(Launcher& L, __half* out, const float* x, int64_t n);

// The parts of one product over matrices laid out together (q, k, v): part i is columns
// [begin[i], begin[i + 1]) of the joined rows, [T][begin[n]]. Passed by value (a kernel argument).
constexpr int kMaxSplitParts = 4;
struct SplitRows {
  float* out[kMaxSplitParts];         // [T][begin[i + 1] - begin[i]]
  const float* bias[kMaxSplitParts];  // [begin[i + 1] - begin[i]] or null
  int32_t begin[kMaxSplitParts + 1];  // every width even
  int32_t rope[kMaxSplitParts];       // 1: the part rotated as launch_rope does, after its bias
  int32_t n;
  int32_t D, adjacent;                // the RoPE's head dim and pairing
  const int32_t* pos;                 // [T]
  const float* inv_freq;              // [D/2]
};
// out_i[t][r] = joined[t][begin[i] + r] + bias_i[r], rotated where rope[i]: each part exactly as
// its own product, add_bias and rope would leave it (the same float operations)
void launch_split_rows(Launcher& L, const SplitRows& s, const float* joined, int64_t T);
// g[t][f] = silu(joined[t][f]) * joined[t][F + f] for f < F: SwiGLU's gate from one product over
// gate and up laid out together, as launch_silu_mul computes it from the two; with gb, g also as
// bf16 there ([T][F], rounded as launch_to_bf16 rounds), for the product that reads it next
void launch_silu_mul_split(Launcher& L, float* g, __nv_bfloat16* gb, const float* joined, int64_t T, int F);

// out[0] = sum (o - o_cut)^2, out[1] = sum o^2 over n values, in double (Backend::error_energy)
void launch_error_energy(Launcher& L, double* out, const float* o, const float* o_cut, int64_t n);

}  // namespace squeezekv::cuda
