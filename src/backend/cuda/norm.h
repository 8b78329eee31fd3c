// RMSNorm on the device, alone or after a residual add (x += y), one block a row.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// out[T][E] = rmsnorm(x) * w; with y: x += y first (x is written), else x is only read. With
// out_bf16: out also as bf16 there ([T][E], rounded to nearest as launch_to_bf16 rounds).
void launch_rmsnorm(Launcher& L, float* out, __nv_bfloat16* out_bf16, float* x, const float* y, const float* w, int64_t T, int64_t E,
                    float eps);

}  // namespace squeezekv::cuda
