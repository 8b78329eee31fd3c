// Attention of one query token (a decode step) over a layer's kept rows: flash-decoding splits,
// their merge, and the policies' mass from the step's kept scores.
#pragma once
#include <cuda_bf16.h>
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

// A decode batch (CudaBackend::attention_batch): one launch for every sequence's layer. The
// table travels as the kernel's argument (a recorded launch's bytes, so a replayed step finds the
// same table: it holds no count, only where the counts are); the step's rows, row b of sequence
// b, and the scratch per row are in DecodeRows.
constexpr int kMaxBatchSeqs = 256;
struct DecodeSeq {
  void* k;                // the layer's K, V [G][capacity] rows (f16 or Q8_0, the batch's type), positions and mass [G][capacity]
  void* v;
  int32_t* pos;
  float* mass;
  const int32_t* count;   // [1] rows held once the step's row is in
  int capacity;
  int splits;             // most splits of its keys (as its lone launch would have them)
  int row;                // its row of the step
  int add_mass;           // 1: its attention adds the mass (DecodeRows::scores kept for it)
};
struct DecodeBatch {
  DecodeSeq s[kMaxBatchSeqs];  // entries past the group's are zero
};
static_assert(sizeof(DecodeSeq) == 5 * 8 + 4 * 4, "DecodeSeq: no padding (a recorded kernel argument)");
// Keys a block of the batch's mass kernel takes (launch_attn_mass_batch's grid: y = the largest
// capacity over this).
constexpr int kMassBlockKeys = 1024;
// What the merge and the mass of a batch need of row b's sequence, recorded by its attention.
struct DecodeInfo {
  float* mass;            // null: no mass
  int N, splits, capacity, pad_;
};
struct DecodeRows {
  float* out;             // [rows][H][D]
  float* ml;              // [rows][H][2]
  float* part_acc;        // [rows][part_stride]: [splits][H][D] each
  float* part_ml;         // [rows][part_ml_stride]: [splits][H][2] each
  float* scores;          // [rows][score_stride]: [G][gmax][capacity] each, for rows that add mass
  DecodeInfo* info;       // [rows]
  const float* q;         // [rows][H][D]
  const int32_t* q_pos;   // [rows] (the new rows' positions too)
  const float* k_new;     // [rows][G][D] f32 rows to write first, or null
  const float* v_new;
  int64_t part_stride, part_ml_stride, score_stride;
  // [rows][H][D]: out rounded to bf16 too (the output product's operand), or null; only the
  // tensor-core kernel (attn_decode_mma.h) and the merge write it
  __nv_bfloat16* out_bf16;
};
static_assert(sizeof(DecodeRows) == 14 * 8, "DecodeRows: no padding (a recorded kernel argument)");

// What block (x, y, z) of a batch launch needs of its sequence b.s[z] (its layer's arrays, the
// step's row s.row of r): its view, its shape (its own splits), its new row to write, and where
// its rows and scratch are. Block (0, 0, z) records what the merge and the mass need (r.info).
struct BatchBlock {
  KvView kv;
  AttnShape a;
  KvRowWrite w;
  float *out, *ml, *part_acc, *part_ml, *scores;
  __nv_bfloat16* out_bf16;  // null: none
  const float* q;
  const int32_t* q_pos;
};
__device__ inline BatchBlock batch_block(const DecodeBatch& b, const DecodeRows& r, const AttnShape& a) {
  const DecodeSeq& s = b.s[blockIdx.z];
  const size_t row = s.row, HD = static_cast<size_t>(a.H) * a.D;
  BatchBlock k;
  k.a = a;
  k.a.splits = s.splits;
  k.kv.k = s.k, k.kv.v = s.v, k.kv.pos = s.pos, k.kv.count_dev = s.count, k.kv.count = 0;
  k.kv.capacity = s.capacity, k.kv.n_kv_heads = a.G, k.kv.head_dim = a.D;  // its type: the kernel's template
  if (r.k_new != nullptr) {
    k.w.K = s.k, k.w.V = s.v, k.w.P = s.pos, k.w.M = s.mass;
    k.w.k = r.k_new + row * a.G * a.D, k.w.v = r.v_new + row * a.G * a.D, k.w.pos = r.q_pos + row;
  }
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
    r.info[row] = DecodeInfo{s.add_mass ? s.mass : nullptr, *s.count, s.splits, s.capacity};
  k.out = r.out + row * HD, k.ml = r.ml + row * 2 * a.H, k.part_acc = r.part_acc + row * r.part_stride;
  k.part_ml = r.part_ml + row * r.part_ml_stride, k.scores = s.add_mass ? r.scores + row * r.score_stride : nullptr;
  k.q = r.q + row * HD, k.q_pos = r.q_pos + row;
  k.out_bf16 = r.out_bf16 != nullptr ? r.out_bf16 + row * HD : nullptr;
  return k;
}

// How a batch launch's blocks share a kv head's splits (both decode kernels): the splits a block
// takes so that about `resident` blocks (what the device holds at once) cover the batch's seqs
// sequences of G kv heads and at most `most` splits each; the grid's y is ceil(most / that).
inline int splits_per_block(int most, int G, int seqs, int resident) {
  const int blocks = resident / (G * seqs) > 1 ? resident / (G * seqs) : 1;  // per kv head and sequence
  return (most + blocks - 1) / blocks;
}

// The decode attention of a batch's rows (its `seqs` sequences, their most splits `most`), each
// split as launch_attn_decode runs it, a block taking several splits of its sequence where that
// keeps about as many blocks as the device's `sms` SMs hold at once; then, once for all rows,
// launch_attn_merge_batch and, with mass, launch_attn_mass_batch.
// Every sequence's rows of one type: f16 or Q8_0.
void launch_attn_decode_batch(Launcher& L, KvType type, int lpk, int gmax, int most, int seqs, int sms, const DecodeBatch& b,
                              const DecodeRows& r, const AttnShape& a);
// Merges rows [0, rows) where their sequence's keys took more than one split.
void launch_attn_merge_batch(Launcher& L, int rows, const DecodeRows& r, const AttnShape& a);
// grid (G, the largest capacity over kMassBlockKeys, rows): the mass of the rows whose sequences add one.
void launch_attn_mass_batch(Launcher& L, int gmax, dim3 grid, bool mass_max, const DecodeRows& r, const AttnShape& a);

// Lanes a K/V row of type and head dim D takes in the decode kernels (16 bytes of f16/f32 values
// a lane, or half a Q8_0 block): 4, 8, 16 or 32; 0 where they do not serve the shape.
int decode_lanes(KvType type, int D);
// grid (G, splits of chunk keys): out [H][D] and the rows' max and sum ml [H][2] (one split) or the
// splits' partials part_acc/part_ml, merged here; scores (or null): the scaled logits kept for the
// mass, [G][gmax][capacity]. lpk: decode_lanes(kv.type, D) (K and V of one type: f16, f32 or Q8_0);
// gmax: 4 or 8, at least grp; w: the step's new row, written first (w.k null: none).
void launch_attn_decode(Launcher& L, int lpk, int gmax, dim3 grid, float* out, float* ml, float* part_acc, float* part_ml,
                        float* scores, const float* q, const int32_t* q_pos, const KvView& kv, const AttnShape& a, const KvRowWrite& w);
// The step's mass from the kept scores and ml: mass[g][j] += sum over the group's heads of p, / grp
// (mass_max: the max). grid as the attention's.
void launch_attn_mass(Launcher& L, int gmax, dim3 grid, float* mass, int64_t stride, bool mass_max, const float* scores, const float* ml,
                      const KvView& kv, const AttnShape& a);

}  // namespace squeezekv::cuda
