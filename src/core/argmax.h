// The first index of the largest value of a row (as std::max_element): greedy decoding's pick,
// shared by the sampler's definition (core/sample.h) and so by every backend's sample_rows.
// The maximum is taken in 16 lanes that the compiler vectorizes, then the first index holding it.
#pragma once
#include <algorithm>
#include <cstddef>
#include <span>

namespace squeezekv {

inline int argmax(std::span<const float> x) {
  constexpr int kLanes = 16;
  const size_t n = x.size();
  if (n < 2 * kLanes) return static_cast<int>(std::max_element(x.begin(), x.end()) - x.begin());
  float best[kLanes];
  for (int j = 0; j < kLanes; ++j) best[j] = x[j];
  size_t i = kLanes;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) best[j] = x[i + j] > best[j] ? x[i + j] : best[j];
  float m = best[0];
  for (int j = 1; j < kLanes; ++j) m = best[j] > m ? best[j] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (size_t k = 0; k < n; ++k)
    if (x[k] == m) return static_cast<int>(k);
  return 0;  // NaN among the first values: as max_element, the first
}

}  // namespace squeezekv
