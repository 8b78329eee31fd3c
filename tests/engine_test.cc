// Engine and Scheduler: batched decode gives every sequence exactly what it gets alone (same
// tokens and text as generate() on a Session with the same settings), with and without eviction,
// whatever shares the batch; stops and cancellations free their sequences.
#include "squeezekv/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "squeezekv/error.h"
#include "squeezekv/model.h"
#include "core/sample.h"
#include "runtime/runner.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

const Model& smollm() {
  static std::unique_ptr<Model> m = Model::load(test::default_model());
  return *m;
}

CacheConfig cache_of(KvPolicy p, int budget) {
  CacheConfig c;
  c.policy = p;
  c.budget = p == KvPolicy::kFull ? 0 : budget;
  c.max_tokens = 512;
  return c;
}

CacheConfig snapkv(int budget, int window) {
  CacheConfig c = cache_of(KvPolicy::kSnapKV, budget);
  c.snapkv_window = window;
  return c;
}

CacheConfig squeeze_at_prompt_end(int budget) {
  CacheConfig c = cache_of(KvPolicy::kSqueeze, budget);
  c.squeeze_resolve = SqueezeResolve::kPrompt;
  return c;
}

// K and V rows of `type`, the newest `ring` of them also in f16 (--kv-recent-f16)
CacheConfig rows_of(CacheConfig c, KvDType type, int ring = 0) {
  c.dtype = type;
  c.recent_f16 = ring;
  return c;
}

struct Case {
  std::string prompt;
  CacheConfig cache;
  int n = test::kSanitized ? 12 : 24;  // tokens generated (under the sanitizers fewer: 147 s there with 24, 2026-12-02)
};

std::vector<Case> cases() {
  return {
      {"The quick brown fox", cache_of(KvPolicy::kFull, 0)},
      {"Once upon a time, in a small village by the sea, there lived an old fisherman who", cache_of(KvPolicy::kH2O, 16)},
      {"Emma Woodhouse, handsome, clever, and rich, with a comfortable home", cache_of(KvPolicy::kSqueeze, 12)},
      {"def fibonacci(n):", cache_of(KvPolicy::kWindow, 10)},
      {"The capital of France is a city that many people", snapkv(12, 4), 30},
      {"Water boils at", cache_of(KvPolicy::kFull, 0), 5},
      // kvzip scores its prompt when the prompt ends (the last of its chunks, Segment::input_end)
      {"Mr. Knightley, a sensible man about seven or eight and thirty, was not only a very old and intimate friend of the family",
       cache_of(KvPolicy::kKvzip, 12)},
      {"It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
       squeeze_at_prompt_end(14)},
  };
}

SessionOptions options(DecodeActivations act) {
  SessionOptions o;
  o.threads = 2;
  o.prefill_chunk = 16;  // prompts run in several chunks, interleaved with other requests' decode steps
  o.decode_activations = act;
  return o;
}

GenerateOptions greedy(int n) {
  GenerateOptions g;
  g.max_tokens = n;
  g.sampler.temperature = 0.0f;
  return g;
}

class EngineTest : public ::testing::TestWithParam<DecodeActivations> {};

TEST_P(EngineTest, BatchedRequestsEqualLoneGeneration) {
  const Model& m = smollm();
  const auto cs = cases();
  std::vector<GenerateResult> lone;
  for (const Case& c : cs) {
    SessionOptions o = options(GetParam());
    o.cache = c.cache;
    Session s(m, o);
    const auto ids = m.tokenizer().encode(c.prompt, true);
    lone.push_back(generate(s, ids, greedy(c.n)));
  }
  Engine engine(m, options(GetParam()), 4);  // 8 requests over 4 slots: four wait, then join running batches
  Scheduler sched(engine);
  std::map<int64_t, GenerateResult> done;
  std::map<int64_t, std::string> streamed;
  std::vector<int64_t> ids;
  for (const Case& c : cs) {
    GenerationRequest r;
    r.prompt = m.tokenizer().encode(c.prompt, true);
    r.options = greedy(c.n);
    r.cache = c.cache;
    const int64_t id = static_cast<int64_t>(ids.size()) + 1;
    r.on_text = [&streamed, id](std::string_view s) {
      streamed[id] += s;
      return true;
    };
    r.on_done = [&done, id](const GenerateResult& res) { done[id] = res; };
    ids.push_back(sched.submit(std::move(r)));
    EXPECT_EQ(ids.back(), id);
  }
  EXPECT_EQ(sched.waiting(), static_cast<int>(cs.size()));
  int steps = 0;
  int most_running = 0;
  while (sched.step()) {
    most_running = std::max(most_running, sched.running());
    ASSERT_LT(++steps, 10000);
  }
  EXPECT_EQ(most_running, 4);
  EXPECT_EQ(engine.sequences(), 0);
  EXPECT_EQ(sched.kv_usage().held, 0);
  EXPECT_EQ(sched.kv_usage().full, 0);
  for (size_t i = 0; i < cs.size(); ++i) {
    const GenerateResult& b = done.at(ids[i]);
    EXPECT_EQ(b.tokens, lone[i].tokens) << "request " << i << ": " << cs[i].prompt;
    EXPECT_EQ(b.text, lone[i].text) << "request " << i;
    EXPECT_EQ(streamed[ids[i]], b.text) << "request " << i;
    EXPECT_EQ(b.stop_reason, lone[i].stop_reason) << "request " << i;
    EXPECT_FALSE(b.tokens.empty());
  }
}

// under the sanitizers the int8 activations alone: the batching is the same code either way, and
// the exact f32 products run there in eval_test and kv_policy_test (105 s of engine_test's 300
// there with both, 2026-12-03)
INSTANTIATE_TEST_SUITE_P(Activations, EngineTest,
                         ::testing::ValuesIn(test::kSanitized ? std::vector<DecodeActivations>{DecodeActivations::kInt8}
                                                              : std::vector<DecodeActivations>{DecodeActivations::kF32,
                                                                                               DecodeActivations::kInt8}));

TEST(Engine, DecodeRowsEqualLoneRowsBitForBit) {
  // the logits themselves, not only the greedy tokens: three sequences at different positions
  const Model& m = smollm();
  const int V = m.config().vocab_size;
  const std::vector<std::vector<int>> prompts = {m.tokenizer().encode("Hello there", true),
                                                 m.tokenizer().encode("A long time ago in a galaxy far, far away", true),
                                                 m.tokenizer().encode("1 2 3 4", true)};
  const std::vector<int> next = {42, 1000, 7};
  Engine engine(m, options(DecodeActivations::kF32), 3);
  std::vector<SequenceId> seqs;
  for (const auto& p : prompts) {
    seqs.push_back(engine.add_sequence(cache_of(KvPolicy::kH2O, 6)));
    engine.prefill(seqs.back(), p);
  }
  engine.decode(seqs, next);  // two decode steps: the second one runs over caches that evicted
  const std::span<const float> out = engine.decode(seqs, next);
  const std::vector<float> batched(out.begin(), out.end());
  for (size_t i = 0; i < prompts.size(); ++i) {
    SessionOptions o = options(DecodeActivations::kF32);
    o.cache = cache_of(KvPolicy::kH2O, 6);
    Session s(m, o);
    s.forward(prompts[i]);
    s.forward(std::span<const int>(&next[i], 1));
    const auto lone = s.forward(std::span<const int>(&next[i], 1));
    ASSERT_EQ(engine.position(seqs[i]), static_cast<int>(prompts[i].size()) + 2);
    for (int j = 0; j < V; ++j) ASSERT_EQ(lone[j], batched[i * V + j]) << "sequence " << i << " logit " << j;
  }
}

// Several sequences' prompt chunks in one step (Engine::prefill of parts, as the Scheduler runs
// requests that arrive together) give each sequence the logits it gets alone and leave its caches
// as alone: under every policy, chunks of different lengths (the last parts of longer prompts
// among them), then two decode steps. With 8-bit activations (the default) bit for bit: the
// default model's products sum each row as a one-row product does, whatever the step's rows.
// With f32 activations a chunk's products take other kernels by the step's row count (a lone
// prompt of 1-2 rows takes the decode path), so within rounding: 1e-3 of the logits' scale, the
// same greedy token.
TEST_P(EngineTest, PrefillPartsEqualLonePrefills) {
  const bool exact = GetParam() == DecodeActivations::kInt8;
  auto expect_same = [exact](std::span<const float> lone, const float* got, int V, const std::string& what) {
    float scale = 0.0f, diff = 0.0f;
    for (int v = 0; v < V; ++v) {
      if (exact) {
        ASSERT_EQ(lone[v], got[v]) << what << " logit " << v;
      }
      scale = std::max(scale, std::fabs(lone[v]));
      diff = std::max(diff, std::fabs(lone[v] - got[v]));
    }
    ASSERT_LE(diff, 1e-3f * scale) << what;
    ASSERT_EQ(std::max_element(lone.begin(), lone.end()) - lone.begin(), std::max_element(got, got + V) - got) << what;
  };
  const Model& m = smollm();
  const int V = m.config().vocab_size;
  const std::vector<Case> cs = cases();
  SessionOptions o = options(GetParam());
  Engine together(m, o, static_cast<int>(cs.size())), alone(m, o, 1);
  std::vector<std::vector<int>> prompts;
  std::vector<SequenceId> a, b;
  for (const Case& c : cs) {
    prompts.push_back(m.tokenizer().encode(c.prompt, true));
    a.push_back(alone.add_sequence(c.cache));
    b.push_back(together.add_sequence(c.cache));
  }
  const int chunk = o.prefill_chunk;
  std::vector<size_t> done(cs.size(), 0);
  for (bool left = true; left;) {  // every round: each unfinished prompt's next chunk, all in one step
    left = false;
    std::vector<Engine::PrefillPart> parts;
    std::vector<size_t> who;
    for (size_t i = 0; i < cs.size(); ++i) {
      const size_t T = std::min(prompts[i].size() - done[i], static_cast<size_t>(chunk));
      if (T == 0) continue;
      parts.push_back({b[i], std::span<const int>(prompts[i]).subspan(done[i], T), static_cast<int>(prompts[i].size())});
      who.push_back(i);
    }
    if (parts.empty()) break;
    // at most max(chunk, batch) rows a step: as many parts as fit
    std::vector<Engine::PrefillPart> step;
    std::vector<size_t> step_who;
    int rows = 0;
    for (size_t j = 0; j < parts.size(); ++j) {
      if (rows + static_cast<int>(parts[j].tokens.size()) > std::max(chunk, static_cast<int>(cs.size()))) continue;
      rows += static_cast<int>(parts[j].tokens.size());
      step.push_back(parts[j]);
      step_who.push_back(who[j]);
    }
    const std::span<const float> out = together.prefill(step);
    const std::vector<float> got(out.begin(), out.end());
    for (size_t j = 0; j < step.size(); ++j) {
      const size_t i = step_who[j];
      const std::span<const float> lone = alone.prefill(a[i], step[j].tokens, static_cast<int>(prompts[i].size()));
      expect_same(lone, got.data() + j * V, V, "sequence " + std::to_string(i) + " at " + std::to_string(done[i]));
      done[i] += step[j].tokens.size();
    }
    left = true;
  }
  std::vector<int> next(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) next[i] = 100 + static_cast<int>(i) * 37;
  for (int t = 0; t < 2; ++t) {
    const std::span<const float> out = together.decode(b, next);
    const std::vector<float> got(out.begin(), out.end());
    for (size_t i = 0; i < cs.size(); ++i) {
      const std::span<const float> lone = alone.decode(std::span<const SequenceId>(&a[i], 1), std::span<const int>(&next[i], 1));
      expect_same(lone, got.data() + i * V, V, "sequence " + std::to_string(i) + " decode step " + std::to_string(t));
    }
  }
  for (size_t i = 0; i < cs.size(); ++i) {
    const auto sa = alone.kv_stats(a[i]), sb = together.kv_stats(b[i]);
    for (size_t l = 0; l < sa.size(); ++l) ASSERT_EQ(sa[l].tokens_kept, sb[l].tokens_kept) << "sequence " << i << " layer " << l;
  }
}

// Prompt chunks over quantized rows that share a step take the path they take alone: a chunk of
// more than kRowTile query rows a kv head reads its rows dequantized once (attention.cc,
// dequantizes_for_tiles). Packed with another sequence's chunk they once ran the register path
// instead, and the server's concurrent answers with 4-bit rows differed from generate's
// (2026-12-06). Two chunks of 8 and then 6 tokens a step, bit for bit (int8 activations).
TEST(Engine, QuantizedRowChunksSharingAStepEqualLoneChunks) {
  const Model& m = smollm();
  const int V = m.config().vocab_size;
  SessionOptions o = options(DecodeActivations::kInt8);
  const std::vector<std::string> texts = {"She was the youngest of the two daughters of a most affectionate, indulgent father",
                                          "The rain in Spain stays mainly in the plain, said the professor to his pupil"};
  const std::vector<CacheConfig> caches = {rows_of(cache_of(KvPolicy::kH2O, 16), KvDType::kQ4_1, 8),
                                           rows_of(cache_of(KvPolicy::kFull, 0), KvDType::kQ8_0)};
  Engine together(m, o, 2), alone(m, o, 1);
  std::vector<std::vector<int>> prompts;
  std::vector<SequenceId> a, b;
  for (size_t i = 0; i < texts.size(); ++i) {
    prompts.push_back(m.tokenizer().encode(texts[i], true));
    ASSERT_GE(prompts.back().size(), 14u);
    a.push_back(alone.add_sequence(caches[i]));
    b.push_back(together.add_sequence(caches[i]));
  }
  int at = 0;
  for (const int T : {8, 6}) {
    std::vector<Engine::PrefillPart> parts;
    for (size_t i = 0; i < texts.size(); ++i)
      parts.push_back({b[i], std::span<const int>(prompts[i]).subspan(at, T), static_cast<int>(prompts[i].size())});
    const std::span<const float> out = together.prefill(parts);
    const std::vector<float> got(out.begin(), out.end());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::span<const float> lone = alone.prefill(a[i], parts[i].tokens, static_cast<int>(prompts[i].size()));
      for (int v = 0; v < V; ++v) ASSERT_EQ(lone[v], got[i * V + v]) << "sequence " << i << " at " << at << " logit " << v;
    }
    at += T;
  }
}

// A batch's tokens picked where the logits are (Engine::decode_sampled, the backend's
// sample_rows) are the picks core/sample.h defines over the logits decode() returns for the same
// step, row by row under each row's settings: greedy (the first largest), temperature alone,
// top-k with min-p, top-p; the two engines stay in step: three sequences, eviction on, six steps.
TEST(Engine, DecodeSampledPicksFromTheLogits) {
  const Model& m = smollm();
  const int V = m.config().vocab_size;
  Engine a(m, options(DecodeActivations::kInt8), 3), b(m, options(DecodeActivations::kInt8), 3);
  std::vector<SequenceId> sa, sb;
  std::vector<std::vector<int>> prompts;
  std::vector<Engine::PrefillPart> pa, pb;
  for (const char* text : {"The sea was calm", "Once upon a time", "def main():"}) {
    prompts.push_back(m.tokenizer().encode(text, true));
    sa.push_back(a.add_sequence(cache_of(KvPolicy::kH2O, 8)));
    sb.push_back(b.add_sequence(cache_of(KvPolicy::kH2O, 8)));
  }
  for (int i = 0; i < 3; ++i) pa.push_back({sa[i], prompts[i]}), pb.push_back({sb[i], prompts[i]});
  std::vector<int> next(3);
  std::mt19937_64 rng(3);
  SampleScratch scratch;
  // the prompts' first tokens (Engine::prefill_sampled), then decode steps
  for (int step = -1; step < 6; ++step) {
    std::vector<SampleParams> params(3);
    for (int i = 0; i < 3; ++i) {
      if (step % 3 == 0 && i == 0) continue;  // greedy
      params[i].temperature = 0.7f + 0.2f * static_cast<float>(i);
      params[i].draw = std::generate_canonical<double, 53>(rng);
      if (i == 1) params[i].top_k = 20, params[i].min_p = 0.05f;
      if (i == 2) params[i].top_p = 0.9f;
    }
    const std::span<const float> logits = step < 0 ? a.prefill(pa) : a.decode(sa, next);
    const std::vector<float> l(logits.begin(), logits.end());
    const std::span<const int> got = step < 0 ? b.prefill_sampled(pb, params) : b.decode_sampled(sb, next, params);
    for (int i = 0; i < 3; ++i) {
      const std::span<const float> row(l.data() + static_cast<size_t>(i) * V, static_cast<size_t>(V));
      const int want = params[i].temperature > 0.0f ? sample_row(row, params[i], scratch)
                                                    : static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
      ASSERT_EQ(got[i], want) << "step " << step << " sequence " << i;
      next[i] = want;
    }
  }
}

// A copied sequence (Engine::copy_sequence) is the original's continuation, bit for bit, under
// every policy: copied after its prompt (the schedule fixed, rows evicted) or in the middle of it
// (squeeze's schedule and kvzip's scoring still to come), with the original removed at once so
// nothing is shared.
TEST(Engine, CopiedSequenceContinuesBitForBit) {
  const Model& m = smollm();
  const int V = m.config().vocab_size;
  // (under the sanitizers the int8 activations: a copy's bits do not depend on them, and the exact
  // f32 products made this test 63 s there, 2026-12-03)
  SessionOptions o = options(test::kSanitized ? DecodeActivations::kInt8 : DecodeActivations::kF32);
  o.prefill_chunk = 8;
  Engine engine(m, o, 2);
  const std::vector<int> prompt =
      m.tokenizer().encode("Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed", true);
  // the evicting policies' budgets bind from the prompt on (under the sanitizers 3 steps: 113 s
  // there with 6, 2026-12-02)
  const std::vector<int> next = test::kSanitized ? std::vector<int>{42, 1000, 7} : std::vector<int>{42, 1000, 7, 300, 12, 9};
  CacheConfig pyramid = cache_of(KvPolicy::kPyramidKV, 12);
  pyramid.snapkv_window = 4;
  const std::vector<CacheConfig> configs = {cache_of(KvPolicy::kFull, 0), cache_of(KvPolicy::kH2O, 10), cache_of(KvPolicy::kWindow, 10),
                                            cache_of(KvPolicy::kSqueeze, 10), snapkv(12, 4), pyramid, cache_of(KvPolicy::kKvzip, 10)};
  const int P = static_cast<int>(prompt.size());
  ASSERT_GT(P, 16);
  // runs the prompt's chunks [from, to) of sequence s
  auto prefill = [&](SequenceId s, int from, int to) {
    for (int at = from; at < to; at += 8)
      engine.prefill(s, std::span<const int>(prompt).subspan(at, std::min(8, to - at)), P);
  };
  for (const CacheConfig& c : configs) {
    const SequenceId ref = engine.add_sequence(c);
    prefill(ref, 0, P);
    std::vector<float> want;
    for (int t : next) {
      const std::span<const float> out = engine.decode(std::span<const SequenceId>(&ref, 1), std::span<const int>(&t, 1));
      want.insert(want.end(), out.begin(), out.end());
    }
    const std::vector<LayerStats> ref_stats = engine.kv_stats(ref);
    engine.remove_sequence(ref);
    for (const int copy_at : {8, P}) {  // in the prompt, after it
      const std::string what = std::string(kv_policy_name(c.policy)) + " copied at " + std::to_string(copy_at);
      const SequenceId a = engine.add_sequence(c);
      prefill(a, 0, copy_at);
      const SequenceId b = engine.copy_sequence(a);
      EXPECT_EQ(engine.position(b), copy_at) << what;
      engine.remove_sequence(a);
      prefill(b, copy_at, P);
      for (size_t i = 0; i < next.size(); ++i) {
        const std::span<const float> out = engine.decode(std::span<const SequenceId>(&b, 1), std::span<const int>(&next[i], 1));
        for (int j = 0; j < V; ++j) ASSERT_EQ(out[j], want[i * V + j]) << what << ": step " << i << " logit " << j;
      }
      const std::vector<LayerStats> stats = engine.kv_stats(b);
      ASSERT_EQ(stats.size(), ref_stats.size());
      for (size_t l = 0; l < stats.size(); ++l) {
        EXPECT_EQ(stats[l].tokens_kept, ref_stats[l].tokens_kept) << what << ": layer " << l;
        EXPECT_EQ(stats[l].budget, ref_stats[l].budget) << what << ": layer " << l;
      }
      engine.remove_sequence(b);
    }
  }
  EXPECT_EQ(engine.sequences(), 0);
}

TEST(Scheduler, CancelAndStopFreeTheirSequences) {
  const Model& m = smollm();
  SessionOptions o = options(DecodeActivations::kInt8);
  o.prefill_chunk = 12;  // one 8-token prompt a step: the second request is still in its prompt after the first
  Engine engine(m, o, 2);
  Scheduler sched(engine);
  std::vector<std::string> reasons(3);
  int calls = 0;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = m.tokenizer().encode("Tell me a story about a dragon", true);
    r.options = greedy(40);
    r.cache = cache_of(KvPolicy::kSqueeze, 8);
    if (i == 0) r.on_text = [&calls](std::string_view) { return ++calls < 3; };  // the client goes away
    r.on_done = [&reasons, i](const GenerateResult& res) { reasons[i] = res.stop_reason; };
    sched.submit(std::move(r));
  }
  sched.step();
  sched.cancel(2);  // still in its prompt
  sched.cancel(3);  // still waiting
  while (sched.step()) {
  }
  EXPECT_EQ(reasons[0], "cancelled");
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(reasons[1], "cancelled");
  EXPECT_EQ(reasons[2], "cancelled");
  EXPECT_EQ(engine.sequences(), 0);
}

// The Scheduler issues each decode step before it takes the step before's tokens, and runs a
// token that may complete a stop string (the row is dropped when the stop is found): requests
// that end by a stop string, by max_tokens, by a full context or by sampling run as they do alone
// (tokens, text, streamed text, stop reason), and what a server reads between steps (running(),
// kv_usage()) counts only the live requests.
TEST(Scheduler, StopStringsAndFullContextsEndAsAlone) {
  const Model& m = smollm();
  struct Req {
    const char* prompt;
    GenerateOptions opt;
    int ctx;
  };
  std::vector<Req> rs;
  GenerateOptions a = greedy(40), b = greedy(40), c = greedy(12), d = greedy(60), e = greedy(30);
  a.stop = {"\n"}, b.stop = {" the", "."}, d.stop = {"zzz"};
  e.sampler.temperature = 0.9f, e.sampler.top_p = 0.9f, e.sampler.seed = 7, e.stop = {","};
  rs.push_back({"List three fruits.", a, 512});
  rs.push_back({"Once upon a time there was", b, 512});
  rs.push_back({"The sea was calm", c, 512});
  rs.push_back({"Tell me a story about a dragon", d, 0});  // the context ends it: 5 tokens of room
  rs.push_back({"Water boils at", e, 512});
  for (Req& r : rs)
    if (r.ctx == 0) r.ctx = static_cast<int>(m.tokenizer().encode(r.prompt, true).size()) + 5;
  std::vector<GenerateResult> lone;
  for (const Req& r : rs) {
    SessionOptions o = options(DecodeActivations::kInt8);
    o.cache = cache_of(KvPolicy::kH2O, 16);
    o.cache.max_tokens = r.ctx;
    Session s(m, o);
    const std::vector<int> ids = m.tokenizer().encode(r.prompt, true);
    // alone, a context of P + 5 holds 5 fed tokens and a sixth picked from the last logits
    GenerateOptions opt = r.opt;
    opt.max_tokens = std::min(opt.max_tokens, r.ctx - static_cast<int>(ids.size()) + 1);
    lone.push_back(generate(s, ids, opt));
  }
  Engine engine(m, options(DecodeActivations::kInt8), 3);
  Scheduler sched(engine);
  std::map<size_t, GenerateResult> done;
  std::map<size_t, std::string> streamed;
  for (size_t i = 0; i < rs.size(); ++i) {
    GenerationRequest r;
    r.prompt = m.tokenizer().encode(rs[i].prompt, true);
    r.options = rs[i].opt;
    r.cache = cache_of(KvPolicy::kH2O, 16);
    r.cache.max_tokens = rs[i].ctx;
    r.on_text = [&streamed, i](std::string_view t) {
      streamed[i] += t;
      return true;
    };
    r.on_done = [&done, i](const GenerateResult& res) { done[i] = res; };
    sched.submit(std::move(r));
  }
  int steps = 0;
  while (sched.step()) {
    EXPECT_LE(sched.running(), 3);
    EXPECT_EQ(sched.running() + static_cast<int>(done.size()) + sched.waiting(), static_cast<int>(rs.size()));
    EXPECT_GE(sched.kv_usage().full, 0);
    ASSERT_LT(++steps, 1000);
  }
  EXPECT_EQ(engine.sequences(), 0);
  EXPECT_EQ(sched.kv_usage().held, 0);
  for (size_t i = 0; i < rs.size(); ++i) {
    const GenerateResult& got = done.at(i);
    EXPECT_EQ(got.tokens, lone[i].tokens) << "request " << i;
    EXPECT_EQ(got.text, lone[i].text) << "request " << i;
    EXPECT_EQ(streamed[i], got.text) << "request " << i;
    EXPECT_EQ(got.stop_reason, lone[i].stop_reason) << "request " << i;
  }
  // the cases end as they were meant to
  EXPECT_EQ(lone[0].stop_reason, "stop");
  EXPECT_EQ(lone[1].stop_reason, "stop");
  EXPECT_EQ(lone[2].stop_reason, "length");
  EXPECT_EQ(lone[3].stop_reason, "length");
  EXPECT_EQ(lone[3].tokens.size(), 6u);
}

// Prompts that arrive together share the prefill between two decode steps, up to one chunk's worth
// of tokens in all: those that fit finish their prompt in the first step, the next one waits.
TEST(Scheduler, PromptsShareAStepUpToOneChunkOfTokens) {
  const Model& m = smollm();
  const std::vector<std::string> texts = {"The quick brown fox", "Water boils at", "Once upon a time there was", "def main():"};
  std::vector<std::vector<int>> prompts;
  for (const auto& t : texts) prompts.push_back(m.tokenizer().encode(t, true));
  SessionOptions o = options(DecodeActivations::kInt8);
  o.prefill_chunk = static_cast<int>(prompts[0].size() + prompts[1].size() + prompts[2].size());
  Engine engine(m, o, 4);
  Scheduler sched(engine);
  std::vector<int> done(prompts.size(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.options = greedy(1);  // done with the token from its prompt's logits
    r.on_done = [&done, i](const GenerateResult& res) { done[i] = static_cast<int>(res.tokens.size()); };
    sched.submit(std::move(r));
  }
  sched.step();
  EXPECT_EQ(done, (std::vector<int>{1, 1, 1, 0}));
  EXPECT_EQ(sched.running(), 1);
  sched.step();
  EXPECT_EQ(done, (std::vector<int>{1, 1, 1, 1}));
  EXPECT_FALSE(sched.step());
  EXPECT_EQ(engine.sequences(), 0);
}

// A prefill of parts or a decode that cannot run is refused with the engine's message, before any
// work: no parts, a part over the chunk, a sequence twice, more rows than a step holds, an
// unknown sequence, tokens that do not match the sequences, sampling settings out of range or
// not one per sequence or part, a decode's tokens taken before it is issued, another step while
// they are not taken.
TEST(Engine, RefusesBadPrefillPartsAndDecodes) {
  const Model& m = smollm();
  Engine engine(m, options(DecodeActivations::kInt8), 2);  // a step holds max(16, 2) rows
  const SequenceId a = engine.add_sequence(cache_of(KvPolicy::kFull, 0)), b = engine.add_sequence(cache_of(KvPolicy::kFull, 0));
  const std::vector<int> ten(10, 5), twenty(20, 5);
  auto refused = [](const std::function<void()>& f, const std::string& says) {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted; expected an error saying '" << says << "'";
  };
  refused([&] { engine.prefill(std::span<const Engine::PrefillPart>()); }, "no sequences");
  refused([&] { engine.prefill(std::vector<Engine::PrefillPart>{{a, twenty}}); }, "prefill chunk");
  refused([&] { engine.prefill(std::vector<Engine::PrefillPart>{{a, ten}, {a, ten}}); }, "twice");
  refused([&] { engine.prefill(std::vector<Engine::PrefillPart>{{a, ten}, {b, ten}}); }, "rows");
  refused([&] { engine.prefill(std::vector<Engine::PrefillPart>{{a + b + 7, ten}}); }, "no sequence");
  EXPECT_EQ(engine.position(a), 0);  // nothing ran
  EXPECT_EQ(engine.position(b), 0);
  const std::vector<SequenceId> ids = {a, b};
  const std::vector<SampleParams> two(2), one(1);
  refused([&] { engine.decode_sampled(ids, std::vector<int>{1}, two); }, "one token each");
  refused([&] { engine.decode_sampled(ids, std::vector<int>{1, 2}, one); }, "1 sampling settings for 2 sequences");
  refused([&] { engine.decode_sampled(std::span<const SequenceId>(), std::span<const int>(), {}); }, "expected 1 to 2");
  for (auto bad : {+[](SampleParams& p) { p.temperature = -1.0f; }, +[](SampleParams& p) { p.top_p = 0.0f; },
                   +[](SampleParams& p) { p.min_p = 1.0f; }, +[](SampleParams& p) { p.top_k = -2; },
                   +[](SampleParams& p) { p.draw = 1.0; }, +[](SampleParams& p) { p.temperature = NAN; }}) {
    std::vector<SampleParams> p(2);
    bad(p[1]);
    refused([&] { engine.decode_sampled(ids, std::vector<int>{1, 2}, p); }, "sampling settings");
    refused([&] { engine.prefill_sampled(std::vector<Engine::PrefillPart>{{a, ten}, {b, std::span<const int>(ten).first(3)}}, p); },
            "sampling settings");
  }
  refused([&] { engine.prefill_sampled(std::vector<Engine::PrefillPart>{{a, ten}}, two); }, "2 sampling settings for 1 parts");
  EXPECT_EQ(engine.position(a), 0);  // nothing ran
  EXPECT_EQ(engine.position(b), 0);
  // the two halves of a decode: tokens taken only once issued; no other step until they are
  refused([&] { engine.decode_picks(); }, "no decode issued");
  engine.issue_decode(ids, std::vector<int>{1, 2}, two);
  refused([&] { engine.prefill(a, ten); }, "decode_picks first");
  refused([&] { engine.prefill(std::vector<Engine::PrefillPart>{{b, ten}}); }, "decode_picks first");
  refused([&] { engine.decode(ids, std::vector<int>{1, 2}); }, "decode_picks first");
  EXPECT_EQ(engine.decode_picks().size(), 2u);
  EXPECT_EQ(engine.position(a), 1);  // only the issued step ran
  EXPECT_EQ(engine.position(b), 1);
  refused([&] { engine.decode_picks(); }, "no decode issued");
}

TEST(Scheduler, RefusesBadRequestsNamingTheField) {
  const Model& m = smollm();
  Engine engine(m, options(DecodeActivations::kInt8), 2);
  Scheduler sched(engine);
  GenerationRequest r;
  r.prompt = {};
  r.options = greedy(4);
  EXPECT_THROW(sched.submit(r), Error);
  r.prompt = {1, 2, 3};
  r.cache = cache_of(KvPolicy::kH2O, 0);  // an evicting policy needs a budget
  EXPECT_THROW(sched.submit(r), Error);
  r.cache = cache_of(KvPolicy::kFull, 0);
  r.prompt = {m.config().vocab_size};
  EXPECT_THROW(sched.submit(r), Error);
  // a prompt that fills the context ends with an error, not a crash
  r.prompt = std::vector<int>(600, 1);  // --ctx 512
  std::string reason, error;
  r.on_done = [&](const GenerateResult& res) {
    reason = res.stop_reason;
    error = res.error;
  };
  sched.submit(r);
  while (sched.step()) {
  }
  EXPECT_EQ(reason, "error");
  EXPECT_NE(error.find("context"), std::string::npos) << error;
  EXPECT_EQ(engine.sequences(), 0);
}

// A prompt cache (SchedulerOptions::prompt_cache_bytes): requests that share a cache_prefix (a
// document, then a question) start from a copy of its compressed cache after the first, and
// their tokens are those the same request gets from a Scheduler that keeps nothing (the prefix
// run as a prompt of its own there too), bit for bit, under every saveable policy. Entries are
// the compressed caches (kvzip's smaller than the full cache's), kept under their byte limit,
// least recently used first out.
std::vector<int> doc_tokens(const Model& m, int which) {
  static const char* docs[] = {
      "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and happy disposition, seemed to unite some of the "
      "best blessings of existence; and had lived nearly twenty-one years in the world with very little to distress or vex her.",
      "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife. "
      "However little known the feelings or views of such a man may be on his first entering a neighbourhood"};
  return m.tokenizer().encode(docs[which], true);
}

GenerateResult run_alone(Scheduler& sched, const Model& m, const std::vector<int>& prefix, const std::string& question,
                         const CacheConfig& cache, int n) {
  GenerationRequest r;
  r.prompt = prefix;
  const std::vector<int> q = m.tokenizer().encode(question, false);
  r.prompt.insert(r.prompt.end(), q.begin(), q.end());
  r.cache_prefix = static_cast<int>(prefix.size());
  r.options = greedy(n);
  r.cache = cache;
  GenerateResult out;
  r.on_done = [&out](const GenerateResult& res) { out = res; };
  sched.submit(std::move(r));
  while (sched.step()) {
  }
  return out;
}

TEST(Scheduler, PromptCacheStartsFromKeptPrefixesAsCold) {
  const Model& m = smollm();
  const std::vector<int> doc = doc_tokens(m, 0);
  const std::vector<std::string> questions = {" Who is Emma?", " How old is she?", " Who is Emma?"};
  const int n = test::kSanitized ? 6 : 12;
  std::map<KvPolicy, int64_t> entry_bytes;
  // under the sanitizers not h2o and window (squeeze runs h2o's code; 39 s there with all five)
  std::vector<CacheConfig> configs = {cache_of(KvPolicy::kFull, 0), cache_of(KvPolicy::kSqueeze, 12), cache_of(KvPolicy::kKvzip, 12)};
  if (!test::kSanitized) configs.insert(configs.end(), {cache_of(KvPolicy::kH2O, 16), cache_of(KvPolicy::kWindow, 10)});
  for (const CacheConfig& c : configs) {
    const std::string name = kv_policy_name(c.policy);
    Engine warm_engine(m, options(DecodeActivations::kInt8), 2), cold_engine(m, options(DecodeActivations::kInt8), 2);
    Scheduler warm(warm_engine, SchedulerOptions{64 << 20}), cold(cold_engine);
    for (size_t i = 0; i < questions.size(); ++i) {
      const GenerateResult w = run_alone(warm, m, doc, questions[i], c, n);
      const GenerateResult k = run_alone(cold, m, doc, questions[i], c, n);
      EXPECT_EQ(w.stop_reason, k.stop_reason) << name << " question " << i << ": " << w.error;
      EXPECT_FALSE(w.tokens.empty()) << name;
      EXPECT_EQ(w.tokens, k.tokens) << name << " question " << i;
      EXPECT_EQ(w.cached_tokens, i == 0 ? 0 : static_cast<int>(doc.size())) << name << " question " << i;
      EXPECT_EQ(k.cached_tokens, 0) << name;
    }
    const PromptCacheStats s = warm.prompt_cache();
    EXPECT_EQ(s.hits, 2) << name;
    EXPECT_EQ(s.misses, 1) << name;
    EXPECT_EQ(s.entries, 1) << name;
    EXPECT_EQ(s.tokens_saved, 2 * static_cast<int64_t>(doc.size())) << name;
    EXPECT_GT(s.bytes, 0) << name;
    EXPECT_EQ(s.limit, 64 << 20) << name;
    EXPECT_EQ(cold.prompt_cache().misses, 0) << name;  // no cache: nothing looked up
    EXPECT_EQ(warm_engine.sequences(), 0) << name;     // an entry is bytes, not a live sequence
    entry_bytes[c.policy] = s.bytes;
  }
  // kept as compressed: kvzip's 12 rows a layer against the full cache's every prefix token
  EXPECT_LT(entry_bytes[KvPolicy::kKvzip] * 2, entry_bytes[KvPolicy::kFull]);
}

TEST(Scheduler, PromptCacheKeepsToItsLimitLeastRecentlyUsedFirst) {
  const Model& m = smollm();
  const CacheConfig c = cache_of(KvPolicy::kH2O, 16);
  const std::vector<int> a = doc_tokens(m, 0), b = doc_tokens(m, 1);
  int64_t one = 0;  // an entry's bytes
  {
    Engine e(m, options(DecodeActivations::kInt8), 2);
    Scheduler s(e, SchedulerOptions{64 << 20});
    run_alone(s, m, a, " Who?", c, 2);
    one = s.prompt_cache().bytes;
    ASSERT_GT(one, 0);
  }
  {  // room for one of the two: b's entry pushes a's out, and a runs again
    Engine e(m, options(DecodeActivations::kInt8), 2);
    Scheduler s(e, SchedulerOptions{one + one / 2});
    run_alone(s, m, a, " Who?", c, 2);
    run_alone(s, m, b, " Who?", c, 2);
    EXPECT_EQ(s.prompt_cache().entries, 1);
    EXPECT_EQ(s.prompt_cache().evicted, 1);
    EXPECT_LE(s.prompt_cache().bytes, s.prompt_cache().limit);
    EXPECT_EQ(run_alone(s, m, a, " Who?", c, 2).cached_tokens, 0);
    EXPECT_EQ(run_alone(s, m, a, " Who?", c, 2).cached_tokens, static_cast<int>(a.size()));
    EXPECT_EQ(s.prompt_cache().hits, 1);
    EXPECT_EQ(s.prompt_cache().misses, 3);
  }
  {  // an entry larger than the limit is not kept; its requests run as without a cache
    Engine e(m, options(DecodeActivations::kInt8), 2);
    Scheduler s(e, SchedulerOptions{one / 2});
    const GenerateResult r1 = run_alone(s, m, a, " Who?", c, 4), r2 = run_alone(s, m, a, " Who?", c, 4);
    EXPECT_EQ(r1.tokens, r2.tokens);
    EXPECT_EQ(r2.cached_tokens, 0);
    EXPECT_EQ(s.prompt_cache().entries, 0);
    EXPECT_EQ(s.prompt_cache().bytes, 0);
  }
  {  // two requests with one prefix at once: both run it, one entry is kept, the next request hits
    Engine e(m, options(DecodeActivations::kInt8), 2);
    Scheduler s(e, SchedulerOptions{64 << 20});
    std::vector<GenerateResult> out(2);
    for (int i = 0; i < 2; ++i) {
      GenerationRequest r;
      r.prompt = a;
      r.prompt.push_back(m.tokenizer().encode(" Who?", false)[0]);
      r.cache_prefix = static_cast<int>(a.size());
      r.options = greedy(3);
      r.cache = c;
      r.on_done = [&out, i](const GenerateResult& res) { out[i] = res; };
      s.submit(std::move(r));
    }
    while (s.step()) {
    }
    EXPECT_EQ(out[0].tokens, out[1].tokens);
    EXPECT_EQ(s.prompt_cache().misses, 2);
    EXPECT_EQ(s.prompt_cache().entries, 1);
    EXPECT_EQ(run_alone(s, m, a, " Who?", c, 2).cached_tokens, static_cast<int>(a.size()));
  }
  // a bad prefix or limit is refused naming it
  Engine e(m, options(DecodeActivations::kInt8), 2);
  EXPECT_THROW(Scheduler(e, SchedulerOptions{-1}), Error);
  Scheduler s(e, SchedulerOptions{1 << 20});
  GenerationRequest r;
  r.prompt = {1, 2, 3};
  r.options = greedy(2);
  for (int bad : {3, 4, -1}) {
    r.cache_prefix = bad;
    try {
      s.submit(r);
      ADD_FAILURE() << "cache_prefix " << bad << " accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("cache_prefix"), std::string::npos) << err.what();
    }
  }
}

// A full cache (no eviction) starts from the longest kept prefix of its own prefix, a
// conversation's turn before, and runs the rest of it (the kept prefixes end off the chunks'
// boundaries, so the warm path's chunks are not the cold path's). The release build gives the
// tokens of a Scheduler that keeps nothing, turn by turn; the sanitizer build does not (seen
// 2026-12-03: a row's arithmetic there depends on where its chunk starts), so there the test
// checks what was kept and reused, not the bits. A compressing policy matches only exactly.
TEST(Scheduler, PromptCacheFullCachesStartFromTheLongestKeptPrefix) {
  const Model& m = smollm();
  std::vector<int> conversation = doc_tokens(m, 0);
  const std::vector<std::string> turns = {" She was the youngest of the two daughters of a most affectionate, indulgent father.",
                                          " Her mother had died too long ago for her to have more than an indistinct remembrance."};
  for (const CacheConfig& c : {cache_of(KvPolicy::kFull, 0), cache_of(KvPolicy::kH2O, 16)}) {
    const bool full = c.policy == KvPolicy::kFull;
    Engine warm_engine(m, options(DecodeActivations::kInt8), 2), cold_engine(m, options(DecodeActivations::kInt8), 2);
    Scheduler warm(warm_engine, SchedulerOptions{64 << 20}), cold(cold_engine);
    std::vector<int> prefix = conversation;
    int kept = 0;  // tokens of the last prefix kept
    for (size_t t = 0; t <= turns.size(); ++t) {
      const GenerateResult w = run_alone(warm, m, prefix, " Who?", c, 6), k = run_alone(cold, m, prefix, " Who?", c, 6);
      if (!test::kSanitized || !full) {
        EXPECT_EQ(w.tokens, k.tokens) << kv_policy_name(c.policy) << " turn " << t;
      }
      EXPECT_FALSE(w.tokens.empty());
      EXPECT_EQ(w.cached_tokens, full ? kept : 0) << kv_policy_name(c.policy) << " turn " << t;
      kept = static_cast<int>(prefix.size());
      ASSERT_NE(kept % options(DecodeActivations::kInt8).prefill_chunk, 0);
      if (t < turns.size())
        for (int id : m.tokenizer().encode(turns[t], false)) prefix.push_back(id);
    }
    EXPECT_EQ(warm.prompt_cache().hits, full ? 2 : 0) << kv_policy_name(c.policy);
    EXPECT_EQ(warm.prompt_cache().entries, 3) << kv_policy_name(c.policy);
    // the same prefix again: an exact match under every policy
    EXPECT_EQ(run_alone(warm, m, prefix, " Why?", c, 2).cached_tokens, static_cast<int>(prefix.size())) << kv_policy_name(c.policy);
  }
}

// --max-memory: a run is refused before allocating what would not fit (naming the flag and the
// parts), a budgeted cache fits where a full one does not, and under the Scheduler a request
// that would fit once another finishes waits for it instead of failing.
TEST(MaxMemory, RefusesWhatDoesNotFitAndQueuesWhatWill) {
  const Model& m = smollm();
  SessionOptions so = options(DecodeActivations::kF32);
  so.prefill_chunk = 64;
  const int64_t base = m.weight_summary().total_bytes + Runner::scratch_bytes(m.config(), 64);
  const int64_t full_kv = CacheBuilder::plan(m.config(), cache_of(KvPolicy::kFull, 0), 64, false).bytes();
  const int64_t small_kv = CacheBuilder::plan(m.config(), cache_of(KvPolicy::kH2O, 32), 64, false).bytes();
  ASSERT_LT(small_kv * 4, full_kv);
  // the weights alone are over the limit
  so.max_memory = base / 2;
  try {
    Session s(m, so);
    ADD_FAILURE() << "a limit below the weights was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-memory"), std::string::npos) << e.what();
  }
  // room for a budgeted cache but not a full one
  so.max_memory = base + full_kv / 2;
  so.cache = cache_of(KvPolicy::kFull, 0);
  try {
    Session s(m, so);
    ADD_FAILURE() << "a full cache over the limit was accepted";
  } catch (const MemoryLimitError& e) {
    EXPECT_TRUE(e.alone());
    EXPECT_NE(std::string(e.what()).find("KV cache"), std::string::npos) << e.what();
  }
  so.cache = cache_of(KvPolicy::kH2O, 32);
  EXPECT_NO_THROW(Session(m, so));
  // one budgeted sequence fits, two do not: the second request waits for the first to finish
  so.max_memory = base + small_kv + small_kv / 2;
  Engine engine(m, so, 2);
  const SequenceId a = engine.add_sequence(cache_of(KvPolicy::kH2O, 32));
  try {
    engine.add_sequence(cache_of(KvPolicy::kH2O, 32));
    ADD_FAILURE() << "a second sequence over the limit was accepted";
  } catch (const MemoryLimitError& e) {
    EXPECT_FALSE(e.alone());
  }
  engine.remove_sequence(a);
  Scheduler sched(engine);
  std::vector<std::string> reasons(2);
  for (int i = 0; i < 2; ++i) {
    GenerationRequest r;
    r.prompt = m.tokenizer().encode("Once upon a time", true);
    r.options = greedy(8);
    r.cache = cache_of(KvPolicy::kH2O, 32);
    r.on_done = [&reasons, i](const GenerateResult& res) { reasons[i] = res.stop_reason + res.error; };
    sched.submit(std::move(r));
  }
  while (sched.step()) {
  }
  EXPECT_EQ(reasons[0], "length");
  EXPECT_EQ(reasons[1], "length");
  EXPECT_EQ(engine.sequences(), 0);
}

// --kv-memory: the KV pool admits sequences by the bytes their caches take in the backend's
// memory (CachePlan::pool_bytes), copies included; Engine::kv_pool() reports it; a sequence that
// could never fit is told so (alone), one that will fit once another goes is not.
TEST(KvMemory, ThePoolAdmitsBySlabs) {
  const Model& m = smollm();
  SessionOptions so = options(DecodeActivations::kF32);
  so.prefill_chunk = 64;
  const CacheConfig small = cache_of(KvPolicy::kH2O, 32), full = cache_of(KvPolicy::kFull, 0);
  const int64_t slab = CacheBuilder::plan(m.config(), small, 64, false).pool_bytes();
  const int64_t whole = CacheBuilder::plan(m.config(), full, 64, false).pool_bytes();
  ASSERT_GT(slab, 0);
  ASSERT_LT(2 * slab, whole);
  so.kv_memory = 2 * slab + slab / 2;  // two budgeted sequences, not three; never a full one
  Engine engine(m, so, 4);
  EXPECT_EQ(engine.kv_pool().limit, so.kv_memory);
  const SequenceId a = engine.add_sequence(small);
  engine.prefill(a, m.tokenizer().encode("Once upon a time", true));
  const SequenceId b = engine.copy_sequence(a);
  KvPoolUsage u = engine.kv_pool();
  EXPECT_EQ(u.reserved, 2 * slab);
  EXPECT_EQ(u.sequences_budgeted, 2);
  EXPECT_EQ(u.sequences_full, 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      if (attempt == 0) engine.add_sequence(small);
      else engine.copy_sequence(a);
      ADD_FAILURE() << "a third sequence over the pool was accepted";
    } catch (const MemoryLimitError& e) {
      EXPECT_FALSE(e.alone());
      EXPECT_NE(std::string(e.what()).find("--kv-memory"), std::string::npos) << e.what();
    }
  }
  try {
    engine.add_sequence(full);
    ADD_FAILURE() << "a full cache larger than the pool was accepted";
  } catch (const MemoryLimitError& e) {
    EXPECT_TRUE(e.alone()) << e.what();
  }
  engine.remove_sequence(a);
  engine.remove_sequence(b);
  EXPECT_EQ(engine.kv_pool().reserved, 0);
  // a share of the free memory resolves to a size; one outside (0, 1] is refused naming the flag
  so.kv_memory = 0;
  so.kv_memory_fraction = 0.5;
  EXPECT_GT(Engine(m, so, 1).kv_pool().limit, 0);
  so.kv_memory_fraction = 1.5;
  try {
    Engine e(m, so, 1);
    ADD_FAILURE() << "a share of 1.5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-memory"), std::string::npos) << e.what();
  }
  // the CPU's default: no pool beyond --max-memory
  so.kv_memory_fraction = 0.0;
  EXPECT_EQ(Engine(m, so, 1).kv_pool().limit, 0);
}

}  // namespace
}  // namespace squeezekv
