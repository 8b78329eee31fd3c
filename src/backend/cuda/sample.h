// A decode batch's tokens picked where the logits are (Backend::sample_rows): greedy's argmax and
// temperature / top-k / min-p / top-p sampling under src/core/sample.h's definition, one block a row.
#pragma once
#include <cstdint>

#include "backend/cuda/launcher.h"
#include "squeezekv/sampling.h"

namespace squeezekv::cuda {

// out[r] = row r's pick from x[r][0, V) under params[r] for r < n; q: scratch [n][V] (a row's
// probabilities, written once and read by the passes after).
void launch_sample_rows(Launcher& L, int32_t* out, const float* x, const SampleParams* params, float* q, int64_t n, int64_t V);

}  // namespace squeezekv::cuda
