// Attention of prompt chunks on the tensor cores (f16 KV, head dims 64 and 128), and the
// policies' mass (sums) of the same chunk from its max and sum.
#pragma once
#include <cstdint>

#include "backend/cuda/attn_common.cuh"

namespace squeezekv::cuda {

constexpr int kMmaRows = 64;  // query rows a block serves: 64 / grp tokens
constexpr int kMmaKeys = 64;  // keys a tile

// grid (G, ceil(T / a.qt)) with a.qt = kMmaRows / grp: out [T][H][D] and the rows' max and sum ml
// [T * H][2] (natural-log units). D = a.D is 64 or 128; grp <= 16.
void launch_attn_mma(Launcher& L, dim3 grid, float* out, float* ml, const float* q, const int32_t* q_pos, const KvView& kv,
                     const AttnShape& a);
// After launch_attn_mma over the same q and kv: mass[g][j] += p / grp over rows t >= row_begin.
// grid (G, query tiles from tile0 on, key splits).
void launch_attn_mma_mass(Launcher& L, dim3 grid, float* mass, int64_t mass_stride, int64_t row_begin, const float* ml, const float* q,
                          const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0);

}  // namespace squeezekv::cuda
