// Cost of eviction bookkeeping in a decode step: per-step time with an evicting policy holding R
// tokens per layer vs the full cache holding the same R tokens. All sessions run interleaved,
// block by block, so machine drift hits every policy alike; the overhead is the median over
// blocks of (policy time / full time - 1).
// Usage: squeezekv_bench_kv MODEL [threads=2] [retained=512] [steps=32] [blocks=15]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
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

struct Runner {
  std::string name;
  bool full;
  std::unique_ptr<Session> session;
  std::vector<int> prompt;
  std::vector<double> ms;  // per block, ms per step
};
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [threads=2] [retained=512] [steps=32] [blocks=15]\n", argv[0]);
    return 2;
  }
  try {
    const int threads = argc > 2 ? std::stoi(argv[2]) : 2;
    const int R = argc > 3 ? std::stoi(argv[3]) : 512;
    const int steps = argc > 4 ? std::stoi(argv[4]) : 32;
    const int blocks = argc > 5 ? std::stoi(argv[5]) : 15;
    auto m = Model::load(argv[1]);
    const int V = m->config().vocab_size;
    std::printf("model=%s threads=%d retained=%d steps=%d blocks=%d\n", argv[1], threads, R, steps, blocks);
    std::vector<Runner> runners;
    // evicting policies are prefilled with 3R tokens (the cache sits at its budget R); the full
    // cache with R - steps/2 before every block (it holds R on average over the block)
    for (KvPolicy p : {KvPolicy::kFull, KvPolicy::kWindow, KvPolicy::kH2O, KvPolicy::kSnapKV, KvPolicy::kSqueeze}) {
      Runner r;
      r.name = kv_policy_name(p);
      r.full = p == KvPolicy::kFull;
      SessionOptions so;
      so.threads = threads;
      so.cache.policy = p;
      so.cache.budget = r.full ? 0 : R;
      so.cache.squeeze_strength = 0.0;  // every layer holds exactly R: the same retained count as full
      r.prompt = tokens(r.full ? R - steps / 2 : 3 * R, V, 1);
      so.cache.max_tokens = static_cast<int>(r.prompt.size()) + steps * (blocks + 1) + 8;
      r.session = std::make_unique<Session>(*m, so);
      r.session->forward(r.prompt);
      runners.push_back(std::move(r));
    }
    const auto cont = tokens(steps * (blocks + 1), V, 2);
    for (int b = 0; b <= blocks; ++b) {
      for (Runner& r : runners) {
        if (r.full && b > 0) {
          r.session->reset();
          r.session->forward(r.prompt);
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i) r.session->forward(std::span<const int>(&cont[b * steps + i], 1));
        const double dt = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        if (b > 0) r.ms.push_back(dt / steps);  // block 0 warms up
      }
    }
    const Runner& full = runners[0];
    std::printf("%-8s %8.3f ms/step\n", "full", median(full.ms));
    for (size_t i = 1; i < runners.size(); ++i) {
      std::vector<double> ratio;
      for (size_t b = 0; b < full.ms.size(); ++b) ratio.push_back(runners[i].ms[b] / full.ms[b] - 1.0);
      std::sort(ratio.begin(), ratio.end());
      std::printf("%-8s %8.3f ms/step  overhead median %+.1f%% (quartiles %+.1f%% .. %+.1f%%)\n", runners[i].name.c_str(),
                  median(runners[i].ms), 100.0 * median(ratio), 100.0 * ratio[ratio.size() / 4],
                  100.0 * ratio[ratio.size() * 3 / 4]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
