// Parameters of the math ops that every backend implements (backend.h) and the CPU kernels take
// (cpu/ops.h). Letters: T rows, H query heads, G kv heads, D head dim, N retained keys.
#pragma once
#include <cstdint>

#include "core/kv_view.h"
#include "core/weight.h"

namespace squeezekv {

// How a decode product (T < 3) treats the activations.
//   kF32:  f32 throughout (the reference arithmetic).
//   kInt8: each block of 32 activations is rounded to 8 bits with one f32 scale (llama.cpp's
//          Q8 activations) and quantized weights are multiplied with integer dot products; each
//          product moves by at most the activations' rounding (sum over blocks of
//          sum|w| * max|x| / 254).
enum class Activations : uint8_t { kF32, kInt8 };

// How the T rows of a matmul relate.
//   kChunk:       rows of one prompt chunk: the backend sums in whatever order is fastest.
//   kIndependent: rows of different sequences (a decode batch): every row gets exactly the
//                 arithmetic of a one-row product, so a sequence's results do not depend on what
//                 else shares the batch; the weights are still read once for all rows. (CUDA
//                 keeps that with --batch-invariant, every decode row on one kernel; by default
//                 a batch of more than 4 rows multiplies through cuBLAS, each row within bf16's
//                 rounding of its lone result.)
enum class RowMode : uint8_t { kChunk, kIndependent };

enum class RopePairing : uint8_t {
  kHalves,    // dimension i pairs with i + D/2 (Hugging Face checkpoints, GGUF qwen2)
  kAdjacent,  // dimension 2i pairs with 2i + 1 (GGUF llama, llama2.c)
};

// How the probabilities a key receives become its mass.
//   kSum: per kv head, the mean over its H/G query heads of the sum over rows (H2O's accumulated
//         attention), added to the mass.
//   kMax: per kv head, the largest probability over its query heads and the rows (KVzip's score);
//         mass = max(mass, that).
enum class MassReduce : uint8_t { kSum, kMax };

// What attention can report besides its output; every field is optional and costs nothing unset.
struct AttentionProbe {
  float* mass = nullptr;       // [G][mass_stride], per kv head the probabilities its keys received over
                               // rows t >= mass_row_begin, reduced as `reduce` says (the backend's
                               // memory, like the KV rows)
  int64_t mass_stride = 0;     // 0: N
  int64_t mass_row_begin = 0;
  MassReduce reduce = MassReduce::kSum;
  bool entropy = false;        // accumulate 1 - H(p)/log(n) ... as sums below (rows with n >= 2)
  double entropy_sum = 0.0;    // out: sum over heads and rows of H(p) / log(n)
  int64_t entropy_rows = 0;    // out: rows counted
};

struct KvArrays;

// The new rows of a call in a batch, written into its layer's arrays just before it attends
// (Backend::kv_write's arguments, at = kv.count - T): a decode batch on a device appends the rows
// to its caches' bookkeeping only (KvStorage::append with write_later), so that the batch's
// writes and attention can be one launch. Null arrays: the rows are written already.
struct RowWrite {
  const KvArrays* arrays = nullptr;
  const float* k = nullptr;        // [T][G*D]
  const float* v = nullptr;        // [T][G*D]
  const int32_t* pos = nullptr;    // [T] (the backend's memory)
};

// One sequence's attention in a batch of them (Backend::attention_batch): the arguments of
// Backend::attention, and the rows to write first.
struct AttentionCall {
  float* out = nullptr;            // [T][H*D]
  const float* q = nullptr;        // [T][H*D]
  const int32_t* q_pos = nullptr;  // [T]
  int64_t T = 0;
  int H = 0;
  KvView kv;
  AttentionProbe* probe = nullptr;
  RowWrite write;
};

// RoPE applied to a product's output (MatmulPart::rope): the rows as Backend::rope rotates them.
struct RopeSpec {
  const int32_t* pos = nullptr;       // [T] positions (the backend's memory)
  const float* inv_freq = nullptr;    // [D/2] (the backend's memory)
  int D = 0;                          // head dim; the output's heads: w->rows / D
  RopePairing pairing = RopePairing::kHalves;
};

// One product of a group that shares its input (Backend::matmuls): out[T][w->rows] = x @ w^T + bias,
// then, with rope, rotated in place (q and k of attention).
struct MatmulPart {
  float* out = nullptr;
  const WeightMatrix* w = nullptr;
  const float* bias = nullptr;     // null: none
  const RopeSpec* rope = nullptr;  // null: none
};

}  // namespace squeezekv
