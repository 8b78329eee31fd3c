// What the attention kernels share (attn_prefill.cu, attn_mma.cu, attn_decode.cu) and what the
// eviction kernel shares with them (kv_rows.cu): the shape argument, how a key range splits over
// blocks, the merge of split partials, and a query group's final softmax.
// Letters: T query tokens, H query heads, G kv heads, grp = H / G, D head dim, N keys.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/launcher.h"
#include "core/kv_view.h"

namespace squeezekv::cuda {

constexpr int kKeyTile = 32;      // keys a split's length is a multiple of
constexpr int kMaxHeadDim = 256;  // the general kernels' largest head dim
constexpr int kMaxSplits = 128;   // most splits of a key range (the merge's shared memory)

// One attention launch's sizes, recorded as argument bytes.
struct AttnShape {
  int T, H, G, grp, D, N, cap, qt;  // qt: query tokens per block; N: 0 when kv.count_dev holds it
  int splits;                       // most splits of the key range (the grid's z may be fewer)
  int direct;                       // 1: one split at most, the output is written without a merge
  int min_keys;                     // fewest keys a split takes (kMinSplitKeys or kMinDecodeSplitKeys)
  float scale;
};
static_assert(sizeof(AttnShape) == 12 * 4, "AttnShape: no padding (a recorded kernel argument)");

// How the N keys split over blocks: at most max_splits splits of at least min_keys keys, each a
// whole number of 32-key tiles. A prompt chunk's blocks have many query rows each and take 256 keys
// at least; a decode step's (one row) 128 (CudaOptions::decode_split_keys), so a short context
// still spreads over the SMs (the split count then changes every 128 keys up to max_splits, and a
// replayed step is recaptured as often). 64 gave one sequence at depth 4096 1.7% more and 64
// sequences 3-4% less, their splits' partials and merge being twice the bytes (2026-12-04,
// docs/raw/2026-12-04-h200-attention-instructions/). Computed on the device from N (which may live
// in device memory, so a recorded step replays for every N) and on the host to size the grid;
// results depend on sizes only.
constexpr int kMinSplitKeys = 256;
constexpr int kMinDecodeSplitKeys = 128;
struct KeyRange {
  int N, splits, chunk;
};
__host__ __device__ inline KeyRange key_range(int N, int max_splits, int min_keys) {
  int splits = (N + min_keys - 1) / min_keys < max_splits ? (N + min_keys - 1) / min_keys : max_splits;
  if (splits < 1) splits = 1;
  int chunk = ((N + splits - 1) / splits + kKeyTile - 1) / kKeyTile * kKeyTile;
  if (chunk < kKeyTile) chunk = kKeyTile;
  splits = N > 0 ? (N + chunk - 1) / chunk : 1;
  return {N, splits, chunk};
}
__device__ inline KeyRange key_range(const KvView& kv, const AttnShape& a) {
  return key_range(kv.count_dev != nullptr ? *kv.count_dev : a.N, a.splits, a.min_keys);
}

// Merges the splits' partial outputs part_acc [splits][rows][D] and max/sum part_ml
// [splits][rows][2] into out [rows][D] and ml_out [rows][2] (rows = T * H); the split count
// from kv and a as the attention kernel found it (attn_decode.cu).
void launch_attn_merge(Launcher& L, float* out, float* ml_out, const float* part_acc, const float* part_ml, int rows, const KvView& kv,
                       const AttnShape& a);

// One kv head's query group's final softmax (max M and 1/L of each of its grp <= GMAX heads, from
// ml [H][2]) and the mass a key gets from it: the one definition that the mass kernel and the
// eviction kernel's deferred mass both use, so both give the same bits. Products and sums are
// rounded explicitly (no contraction into an FMA, which the compiler may choose differently in
// two kernels).
template <int GMAX>
struct GroupSoftmax {
  float M[GMAX], inv[GMAX];
  int grp;
  __device__ __forceinline__ GroupSoftmax(const float* ml, int g, int grp_) : grp(grp_) {
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      const int h = g * grp + (r < grp ? r : 0);
      M[r] = ml[2 * h];
      inv[r] = ml[2 * h + 1] > 0.0f ? 1.0f / ml[2 * h + 1] : 0.0f;
    }
  }
  // old mass of key j + this step's: sc holds the group's score rows [GMAX][cap] (-inf: masked)
  __device__ __forceinline__ float add_mass(float old, const float* sc, size_t cap, int j, bool mass_max) const {
    float acc = 0.0f;
#pragma unroll
    for (int r = 0; r < GMAX; ++r) {
      if (r >= grp) break;
      const float s = sc[static_cast<size_t>(r) * cap + j];
      if (s == -INFINITY) continue;
      const float p = __fmul_rn(__expf(s - M[r]), inv[r]);
      acc = mass_max ? fmaxf(acc, p) : __fadd_rn(acc, p);
    }
    return mass_max ? fmaxf(old, acc) : __fadd_rn(old, __fdiv_rn(acc, static_cast<float>(grp)));
  }
};

}  // namespace squeezekv::cuda
