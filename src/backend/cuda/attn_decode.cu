// Decode attention (attn_decode.h) and the merge of split partials (attn_common.cuh).
// Flash-decoding for T = 1: grid (G, splits), kDecWarps warps. The block streams its split's K/V
// rows through shared memory in tiles of 8 KB of K and 8 KB of V, kDecStages tiles in flight
// (cp.async: the copies run while the warps compute on an earlier tile, so enough bytes are on
// their way to keep HBM busy). The grp query heads of kv head g ride together, so each row is read
// once: LPK lanes hold a row (DecRow: 8 f16, 4 f32 or 8 Q8_0 values each), a warp covers 32 / LPK rows
// per step; each warp keeps an online softmax per query head over its rows, updated once a tile
// (its scores first, then one max and one rescale, then P V: the kernel was bound by its own
// instructions when it rescaled for every key); at the end the warps
// merge in shared memory and the block writes its split's partial max, sum and output, which
// k_attn_merge combines. With `scores` the scaled logits are kept ([G][GMAX][capacity], -inf where
// masked), and the policies' mass comes from them (k_attn_mass) without reading K again.
// A decode batch runs the same blocks for every sequence in one launch (k_attn_decode_batch: the
// sequence is blockIdx.z, its layer's arrays in the launch's table), then one merge and one mass
// launch for all: each sequence gets exactly its lone arithmetic.
#include "backend/cuda/attn_decode.h"

#include <cuda_fp16.h>
#include <cuda_pipeline.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kv_q8.cuh"

namespace squeezekv::cuda {
namespace {

constexpr int kDecStages = 3;
constexpr int kDecTileBytes = 8192;  // of K (and as much of V) per tile
// Warps of a block, and blocks an SM holds: 4 and, for up to 4 query heads a kv head, 4 (at most
// 128 registers a thread; 8 heads would spill: 2 blocks, as many registers as they need). Measured on
// the H200 (docs/raw/2026-12-01-h200-batch-step/run-b.sh): a decode batch of 64 sequences'
// attention at depth 512 took 131 us with 8 warps for short splits (128 registers with spills:
// 2 blocks an SM), 142 us with 4 warps at 156 registers (3 blocks), 101 us with these; at depth
// 4096 940, 1034 and 665 us. One sequence alone: 11.1 / 13.0 us at depth 512, 22.7 / 19.1 us at 4096.
constexpr int kDecWarps = 4;
template <int GMAX>
constexpr int kDecBlocksPerSm = GMAX <= 4 ? 4 : 2;

// How the kernel reads a row format (core/kv_view.h): the LPK lanes that hold a row take kEpv
// values each, lane `part` values [part * kEpv, (part + 1) * kEpv) (as exact values, or for a
// block type its integers, the returned scale applying to all: kScaled).
template <KvType T>
struct DecRow;
template <>
struct DecRow<KvType::kF16> {
  static constexpr int kEpv = 8;
  static constexpr bool kScaled = false;
  __host__ __device__ static constexpr int bytes(int D) { return D * 2; }
  __device__ static float load(const unsigned char* row, int part, float* f) {
    const uint4 u = *reinterpret_cast<const uint4*>(row + part * 16);
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 x = __half22float2(h[k]);
      f[2 * k] = x.x, f[2 * k + 1] = x.y;
    }
    return 1.0f;
  }
  __device__ static void store(unsigned char* row, const float* x, int D) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) reinterpret_cast<__half*>(row)[d] = __float2half_rn(x[d]);
  }
};
template <>
struct DecRow<KvType::kF32> {
  static constexpr int kEpv = 4;
  static constexpr bool kScaled = false;
  __host__ __device__ static constexpr int bytes(int D) { return D * 4; }
  __device__ static float load(const unsigned char* row, int part, float* f) {
    const float4 x = *reinterpret_cast<const float4*>(row + part * 16);
    f[0] = x.x, f[1] = x.y, f[2] = x.z, f[3] = x.w;
    return 1.0f;
  }
  __device__ static void store(unsigned char* row, const float* x, int D) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) reinterpret_cast<float*>(row)[d] = x[d];
  }
};
// Q8_0: a lane takes a quarter of a block (kv_q8.cuh: as many values as an f16 lane, so the
// registers of a kernel are those of f16's); rows of 34 bytes a block are 4-byte aligned only
// (the copies below take that into account).
template <>
struct DecRow<KvType::kQ8_0> {
  static constexpr int kEpv = 8;
  static constexpr bool kScaled = true;
  __host__ __device__ static constexpr int bytes(int D) { return D / kQ8Block * kQ8BlockBytes; }
  __device__ static float load(const unsigned char* row, int part, float* f) {
    return q8_load8(row + (part / 4) * kQ8BlockBytes, part % 4, f);
  }
  __device__ static void store(unsigned char* row, const float* x, int D) {  // warp b: block b
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int b = warp; b < D / kQ8Block; b += blockDim.x / 32) q8_store_block(x[b * kQ8Block + lane], row + b * kQ8BlockBytes, lane);
  }
};

// Keys a tile holds for rows of D values in row_bytes, `step` rows at a time (the warps' rows of
// one step): what 8 KB hold, less 16 bytes where rows are not 16-byte multiples (a tile's copy may
// then start up to 12 bytes into its stage), and no more than 8 KB of f16 rows (the keys a warp
// keeps scores of per tile are registers: Q8_0's 34-byte blocks would otherwise spill them);
// in whole steps.
__host__ __device__ constexpr int dec_tile_keys(int D, int row_bytes, int step) {
  const int fit = (kDecTileBytes - (row_bytes % 16 != 0 ? 16 : 0)) / row_bytes, f16 = kDecTileBytes / (2 * D);
  return (fit < f16 ? fit : f16) / step * step;
}
// Shared memory of k_attn_decode for a row format and LPK: the stages' K, V and positions.
template <KvType KT, int LPK>
__host__ __device__ constexpr int dec_tile_keys() {
  constexpr int D = LPK * DecRow<KT>::kEpv;
  return dec_tile_keys(D, DecRow<KT>::bytes(D), kDecWarps * (32 / LPK));
}
template <KvType KT, int LPK>
__host__ __device__ constexpr size_t dec_smem_bytes() {
  return static_cast<size_t>(kDecStages) * (2 * kDecTileBytes + dec_tile_keys<KT, LPK>() * sizeof(int32_t));
}

// Whether a block's warps can merge a split's partials in one stage's K and V tiles (the stage just
// consumed), so that the next split's copies stay in flight in the other stages meanwhile: then a
// block may take several splits. Otherwise the merge takes the stages' whole memory, free only
// after the block's last tile, and a block takes one split.
template <int D, int GMAX>
__host__ __device__ constexpr bool dec_merge_in_stage() {
  return (kDecWarps / 2) * GMAX * D * static_cast<int>(sizeof(float)) <= kDecTileBytes;
}

// One block's work of one sequence's decode attention: kv head g, splits [split0, split0 + nsplit)
// of its keys, one after another through one copy pipeline (k_attn_decode takes one split a block,
// k_attn_decode_batch several: every split gets the same arithmetic either way, so a sequence's
// results depend neither on the batch nor on how its splits share blocks). GMAX: the most query
// heads per kv head this instantiation serves (a.grp <= GMAX). One split in all (kr.splits == 1):
// the output and ml directly, else each split's partials.
template <KvType KT, int LPK, int GMAX>
__device__ __forceinline__ void decode_block(float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                                             const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w, int g,
                                             int split0, int nsplit, unsigned char* dsm) {
  using Row = DecRow<KT>;
  constexpr int EPV = Row::kEpv;        // values a lane holds of a row
  constexpr int D = LPK * EPV;
  constexpr int KPW = 32 / LPK;         // rows a warp covers per step
  constexpr int ROW = Row::bytes(D);    // bytes of a row
  constexpr int TILE = dec_tile_keys<KT, LPK>();
  static_assert(TILE % (kDecWarps * KPW) == 0, "a tile splits evenly over the warps");
  constexpr bool kInStage = dec_merge_in_stage<D, GMAX>();
  static_assert(sizeof(float) * kDecWarps * GMAX * D <= 2 * kDecStages * kDecTileBytes, "the merge fits the stages");
  constexpr int STEPS = TILE / (kDecWarps * KPW);  // key groups a warp takes per tile
  unsigned char* sk = dsm;                                  // [stage][TILE][ROW]
  unsigned char* sv = dsm + kDecStages * kDecTileBytes;     // [stage][TILE][ROW]
  int32_t* sp = reinterpret_cast<int32_t*>(dsm + 2 * kDecStages * kDecTileBytes);  // [stage][TILE]
  __shared__ float s_ml[kDecWarps * GMAX * 2];              // [warp][GMAX][2] for the merge

  const int grp = a.grp;
  const KeyRange kr = key_range(kv, a);
  if (split0 >= kr.splits) return;
  if constexpr (!kInStage) nsplit = 1;  // the launcher gives such blocks one split
  const int split_end = min(kr.splits, split0 + nsplit);
  // tiles: every split but the range's last has chunk keys (only the last of all may be shorter)
  const int per_split = (kr.chunk + TILE - 1) / TILE;
  const int last_keys = min(kr.N, split_end * kr.chunk) - (split_end - 1) * kr.chunk;
  const int n_tiles = (split_end - 1 - split0) * per_split + (last_keys + TILE - 1) / TILE;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane / LPK, part = lane % LPK;
  const int qp = q_pos[0];
  const unsigned char* Kg = static_cast<const unsigned char*>(kv.k) + static_cast<size_t>(g) * kv.capacity * ROW;
  const unsigned char* Vg = static_cast<const unsigned char*>(kv.v) + static_cast<size_t>(g) * kv.capacity * ROW;
  const int32_t* Pg = kv.pos + static_cast<size_t>(g) * kv.capacity;
  if (w.k != nullptr && split_end == kr.splits) {  // the last split holds the new row: it goes in first
    const size_t slot = static_cast<size_t>(g) * kv.capacity + kr.N - 1;
    Row::store(static_cast<unsigned char*>(w.K) + slot * ROW, w.k + g * D, D);
    Row::store(static_cast<unsigned char*>(w.V) + slot * ROW, w.v + g * D, D);
    if (threadIdx.x == 0) w.P[slot] = w.pos[0], w.M[slot] = 0.0f;
    __threadfence_block();
    __syncthreads();  // the block's copies below read the row
  }
  // tile u of the block: split split0 + u / per_split, its keys [j0, j0 + rows)
  auto tile_at = [&](int u, int& j0, int& rows) {
    const int s = split0 + u / per_split;
    const int end = min(kr.N, (s + 1) * kr.chunk);
    j0 = s * kr.chunk + (u % per_split) * TILE;
    rows = min(TILE, end - j0);
  };
  // Where tile u's rows start in their stage: 0, or for rows that are not 16-byte multiples the
  // offset of their first byte within its 16 bytes (a multiple of 4), so that the 16-byte copies
  // meet 16-byte-aligned addresses on both sides (the same for K and V: both arrays are 16-byte
  // aligned and their rows of one size).
  auto tile_skew = [&](int j0) -> int {
    if constexpr (ROW % 16 == 0) return 0;
    else return static_cast<int>(reinterpret_cast<uintptr_t>(Kg + static_cast<size_t>(j0) * ROW) & 15);
  };
  // issues the copies of tile u (rows past the split's end are not copied; their slots are never read)
  auto issue = [&](int u) {
    if (u < n_tiles) {
      int j0, rows;
      tile_at(u, j0, rows);
      const int st = u % kDecStages;
      unsigned char* dk = sk + st * kDecTileBytes;
      unsigned char* dv = sv + st * kDecTileBytes;
      const unsigned char* k0 = Kg + static_cast<size_t>(j0) * ROW;
      const unsigned char* v0 = Vg + static_cast<size_t>(j0) * ROW;
      if constexpr (ROW % 16 == 0) {
        for (int c = threadIdx.x; c < rows * (ROW / 16); c += blockDim.x) {
          __pipeline_memcpy_async(dk + c * 16, k0 + c * 16, 16);
          __pipeline_memcpy_async(dv + c * 16, v0 + c * 16, 16);
        }
      } else {  // 4-byte copies up to the first 16-byte boundary and after the last, 16-byte ones between
        const int skew = tile_skew(j0), bytes = rows * ROW;
        const int head = min(bytes, (16 - skew) & 15), mid = (bytes - head) & ~15, tail = bytes - head - mid;
        dk += skew, dv += skew;
        for (int c = threadIdx.x; c < (head + tail) / 4; c += blockDim.x) {
          const int o = c < head / 4 ? 4 * c : head + mid + 4 * (c - head / 4);
          __pipeline_memcpy_async(dk + o, k0 + o, 4);
          __pipeline_memcpy_async(dv + o, v0 + o, 4);
        }
        for (int c = threadIdx.x; c < mid / 16; c += blockDim.x) {
          __pipeline_memcpy_async(dk + head + c * 16, k0 + head + c * 16, 16);
          __pipeline_memcpy_async(dv + head + c * 16, v0 + head + c * 16, 16);
        }
      }
      for (int c = threadIdx.x; c < rows; c += blockDim.x) __pipeline_memcpy_async(sp + st * TILE + c, Pg + j0 + c, 4);
    }
    __pipeline_commit();  // an empty group past the last tile keeps the counting uniform
  };

  float qv[GMAX][EPV], m[GMAX], l[GMAX], acc[GMAX][EPV];
#pragma unroll
  for (int r = 0; r < GMAX; ++r)
#pragma unroll
    for (int e = 0; e < EPV; ++e) qv[r][e] = r < grp ? q[static_cast<size_t>(g * grp + r) * D + part * EPV + e] * a.scale : 0.0f;
  for (int t = 0; t < kDecStages - 1; ++t) issue(t);
  for (int u = 0; u < n_tiles; ++u) {
    if (u % per_split == 0) {  // a split begins: its own softmax
#pragma unroll
      for (int r = 0; r < GMAX; ++r) {
        m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < EPV; ++e) acc[r][e] = 0.0f;
      }
    }
    issue(u + kDecStages - 1);
    __pipeline_wait_prior(kDecStages - 1);  // this thread's copies of tile u have landed
    __syncthreads();                          // and everyone's
    const int st = u % kDecStages;
    int j0, rows;
    tile_at(u, j0, rows);
    const int end = j0 + rows;
    const unsigned char* kt = sk + st * kDecTileBytes + tile_skew(j0);
    const unsigned char* vt = sv + st * kDecTileBytes + tile_skew(j0);
    const int32_t* pt = sp + st * TILE;
    // warp w takes rows [w * TILE / kDecWarps, (w + 1) * TILE / kDecWarps) of the tile, KPW a step:
    // first all their scores, then one max and one rescale per head for the tile, then P V
    float sc[STEPS][GMAX];
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
      const int i = warp * (TILE / kDecWarps) + step * KPW + sub, j = j0 + i;
      const bool in = j < end, vis = in && pt[i] <= qp;
      float kf[EPV];
      const float kd = Row::load(kt + i * ROW, part, kf);
#pragma unroll
      for (int r = 0; r < GMAX; ++r) {
        if (r >= grp) break;  // uniform
        float x = 0.0f;
#pragma unroll
        for (int e = 0; e < EPV; ++e) x += qv[r][e] * kf[e];
        if constexpr (Row::kScaled) x *= kd;  // this lane's block's scale (a block's lanes share it)
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        x = vis ? x : -INFINITY;
        if (scores != nullptr && part == 0 && in) scores[(static_cast<size_t>(g) * GMAX + r) * kv.capacity + j] = x;
        sc[step][r] = x;
      }
    }
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      if (r >= grp) break;
      float mx = sc[0][r];
#pragma unroll
      for (int step = 1; step < STEPS; ++step) mx = fmaxf(mx, sc[step][r]);
#pragma unroll
      for (int o = LPK; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float mn = fmaxf(m[r], mx);
      if (mn == -INFINITY) continue;  // uniform: nothing visible yet
      const float alpha = m[r] > -INFINITY ? __expf(m[r] - mn) : 0.0f;
      l[r] *= alpha;
#pragma unroll
      for (int e = 0; e < EPV; ++e) acc[r][e] *= alpha;
      m[r] = mn;
    }
#pragma unroll
    for (int step = 0; step < STEPS; ++step) {
      const int i = warp * (TILE / kDecWarps) + step * KPW + sub;
      float vf[EPV];
      float vd = Row::load(vt + i * ROW, part, vf);
      if (j0 + i >= end) {  // a row past the split's end was never copied: whatever is there, p = 0 must not meet NaN
        vd = 0.0f;
#pragma unroll
        for (int e = 0; e < EPV; ++e) vf[e] = 0.0f;
      }
#pragma unroll
      for (int r = 0; r < GMAX; ++r) {
        if (r >= grp) break;
        const float p = sc[step][r] == -INFINITY ? 0.0f : __expf(sc[step][r] - m[r]);
        l[r] += p;
        const float pv = Row::kScaled ? p * vd : p;
#pragma unroll
        for (int e = 0; e < EPV; ++e) acc[r][e] += pv * vf[e];
      }
    }
    __syncthreads();  // the stage is refilled by a later issue() (after this split's merge, if it ends here)
    if (u + 1 < n_tiles && (u + 1) % per_split != 0) continue;
    // the split ends: the warp's row groups share one max per head: sum their sums and outputs
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
#pragma unroll
      for (int o = LPK; o < 32; o <<= 1) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], o);
#pragma unroll
        for (int e = 0; e < EPV; ++e) acc[r][e] += __shfl_xor_sync(0xffffffffu, acc[r][e], o);
      }
    }
    // the block's warps: each puts its max and sum in s_ml and its output [GMAX][D] where
    // warp_acc says: in the stage just used (the first half of the warps in its K tile, the rest
    // in its V tile: the other stages' copies stay in flight), or where none is in flight any more
    auto warp_acc = [&](int wi) -> float* {
      if constexpr (kInStage)
        return reinterpret_cast<float*>(wi < kDecWarps / 2 ? sk + st * kDecTileBytes : sv + st * kDecTileBytes) +
               (wi % (kDecWarps / 2)) * GMAX * D;
      else
        return reinterpret_cast<float*>(dsm) + wi * GMAX * D;
    };
    float* s_acc = warp_acc(warp);
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      if (lane == 0) s_ml[(warp * GMAX + r) * 2] = m[r], s_ml[(warp * GMAX + r) * 2 + 1] = l[r];
      if (sub == 0)
#pragma unroll
        for (int e = 0; e < EPV; ++e) s_acc[r * D + part * EPV + e] = acc[r][e];
    }
    __syncthreads();
    const int split = split0 + u / per_split;
    for (int i = threadIdx.x; i < grp * D; i += blockDim.x) {
      const int r = i / D, d = i % D;
      float M = -INFINITY;
#pragma unroll
      for (int w2 = 0; w2 < kDecWarps; ++w2) M = fmaxf(M, s_ml[(w2 * GMAX + r) * 2]);
      float L = 0.0f, o = 0.0f;
#pragma unroll
      for (int w2 = 0; w2 < kDecWarps; ++w2) {
        const float mw = s_ml[(w2 * GMAX + r) * 2];
        if (mw == -INFINITY) continue;
        const float c = __expf(mw - M);
        const float* wa = warp_acc(w2);
        L += s_ml[(w2 * GMAX + r) * 2 + 1] * c;
        o += wa[r * D + d] * c;
      }
      const size_t h = static_cast<size_t>(g) * grp + r;  // rows: T * H with T = 1
      if (kr.splits == 1) {  // one split: the final output, no merge
        out[h * D + d] = L > 0.0f ? o / L : 0.0f;
        if (d == 0) ml[2 * h] = M, ml[2 * h + 1] = L;
      } else {
        const size_t prow = static_cast<size_t>(split) * a.H + h;
        part_acc[prow * D + d] = o;
        if (d == 0) part_ml[2 * prow] = M, part_ml[2 * prow + 1] = L;
      }
    }
    __syncthreads();  // the merge has read the stage and s_ml before the next split's copies and merge
  }
}

// A lone sequence: grid (G, splits).
template <KvType KT, int LPK, int GMAX>
__global__ void __launch_bounds__(kDecWarps * 32, kDecBlocksPerSm<GMAX>) k_attn_decode(float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                                                                 const float* q, const int32_t* q_pos, KvView kv, AttnShape a,
                                                                 KvRowWrite w) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  decode_block<KT, LPK, GMAX>(out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w, blockIdx.x, blockIdx.y, 1, dsm);
}

// A decode batch: grid (G, the batch's most splits / per_block, sequences); block (x, y, z) does
// splits [y * per_block, (y + 1) * per_block) of kv head x of sequence b.s[z], each exactly as
// k_attn_decode does it for that sequence alone (batch_block: its view and rows).
template <KvType KT, int LPK, int GMAX>
__global__ void __launch_bounds__(kDecWarps * 32, kDecBlocksPerSm<GMAX>) k_attn_decode_batch(DecodeBatch b, DecodeRows r, AttnShape a, int per_block) {
  pdl_enter();
  extern __shared__ __align__(16) unsigned char dsm[];
  const BatchBlock k = batch_block(b, r, a);
  decode_block<KT, LPK, GMAX>(k.out, k.ml, k.part_acc, k.part_ml, k.scores, k.q, k.q_pos, k.kv, k.a, k.w, blockIdx.x,
                              blockIdx.y * per_block, per_block, dsm);
}

// The policies' mass of kv head g's keys in one split, from the kept scores sc [G][GMAX][cap] and
// the final max and sum (ml [H][2]): mass[g][j] += sum over the grp heads of exp(s - M) / L, / grp
// (or the max over them). One thread per key: no atomics, the same sums every run.
template <int GMAX>
__device__ __forceinline__ void mass_keys(float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml, int cap,
                                          int begin, int end, int g, int grp) {
  const GroupSoftmax<GMAX> sm(ml, g, grp);
  const float* sc = scores + static_cast<size_t>(g) * GMAX * cap;
  for (int j = begin + threadIdx.x; j < end; j += blockDim.x) {
    float* dst = mass + static_cast<size_t>(g) * stride + j;
    *dst = sm.add_mass(*dst, sc, cap, j, mass_max);
  }
}
template <int GMAX>
__device__ __forceinline__ void mass_split(float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml, int cap,
                                           const KeyRange& kr, int g, int split, int grp) {
  if (split >= kr.splits) return;
  mass_keys<GMAX>(mass, stride, mass_max, scores, ml, cap, split * kr.chunk, min(kr.N, split * kr.chunk + kr.chunk), g, grp);
}
template <int GMAX>
__global__ void k_attn_mass(float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml, KvView kv,
                            AttnShape a) {
  pdl_enter();
  mass_split<GMAX>(mass, stride, mass_max, scores, ml, kv.capacity, key_range(kv, a), blockIdx.x, blockIdx.y, a.grp);
}
// grid (G, key blocks of kMassBlockKeys over the largest capacity, rows): row z's mass where its
// table entry asked for one (r.info). The keys' probabilities need only the merged max/sum, not
// the splits, so a block takes kMassBlockKeys keys whatever the splits were: blocks of one 64-key
// split each left most threads idle and made the kernel launch-bound (about 100 us a layer for 128
// sequences of 2048 keys, against 17 us of bytes).
template <int GMAX>
__global__ void k_attn_mass_batch(bool mass_max, DecodeRows r, AttnShape a) {
  pdl_enter();
  const size_t row = blockIdx.z;
  const DecodeInfo in = r.info[row];
  if (in.mass == nullptr) return;
  const int begin = static_cast<int>(blockIdx.y) * kMassBlockKeys;
  if (begin >= in.N) return;
  mass_keys<GMAX>(in.mass, in.capacity, mass_max, r.scores + row * r.score_stride, r.ml + row * 2 * a.H, in.capacity, begin,
                  min(in.N, begin + kMassBlockKeys), blockIdx.x, a.grp);
}


// A batch's blocks: each takes as many of its sequence's splits as keep the SMs' resident blocks
// busy (where the warps' merge lets a block take several: dec_merge_in_stage), so a batch of short
// sequences runs few long blocks instead of many blocks of one 64-key split each.
template <KvType KT, int LPK, int GMAX>
void launch_batch_one(Launcher& L, int G, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r,
                      const AttnShape& a) {
  constexpr size_t smem = dec_smem_bytes<KT, LPK>();
  static bool attribute_set = false;
  if (!attribute_set) {
    check(cudaFuncSetAttribute(k_attn_decode_batch<KT, LPK, GMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "decode attention smem");
    attribute_set = true;
  }
  int per_block = 1;
  if constexpr (dec_merge_in_stage<LPK * DecRow<KT>::kEpv, GMAX>()) per_block = splits_per_block(most, G, seqs, kDecBlocksPerSm<GMAX> * sms);
  const dim3 grid(G, (most + per_block - 1) / per_block, seqs);
  L.launch(k_attn_decode_batch<KT, LPK, GMAX>, grid, kDecWarps * 32, smem, b, r, a, per_block);
}
template <KvType KT, int GMAX>
void launch_batch_type(Launcher& L, int lpk, int G, int most, int seqs, int sms, const DecodeBatch& b, const DecodeRows& r,
                       const AttnShape& a) {
  switch (lpk) {
    case 4: launch_batch_one<KT, 4, GMAX>(L, G, most, seqs, sms, b, r, a); break;
    case 8: launch_batch_one<KT, 8, GMAX>(L, G, most, seqs, sms, b, r, a); break;
    case 16: launch_batch_one<KT, 16, GMAX>(L, G, most, seqs, sms, b, r, a); break;
    default: launch_batch_one<KT, 32, GMAX>(L, G, most, seqs, sms, b, r, a); break;
  }
}

template <KvType KT, int LPK, int GMAX>
void launch_decode_one(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores, const float* q,
                       const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  constexpr size_t smem = dec_smem_bytes<KT, LPK>();
  static bool attribute_set = false;  // once per instantiation (the attribute belongs to the function)
  if (!attribute_set) {
    check(cudaFuncSetAttribute(k_attn_decode<KT, LPK, GMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
          "decode attention smem");
    attribute_set = true;
  }
  L.launch(k_attn_decode<KT, LPK, GMAX>, grid, kDecWarps * 32, smem, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
}

template <KvType KT, int GMAX>
void launch_decode_type(Launcher& L, int lpk, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                   const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  switch (lpk) {
    case 4: launch_decode_one<KT, 4, GMAX>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    case 8: launch_decode_one<KT, 8, GMAX>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    case 16: launch_decode_one<KT, 16, GMAX>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
    default: launch_decode_one<KT, 32, GMAX>(L, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w); break;
  }
}

// Merges the splits of one row's columns [c0, c0 + 32 NK) (ml_out [rows][2]: by the block with
// c0 = 0). A thread of the block's PW warps holds one split's max and sum (kMaxSplits at most), the
// splits' weights exp(m_s - M) go to shared memory, and the splits are summed in kMergeShares shares
// (share j: splits j, j + 8, ..., in order), each warp taking shares wid, wid + PW, ... with those
// loads in flight (the partials sit in L2); the 8 shares' sums are added in order. A column's
// arithmetic is the same whatever NK and PW are (L's block sum adds exact zeros for the threads
// past kMaxSplits), so the bits depend on the split count alone: a sequence's merge is the same
// alone and in any batch. A launch with few rows gives each row D / 32 blocks of one column chunk
// and 8 warps (NK = 1, PW = 8), one with many rows one block of 4 warps a row (NK = kMergeChunks,
// PW = 4): merge_col_blocks. One block a row, each thread one column streaming every split (until
// 2026-12-07), left one sequence at depth 32768 with 32 blocks, each reading its 128 splits in 16
// dependent rounds of L2 loads; whole rows in blocks of 8 warps (2026-12-07 only) put a batch of
// 64 sequences' 2,048 rows in two waves of blocks on an H100 where blocks of 4 warps take one.
constexpr int kMergeShares = 8;
constexpr int kMergeChunks = kMaxHeadDim / 32;  // column chunks of 32 a block takes at most
constexpr int kMergeRowWarps = 4;               // warps of a whole row's block
static_assert(kMaxSplits <= 32 * kMergeRowWarps, "a split a thread");
// Blocks a row: D / 32 (rounded up) when the launch has fewer than kMergeSplitRows rows, else 1.
constexpr int kMergeSplitRows = 256;
inline int merge_col_blocks(int rows, int D) { return rows < kMergeSplitRows ? (D + 31) / 32 : 1; }
// Warps of a block that takes NK column chunks of a row.
template <int NK>
constexpr int kMergeWarpsOf = NK == 1 ? kMergeShares : kMergeRowWarps;
template <int NK, int PW = kMergeWarpsOf<NK>>
__device__ __forceinline__ void merge_row(float* out, __nv_bfloat16* ob, float* ml_out, const float* part_acc, const float* part_ml,
                                          int rows, int row, int c0, int splits, int D) {
  static_assert(kMergeShares % PW == 0, "whole shares a warp");
  constexpr int R = kMergeShares / PW;  // shares a warp
  __shared__ float w[kMaxSplits];
  __shared__ float red[32];
  __shared__ float acc[kMergeShares][32 * NK];
  const int t = threadIdx.x, lane = t % 32, wid = t / 32;
  const size_t ml_at = 2 * (static_cast<size_t>(t) * rows + row);
  const float ms = t < splits ? part_ml[ml_at] : -INFINITY, ls = t < splits ? part_ml[ml_at + 1] : 0.0f;
  const float mx = warp_max(ms);
  if (lane == 0) red[wid] = mx;
  __syncthreads();
  float M = -INFINITY;
  for (int i = 0; i < PW; ++i) M = fmaxf(M, red[i]);
  const float c = ms > -INFINITY ? __expf(ms - M) : 0.0f;
  if (t < splits) w[t] = c;
  const float L = block_sum(c * ls, red);  // its barriers also publish w (and order red's reads above before its writes)
  const int ncols = min(32 * NK, D - c0);
  float o[R][NK];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < NK; ++k) o[r][k] = 0.0f;
#pragma unroll(NK == 1 ? 16 : 2)
  for (int s = wid; s < splits; s += kMergeShares) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int sr = s + PW * r;  // share wid + PW r
      if (sr >= splits) break;
      const float* p = part_acc + (static_cast<size_t>(sr) * rows + row) * D + c0 + lane;
      const float ws = w[sr];
#pragma unroll
      for (int k = 0; k < NK; ++k)
        if (32 * k + lane < ncols) o[r][k] += p[32 * k] * ws;
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < NK; ++k) acc[wid + PW * r][32 * k + lane] = o[r][k];
  __syncthreads();
  const float inv = L > 0.0f ? 1.0f / L : 0.0f;
  for (int j = t; j < ncols; j += 32 * PW) {
    float sum = acc[0][j];
#pragma unroll
    for (int i = 1; i < kMergeShares; ++i) sum += acc[i][j];
    const float y = sum * inv;
    out[static_cast<size_t>(row) * D + c0 + j] = y;
    if (ob != nullptr) ob[static_cast<size_t>(row) * D + c0 + j] = __float2bfloat16(y);
  }
  if (t == 0 && c0 == 0) ml_out[2 * row] = M, ml_out[2 * row + 1] = L;
}
// grid rows x cbs (merge_col_blocks): column chunk x % cbs of row x / cbs
template <int NK>
__global__ void __launch_bounds__(32 * kMergeWarpsOf<NK>) k_attn_merge(float* out, float* ml_out, const float* part_acc, const float* part_ml,
                                                                     int rows, int cbs, KvView kv, AttnShape a) {
  pdl_enter();
  merge_row<NK>(out, nullptr, ml_out, part_acc, part_ml, rows, blockIdx.x / cbs, 32 * (blockIdx.x % cbs), key_range(kv, a).splits, a.D);
}
// grid (H x cbs, rows of the batch): head x / cbs of row y, where its sequence's keys took more
// than one split.
template <int NK>
__global__ void __launch_bounds__(32 * kMergeWarpsOf<NK>) k_attn_merge_batch(DecodeRows r, AttnShape a, int cbs) {
  pdl_enter();
  const size_t row = blockIdx.y;
  const DecodeInfo in = r.info[row];
  const int splits = key_range(in.N, in.splits, a.min_keys).splits;
  if (splits == 1) return;  // written directly
  const size_t HD = static_cast<size_t>(a.H) * a.D;
  __nv_bfloat16* ob = r.out_bf16 != nullptr ? r.out_bf16 + row * HD : nullptr;
  merge_row<NK>(r.out + row * HD, ob, r.ml + row * 2 * a.H, r.part_acc + row * r.part_stride, r.part_ml + row * r.part_ml_stride, a.H,
                blockIdx.x / cbs, 32 * (blockIdx.x % cbs), splits, a.D);
}

}  // namespace

void launch_attn_merge(Launcher& L, float* out, float* ml_out, const float* part_acc, const float* part_ml, int rows, const KvView& kv,
                       const AttnShape& a) {
  const int cbs = merge_col_blocks(rows, a.D);
  const unsigned grid = static_cast<unsigned>(rows * cbs);
  if (cbs > 1) L.launch(k_attn_merge<1>, grid, 32 * kMergeWarpsOf<1>, 0, out, ml_out, part_acc, part_ml, rows, cbs, kv, a);
  else L.launch(k_attn_merge<kMergeChunks>, grid, 32 * kMergeWarpsOf<kMergeChunks>, 0, out, ml_out, part_acc, part_ml, rows, cbs, kv, a);
}

void launch_attn_decode(Launcher& L, int lpk, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml,
                        float* scores, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w) {
  switch (kv.type) {
    case KvType::kF16:
      if (gmax == 4) launch_decode_type<KvType::kF16, 4>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      else launch_decode_type<KvType::kF16, 8>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      break;
    case KvType::kQ8_0:
      if (gmax == 4) launch_decode_type<KvType::kQ8_0, 4>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      else launch_decode_type<KvType::kQ8_0, 8>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      break;
    default:
      if (gmax == 4) launch_decode_type<KvType::kF32, 4>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      else launch_decode_type<KvType::kF32, 8>(L, lpk, grid, out, ml, part_acc, part_ml, scores, q, q_pos, kv, a, w);
      break;
  }
  if (!a.direct) launch_attn_merge(L, out, ml, part_acc, part_ml, a.H, kv, a);
}

void launch_attn_mass(Launcher& L, int gmax, dim3 grid, float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml,
                      const KvView& kv, const AttnShape& a) {
  if (gmax == 4) L.launch(k_attn_mass<4>, grid, 256, 0, mass, stride, mass_max, scores, ml, kv, a);
  else L.launch(k_attn_mass<8>, grid, 256, 0, mass, stride, mass_max, scores, ml, kv, a);
}

void launch_attn_decode_batch(Launcher& L, KvType type, int lpk, int gmax, int most, int seqs, int sms, const DecodeBatch& b,
                              const DecodeRows& r, const AttnShape& a) {
  if (type == KvType::kQ8_0) {
    if (gmax == 4) launch_batch_type<KvType::kQ8_0, 4>(L, lpk, a.G, most, seqs, sms, b, r, a);
    else launch_batch_type<KvType::kQ8_0, 8>(L, lpk, a.G, most, seqs, sms, b, r, a);
  } else {
    if (gmax == 4) launch_batch_type<KvType::kF16, 4>(L, lpk, a.G, most, seqs, sms, b, r, a);
    else launch_batch_type<KvType::kF16, 8>(L, lpk, a.G, most, seqs, sms, b, r, a);
  }
}

int decode_lanes(KvType type, int D) {
  int epv = 0;
  switch (type) {
    case KvType::kF16: epv = DecRow<KvType::kF16>::kEpv; break;
    case KvType::kF32: epv = DecRow<KvType::kF32>::kEpv; break;
    case KvType::kQ8_0:
      if (D % 64 != 0) return 0;  // rows of whole 32-bit words (cuda_kv_types)
      epv = DecRow<KvType::kQ8_0>::kEpv;
      break;
    default: return 0;
  }
  const int lpk = D % epv == 0 ? D / epv : 0;
  return lpk == 4 || lpk == 8 || lpk == 16 || lpk == 32 ? lpk : 0;
}

void launch_attn_merge_batch(Launcher& L, int rows, const DecodeRows& r, const AttnShape& a) {
  const int cbs = merge_col_blocks(rows * a.H, a.D);
  const dim3 grid(static_cast<unsigned>(a.H * cbs), static_cast<unsigned>(rows));
  if (cbs > 1) L.launch(k_attn_merge_batch<1>, grid, 32 * kMergeWarpsOf<1>, 0, r, a, cbs);
  else L.launch(k_attn_merge_batch<kMergeChunks>, grid, 32 * kMergeWarpsOf<kMergeChunks>, 0, r, a, cbs);
}

void launch_attn_mass_batch(Launcher& L, int gmax, dim3 grid, bool mass_max, const DecodeRows& r, const AttnShape& a) {
  if (gmax == 4) L.launch(k_attn_mass_batch<4>, grid, 256, 0, mass_max, r, a);
  else L.launch(k_attn_mass_batch<8>, grid, 256, 0, mass_max, r, a);
}

}  // namespace squeezekv::cuda
