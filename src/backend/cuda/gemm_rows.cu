// Batched decode products on the tensor cores (gemm_rows.h), the weights streamed the way the
// GEMV streams them. The weight rows are mma's A operand (m16) and the activation rows its B
// operand (n8: a batch of 8 rows fills it), both fragments read as 16-byte pieces: within 32
// columns, lane l takes the 8 values at column (l % 4) * 8 of its rows, which the m16n8k16
// fragments read as two k16 steps once the columns are permuted alike for both operands (step h's
// k values 2q, 2q + 1 are columns 8q + 4h, +1; its k values 8 + 2q, +1 are 8q + 4h + 2, +3; the
// order of a dot product's terms is fixed by this alone). So each warp streams its 16 weight rows
// from DRAM into registers, without shared memory (the next step's loads in flight while the
// current one multiplies, L1 skipped), and the block's activation rows (the same for its 8 warps)
// pass through shared memory in pieces of 256 columns, the next piece copied while the warps
// multiply the current one. A block takes 128 weight rows of one of S column slices; the S
// blocks of a tile form a thread-block cluster and add their partial sums in slice order through
// distributed shared memory, so every output's order is fixed by the matrix's shape alone:
// batch-invariant. Until 2026-12-04 the weights went through shared memory in 64-column stages
// with the activation rows as the m16 operand (2.0x the time at 64 rows, H200; docs/DESIGN.md).
// Letters: B activation rows, R weight rows, C columns, S column slices.
#include "backend/cuda/gemm_rows.h"

#include <cooperative_groups.h>

#include <cuda_pipeline.h>

#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kBlockRows = kWarps * 16;  // weight rows a block: one m16 tile a warp
constexpr int kPiece = 256;              // activation columns a stage of shared memory holds
constexpr int kXLd = kPiece + 32;        // its row pitch in values: a quarter warp's two rows on different banks
constexpr int kPartLd = kBlockRows + 4;  // partials' row pitch: a warp's stores on 32 banks

// 16 bytes of weights, read once: not kept in L1
__device__ inline uint4 load_weights(const __nv_bfloat16* p) {
  uint4 u;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
               : "l"(p));
  return u;
}

template <int NT>
constexpr size_t smem_bytes() {
  const size_t stages = sizeof(__nv_bfloat16) * 2 * NT * 8 * kXLd, partials = sizeof(float) * NT * 8 * kPartLd;
  return stages > partials ? stages : partials;
}

// grid (ceil(B / (NT * 8)), ceil(R / kBlockRows), S), clusters of (1, 1, S), block kWarps * 32,
// shared memory smem_bytes<NT>(). NT: n8 tiles of activation rows a block; CH: 32-column chunks a
// step of the weights' loads. C % (S * CH * 32) == 0.
template <int NT, int CH, int S>
__global__ void __cluster_dims__(1, 1, S) __launch_bounds__(kWarps * 32, 2)
    k_gemm_rows(float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  pdl_launch_next();
  extern __shared__ __align__(16) unsigned char gsm[];
  __nv_bfloat16* sx = reinterpret_cast<__nv_bfloat16*>(gsm);  // [2][NT * 8][kXLd]: the activation rows, a piece a stage
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int tb = blockIdx.x * NT * 8;                            // the block's first activation row
  const int rb = blockIdx.y * kBlockRows, r0 = rb + warp * 16;  // the block's and the warp's first weight row
  const int per = C / S, k0 = blockIdx.z * per;                  // the block's slice of the columns
  // rows past R read the last row again and rows past B the last activation row: their outputs
  // are not written, and no other output reads them
  const __nv_bfloat16* wa = W + static_cast<size_t>(min(r0 + g, R - 1)) * C + k0 + q * 8;
  const __nv_bfloat16* wb = W + static_cast<size_t>(min(r0 + g + 8, R - 1)) * C + k0 + q * 8;
  constexpr int kStep = CH * 32;
  const int steps = per / kStep;
  uint4 cur[CH][2], next[CH][2];  // [chunk][rows g, g + 8]
  auto load = [&](uint4 (&w)[CH][2], int s) {
#pragma unroll
    for (int c = 0; c < CH; ++c) {
      w[c][0] = load_weights(wa + s * kStep + c * 32);
      w[c][1] = load_weights(wb + s * kStep + c * 32);
    }
  };
  load(cur, 0);  // the weights do not depend on the kernels before: asked for before waiting on them
  pdl_wait();
  // piece p: columns [p * kPiece, min(per, (p + 1) * kPiece)) of the slice, into stage p % 2
  const int pieces = (per + kPiece - 1) / kPiece;
  auto stage = [&](int p) {
    if (p < pieces) {
      const int c0 = p * kPiece, width = min(kPiece, per - c0), n16 = width / 8;
      __nv_bfloat16* dst = sx + (p % 2) * NT * 8 * kXLd;
      for (int i = threadIdx.x; i < NT * 8 * n16; i += kWarps * 32) {
        const int row = i / n16, piece = i % n16;
        __pipeline_memcpy_async(dst + row * kXLd + piece * 8, xb + static_cast<size_t>(min(tb + row, B - 1)) * C + k0 + c0 + piece * 8, 16);
      }
    }
    __pipeline_commit();
  };
  stage(0);
  float acc[NT][4] = {};
  for (int p = 0, s = 0; p < pieces; ++p) {
    stage(p + 1);
    __pipeline_wait_prior(1);
    __syncthreads();
    const __nv_bfloat16* xs = sx + (p % 2) * NT * 8 * kXLd + g * kXLd + q * 8;
    const int end = min(steps, (p + 1) * (kPiece / kStep));
    for (; s < end; ++s) {
      if (s + 1 < steps) load(next, s + 1);
      const __nv_bfloat16* xc = xs + (s % (kPiece / kStep)) * kStep;
#pragma unroll
      for (int c = 0; c < CH; ++c) {
        const uint32_t a0[4] = {cur[c][0].x, cur[c][1].x, cur[c][0].y, cur[c][1].y};  // k16 step 0
        const uint32_t a1[4] = {cur[c][0].z, cur[c][1].z, cur[c][0].w, cur[c][1].w};  // k16 step 1
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint4 xv = *reinterpret_cast<const uint4*>(xc + nt * 8 * kXLd + c * 32);
          const uint32_t b0[2] = {xv.x, xv.y}, b1[2] = {xv.z, xv.w};
          mma_bf16(acc[nt], a0, b0);
          mma_bf16(acc[nt], a1, b1);
        }
      }
#pragma unroll
      for (int c = 0; c < CH; ++c) cur[c][0] = next[c][0], cur[c][1] = next[c][1];
    }
    __syncthreads();  // the stage is refilled by the next stage()
  }
  // acc[nt][e]: weight row r0 + g (e = 0, 1) or r0 + g + 8 (e = 2, 3), activation row
  // tb + nt * 8 + 2q + e % 2
  if constexpr (S == 1) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = tb + nt * 8 + 2 * q + e % 2, r = r0 + g + (e / 2) * 8;
        if (t < B && r < R) out[static_cast<size_t>(t) * R + r] = acc[nt][e] + (bias != nullptr ? bias[r] : 0.0f);
      }
  } else {
    // each block's partials [NT * 8][kPartLd] in its shared memory (the stages are done with);
    // block `rank` of the cluster then adds weight rows rank * kBlockRows / S .. of every
    // block's, in slice order
    namespace cg = cooperative_groups;
    float* part = reinterpret_cast<float*>(gsm);
    cg::cluster_group cluster = cg::this_cluster();
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) part[(nt * 8 + 2 * q + e % 2) * kPartLd + warp * 16 + g + (e / 2) * 8] = acc[nt][e];
    cluster.sync();
    constexpr int kRowsEach = kBlockRows / S;
    const int first = static_cast<int>(cluster.block_rank()) * kRowsEach;
    for (int i = threadIdx.x; i < NT * 8 * kRowsEach; i += kWarps * 32) {
      const int lt = i / kRowsEach, lr = first + i % kRowsEach, t = tb + lt, r = rb + lr;
      float sum = 0.0f;
#pragma unroll
      for (int z = 0; z < S; ++z) sum += cluster.map_shared_rank(part, z)[lt * kPartLd + lr];
      if (t < B && r < R) out[static_cast<size_t>(t) * R + r] = sum + (bias != nullptr ? bias[r] : 0.0f);
    }
    cluster.sync();  // every block's partials stay until the cluster has read them
  }
}

template <int NT, int CH, int S>
void launch_one(Launcher& L, const dim3& grid, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R,
                int C) {
  constexpr size_t smem = smem_bytes<NT>();
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) {
    check(cudaFuncSetAttribute(k_gemm_rows<NT, CH, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "gemm rows smem");
    attribute_set = true;
  }
  L.launch(k_gemm_rows<NT, CH, S>, grid, kWarps * 32, smem, out, xb, W, bias, B, R, C);
}

template <int NT, int CH>
void launch_slices(Launcher& L, int S, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  const dim3 grid(static_cast<unsigned>((B + NT * 8 - 1) / (NT * 8)), static_cast<unsigned>((R + kBlockRows - 1) / kBlockRows), S);
  switch (S) {
    case 8: return launch_one<NT, CH, 8>(L, grid, out, xb, W, bias, B, R, C);
    case 4: return launch_one<NT, CH, 4>(L, grid, out, xb, W, bias, B, R, C);
    case 2: return launch_one<NT, CH, 2>(L, grid, out, xb, W, bias, B, R, C);
    default: return launch_one<NT, CH, 1>(L, grid, out, xb, W, bias, B, R, C);
  }
}

template <int CH>
void launch_tiles(Launcher& L, int S, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C) {
  // n8 tiles a block: the fewest that hold B rows, up to 8 (more rows: more blocks
  // over the same weights, adjacent in the grid so that the later ones find them in L2)
  if (B <= 8) launch_slices<1, CH>(L, S, out, xb, W, bias, B, R, C);
  else if (B <= 16) launch_slices<2, CH>(L, S, out, xb, W, bias, B, R, C);
  else if (B <= 32) launch_slices<4, CH>(L, S, out, xb, W, bias, B, R, C);
  else launch_slices<8, CH>(L, S, out, xb, W, bias, B, R, C);
}

}  // namespace

int gemm_rows_slices_of(int tiles, int chunks) {
  int S = 1;
  while (S < 8 && tiles * S < kGemmRowsBlocks && chunks % (2 * S) == 0) S *= 2;
  return S;
}

int gemm_rows_slices(int R, int C) {
  // the S of 1, 2, 4, 8 (dividing the columns into whole 64-column steps) with the shortest time
  // in waves of kGemmRowsBlocks blocks, ceil(blocks / kGemmRowsBlocks) / S; the fewer slices on a tie
  const int tiles = (R + kBlockRows - 1) / kBlockRows, chunks = C / kGemmRowsK;
  int best = 1;
  for (int S = 2; S <= 8; S *= 2) {
    if (chunks % S != 0) break;
    const long waves = (static_cast<long>(tiles) * S + kGemmRowsBlocks - 1) / kGemmRowsBlocks;
    const long best_waves = (static_cast<long>(tiles) * best + kGemmRowsBlocks - 1) / kGemmRowsBlocks;
    if (waves * best < best_waves * S) best = S;
  }
  return best;
}

void launch_gemm_rows(Launcher& L, float* out, const __nv_bfloat16* xb, const __nv_bfloat16* W, const float* bias, int B, int R, int C,
                      int step) {
  // steps of 128 columns where a slice holds whole ones, except for 64 rows a block, whose
  // accumulators leave too few registers for them (H200, 2026-12-04: 64 x 512 decode 5,636 tok/s
  // with steps of 64, 5,321 with 128; 16 sequences 2,043 against 2,238)
  const int S = gemm_rows_slices(R, C);
  if (step == 128 && B <= 32 && (C / S) % 128 == 0) launch_tiles<4>(L, S, out, xb, W, bias, B, R, C);
  else launch_tiles<2>(L, S, out, xb, W, bias, B, R, C);
}

}  // namespace squeezekv::cuda
