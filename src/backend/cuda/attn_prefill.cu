// Prompt attention on the CUDA cores (attn_prefill.h).
// One block serves one kv head g and a tile of query tokens: its rows are (token, query head of g)
// pairs, so the heads that share g read each K/V tile once (from shared memory). Keys go in
// tiles of 32, one per lane; each warp keeps an online softmax for its rows (up to 4). Long key
// ranges split over blocks (flash-decoding: partial max, sum and output per split, merged after);
// the split depends on sizes only. The policies' mass and the entropy come from a second kernel
// over the same scores with the final max and sum (only when asked for).
#include "backend/cuda/attn_prefill.h"

#include <cuda_fp16.h>

#include <climits>

#include "backend/cuda/common.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kAttnWarps = 8;
constexpr int kRowsPerWarp = 4;
static_assert(kAttnRows == kAttnWarps * kRowsPerWarp, "rows per block");

template <typename KT>
__device__ inline float to_f(KT v);
template <>
__device__ inline float to_f<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ inline float to_f<float>(float v) {
  return v;
}

// The block's shared memory: q rows [rows][D], K tile [32][D + 1] (padded: lanes read different
// banks), V tile [32][D], the tile's positions [32].
struct AttnSmem {
  float *q, *k, *v;
  int* pos;
};
__device__ inline AttnSmem carve(float* smem, int D) {
  AttnSmem s;
  s.q = smem;
  s.k = s.q + kAttnRows * D;
  s.v = s.k + kKeyTile * (D + 1);
  s.pos = reinterpret_cast<int*>(s.v + kKeyTile * D);
  return s;
}

size_t smem_bytes(int D) {
  return sizeof(float) * (static_cast<size_t>(kAttnRows) * D + kKeyTile * (D + 1) + kKeyTile * D) + kKeyTile * sizeof(int);
}

// Loads the block's query rows (scaled) into qs; returns nothing. Row r = (token t0 + r / grp, head g*grp + r % grp).
__device__ inline void load_q(float* qs, const float* q, const AttnShape& a, int g, int t0) {
  const int live = min(a.qt, a.T - t0) * a.grp * a.D;  // rows past it are never read
#pragma unroll 4
  for (int i = threadIdx.x; i < live; i += blockDim.x) {
    const int r = i / a.D, d = i % a.D, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    qs[i] = (r < a.qt * a.grp && t < a.T) ? q[(static_cast<size_t>(t) * a.H + h) * a.D + d] * a.scale : 0.0f;
  }
}

template <typename KT>
__device__ inline void load_tile(float* ks, float* vs, int* ps, const KvView& kv, int g, int start, int end, int D) {
  const KT* K = static_cast<const KT*>(kv.k) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const KT* V = static_cast<const KT*>(kv.v) + (static_cast<size_t>(g) * kv.capacity + start) * D;
  const int n = min(kKeyTile, end - start);
#pragma unroll 4
  for (int i = threadIdx.x; i < kKeyTile * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    ks[j * (D + 1) + d] = j < n ? to_f<KT>(K[i]) : 0.0f;
    vs[i] = j < n ? to_f<KT>(V[i]) : 0.0f;
  }
  if (threadIdx.x < kKeyTile) ps[threadIdx.x] = threadIdx.x < n ? kv.pos[static_cast<size_t>(g) * kv.capacity + start + threadIdx.x] : INT_MAX;
}

// grid (G, ceil(T / qt), splits). Writes, per row (t, h) and split, the partial max, sum and
// output; with one split the output is final (out) and so are max and sum (ml).
template <typename KT>
__global__ void k_attn(float* out, float* part_acc, float* ml, const float* q, const int32_t* q_pos, KvView kv, AttnShape a) {
  pdl_enter();
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = blockIdx.y * a.qt, split = blockIdx.z;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;  // a split this N does not need
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxHeadDim / 32];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
    for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] = 0.0f;
  }
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;  // uniform across the warp
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      const bool vis = ps[lane] <= qp[i];
      sc = vis ? sc : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(sc));
      if (mn == -INFINITY) continue;
      const float p = vis ? __expf(sc - mn) : 0.0f;
      const float alpha = m[i] > -INFINITY ? __expf(m[i] - mn) : 0.0f;
      l[i] = l[i] * alpha + warp_sum(p);
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd) acc[i][dd] *= alpha;
      for (int j = 0; j < kKeyTile; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vr = vs + j * D + lane;
#pragma unroll
        for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
          if (dd * 32 + lane < D) acc[i][dd] += pj * vr[dd * 32];
      }
      m[i] = mn;
    }
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    const size_t row = static_cast<size_t>(t) * a.H + h;
    if (a.direct) {
      const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) out[row * D + dd * 32 + lane] = acc[i][dd] * inv;
      if (lane == 0) ml[2 * row] = m[i], ml[2 * row + 1] = l[i];
    } else {
      const size_t prow = static_cast<size_t>(split) * a.T * a.H + row;
#pragma unroll
      for (int dd = 0; dd < kMaxHeadDim / 32; ++dd)
        if (dd * 32 + lane < D) part_acc[prow * D + dd * 32 + lane] = acc[i][dd];
      if (lane == 0) ml[2 * prow] = m[i], ml[2 * prow + 1] = l[i];
    }
  }
}

// The policies' outputs from the final max and sum: mass[g][j] += p / grp over rows with
// t >= mass_row_begin (the grid starts at query tile tile0; summed within the warp first;
// mass_max: mass = max(mass, p), through the bits of non-negative floats, which order as
// integers), and per row the entropy sum -p log p and the visible key count (atomically over
// splits) into ent[row][2].
template <typename KT>
__global__ void k_attn_probe(float* mass, int64_t mass_stride, int64_t mass_row_begin, bool mass_max, float* ent, const float* ml,
                             const float* q, const int32_t* q_pos, KvView kv, AttnShape a, int tile0) {
  pdl_enter();
  extern __shared__ float smem[];
  const int D = a.D, g = blockIdx.x, t0 = (blockIdx.y + tile0) * a.qt, split = blockIdx.z;
  const KeyRange kr = key_range(kv, a);
  if (split >= kr.splits) return;
  const AttnSmem sm = carve(smem, D);
  float *qs = sm.q, *ks = sm.k, *vs = sm.v;
  int* ps = sm.pos;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_q(qs, q, a, g, t0);
  float m[kRowsPerWarp], inv[kRowsPerWarp], h_sum[kRowsPerWarp], n_vis[kRowsPerWarp];
  int qp[kRowsPerWarp];
  bool live[kRowsPerWarp], to_mass[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    live[i] = r < a.qt * a.grp && t < a.T;
    const size_t row = static_cast<size_t>(live[i] ? t : 0) * a.H + h;
    qp[i] = live[i] ? q_pos[t] : -1;
    m[i] = live[i] ? ml[2 * row] : 0.0f;
    inv[i] = live[i] && ml[2 * row + 1] > 0.0f ? 1.0f / ml[2 * row + 1] : 0.0f;
    to_mass[i] = live[i] && mass != nullptr && t >= mass_row_begin;
    h_sum[i] = 0.0f, n_vis[i] = 0.0f;
  }
  const int begin = split * kr.chunk, end = min(kr.N, begin + kr.chunk);
  for (int start = begin; start < end; start += kKeyTile) {
    __syncthreads();
    load_tile<KT>(ks, vs, ps, kv, g, start, end, D);
    __syncthreads();
    float msum = 0.0f;
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (!live[i]) continue;
      const float* qr = qs + (warp + kAttnWarps * i) * D;
      const float* kr = ks + lane * (D + 1);
      float sc = 0.0f;
      for (int d = 0; d < D; ++d) sc += qr[d] * kr[d];
      if (ps[lane] > qp[i]) continue;
      const float p = __expf(sc - m[i]) * inv[i];
      if (to_mass[i]) msum = mass_max ? fmaxf(msum, p) : msum + p;
      if (p > 0.0f) h_sum[i] -= p * __logf(p);
      n_vis[i] += 1.0f;
    }
    if (mass != nullptr && msum > 0.0f && start + lane < end) {
      float* dst = mass + static_cast<size_t>(g) * mass_stride + start + lane;
      if (mass_max) atomicMax(reinterpret_cast<int*>(dst), __float_as_int(msum));
      else atomicAdd(dst, msum / static_cast<float>(a.grp));
    }
  }
  if (ent == nullptr) return;
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    if (!live[i]) continue;
    const float hs = warp_sum(h_sum[i]), nv = warp_sum(n_vis[i]);
    const int r = warp + kAttnWarps * i, t = t0 + r / a.grp, h = g * a.grp + r % a.grp;
    if (lane == 0) {
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h), hs);
      atomicAdd(ent + 2 * (static_cast<size_t>(t) * a.H + h) + 1, nv);
    }
  }
}

// Once per kernel (the attribute belongs to the function): shared memory past the default 48 KiB.
template <class K>
void allow_smem(K kernel, size_t smem, size_t& set) {
  if (smem > 48 * 1024 && set < smem) {
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "attention smem");
    set = smem;
  }
}

}  // namespace

void launch_attn_tiles(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, const float* q,
                       const int32_t* q_pos, const KvView& kv, const AttnShape& a) {
  const size_t smem = smem_bytes(a.D);
  float* kml = a.direct ? ml : part_ml;  // one split: final max and sum
  if (kv.type == KvType::kF16) {
    static size_t set = 0;
    allow_smem(k_attn<__half>, smem, set);
    L.launch(k_attn<__half>, grid, kAttnWarps * 32, smem, out, part_acc, kml, q, q_pos, kv, a);
  } else {
    static size_t set = 0;
    allow_smem(k_attn<float>, smem, set);
    L.launch(k_attn<float>, grid, kAttnWarps * 32, smem, out, part_acc, kml, q, q_pos, kv, a);
  }
  if (!a.direct) launch_attn_merge(L, out, ml, part_acc, part_ml, a.T * a.H, kv, a);
}

void launch_attn_probe(Launcher& L, dim3 grid, float* mass, int64_t mass_stride, int64_t row_begin, bool mass_max, float* ent,
                       const float* ml, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0) {
  const size_t smem = smem_bytes(a.D);
  if (kv.type == KvType::kF16) {
    static size_t set = 0;
    allow_smem(k_attn_probe<__half>, smem, set);
    L.launch(k_attn_probe<__half>, grid, kAttnWarps * 32, smem, mass, mass_stride, row_begin, mass_max, ent, ml, q, q_pos, kv, a, tile0);
  } else {
    static size_t set = 0;
    allow_smem(k_attn_probe<float>, smem, set);
    L.launch(k_attn_probe<float>, grid, kAttnWarps * 32, smem, mass, mass_stride, row_begin, mass_max, ent, ml, q, q_pos, kv, a, tile0);
  }
}

}  // namespace squeezekv::cuda
