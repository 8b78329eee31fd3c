// The CUDA backend's options and factory (built with -DSQUEEZEKV_CUDA=ON into libsqueezekv_cuda.so,
// which make_backend loads at run time; cuda_backend.cu).
#pragma once
#include <memory>

#include "backend/backend.h"

namespace squeezekv {

struct CudaOptions {
  bool f32_weights = false;  // the exact test mode: matrices kept in f32 instead of bf16
  // quantized matrices kept in their GGUF blocks (gemv_q.h) instead of dequantized to bf16
  bool native_weights = true;
  bool graphs = true;        // repeated launch lists (decode steps) replayed as CUDA graphs
  bool pdl = true;           // programmatic dependent launch: a kernel starts while the one before finishes
  bool mma_attention = true; // prompt attention on the tensor cores where the shape allows
  bool mma_decode = true;    // decode attention on the tensor cores where the shape allows
  bool fuse_kv_write = true; // a decode step's new KV row written by its attention kernel
  bool defer_mass = true;    // a decode step's mass added by the layer's eviction kernel
  bool mma_mass = true;      // a prompt chunk's mass (sum) on the tensor cores after k_attn_mma
  // How a decode batch of more than 4 rows multiplies (bf16 activations on the tensor cores, or
  // the GEMV's f32 rows):
  //   kTuned: cuBLASLt, each shape's algorithm the fastest of its heuristic's candidates, timed
  //          at the shape's first product (gemm_lt.h; the default). The algorithm depends on the
  //          batch, so a row's sums, and its logits within bf16's rounding, may depend on what
  //          shares it;
  //   kBlas: cuBLAS's own choice of algorithm (cublasGemmEx, as prompt chunks), for comparison;
  //   kGemv: 4-row GEMV launches, each row with a lone row's arithmetic (a sequence's tokens the
  //          same bits in any batch; the weights read once per 4 rows; for comparison);
  //   kMma:  gemm_rows.h for every decode row, a lone sequence's one row too (--batch-invariant on:
  //          each row's sums the same bits in any batch; H200, 2026-12-04: 0.65x cuBLASLt's decode
  //          at 64 sequences, 8.3x kGemv's).
  enum class BatchProducts : uint8_t { kTuned, kBlas, kGemv, kMma };
  BatchProducts batch = BatchProducts::kTuned;
  int gemm_rows_step = 128;  // gemm_rows.h's step: the columns its weight loads run ahead (64 or 128)
  // Over weights kept in their blocks (--device-weights native): up to this many rows through the
  // integer GEMV, more through packed_mma's kernel (a decode batch of up to 64 rows) or a
  // dequantization to bf16 and cuBLAS (a prompt chunk, a larger batch, or packed_mma off)
  int packed_gemv_rows = 16;
  // cuBLASLt's candidates timed for each decode-batch shape, and the timed runs of each (gemm_lt.h)
  int lt_algos = 8, lt_runs = 3;
  // the fewest keys a decode split takes (attn_common.cuh: kMinDecodeSplitKeys), a multiple of 32;
  // lone and batched sequences split alike whatever it is
  int decode_split_keys = 128;
  // a decode step's attention blocks per SM a sequence at most (its keys split into up to this
  // many times the SMs over its kv heads), lone and batched alike; 0: the kernel's own, 8 of the
  // tensor-core kernel's one-warp blocks (H100, 2026-12-06: q8_0 rows at depth 32768 5% faster
  // than 4, f16 the same) and 4 of the CUDA-core kernel's four-warp blocks
  int decode_blocks_per_sm = 0;
  // a decode batch's attention splits each sequence's keys as its lone launch does (true, with
  // --batch-invariant: a sequence's bits alone), or at most into as many splits as fill
  // decode_blocks_per_sm over the whole batch (false, the default: a batch of many long sequences
  // fills the GPU with few splits each, so fewer partial sums are written and merged; a
  // sequence's attention within rounding of its lone one)
  bool batch_lone_splits = false;
  bool packed_mma = true;  // a decode batch over packed weights on the tensor cores (gemm_rows_q.h)
  // a decode batch's KV writes and attention in one launch for all its sequences (each with its
  // lone arithmetic); off: one sequence after another
  bool batch_attention = true;
  // the launches recorded so far issued at every Backend::submit() (after each layer: the host
  // records a layer while the device runs the one before, each layer's list its own graph); off:
  // a step's launches issued together when the host first waits (its logits)
  bool layer_submit = true;
  // products over matrices laid out together (prepare_weights: q, k, v; gate, up) as one product
  // for a decode batch or a prompt chunk, split after; off: one product per matrix
  bool join_products = true;
  // a prompt chunk's and a decode batch's tensor-core attention (and the splits' merge) write the
  // output in bf16 too, the output product's operand (no conversion launch a layer); off:
  // converted before that product
  bool attn_bf16_out = true;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);

}  // namespace squeezekv
