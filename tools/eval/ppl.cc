// Long-context perplexity under eviction, the streaming way users run: prefill P tokens, then
// teacher-forced one-token steps with eviction active at every step; every continuation token is
// scored.
#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "eval/eval.h"
#include "eval/progress.h"
#include "squeezekv/error.h"

namespace squeezekv::eval {

void validate(const PplOptions& o) {
  std::ifstream in(o.text_file);
  if (o.text_file.empty() || !in) throw Error("--text: cannot read text file '" + o.text_file + "'");
  if (o.ctx < 2) throw Error("--ctx: must be at least 2, got " + std::to_string(o.ctx));
  if (o.prefix < 1 || o.prefix >= o.ctx)
    throw Error("--prefix: must be in [1, ctx - 1] = [1, " + std::to_string(o.ctx - 1) + "], got " + std::to_string(o.prefix));
  if (o.windows < 1) throw Error("--windows: must be at least 1, got " + std::to_string(o.windows));
}

namespace {
// -log softmax(logits)[target], in double
double nll(std::span<const float> logits, int target) {
  double mx = logits[0];
  for (float x : logits) mx = std::max(mx, static_cast<double>(x));
  double sum = 0.0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  return std::log(sum) + mx - static_cast<double>(logits[target]);
}
}  // namespace

void RunCost::add(const std::vector<LayerStats>& layers) {
  layer_budgets.clear();
  for (const LayerStats& st : layers) {
    kept_bytes += st.kept_bytes;
    full_bytes += st.full_bytes;
    layer_budgets.push_back(st.budget);
  }
}

void RunCost::finish(int64_t n) {
  kept_bytes /= n;
  full_bytes /= n;
}

PplResult run_ppl(const Model& m, const SessionOptions& so_in, const PplOptions& o) {
  validate(o);
  std::ifstream in(o.text_file);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::vector<int> ids = m.tokenizer().encode(ss.str(), /*add_bos=*/false);
  const int64_t need = static_cast<int64_t>(o.ctx) * o.windows;
  if (static_cast<int64_t>(ids.size()) < need)
    throw Error("--text: '" + o.text_file + "' has " + std::to_string(ids.size()) + " tokens, fewer than --ctx x --windows = " +
                std::to_string(need));
  SessionOptions so = so_in;
  so.cache.max_tokens = o.ctx;
  Session s(m, so);
  PplResult r;
  double total_nll = 0.0;
  const auto t0 = std::chrono::steady_clock::now();
  Progress bar("ppl", static_cast<int64_t>(o.windows) * (o.ctx - o.prefix), o.progress);
  int64_t done = 0;
  for (int w = 0; w < o.windows; ++w) {
    s.reset();
    const int* win = ids.data() + static_cast<size_t>(w) * o.ctx;
    auto logits = s.forward(std::span<const int>(win, static_cast<size_t>(o.prefix)));
    double wn = 0.0;
    for (int i = o.prefix; i < o.ctx; ++i) {
      wn += nll(logits, win[i]);
      bar.update(++done);
      if (i + 1 < o.ctx) logits = s.forward(std::span<const int>(win + i, 1));
    }
    const int scored = o.ctx - o.prefix;
    r.window_ppl.push_back(std::exp(wn / scored));
    total_nll += wn;
    r.tokens += scored;
    r.cost.add(s.kv_stats());
  }
  bar.finish();
  r.cost.finish(o.windows);
  r.ppl = std::exp(total_nll / static_cast<double>(r.tokens));
  r.cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cost.tokens_per_second = static_cast<double>(o.windows) * (o.ctx - 1) / r.cost.seconds;
  return r;
}

}  // namespace squeezekv::eval
