// Batched decode through the library's Engine, without HTTP: B sequences (each with its own
// cache, at depth D) decode together; one step runs every sequence's row through each weight
// matrix once. Prints per-step time and aggregate tokens/s for each B, median of R runs of S
// steps, so the server's own figures (bench/bench_server.py) can be read against the engine's.
// Usage: squeezekv_bench_batch MODEL|dummy:CONFIG.json [threads=2] [batches=1,2,4,8] [depth=64] [steps=64]
//        [runs=5] [device=cpu|cuda]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "squeezekv/device.h"
#include "squeezekv/engine.h"
#include "squeezekv/model.h"

namespace {
using namespace squeezekv;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL|dummy:CONFIG.json [threads=2] [batches=1,2,4,8] [depth=64] [steps=64] [runs=5] [device=cpu|cuda]\n",
                 argv[0]);
    return 2;
  }
  try {
    const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
    std::vector<int> batches;
    std::stringstream list(argc > 3 ? argv[3] : "1,2,4,8");
    for (std::string b; std::getline(list, b, ',');) batches.push_back(std::atoi(b.c_str()));
    const int depth = argc > 4 ? std::atoi(argv[4]) : 64, steps = argc > 5 ? std::atoi(argv[5]) : 64,
              runs = argc > 6 ? std::atoi(argv[6]) : 5;
    const std::string what = argv[1];
    auto model = what.rfind("dummy:", 0) == 0 ? Model::dummy(what.substr(6)) : Model::load(what);
    const int V = model->config().vocab_size;
    SessionOptions o;
    o.threads = threads;
    o.decode_activations = DecodeActivations::kInt8;  // what generate and serve use
    o.device = parse_device(argc > 7 ? argv[7] : "cpu");
    const int most = *std::max_element(batches.begin(), batches.end());
    Engine engine(*model, o, most);
    std::printf("# %s, %s, depth %d, %d steps per run, median of %d runs (int8 decode on the CPU)\n", argv[1],
                engine.device_description().c_str(), depth, steps, runs);
    std::printf("| sequences | ms per step | aggregate tok/s | vs 1 |\n|---|---:|---:|---:|\n");
    double one = 0.0;
    for (int B : batches) {
      std::vector<double> per_step;
      for (int r = 0; r < runs; ++r) {
        std::vector<SequenceId> ids;
        std::vector<int> next;
        CacheConfig c;
        c.max_tokens = depth + steps + 1;
        for (int i = 0; i < B; ++i) {
          ids.push_back(engine.add_sequence(c));
          std::vector<int> prompt(depth);
          for (int t = 0; t < depth; ++t) prompt[t] = 100 + (t * 7919 + i * 104729) % (V - 200);
          for (int s = 0; s < depth; s += engine.prefill_chunk())
            engine.prefill(ids.back(), std::span<const int>(prompt).subspan(s, std::min(engine.prefill_chunk(), depth - s)));
          next.push_back(100 + i);
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < steps; ++s) engine.decode(ids, next);
        per_step.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps);
        for (SequenceId id : ids) engine.remove_sequence(id);
      }
      const double ms = 1e3 * median(per_step), tps = B / median(per_step);
      if (one == 0.0) one = tps;
      std::printf("| %d | %.2f | %.1f | %.2fx |\n", B, ms, tps, tps / one);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
