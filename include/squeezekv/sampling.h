// One row's sampling settings and its uniform draw: what a batch's decode step needs to pick each
// row's token where the logits are (Engine::decode_sampled). The pick's definition is
// src/core/sample.h's; SamplerConfig (generate.h) is the user's side of the same settings.
#pragma once
#include <cstdint>

namespace squeezekv {

// The same layout on the host and the device.
struct SampleParams {
  double draw = 0.0;         // u in [0, 1)
  float temperature = 0.0f;  // <= 0: greedy (the first largest logit)
  float top_p = 1.0f;        // >= 1: off
  float min_p = 0.0f;        // <= 0: off
  int32_t top_k = 0;         // <= 0 or >= V: off
};

}  // namespace squeezekv
