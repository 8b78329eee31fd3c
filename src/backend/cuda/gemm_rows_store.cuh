// The end of a decode batch's tensor-core product (gemm_rows.cu over bf16 weights, gemm_rows_q.cu
// over packed ones): each warp's m16 x (NT n8 tiles) f32 accumulators into out[B][R] (+ bias),
// the S column slices of a thread-block cluster added in slice order, so a sum's order is fixed
// by the matrix's shape alone.
#pragma once
#include <cooperative_groups.h>

#include <cstddef>

namespace squeezekv::cuda {

constexpr int kGemmRowsTile = 64;  // activation rows a block of either kernel: 4 m16 groups of warps

// acc: this warp's tiles, rows m0 .. m0 + 15 of the block (m0 = its m16 group * 16) and columns
// c0 + nt * 8 .. of the block's OUT weight rows, which start at r0; the block's activation rows
// start at tb. live: the warp's rows start below B. With S > 1, smem (the block's dynamic shared
// memory, free once its stages are done) holds the block's partials [64][OUT]; every thread of
// the cluster's blocks must call this.
template <int NT, int OUT, int S, int THREADS>
__device__ inline void store_rows(const float (&acc)[NT][4], float* out, const float* bias, int B, int R, int tb, int r0, int m0, int c0,
                                  bool live, unsigned char* smem) {
  const int lane = threadIdx.x % 32, tid = threadIdx.x;
  const int la = m0 + lane / 4, lb = la + 8;  // this thread's two rows of the accumulators, in the block
  if constexpr (S == 1) {
    if (!live) return;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = r0 + c0 + nt * 8 + (lane % 4) * 2 + e;
        if (col >= R) continue;
        const float b = bias != nullptr ? bias[col] : 0.0f;
        if (tb + la < B) out[static_cast<size_t>(tb + la) * R + col] = acc[nt][e] + b;
        if (tb + lb < B) out[static_cast<size_t>(tb + lb) * R + col] = acc[nt][2 + e] + b;
      }
  } else {
    // the slices' partials [64][OUT] in each block's shared memory; block `rank` of the cluster
    // then adds rows rank * 64 / S .. of every block's, in slice order
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    float* part = reinterpret_cast<float*>(smem);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int lc = c0 + nt * 8 + (lane % 4) * 2 + e;
        part[la * OUT + lc] = acc[nt][e];
        part[lb * OUT + lc] = acc[nt][2 + e];
      }
    cluster.sync();
    constexpr int kRowsEach = kGemmRowsTile / S;
    const int first = static_cast<int>(cluster.block_rank()) * kRowsEach;
    for (int i = tid; i < kRowsEach * OUT; i += THREADS) {
      const int lr = first + i / OUT, lc = i % OUT, row = tb + lr, col = r0 + lc;
      float sum = 0.0f;
#pragma unroll
      for (int z = 0; z < S; ++z) sum += cluster.map_shared_rank(part, z)[lr * OUT + lc];
      if (row < B && col < R) out[static_cast<size_t>(row) * R + col] = sum + (bias != nullptr ? bias[col] : 0.0f);
    }
    cluster.sync();  // every block's partials stay until the cluster has read them
  }
}

}  // namespace squeezekv::cuda
