// A layer's KV rows on the device: new rows written, rows moved (compaction), a decode step's
// evictions of every layer and sequence in one launch, and a chunk's evictions of any number of rows.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// One layer's eviction (CudaBackend::kv_evict_one): its arrays, sizes and the protected positions.
struct EvictOne {
  uint32_t* K;
  uint32_t* V;
  int32_t* P;
  float* M;
  const int32_t* newest;  // the newest position on the device (keep_from = *newest - n_recent + 1), or null
  // this step's mass, not yet added (CudaBackend's deferred mass): the decode attention's kept
  // scores [G][gmax][cap] and final max and sum [H][2]; null scores: the mass is up to date
  const float* scores;
  const float* ml;
  uint32_t k_words, v_words;  // 32-bit words of a K row and of a V row
  int cap, count, keep_below, keep_from, n_recent, grp, gmax, mass_max;
};
static_assert(sizeof(EvictOne) == 8 * 8 + 8 * 4, "EvictOne: no padding (compared as bytes)");

// T rows k, v [T][G][D] f32 (as a.type's and a.v_type's rows: f16, f32 or Q8_0 for both, or Q4_1
// values beside f16 or Q8_0 keys) at slots at.. (or, with a.count_dev, the last T of *count_dev),
// positions rows_pos [T], mass 0; recorded with launch_tagged(tag) (null: none).
void launch_kv_write(Launcher& L, const void* tag, const KvArrays& a, int at, const float* k, const float* v, const int32_t* rows_pos,
                     int T);
// One array of kv's rows [0, N) (K's or V's, rows of type `from`: f16, f32, Q8_0 or Q4_1) as values
// of type `to` (f16 or f32) into out [G][capacity][D] (N: *kv.count_dev, or kv.count), for the
// kernels that read f16 or f32 rows (a prompt chunk's attention, the probes).
void launch_kv_dequantize(Launcher& L, KvType from, KvType to, void* out, const void* rows, const KvView& kv);
// Row from[i] -> to[i] (device arrays [n]) of K, V, positions and mass.
void launch_kv_move(Launcher& L, const KvArrays& a, const int* from, const int* to, int n);
// The evictions table[0, n) (device memory, n up to 65535), one block a (kv head, entry): the
// least-mass row outside the protected positions goes (count - 1 moves into its hole). Tagged
// with tag: the caller may take the launch back and relaunch it with one entry more.
void launch_kv_evict(Launcher& L, const void* tag, const EvictOne* table, int n, int G);

// Backend::kv_evict_top for every head, one block a head: the n_evict least-mass rows among the
// positions [keep_below, keep_from) go (moved over, or marked in dead_pos [G][capacity]); scratch:
// [G][2][n_evict] ints of device memory for the moves (unused with dead_pos).
void launch_kv_evict_top(Launcher& L, const KvArrays& a, int count, int n_evict, int32_t keep_below, int32_t keep_from,
                         int32_t* dead_pos, int* scratch);

}  // namespace squeezekv::cuda
