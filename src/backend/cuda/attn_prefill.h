// Attention of prompt chunks on the CUDA cores, for any KV type and head dims up to 256 (the
// tensor-core kernel, attn_mma.h, takes the shapes it serves), and the policies' mass and the
// rows' entropy from a second pass over the same scores.
#pragma once
#include <cstdint>

#include "backend/cuda/attn_common.cuh"

namespace squeezekv::cuda {

constexpr int kAttnRows = 32;  // (token, query head) rows a block serves: grp <= 32

// grid (G, ceil(T / a.qt), splits): out [T][H][D] and the rows' max and sum ml [T * H][2]; with
// more than one split (not a.direct) the splits' partials go to part_acc [splits][T * H][D] and
// part_ml [splits][T * H][2] and are merged.
void launch_attn_tiles(Launcher& L, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, const float* q,
                       const int32_t* q_pos, const KvView& kv, const AttnShape& a);
// The second pass from the final max and sum ml: mass[g][j] += p / grp over rows t >= row_begin
// (mass_max: the max of p instead; mass null: none), and ent [T * H][2] (or null) += per row the
// sum -p log p and the visible key count. grid (G, query tiles from tile0 on, splits).
void launch_attn_probe(Launcher& L, dim3 grid, float* mass, int64_t mass_stride, int64_t row_begin, bool mass_max, float* ent,
                       const float* ml, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0);

}  // namespace squeezekv::cuda
