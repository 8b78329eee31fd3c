// The CUDA backend's options and factory (built with -DSQUEEZEKV_CUDA=ON; cuda_backend.cu).
#pragma once
#include <memory>

#include "backend/backend.h"

namespace squeezekv {

struct CudaOptions {
  bool f32_weights = false;  // the exact test mode: matrices kept in f32 instead of bf16
  bool graphs = true;        // repeated launch lists (decode steps) replayed as CUDA graphs
  bool pdl = true;           // programmatic dependent launch: a kernel starts while the one before finishes
  bool mma_attention = true; // prompt attention on the tensor cores where the shape allows
  bool fuse_kv_write = true; // a decode step's new KV row written by its attention kernel
  bool defer_mass = true;    // a decode step's mass added by the layer's eviction kernel
  bool mma_mass = true;      // a prompt chunk's mass (sum) on the tensor cores after k_attn_mma
  // decode batches of more than 4 rows multiply on the tensor cores with bf16 activations
  // (gemm_rows.h: the weights read once per 64 rows); off: 4-row GEMV launches, each row with a
  // lone row's arithmetic (the default until it is measured and batch invariance is decided)
  bool batch_mma = false;
  // a decode batch's KV writes and attention in one launch for all its sequences (each with its
  // lone arithmetic); off: one sequence after another
  bool batch_attention = true;
};

std::unique_ptr<Backend> make_cuda_backend(const CudaOptions& options);

}  // namespace squeezekv
