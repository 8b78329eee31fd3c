// Prompt attention on the tensor cores (attn_mma.h).
// Flash attention (FlashAttention-2's loop) with mma.sync m16n8k16 (f16 in, f32 accumulate) for
// f16 KV and head dims 64 or 128: a block takes the query rows of 64 / grp tokens of one kv head g
// (row r = token t0 + r / grp, query head g * grp + r % grp, so the heads that share g read each
// K/V tile once; rows past qt * grp stay empty), 4 warps of 16 rows; K/V tiles of kMmaKeys keys
// stream through shared memory two deep (cp.async). S = Q K^T and O += P V run on the tensor
// cores; the softmax is online, per row, in base 2 (q is scaled by scale * log2 e); P goes from
// the S accumulators straight into the A operand of the second product (their layouts coincide).
// Key j is visible to row r iff pos[j] <= q_pos[t] (dead slots hold the largest position). It
// writes the output and, per row, the max and sum (ml, natural-log units, as k_attn does), which
// the policies' mass pass reads.
#include "backend/cuda/attn_mma.h"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include <climits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/mma.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kMmaWarps = 4;

template <int D>
__host__ __device__ constexpr size_t mma_smem_bytes() {
  return sizeof(__half) * (kMmaRows + 4 * kMmaKeys) * (D + 8) + sizeof(int32_t) * 2 * kMmaKeys;
}

// What k_attn_mma and k_attn_mma_mass share, so both compute S = Q K^T with the same bits.
// One tile's copies into stage st: K (and V when sv is given) rows j0.. (past N: zeros, a finite
// V row times P = 0) and their positions (past N: INT_MAX, masked), then one commit.
template <int D, bool kWithV>
__device__ inline void mma_issue_tile(__half* sk, __half* sv, int32_t* sp, const __half* Kg, const __half* Vg,
                                      const int32_t* Pg, int j0, int st, int N, int tid) {
  constexpr int LD = D + 8, CH = D / 8;  // CH: 16-byte pieces of a row
  for (int c = tid; c < kMmaKeys * CH; c += kMmaWarps * 32) {
    const int r = c / CH, piece = c % CH, j = j0 + r;
    const int src_row = j < N ? j : 0;
    const int zfill = j < N ? 0 : 16;
    __pipeline_memcpy_async(sk + (st * kMmaKeys + r) * LD + piece * 8, Kg + static_cast<size_t>(src_row) * D + piece * 8, 16, zfill);
    if constexpr (kWithV)
      __pipeline_memcpy_async(sv + (st * kMmaKeys + r) * LD + piece * 8, Vg + static_cast<size_t>(src_row) * D + piece * 8, 16, zfill);
  }
  for (int r = tid; r < kMmaKeys; r += kMmaWarps * 32) {
    if (j0 + r < N) __pipeline_memcpy_async(sp + st * kMmaKeys + r, Pg + j0 + r, 4);
    else sp[st * kMmaKeys + r] = INT_MAX;
  }
}
// The block's query rows (row r: token t0 + r / grp, head g * grp + r % grp), scaled by
// scale * log2 e, as f16 into sq [kMmaRows][D + 8]; rows past qt * grp or T are zeros. Then, after
// a barrier, warp rows rb.. rb + 15 as mma A operands qa [D / 16][4].
template <int D>
__device__ inline void mma_load_q(uint32_t (&qa)[D / 16][4], __half* sq, const float* q, const AttnShape& a, int g, int t0,
                                  int rb, int lane, int tid) {
  constexpr int LD = D + 8;
  constexpr float kLog2e = 1.4426950408889634f;
  for (int i = tid; i < kMmaRows * D / 2; i += kMmaWarps * 32) {
    const int r = i / (D / 2), d = (i % (D / 2)) * 2, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    float2 v = make_float2(0.0f, 0.0f);
    if (r < a.qt * a.grp && t < a.T) v = *reinterpret_cast<const float2*>(q + (static_cast<size_t>(t) * a.H + h) * D + d);
    const float s = a.scale * kLog2e;
    *reinterpret_cast<__half2*>(sq + r * LD + d) = __floats2half2_rn(v.x * s, v.y * s);
  }
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int mi = lane / 8, rr = lane % 8;
    ldsm_x4(qa[ks], sq + (rb + rr + (mi & 1) * 8) * LD + ks * 16 + (mi >> 1) * 8);
  }
}
// The block of kv head g whose query rows start at token t0 (k_attn_mma: one chunk's; k_attn_mma_parts:
// one part's of a batch).
template <int D>
__device__ __forceinline__ void mma_attend(float* out, __nv_bfloat16* ob, float* ml, const float* q, const int32_t* q_pos,
                                           const KvView& kv, const AttnShape& a, int g, int t0) {
  constexpr int LD = D + 8;  // row pitch in halves: 8 rows of an ldmatrix fall on different banks
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char msm[];
  __half* sq = reinterpret_cast<__half*>(msm);       // [kMmaRows][LD]
  __half* sk = sq + kMmaRows * LD;                    // [2][kMmaKeys][LD]
  __half* sv = sk + 2 * kMmaKeys * LD;                // [2][kMmaKeys][LD]
  int32_t* sp = reinterpret_cast<int32_t*>(sv + 2 * kMmaKeys * LD);  // [2][kMmaKeys]
  const int grp = a.grp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int N = kv.count_dev != nullptr ? *kv.count_dev : a.N;
  const __half* Kg = static_cast<const __half*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const __half* Vg = static_cast<const __half*>(kv.v) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  const int n_tiles = (N + kMmaKeys - 1) / kMmaKeys;
  auto issue = [&](int tile) {
    if (tile < n_tiles) mma_issue_tile<D, true>(sk, sv, sp, Kg, Vg, Pg, tile * kMmaKeys, tile % 2, N, tid);
    __pipeline_commit();
  };
  issue(0);
  const int rb = warp * 16;
  uint32_t qa[D / 16][4];
  mma_load_q<D>(qa, sq, q, a, g, t0, rb, lane, tid);
  // this thread's two rows: rb + lane / 4 and rb + 8 + lane / 4
  int qp[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    qp[i] = (r < a.qt * grp && t < a.T) ? q_pos[t] : INT_MIN;  // INT_MIN: sees nothing
  }
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  for (int tile = 0; tile < n_tiles; ++tile) {
    issue(tile + 1);
    __pipeline_wait_prior(1);
    __syncthreads();
    const int st = tile % 2;
    const __half* kt = sk + st * kMmaKeys * LD;
    const __half* vt = sv + st * kMmaKeys * LD;
    const int32_t* pt = sp + st * kMmaKeys;
    float s[kMmaKeys / 8][4];
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) mma_scores<D>(s[nt], qa, kt, nt, lane);
    // mask, then the online softmax of the two rows
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = nt * 8 + (lane % 4) * 2 + e;
          float& x = s[nt][2 * i + e];
          x = pt[j] <= qp[i] ? x : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[i], mx), ref = mn == -INFINITY ? 0.0f : mn;
      const float alpha = exp2f(m[i] - ref);
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[nt][2 * i + e];
          x = exp2f(x - ref);
          sum += x;
        }
      l[i] = l[i] * alpha + sum;
      m[i] = mn;
#pragma unroll
      for (int nd = 0; nd < D / 8; ++nd) o[nd][2 * i] *= alpha, o[nd][2 * i + 1] *= alpha;
    }
    // O += P V: P from the S accumulators (k-step kk: key tiles 2kk and 2kk + 1)
#pragma unroll
    for (int kk = 0; kk < kMmaKeys / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int nd = 0; nd < D / 8; nd += 2) {
        uint32_t b[4];  // b[0..1]: d tile nd, b[2..3]: nd + 1
        const int mi = lane / 8, rr = lane % 8;
        ldsm_x4_trans(b, vt + (kk * 16 + rr + (mi & 1) * 8) * LD + nd * 8 + (mi >> 1) * 8);
        mma_f16(o[nd], pa, b);
        mma_f16(o[nd + 1], pa, b + 2);
      }
    }
    __syncthreads();  // the stage is refilled by a later issue()
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    if (r >= a.qt * grp || t >= a.T) continue;
    const size_t row = static_cast<size_t>(t) * a.H + g * grp + r % grp;
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
    for (int nd = 0; nd < D / 8; ++nd) {
      const float2 y = make_float2(o[nd][2 * i] * inv, o[nd][2 * i + 1] * inv);
      *reinterpret_cast<float2*>(out + row * D + nd * 8 + (lane % 4) * 2) = y;
      if (ob != nullptr) *reinterpret_cast<__nv_bfloat162*>(ob + row * D + nd * 8 + (lane % 4) * 2) = __floats2bfloat162_rn(y.x, y.y);
    }
    if (lane % 4 == 0) ml[2 * row] = m[i] == -INFINITY ? -INFINITY : m[i] / kLog2e, ml[2 * row + 1] = l[i];
  }
}
template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma(float* out, __nv_bfloat16* ob, float* ml, const float* q,
                                                             const int32_t* q_pos, KvView kv, AttnShape a) {
  pdl_enter();
  mma_attend<D>(out, ob, ml, q, q_pos, kv, a, blockIdx.x, blockIdx.y * a.qt);
}

// Part z's view and shape in a batch (its keys, its T and N; q, out, ml and q_pos from its row).
__device__ __forceinline__ KvView part_view(const MmaPart& p, const AttnShape& a) {
  KvView kv;
  kv.k = p.k, kv.v = p.v, kv.pos = p.pos, kv.count_dev = p.count, kv.count = p.n, kv.capacity = p.capacity;
  kv.n_kv_heads = a.G, kv.head_dim = a.D;
  return kv;
}
// A batch of prompt parts: grid (G, the most query tiles of a part, parts); block (x, y, z) is
// block (x, y) of part z's lone launch (none past its tiles).
template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma_parts(float* out, float* ml, const float* q, const int32_t* q_pos,
                                                                   MmaParts b, AttnShape a) {
  pdl_enter();
  const MmaPart& p = b.p[blockIdx.z];
  a.T = p.T, a.N = p.n;
  if (static_cast<int>(blockIdx.y) * a.qt >= a.T) return;
  const size_t row = p.row;
  mma_attend<D>(out + row * a.H * D, nullptr, ml + row * a.H * 2, q + row * a.H * D, q_pos + row, part_view(p, a), a, blockIdx.x,
                blockIdx.y * a.qt);
}

// The policies' mass of a prompt chunk on the tensor cores, after k_attn_mma wrote the rows' max
// and sum (ml): S = Q K^T again as k_attn_mma computes it (the same f16 operands and tiles), then
// p = exp(s - m) / l per visible key, summed over the block's rows with t >= mass_row_begin
// (within a warp by shuffles, over the warps in shared memory) and added as mass[g][j] += sum /
// grp. Grid (G, query tiles from tile0 on, key splits): the rows before mass_row_begin (snapkv's
// window) cost nothing, and the key tiles split over blocks (no merge: each key's sum is atomic).
// It replaces, after k_attn_mma, the CUDA-core pass (k_attn_probe: one dot product per lane and key).
template <int D>
__host__ __device__ constexpr size_t mma_mass_smem_bytes() {
  return sizeof(__half) * (kMmaRows + 2 * kMmaKeys) * (D + 8) + sizeof(int32_t) * 2 * kMmaKeys +
         sizeof(float) * kMmaWarps * kMmaKeys;
}

// Query tile (tile0 + y) of kv head g, key split z of nz.
template <int D>
__device__ __forceinline__ void mma_mass(float* mass, int64_t mass_stride, int64_t mass_row_begin, const float* ml, const float* q,
                                         const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0, int g, int y, int z,
                                         int nz) {
  constexpr int LD = D + 8;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ __align__(16) unsigned char msm[];
  __half* sq = reinterpret_cast<__half*>(msm);                       // [kMmaRows][LD]
  __half* sk = sq + kMmaRows * LD;                                    // [2][kMmaKeys][LD]
  int32_t* sp = reinterpret_cast<int32_t*>(sk + 2 * kMmaKeys * LD);  // [2][kMmaKeys]
  float* red = reinterpret_cast<float*>(sp + 2 * kMmaKeys);          // [kMmaWarps][kMmaKeys]
  const int t0 = (y + tile0) * a.qt, grp = a.grp;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int N = kv.count_dev != nullptr ? *kv.count_dev : a.N;
  const __half* Kg = static_cast<const __half*>(kv.k) + static_cast<size_t>(g) * kv.capacity * D;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  // this block's key tiles: split z of nz (a key's mass needs no merge across splits)
  const int all_tiles = (N + kMmaKeys - 1) / kMmaKeys, per_split = (all_tiles + nz - 1) / nz;
  const int first_tile = z * per_split, n_tiles = min(all_tiles, first_tile + per_split);
  if (first_tile >= n_tiles) return;
  auto issue = [&](int tile) {
    if (tile < n_tiles) mma_issue_tile<D, false>(sk, nullptr, sp, Kg, nullptr, Pg, tile * kMmaKeys, tile % 2, N, tid);
    __pipeline_commit();
  };
  issue(first_tile);
  const int rb = warp * 16;
  uint32_t qa[D / 16][4];
  mma_load_q<D>(qa, sq, q, a, g, t0, rb, lane, tid);
  // this thread's two rows: rb + lane / 4 and rb + 8 + lane / 4, in base-2 units
  int qp[2];
  float m2[2], inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = rb + lane / 4 + 8 * i, t = t0 + r / grp;
    const bool live = r < a.qt * grp && t < a.T && t >= mass_row_begin;
    const size_t row = static_cast<size_t>(live ? t : 0) * a.H + g * grp + r % grp;
    const float l = live ? ml[2 * row + 1] : 0.0f;
    qp[i] = live && l > 0.0f ? q_pos[t] : INT_MIN;  // INT_MIN: adds nothing
    m2[i] = qp[i] != INT_MIN ? ml[2 * row] * kLog2e : 0.0f;
    inv[i] = qp[i] != INT_MIN ? 1.0f / l : 0.0f;
  }
  for (int tile = first_tile; tile < n_tiles; ++tile) {
    issue(tile + 1);
    __pipeline_wait_prior(1);
    __syncthreads();
    const int st = tile % 2;
    const __half* kt = sk + st * kMmaKeys * LD;
    const int32_t* pt = sp + st * kMmaKeys;
    float cs[kMmaKeys / 8][2];
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
      float s[4];
      mma_scores<D>(s, qa, kt, nt, lane);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = nt * 8 + (lane % 4) * 2 + e;
        float c = 0.0f;
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (pt[j] <= qp[i]) c += exp2f(s[2 * i + e] - m2[i]) * inv[i];
        // the 8 lanes holding this column (same lane % 4) for the warp's 16 rows
        c += __shfl_xor_sync(0xffffffffu, c, 4);
        c += __shfl_xor_sync(0xffffffffu, c, 8);
        c += __shfl_xor_sync(0xffffffffu, c, 16);
        cs[nt][e] = c;
      }
    }
    if (lane < 4) {
#pragma unroll
      for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
        red[warp * kMmaKeys + nt * 8 + lane * 2] = cs[nt][0];
        red[warp * kMmaKeys + nt * 8 + lane * 2 + 1] = cs[nt][1];
      }
    }
    __syncthreads();
    if (tid < kMmaKeys) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) sum += red[w * kMmaKeys + tid];
      const int j = tile * kMmaKeys + tid;
      if (j < N && sum > 0.0f) atomicAdd(mass + static_cast<size_t>(g) * mass_stride + j, sum / static_cast<float>(grp));
    }
    __syncthreads();  // the stage and red are reused
  }
}
template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma_mass(float* mass, int64_t mass_stride, int64_t mass_row_begin,
                                                                  const float* ml, const float* q, const int32_t* q_pos,
                                                                  KvView kv, AttnShape a, int tile0) {
  pdl_enter();
  mma_mass<D>(mass, mass_stride, mass_row_begin, ml, q, q_pos, kv, a, tile0, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z);
}
// The mass of a batch of parts after k_attn_mma_parts: grid (G, the most mass tiles of a part,
// parts x splits); block (x, y, z) is block (x, y, z % splits) of part z / splits's lone launch,
// none past its tiles or for a part without a mass.
template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32) k_attn_mma_mass_parts(const float* ml, const float* q, const int32_t* q_pos, MmaParts b,
                                                                        AttnShape a, int splits) {
  pdl_enter();
  const MmaPart& p = b.p[blockIdx.z / splits];
  a.T = p.T, a.N = p.n;
  const int qtiles = (a.T + a.qt - 1) / a.qt;
  if (p.mass == nullptr || p.mass_tile0 + static_cast<int>(blockIdx.y) >= qtiles) return;
  const size_t row = p.row;
  mma_mass<D>(p.mass, p.mass_stride, p.mass_row_begin, ml + row * a.H * 2, q + row * a.H * D, q_pos + row, part_view(p, a), a,
              p.mass_tile0, blockIdx.x, blockIdx.y, blockIdx.z % splits, splits);
}

// Records Fn<<<grid, kMmaWarps * 32, smem>>>(args...), first raising Fn's dynamic shared memory
// limit to smem (once per kernel: the attribute belongs to the function).
template <auto Fn, class... A>
void launch_smem(Launcher& L, dim3 grid, size_t smem, const char* what, const A&... args) {
  static const bool attribute_set = [&] {
    check(cudaFuncSetAttribute(Fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), what);
    return true;
  }();
  (void)attribute_set;
  L.launch(Fn, grid, kMmaWarps * 32, smem, args...);
}

template <int D>
void launch_mma(Launcher& L, dim3 grid, float* out, __nv_bfloat16* ob, float* ml, const float* q, const int32_t* q_pos, const KvView& kv,
                const AttnShape& a) {
  launch_smem<k_attn_mma<D>>(L, grid, mma_smem_bytes<D>(), "mma attention smem", out, ob, ml, q, q_pos, kv, a);
}

template <int D>
void launch_mma_mass(Launcher& L, dim3 grid, float* mass, int64_t stride, int64_t row_begin, const float* ml, const float* q,
                     const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0) {
  launch_smem<k_attn_mma_mass<D>>(L, grid, mma_mass_smem_bytes<D>(), "mma mass smem", mass, stride, row_begin, ml, q, q_pos, kv, a,
                                   tile0);
}

template <int D>
void launch_mma_parts(Launcher& L, dim3 grid, float* out, float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                      const AttnShape& a) {
  launch_smem<k_attn_mma_parts<D>>(L, grid, mma_smem_bytes<D>(), "mma attention parts smem", out, ml, q, q_pos, b, a);
}

template <int D>
void launch_mma_mass_parts(Launcher& L, dim3 grid, const float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                           const AttnShape& a, int splits) {
  launch_smem<k_attn_mma_mass_parts<D>>(L, grid, mma_mass_smem_bytes<D>(), "mma mass parts smem", ml, q, q_pos, b, a, splits);
}

}  // namespace

void launch_attn_mma_parts(Launcher& L, dim3 grid, float* out, float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                           const AttnShape& a) {
  if (a.D == 64) launch_mma_parts<64>(L, grid, out, ml, q, q_pos, b, a);
  else launch_mma_parts<128>(L, grid, out, ml, q, q_pos, b, a);
}

void launch_attn_mma_mass_parts(Launcher& L, dim3 grid, const float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                                const AttnShape& a, int splits) {
  if (a.D == 64) launch_mma_mass_parts<64>(L, grid, ml, q, q_pos, b, a, splits);
  else launch_mma_mass_parts<128>(L, grid, ml, q, q_pos, b, a, splits);
}

void launch_attn_mma(Launcher& L, dim3 grid, float* out, __nv_bfloat16* ob, float* ml, const float* q, const int32_t* q_pos,
                     const KvView& kv, const AttnShape& a) {
  if (a.D == 64) launch_mma<64>(L, grid, out, ob, ml, q, q_pos, kv, a);
  else launch_mma<128>(L, grid, out, ob, ml, q, q_pos, kv, a);
}

void launch_attn_mma_mass(Launcher& L, dim3 grid, float* mass, int64_t mass_stride, int64_t row_begin, const float* ml, const float* q,
                          const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0) {
  if (a.D == 64) launch_mma_mass<64>(L, grid, mass, mass_stride, row_begin, ml, q, q_pos, kv, a, tile0);
  else launch_mma_mass<128>(L, grid, mass, mass_stride, row_begin, ml, q, q_pos, kv, a, tile0);
}

}  // namespace squeezekv::cuda
