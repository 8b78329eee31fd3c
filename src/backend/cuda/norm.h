// RMSNorm on the device, alone or after a residual add (x += y), one block a row.
#pragma once
#include <cstdint>

#include "backend/cuda/launcher.h"

namespace squeezekv::cuda {

// out[T][E] = rmsnorm(x) * w; with y: x += y first (x is written), else x is only read.
void launch_rmsnorm(Launcher& L, float* out, float* x, const float* y, const float* w, int64_t T, int64_t E, float eps);

}  // namespace squeezekv::cuda
