// Generation throughput: prompt tokens/s and decode tokens/s, median of several runs.
// Usage: squeezekv_bench MODEL [threads] [prompt_tokens] [gen_tokens] [runs] [decode_activations: int8|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "squeezekv/error.h"
#include "squeezekv/generate.h"
#include "squeezekv/model.h"
#include "squeezekv/session.h"

int main(int argc, char** argv) {
  using namespace squeezekv;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s MODEL [threads=2] [prompt_tokens=64] [gen_tokens=64] [runs=5] [int8|f32]\n", argv[0]);
    return 2;
  }
  try {
    const std::string path = argv[1];
    const int threads = argc > 2 ? std::stoi(argv[2]) : 2;
    const int n_prompt = argc > 3 ? std::stoi(argv[3]) : 64;
    const int n_gen = argc > 4 ? std::stoi(argv[4]) : 64;
    const int runs = argc > 5 ? std::stoi(argv[5]) : 5;
    const std::string act = argc > 6 ? argv[6] : "int8";
    auto model = Model::load(path);
    SessionOptions so;
    so.threads = threads;
    so.decode_activations = parse_decode_activations(act);
    so.cache.max_tokens = n_prompt + n_gen + 1;
    Session session(*model, so);
    std::vector<int> prompt;
    for (int i = 0; i < n_prompt; ++i) prompt.push_back(100 + (i * 7919) % (model->config().vocab_size - 200));
    std::vector<double> pp, tg;
    GenerateOptions go;
    go.max_tokens = n_gen;
    go.sampler.temperature = 0.0f;
    for (int r = 0; r < runs + 1; ++r) {
      session.reset();
      // ignore end-of-generation: time exactly n_gen decode steps
      const auto t0 = std::chrono::steady_clock::now();
      auto logits = session.forward(prompt);
      const auto t1 = std::chrono::steady_clock::now();
      int tok = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      for (int i = 0; i < n_gen; ++i) {
        logits = session.forward(std::span<const int>(&tok, 1));
        tok = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      }
      const auto t2 = std::chrono::steady_clock::now();
      if (r == 0) continue;  // warm-up
      pp.push_back(n_prompt / std::chrono::duration<double>(t1 - t0).count());
      tg.push_back(n_gen / std::chrono::duration<double>(t2 - t1).count());
    }
    std::sort(pp.begin(), pp.end());
    std::sort(tg.begin(), tg.end());
    std::printf("model=%s threads=%d prompt_tokens=%d gen_tokens=%d runs=%d decode_activations=%s\n", path.c_str(), threads,
                n_prompt, n_gen, runs, act.c_str());
    std::printf("prompt_tok_s_median=%.1f (min %.1f max %.1f)\n", pp[pp.size() / 2], pp.front(), pp.back());
    std::printf("gen_tok_s_median=%.1f (min %.1f max %.1f)\n", tg[tg.size() / 2], tg.front(), tg.back());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
