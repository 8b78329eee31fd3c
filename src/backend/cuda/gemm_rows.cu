// Batched decode products on the tensor cores (gemm_rows.h). A block takes 64 activation rows (4
// warps of one m16 group each), OUT weight rows (32 or 64: OUT / 8 n8 tiles a warp) and one of S
// slices of the columns, and streams its weight rows and its activation rows (bf16 already)
// through shared memory in stages of 64 columns (cp.async, five in flight), the fragments from
// there by ldmatrix. The S blocks of one tile form a thread-block cluster: each leaves its partial
// sums in its shared memory and the cluster adds them in slice order (distributed shared memory),
// so a sum's order is fixed by the matrix's shape alone. Without the slices a block ran the whole
// row of 64-column stages one after another and took ~0.7 us a stage whatever B was (H200,
// 2026-12-01: 48 us for the 8 MB k matrix). The blocks that share a weight slice are adjacent in
// the grid (x: row groups), so a batch of more than 64 rows finds the slice in L2.
// Letters: B rows, R weight rows, C columns, S column slices.
#include "backend/cuda/gemm_rows.h"

#include <cuda_pipeline.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemm_rows_store.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kRowsPerBlock = kGemmRowsTile;
constexpr int kWarps = 4;
constexpr int kStages = 6;
constexpr int kLd = kGemmRowsK + 8;  // row pitch in halves: the 8 rows of an ldmatrix on different banks

template <int OUT>
constexpr size_t smem_bytes() {
  return sizeof(__nv_bfloat16) * kStages * (OUT + kRowsPerBlock) * kLd;
}

// grid (ceil(B / 64), ceil(R / OUT), S), clusters of (1, 1, S), block 128; shared memory
// smem_bytes<OUT>(). C % (S * kGemmRowsK) == 0.
template <int OUT, int S>
__global__ void __cluster_dims__(1, 1, S) __launch_bounds__(kWarps * 32)
    k_gemm_rows(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char gsm[];
  __nv_bfloat16* sw = reinterpret_cast<__nv_bfloat16*>(gsm);  // [stage][OUT][kLd] weight rows
  __nv_bfloat16* sx = sw + kStages * OUT * kLd;                // [stage][64][kLd] activation rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int tb = blockIdx.x * kRowsPerBlock, t0 = tb + warp * 16, r0 = blockIdx.y * OUT;
  const int n_chunks = C / kGemmRowsK / S, c0 = blockIdx.z * n_chunks;  // this block's slice of the columns
  const int rows = min(kRowsPerBlock, B - tb);  // live activation rows of the block
  auto issue = [&](int chunk) {
    if (chunk < n_chunks) {
      const int st = chunk % kStages, k0 = (c0 + chunk) * kGemmRowsK;
      __nv_bfloat16* dw = sw + st * OUT * kLd;
      __nv_bfloat16* dx = sx + st * kRowsPerBlock * kLd;
      constexpr int kPieces = kGemmRowsK / 8;  // 16-byte pieces of a row's chunk
      for (int c = tid; c < OUT * kPieces; c += kWarps * 32) {
        const int r = c / kPieces, piece = c % kPieces;
        const int row = min(r0 + r, R - 1);  // past R: the last row again (its outputs are not written)
        __pipeline_memcpy_async(dw + r * kLd + piece * 8, W + static_cast<size_t>(row) * C + k0 + piece * 8, 16);
      }
      for (int c = tid; c < kRowsPerBlock * kPieces; c += kWarps * 32) {
        const int r = c / kPieces, piece = c % kPieces;
        const bool in = r < rows;  // rows past B: zeros
        __pipeline_memcpy_async(dx + r * kLd + piece * 8, xb + static_cast<size_t>(tb + (in ? r : 0)) * C + k0 + piece * 8, 16,
                                in ? 0 : 16);
      }
    }
    __pipeline_commit();  // an empty group past the last chunk keeps the counting uniform
  };
  for (int s = 0; s < kStages - 1; ++s) issue(s);
  const bool live = t0 < B;
  float acc[OUT / 8][4] = {};
  for (int chunk = 0; chunk < n_chunks; ++chunk) {
    issue(chunk + kStages - 1);
    __pipeline_wait_prior(kStages - 1);
    __syncthreads();
    const __nv_bfloat16* wt = sw + (chunk % kStages) * OUT * kLd;
    const __nv_bfloat16* xt = sx + (chunk % kStages) * kRowsPerBlock * kLd + warp * 16 * kLd;
    if (live) {
#pragma unroll
      for (int kk = 0; kk < kGemmRowsK / 16; kk += 2) {  // two k16 steps per ldmatrix x4 of W
        uint32_t a[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int mi = lane / 8, rr = lane % 8;
          ldsm_x4(a[h], xt + (rr + (mi & 1) * 8) * kLd + (kk + h) * 16 + (mi >> 1) * 8);
        }
#pragma unroll
        for (int nt = 0; nt < OUT / 8; ++nt) {
          uint32_t b[4];  // b[0..1]: k-step kk, b[2..3]: kk + 1
          ldsm_x4(b, wt + (nt * 8 + lane % 8) * kLd + kk * 16 + (lane / 8) * 8);
          mma_bf16(acc[nt], a[0], b);
          mma_bf16(acc[nt], a[1], b + 2);
        }
      }
    }
    __syncthreads();  // the stage is refilled by a later issue()
  }
  store_rows<OUT / 8, OUT, S, kWarps * 32>(acc, out, bias, B, R, tb, r0, warp * 16, 0, live, gsm);
}

template <int OUT, int S>
void launch_out(Launcher& L, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  constexpr size_t smem = smem_bytes<OUT>();
  static_assert(sizeof(float) * kRowsPerBlock * OUT <= smem, "the partials fit the stages' memory");
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) {
    check(cudaFuncSetAttribute(k_gemm_rows<OUT, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "gemm rows smem");
    attribute_set = true;
  }
  const dim3 grid(static_cast<unsigned>((B + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>((R + OUT - 1) / OUT), S);
  L.launch(k_gemm_rows<OUT, S>, grid, kWarps * 32, smem, out, xb, W, bias, B, R, C);
}

template <int OUT>
void launch_slices(Launcher& L, int S, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  switch (S) {
    case 8: return launch_out<OUT, 8>(L, out, xb, W, bias, B, R, C);
    case 4: return launch_out<OUT, 4>(L, out, xb, W, bias, B, R, C);
    case 2: return launch_out<OUT, 2>(L, out, xb, W, bias, B, R, C);
    default: return launch_out<OUT, 1>(L, out, xb, W, bias, B, R, C);
  }
}

}  // namespace

int gemm_rows_slices_of(int tiles, int chunks) {
  int S = 1;
  while (S < 8 && tiles * S < kGemmRowsBlocks && chunks % (2 * S) == 0) S *= 2;
  return S;
}

int gemm_rows_slices(int R, int C) {
  const int out = R >= 8192 ? 64 : 32;
  return gemm_rows_slices_of((R + out - 1) / out, C / kGemmRowsK);
}

void launch_gemm_rows(Launcher& L, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  // 64 weight rows a block for the large matrices (gate, up, the output head), 32 for the small
  // ones (k, v: 1024 rows) so that they still spread over the SMs; the columns in slices until a
  // row group's blocks fill the device (gemm_rows_slices: from R and C alone)
  const int S = gemm_rows_slices(R, C);
  if (R >= 8192) launch_slices<64>(L, S, out, xb, W, bias, B, R, C);
  else launch_slices<32>(L, S, out, xb, W, bias, B, R, C);
}

}  // namespace squeezekv::cuda
