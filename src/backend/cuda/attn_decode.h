// Attention of one query token (a decode step) over a layer's kept rows: flash-decoding splits,
// their merge, and the policies' mass from the step's kept scores.
#pragma once
#include <cstdint>

#include "backend/cuda/attn_common.cuh"

namespace squeezekv::cuda {

// The decode step's new row (what k_kv_write would write for T = 1 at slot N - 1, N read on the
// device), written by the decode attention itself when its kv_write was the launch just before
// (CudaBackend::attention_decode): k, v [G][D] f32; null k: nothing to write.
struct KvRowWrite {
  void* K = nullptr;             // the view's K, V, positions (writable) and the mass [G][cap]
  void* V = nullptr;
  int32_t* P = nullptr;
  float* M = nullptr;
  const float* k = nullptr;      // [G][D]
  const float* v = nullptr;      // [G][D]
  const int32_t* pos = nullptr;  // [1]
};

// grid (G, splits of chunk keys): out [H][D] and the rows' max and sum ml [H][2] (one split) or the
// splits' partials part_acc/part_ml, merged here; scores (or null): the scaled logits kept for the
// mass, [G][gmax][capacity]. lpk: lanes a K/V row takes (D * value bytes / 16: 4, 8, 16 or 32);
// gmax: 4 or 8, at least grp; w: the step's new row, written first (w.k null: none).
void launch_attn_decode(Launcher& L, int lpk, int gmax, int chunk, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml,
                        float* scores, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w);
// The step's mass from the kept scores and ml: mass[g][j] += sum over the group's heads of p, / grp
// (mass_max: the max). grid as the attention's.
void launch_attn_mass(Launcher& L, int gmax, dim3 grid, float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml,
                      const KvView& kv, const AttnShape& a);

}  // namespace squeezekv::cuda
