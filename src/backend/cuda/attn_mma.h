// Attention of prompt chunks on the tensor cores (f16 KV, head dims 64 and 128), and the
// policies' mass (sums) of the same chunk from its max and sum.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/attn_common.cuh"

namespace squeezekv::cuda {

constexpr int kMmaRows = 64;  // query rows a block serves: 64 / grp tokens
constexpr int kMmaKeys = 64;  // keys a tile

// grid (G, ceil(T / a.qt)) with a.qt = kMmaRows / grp: out [T][H][D] (and, where ob is not null,
// the same values rounded to bf16 in ob [T][H][D]: the output product's operand) and the rows'
// max and sum ml [T * H][2] (natural-log units). D = a.D is 64 or 128; grp <= 16.
void launch_attn_mma(Launcher& L, dim3 grid, float* out, __nv_bfloat16* ob, float* ml, const float* q, const int32_t* q_pos,
                     const KvView& kv, const AttnShape& a);
// After launch_attn_mma over the same q and kv: mass[g][j] += p / grp over rows t >= row_begin.
// grid (G, query tiles from tile0 on, key splits).
void launch_attn_mma_mass(Launcher& L, dim3 grid, float* mass, int64_t mass_stride, int64_t row_begin, const float* ml, const float* q,
                          const int32_t* q_pos, const KvView& kv, const AttnShape& a, int tile0);

// A batch of prompt parts (Backend::attention_batch with chunks of several sequences): each part's
// rows attend over its own cache, in one launch, every block as in the part's lone k_attn_mma.
// The step's rows are in order: part i's q, out, q_pos and ml start at its row.
constexpr int kMaxPromptParts = 128;
struct MmaPart {
  const void* k;          // the layer's K, V [G][capacity] f16 rows, positions [G][capacity]
  const void* v;
  const int32_t* pos;
  const int32_t* count;   // [1] rows held (the part's own in); null: n
  float* mass;            // [G][mass_stride], or null: no mass for this part
  int64_t mass_stride;
  int64_t mass_row_begin;
  int n;                  // rows held when count is null
  int capacity;
  int row;                // its first row of the step
  int T;                  // its rows
  int mass_tile0;         // its first query tile that adds mass (first_mass_tile)
  int pad_;
};
static_assert(sizeof(MmaPart) == 5 * 8 + 2 * 8 + 6 * 4, "MmaPart: no padding (a recorded kernel argument)");
struct MmaParts {
  MmaPart p[kMaxPromptParts];  // entries past the batch's are zero
};
// grid (G, the most query tiles of a part (a.qt = kMmaRows / grp tokens each), parts): out, ml,
// q and q_pos of the whole step; a's T and N are each part's.
void launch_attn_mma_parts(Launcher& L, dim3 grid, float* out, float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                           const AttnShape& a);
// After launch_attn_mma_parts over the same rows: each part's mass as launch_attn_mma_mass adds
// it, with `splits` key splits. grid (G, the most mass tiles of a part, parts x splits).
void launch_attn_mma_mass_parts(Launcher& L, dim3 grid, const float* ml, const float* q, const int32_t* q_pos, const MmaParts& b,
                                const AttnShape& a, int splits);

}  // namespace squeezekv::cuda
