// Cost of eviction bookkeeping in a decode step: per-step time with an evicting policy holding R
// tokens per layer vs the full cache holding the same R tokens (median over blocks of steps).
// Usage: squeezekv_bench_kv MODEL [threads=2] [retained=512] [steps=32] [blocks=5]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "squeezekv/kv_cache.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace {
using namespace squeezekv;

std::vector<int> tokens(int n, int vocab, int salt) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = 100 + (i * 7919 + salt * 104729) % (vocab - 200);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median milliseconds per decode step. Evicting policies are prefilled with 3R tokens (so the
// cache sits at its budget R); the full cache with R - steps/2 (so it holds R on average).
double step_ms(const Model& m, CacheConfig cc, int threads, int R, int steps, int blocks) {
  const bool full = cc.policy == KvPolicy::kFull;
  const int n_prompt = full ? R - steps / 2 : 3 * R;
  SessionOptions so;
  so.threads = threads;
  so.cache = cc;
  so.cache.max_tokens = n_prompt + steps * (blocks + 1) + 8;
  Session s(m, so);
  const auto prompt = tokens(n_prompt, m.config().vocab_size, 1);
  const auto cont = tokens(steps * (blocks + 1), m.config().vocab_size, 2);
  std::vector<double> ms;
  s.forward(prompt);
  size_t next = 0;
  for (int b = 0; b <= blocks; ++b) {
    if (full && b > 0) {  // keep the full cache at the same retained count
      s.reset();
      s.forward(prompt);
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < steps; ++i) s.forward(std::span<const int>(&cont[next++], 1));
    const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (b > 0) ms.push_back(dt / steps);  // block 0 warms up
  }
  return median(ms);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [threads=2] [retained=512] [steps=32] [blocks=5]\n", argv[0]);
    return 2;
  }
  try {
    const int threads = argc > 2 ? std::stoi(argv[2]) : 2;
    const int R = argc > 3 ? std::stoi(argv[3]) : 512;
    const int steps = argc > 4 ? std::stoi(argv[4]) : 32;
    const int blocks = argc > 5 ? std::stoi(argv[5]) : 5;
    auto m = Model::load(argv[1]);
    std::printf("model=%s threads=%d retained=%d steps=%d blocks=%d\n", argv[1], threads, R, steps, blocks);
    CacheConfig full;
    const double base = step_ms(*m, full, threads, R, steps, blocks);
    std::printf("%-10s %8.3f ms/step\n", "full", base);
    for (KvPolicy p : {KvPolicy::kWindow, KvPolicy::kH2O, KvPolicy::kSnapKV, KvPolicy::kSqueeze}) {
      CacheConfig cc;
      cc.policy = p;
      cc.budget = R;
      cc.squeeze_strength = 0.0;  // every layer holds exactly R: same retained count as full
      const double t = step_ms(*m, cc, threads, R, steps, blocks);
      std::printf("%-10s %8.3f ms/step  overhead %+.1f%%\n", kv_policy_name(p), t, 100.0 * (t - base) / base);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
