// The decode GEMV (gemv.h). Letters: T activation rows, R/C matrix rows/cols, D head dim.
#include "backend/cuda/gemv.h"

#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.h"
#include "backend/cuda/gemv_parts.cuh"

namespace squeezekv::cuda {
namespace {
using namespace gemv_detail;

constexpr int kGemvWarps = 8;  // a block's warps, splitting the columns

// One launch serves up to kMaxParts matrices that share their input (q, k, v; gate and up): the
// grid's blocks are dealt out to the parts, kGemvBlockRows matrix rows a block, all its warps
// splitting the columns (so even a 1024-row matrix fills its share of the device): each lane
// streams 16 bytes of every row per step, two steps in flight, the x values it loads serving all
// rows; partial sums meet in shared memory, where an epilogue may finish the op that follows the
// product: RoPE on q and k (a block's rows are whole rotation pairs), or SwiGLU (a block's rows are
// 4 of the gate's and the same 4 of the up's). Each output is the same float sum, in the same order,
// as a one-part launch, and the epilogues compute exactly what k_rope and k_silu_mul compute.
// Weights are read once, so their loads skip L1 (where x stays).
template <typename WT, int T>
__global__ void __launch_bounds__(kGemvWarps * 32, 2) k_gemv(const float* x, GemvParts P) {
  constexpr int RB = kGemvBlockRows;
  const int C = P.C;
  const int p = gemv_part(P);
  pdl_launch_next();
  const GemvRows g = gemv_rows(P, p, blockIdx.x - pick(P.first_block, p));
  const WT* wr[RB];
  gemv_row_starts(wr, P, g, C);
  pdl_wait();
  float acc[RB][T] = {};
#pragma unroll 2
  for (int c = threadIdx.x * 8; c < C; c += kGemvWarps * 32 * 8) {
    float xv[T][8];
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const float* xt = x + static_cast<size_t>(t) * C + c;
      const float4 a = *reinterpret_cast<const float4*>(xt), e = *reinterpret_cast<const float4*>(xt + 4);
      xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w, xv[t][4] = e.x, xv[t][5] = e.y, xv[t][6] = e.z, xv[t][7] = e.w;
    }
#pragma unroll
    for (int i = 0; i < RB; ++i) {
      float w[8];
      load8(wr[i] + c, w);
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[i][t] += w[k] * xv[t][k];
    }
  }
  gemv_finish<T, kGemvWarps>(P, p, g, acc);
}

template <typename WT>
void launch_k_gemv(Launcher& L, const float* x, const GemvParts& P, int T) {
  const unsigned grid = static_cast<unsigned>(P.first_block[P.n]);
  switch (T) {
    case 1: L.launch(k_gemv<WT, 1>, grid, kGemvWarps * 32, 0, x, P); break;
    case 2: L.launch(k_gemv<WT, 2>, grid, kGemvWarps * 32, 0, x, P); break;
    case 3: L.launch(k_gemv<WT, 3>, grid, kGemvWarps * 32, 0, x, P); break;
    default: L.launch(k_gemv<WT, 4>, grid, kGemvWarps * 32, 0, x, P); break;
  }
}

}  // namespace

bool launch_gemv(Launcher& L, const MatmulPart* parts, int n, const float* x, int T, bool swiglu) {
  if (T < 1 || T > kGemvRows) return false;
  const DType t = parts[0].w->type;
  if (parts[0].w->cols % 8 != 0 || (t != DType::BF16 && t != DType::F32)) return false;
  GemvParts P;
  if (!make_gemv_parts(P, parts, n, swiglu)) return false;
  if (t == DType::BF16) launch_k_gemv<__nv_bfloat16>(L, x, P, T);
  else launch_k_gemv<float>(L, x, P, T);
  rope_left(L, parts, n, P, T);
  return true;
}

}  // namespace squeezekv::cuda
