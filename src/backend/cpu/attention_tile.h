// The tiles of the fast attention path (attention.cc): what one tile of query rows of one kv head
// reads and writes. The tile kernel is written once (attention_kernel.h) over a vector type and
// compiled twice: 8 floats (AVX2, attention.cc) and 16 floats (AVX-512, attention_avx512.cc,
// chosen at run time). Letters as in ops.h: T query rows, H query heads, G kv heads, D head dim,
// N retained keys per kv head.
#pragma once
#include <cstdint>

#include "backend/cpu/quant_dot.h"
#include "core/kv_view.h"

namespace squeezekv::cpu::attn {

constexpr int kRowTile = 16;  // query rows whose score rows [kRowTile][N] are held at once

// Q8_0 keys met by 8-bit queries (TiledArgs::q8_scores): a query row of 64 values rounded to 8
// bits a block of 32 (quantize_q8, as the products' int8 activations are), its scales times the
// attention's scale. A (row, key) score is then, with i_b the exact integer dot product of block
// b, s = float(i_0) * (d_k0 * d_q0) and s = fma(float(i_1), d_k1 * d_q1, s): the vector kernel
// and q8_score form the same float.
struct Q8Query {
  Q8Block b[2];
  float d[2];  // b[i].d * scale
};
void quantize_query(const float* x, float scale, Q8Query& out);
// The score of one Q8_0 key row (64 values: two blocks of a f16 scale and 32 int8).
float q8_score(const Q8Query& q, const uint8_t* k);
// s[r * s_stride + n] for 16 consecutive keys n (rows kb bytes apart) and `rows` queries: the
// keys' bytes transposed (16 keys' dims 4j..4j+3 in one register) and summed by vpdpbusd into 16
// keys' lanes at once, no horizontal sums (attention_vnni.cc).
using Q8ScoresFn = void (*)(float* s, int64_t s_stride, const Q8Query* q, int rows, const uint8_t* k, int64_t kb);
// The kernel where the build has it and the CPU runs AVX-512 VNNI; else null.
Q8ScoresFn vnni_q8_scores16();

struct TiledArgs {
  const float* q;  // [T][H*D]
  float* out;      // [T][H*D]
  const int32_t* q_pos;  // [T]
  int H, group, D, N, capacity;
  const void* k;       // [G][kv_rows] rows (the kernel's K row format)
  const void* v;       // [G][kv_rows] rows (its V row format)
  const int32_t* pos;  // [G][capacity]
  float scale;
  int64_t mass_from;
  bool want_mass, entropy;
  bool mass_max;
  int kv_rows;  // rows a kv head's K and V take: the capacity, or N for rows dequantized to scratch
  // The recent ring (KvView::ring_k): a key at position p >= ring_from with ring_pos[p % ring] == p
  // is scored against ring_k's row and weighs ring_v's row instead of its quantized ones.
  const uint16_t* ring_k = nullptr;  // [G][ring][D] f16, or null
  const uint16_t* ring_v = nullptr;  // [G][ring][D] f16, or null
  const int32_t* ring_pos = nullptr; // [ring]
  int ring = 0;
  int32_t ring_from = 0;
  // Q8_0 keys of head dim 64 met by 8-bit queries (Q8Query): 16 keys a call here, the rest by
  // q8_score; null: f32 queries (attention.cc says when).
  Q8ScoresFn q8_scores = nullptr;
};

// One tile of up to kRowTile rows of one kv head. Rows are (token, query head of the group) pairs,
// token-major, so the H/G query heads that share a kv head read its keys and values once (GQA).
struct TileJob {
  int g = 0;            // kv head
  int64_t row0 = 0;     // first row in [0, T * group)
  int rows = 0;
  float* mass = nullptr;  // [N] this tile's share, summed over rows t >= mass_from (not yet / group)
  double entropy_sum = 0.0;
  int64_t entropy_rows = 0;
};

// A key segment's softmax over its own keys, to be merged with the tile's other segments
// (flash-decoding): per row the segment max m, sum l = sum e and sum e x of e = exp(s - m),
// x = s - m, the visible keys, and the unnormalised output sum e v. The e stay in the tile's
// score rows, columns [n0, n1).
struct SegmentPart {
  float m[kRowTile], l[kRowTile], ex[kRowTile];
  int visible[kRowTile];
  float out[kRowTile][256];  // head dims up to 256 split this way; larger ones use one segment
};

// Keys [n0, n1) of one tile (n0 a multiple of 4; D a multiple of 16). part == null: the segment
// is all keys; the rows are normalised and the output, mass and entropy written here. Otherwise
// the segment's partial results go to part, the exponentials to s (the tile's score rows
// [rows][N]), and the caller merges the segments.
//   s: [kRowTile][N] scratch; skip: N / 4 + 1 bytes of scratch (key quads no row of the tile sees)
using TileFn = void (*)(const TiledArgs& a, TileJob& job, int n0, int n1, float* s, SegmentPart* part, uint8_t* skip);

// The AVX-512 tile kernel for K rows of type k and V rows of type v (attention_avx512.cc); null
// where the build has none, the CPU does not run it (cpu_features.h) or the pair has none (f32
// pairs only with f32).
TileFn avx512_tile(KvType k, KvType v);

}  // namespace squeezekv::cpu::attn
