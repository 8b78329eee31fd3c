// Host cost of the policies' decode-step selection for a large model's cache: every layer holds
// its budget, a decode step appends one row, and end_step() selects the row to evict per kv head
// (h2o: the lowest accumulated mass outside the sinks and the recent window) and compacts. This
// is what a GPU backend would pay per step if the mass came back to the host for selection
// (docs/DESIGN.md, "Eviction runs where the mass lives"); the attention itself is
// not timed.
// Usage: squeezekv_bench_select [layers=32] [kv_heads=8] [head_dim=128] [budget=2048] [steps=200]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kv/layer_cache.h"
#include "squeezekv/kv_cache.h"

int main(int argc, char** argv) {
  using namespace squeezekv;
  const int L = argc > 1 ? std::stoi(argv[1]) : 32;
  const int G = argc > 2 ? std::stoi(argv[2]) : 8;
  const int D = argc > 3 ? std::stoi(argv[3]) : 128;
  const int B = argc > 4 ? std::stoi(argv[4]) : 2048;
  const int steps = argc > 5 ? std::stoi(argv[5]) : 200;
  CacheConfig cfg;
  cfg.policy = KvPolicy::kH2O;
  cfg.budget = B;
  std::vector<LayerCache> layers;
  for (int l = 0; l < L; ++l)
    layers.emplace_back(l, G, D, KvType::kF16, make_h2o_policy({cfg, l, L, B + steps + 1}), 1, B + steps + 1);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(G) * D), v(k.size());
  for (auto& x : k) x = u(rng);
  for (auto& x : v) x = u(rng);
  std::vector<double> us;
  for (int t = 0; t < B + steps; ++t) {
    const int32_t pos = t;
    for (LayerCache& c : layers) {
      c.append(k.data(), v.data(), &pos, 1);
      float* mass = c.mass_accumulator();  // what attention would add: a random share per row
      const int cap = c.storage().capacity(), n = c.storage().count();
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < n; ++j) mass[static_cast<size_t>(g) * cap + j] += u(rng) / n;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (LayerCache& c : layers) c.end_step();
    const double dt = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (t >= B) us.push_back(dt);  // steady state: every step evicts one row per head
  }
  std::sort(us.begin(), us.end());
  const int cap = layers[0].storage().capacity();
  std::printf("layers=%d kv_heads=%d head_dim=%d budget=%d capacity=%d steps=%d\n", L, G, D, B, cap, steps);
  std::printf("host selection + compaction per decode step (all layers): median %.1f us (min %.1f, max %.1f)\n",
              us[us.size() / 2], us.front(), us.back());
  std::printf("mass a device would copy back per step: %.2f MB (layers x kv_heads x capacity x 4 bytes)\n",
              static_cast<double>(L) * G * cap * 4 / 1e6);
  return 0;
}
