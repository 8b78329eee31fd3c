// Decode products: up to kGemvRows activation rows through up to four matrices that share their
// input (q, k, v with RoPE; gate and up with SwiGLU) in one launch, the weights read once.
#pragma once
#include "backend/backend.h"
#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

constexpr int kGemvRows = 4;  // activation rows a launch serves

// The parts as one k_gemv launch (T <= kGemvRows), their rotations in its epilogue (or, where it
// cannot take one, by launch_rope after it); swiglu: parts 0 (gate) and 1 (up), out[0] = silu(gate)
// * up. False, launching nothing, where the GEMV does not serve them (columns not a multiple of 8
// or not shared, weight types other than bf16 and f32 or mixed, more than four parts).
bool launch_gemv(Launcher& L, const MatmulPart* parts, int n, const float* x, int T, bool swiglu);

}  // namespace squeezekv::cuda
