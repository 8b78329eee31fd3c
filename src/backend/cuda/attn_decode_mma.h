// Decode attention on the tensor cores for f16 and Q8_0 KV rows (K and V of one type, or Q4_1
// values beside f16 or Q8_0 keys), head dims 64 and 128 and up to 8 query heads a kv head (every
// Llama-family shape we serve): the kernels that attn_decode.h's serve otherwise, with the same
// splits, outputs, partials and kept scores, so its merge and mass kernels follow unchanged.
#pragma once
#include "backend/cuda/attn_decode.h"

namespace squeezekv::cuda {

// Whether the tensor-core kernels serve this K and V type pair (any head dim and group), and this
// view and query group.
bool decode_mma_pair(KvType k, KvType v);
bool decode_mma_serves(const KvView& kv, int grp);
// The blocks (one warp each) of these kernels that an SM holds at once.
int decode_mma_blocks_per_sm();

// As launch_attn_decode (lpk is not needed): grid (G, splits); then the merge where there are
// several splits.
void launch_attn_decode_mma(Launcher& L, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml, float* scores,
                            const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w);
// As launch_attn_decode_batch (k_type, v_type: every sequence's K and V rows).
void launch_attn_decode_mma_batch(Launcher& L, KvType k_type, KvType v_type, int gmax, int most, int seqs, int sms,
                                  const DecodeBatch& b, const DecodeRows& r, const AttnShape& a);

}  // namespace squeezekv::cuda
