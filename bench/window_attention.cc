// Where the question's attention goes, layer by layer: the analysis behind SnapKV's failure on
// question-aware passkey prompts (docs/RESULTS.md). For each sample of an `eval retrieval
// --question-aware --json` record it prefills the prompt in one step with every row kept and the
// attention mass of the last W rows (the question: SnapKV's observation window) accumulated per
// key, then reports per layer the share of that mass on the sinks, the needle's tokens, the window
// itself and the rest; and, with snapkv at the given budget, the share of needle tokens each layer
// keeps (mean over kv heads).
// Usage: squeezekv_window_attention MODEL RECORD.json [budget=819] [window=32] [threads=2]
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/runner.h"
#include "squeezekv/model.h"

using namespace squeezekv;

namespace {

// Token indices whose text overlaps an occurrence of `needle` in the decoded prompt.
std::vector<int> needle_tokens(const Tokenizer& tok, const std::vector<int>& ids, const std::string& needle) {
  std::string text;
  std::vector<size_t> start(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    start[i] = text.size();
    text += tok.decode(std::span<const int>(&ids[i], 1));
  }
  std::vector<int> out;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t end = i + 1 < ids.size() ? start[i + 1] : text.size();
      if (start[i] < at + needle.size() && end > at) out.push_back(static_cast<int>(i));
    }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL RECORD.json [budget=819] [window=32] [threads=2]\n", argv[0]);
    return 2;
  }
  const int budget = argc > 3 ? std::stoi(argv[3]) : 819, window = argc > 4 ? std::stoi(argv[4]) : 32;
  const int threads = argc > 5 ? std::stoi(argv[5]) : 2;
  auto model = Model::load(argv[1]);
  std::ifstream in(argv[2]);
  const nlohmann::json rec = nlohmann::json::parse(in);
  const int L = model->config().n_layers, G = model->config().n_kv_heads;
  std::vector<double> sinks(L), needle(L), win(L), rest(L), kept(L);
  int n = 0;
  for (const auto& s : rec.at("samples")) {
    const std::vector<int> ids = s.at("prompt_ids").get<std::vector<int>>();
    const std::vector<int> nt = needle_tokens(model->tokenizer(), ids, s.at("expected")[0].get<std::string>());
    if (nt.empty()) continue;
    const int T = static_cast<int>(ids.size());
    SessionOptions so;
    so.threads = threads;
    so.prefill_chunk = T;
    Runner runner(*model, so, T);
    CacheConfig watch;  // snapkv with room for everything: no eviction, the window's mass kept
    watch.policy = KvPolicy::kSnapKV;
    watch.budget = T + 1;
    watch.snapkv_window = window;
    watch.max_tokens = T + 1;
    SequenceState all = runner.new_sequence(watch);
    const Segment seg{&all, ids.data(), T};
    runner.step({&seg, 1});
    CacheConfig snap = watch;
    snap.budget = budget;
    SequenceState cut = runner.new_sequence(snap);
    const Segment seg2{&cut, ids.data(), T};
    runner.step({&seg2, 1});
    for (int l = 0; l < L; ++l) {
      const KvStorage& st = all.caches.layers[l].storage();
      const KvStorage& ct = cut.caches.layers[l].storage();
      for (int g = 0; g < G; ++g) {
        double tot = 0, sk = 0, nd = 0, w = 0;
        for (int j = 0; j < st.count(); ++j) {
          const int32_t p = st.positions(g)[j];
          const double m = st.mass(g)[j];
          tot += m;
          if (p < 4) sk += m;
          else if (std::binary_search(nt.begin(), nt.end(), p)) nd += m;
          else if (p >= T - window) w += m;
        }
        sinks[l] += sk / tot / G;
        needle[l] += nd / tot / G;
        win[l] += w / tot / G;
        rest[l] += (tot - sk - nd - w) / tot / G;
        int k = 0;
        for (int j = 0; j < ct.count(); ++j) k += std::binary_search(nt.begin(), nt.end(), ct.positions(g)[j]);
        kept[l] += static_cast<double>(k) / static_cast<double>(nt.size()) / G;
      }
    }
    ++n;
  }
  std::printf("%d samples; share of the last %d rows' attention mass by key group, and the share of needle tokens snapkv keeps at budget %d\n",
              n, window, budget);
  std::printf("%5s %7s %7s %7s %7s %12s\n", "layer", "sinks", "needle", "window", "rest", "needle_kept");
  for (int l = 0; l < L; ++l)
    std::printf("%5d %7.3f %7.3f %7.3f %7.3f %12.2f\n", l, sinks[l] / n, needle[l] / n, win[l] / n, rest[l] / n, kept[l] / n);
  return 0;
}
