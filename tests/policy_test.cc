// Eviction policies on synthetic keys and attention mass, without a model: the registry, each
// policy's survivor rule against an independent computation, the squeeze schedule (when it is
// decided, the cap), kvzip's phases, and the concentration metrics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "backend/backend.h"
#include "kv/concentration.h"
#include "kv/layer_cache.h"
#include "kv/policy.h"
#include "squeezekv/error.h"
#include "squeezekv/model_config.h"

namespace squeezekv {
namespace {

constexpr int kG = 2, kD = 8;

ModelConfig tiny_model(int layers) {
  ModelConfig m;
  m.n_layers = layers;
  m.n_kv_heads = kG;
  m.head_dim = kD;
  m.n_heads = kG;
  m.dim = kG * kD;
  m.context_length = 4096;
  return m;
}

// A deterministic score per (layer, head, position), distinct so the top-k is unique.
float score_of(int layer, int g, int pos) {
  const uint32_t h = (static_cast<uint32_t>(pos) * 2654435761u) ^ (static_cast<uint32_t>(g * 977 + layer * 131) * 40503u);
  return static_cast<float>(h % 1000003) / 1000003.0f;
}

// Drives a sequence's caches as the forward pass does: append rows (random keys, or `keys`),
// set each new row's mass to its synthetic score (what attention would have added), end the step.
struct Driver {
  SequenceCache sc;
  int64_t pos = 0;
  std::mt19937 rng{7};
  explicit Driver(const CacheConfig& cfg, int layers = 2, int chunk = 128)
      : sc(CacheBuilder::for_model(tiny_model(layers), cfg, chunk)) {}

  void step(int T, int64_t input_end, const std::vector<float>* keys = nullptr) {
    std::normal_distribution<float> nd;
    std::vector<float> k(static_cast<size_t>(T) * kG * kD), v(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      k[i] = keys != nullptr ? (*keys)[i] : nd(rng);
      v[i] = nd(rng);
    }
    std::vector<int32_t> p(static_cast<size_t>(T));
    std::iota(p.begin(), p.end(), static_cast<int32_t>(pos));
    for (LayerCache& l : sc.layers) {
      if (ConcentrationMeter* m = l.meter(); m != nullptr && m->metric() == SqueezeMetric::kKeyCosine)
        m->add_keys(k.data(), T, kG, kD);
      l.append(k.data(), v.data(), p.data(), T);
      if (l.wants_mass()) set_scores(l, static_cast<int>(l.storage().count()) - T);
    }
    pos += T;
    sc.end_step(std::max<int64_t>(input_end, pos));
  }
  // mass of slots [from, count) := the synthetic score of their position
  static void set_scores(LayerCache& l, int from) {
    const KvStorage& s = l.storage();
    for (int g = 0; g < kG; ++g)
      for (int j = from; j < s.count(); ++j)
        l.mass_accumulator()[static_cast<size_t>(g) * s.capacity() + j] = score_of(0, g, s.positions(g)[j]);
  }
  std::set<int32_t> kept(int layer, int g) const {  // live rows only (no dead slots)
    const KvStorage& s = sc.layers[layer].storage();
    std::set<int32_t> k;
    for (int j = 0; j < s.count(); ++j)
      if (s.positions(g)[j] != KvStorage::kDeadPos) k.insert(s.positions(g)[j]);
    return k;
  }
};

// The survivors the sinks/recent/top rule must keep, computed from scratch over positions [0, n).
std::set<int32_t> expected_survivors(int n, int budget, int sinks, int recent, int g) {
  std::set<int32_t> keep;
  for (int p = 0; p < std::min(sinks, n); ++p) keep.insert(p);
  for (int p = std::max(0, n - recent); p < n; ++p) keep.insert(p);
  std::vector<int32_t> middle;
  for (int p = sinks; p < n - recent; ++p) middle.push_back(p);
  std::sort(middle.begin(), middle.end(), [&](int32_t a, int32_t b) {
    const float sa = score_of(0, g, a), sb = score_of(0, g, b);
    return sa > sb || (sa == sb && a < b);
  });
  const int n_top = budget - static_cast<int>(keep.size());
  for (int i = 0; i < n_top && i < static_cast<int>(middle.size()); ++i) keep.insert(middle[i]);
  return keep;
}

CacheConfig config(KvPolicy p, int budget, int sinks = 4, int recent = -1) {
  CacheConfig c;
  c.policy = p;
  c.budget = budget;
  c.sinks = sinks;
  c.recent = recent;
  return c;
}

TEST(PolicyRegistry, EveryPolicyHasOneRowAndItsNameRoundTrips) {
  std::set<std::string> names;
  for (const PolicyInfo& i : policy_registry()) {
    EXPECT_TRUE(names.insert(i.name).second) << i.name;
    EXPECT_EQ(parse_kv_policy(i.name), i.id);
    EXPECT_STREQ(kv_policy_name(i.id), i.name);
    EXPECT_EQ(&policy_info(i.id), &i);
    EXPECT_NE(std::string(kv_policy_names()).find(i.name), std::string::npos);
  }
  EXPECT_EQ(names.size(), 8u);  // full window h2o snapkv pyramidkv squeeze kvzip custom
  try {
    parse_kv_policy("h2");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--kv-policy"), std::string::npos) << m;
    EXPECT_NE(m.find("kvzip"), std::string::npos) << m;
  }
}

TEST(Policy, H2OKeepsSinksRecentAndTheHighestMass) {
  Driver d(config(KvPolicy::kH2O, 24, 4, 8));
  d.step(100, 100);
  for (int g = 0; g < kG; ++g) EXPECT_EQ(d.kept(0, g), expected_survivors(100, 24, 4, 8, g)) << "head " << g;
  // decode steps: one row in, one row out, always by the same rule over what is held
  for (int t = 0; t < 20; ++t) {
    d.step(1, 0);
    for (const LayerCache& l : d.sc.layers) EXPECT_EQ(l.storage().count(), 24);
  }
  for (int g = 0; g < kG; ++g) {
    const std::set<int32_t> k = d.kept(1, g);
    for (int p = 0; p < 4; ++p) EXPECT_TRUE(k.count(p)) << "sink " << p;
    for (int p = 112; p < 120; ++p) EXPECT_TRUE(k.count(p)) << "recent " << p;
  }
}

// Ada-KV: the layer's G x budget rows are shared by score across heads; a head whose keys drew
// more attention keeps more. Here head 1's scores are all above head 0's.
TEST(Policy, HeadAdaptiveH2OSharesTheLayersRowsByScore) {
  CacheConfig c = config(KvPolicy::kH2O, 24, 4, 8);
  c.head_alloc = HeadAlloc::kAdaptive;
  Driver d(c, 1, 128);
  LayerCache& l = d.sc.layers[0];
  std::normal_distribution<float> nd;
  std::vector<float> k(100 * kG * kD);
  for (auto& x : k) x = nd(d.rng);
  std::vector<int32_t> p(100);
  std::iota(p.begin(), p.end(), 0);
  l.append(k.data(), k.data(), p.data(), 100);
  const int cap = l.storage().capacity();
  for (int j = 0; j < 100; ++j) {
    l.mass_accumulator()[j] = score_of(0, 0, j);            // head 0: in [0, 1)
    l.mass_accumulator()[cap + j] = 1.0f + score_of(0, 1, j);  // head 1: all above head 0
  }
  d.pos = 100;
  d.sc.end_step(100);
  const KvStorage& s = l.storage();
  EXPECT_EQ(s.live_total(), kG * 24);
  // the heavy rows (2 x (24 - 12) = 24) go to head 1, except head 0's floor of (24 - 12) / 5 = 2
  EXPECT_EQ(s.live(0), 12 + 2);
  EXPECT_EQ(s.live(1), 12 + 22);
  EXPECT_LE(s.live(1), 2 * 24);
  EXPECT_EQ(s.count(), s.live(1));  // the fullest head sets the extent; head 0's other slots are dead
  for (int j = s.live(0); j < s.count(); ++j) EXPECT_EQ(s.positions(0)[j], KvStorage::kDeadPos);
  for (int g = 0; g < kG; ++g) {
    const std::set<int32_t> kept = d.kept(0, g);
    for (int q = 0; q < 4; ++q) EXPECT_TRUE(kept.count(q)) << "sink";
    for (int q = 92; q < 100; ++q) EXPECT_TRUE(kept.count(q)) << "recent";
  }
  // head 0 kept its two best middle rows
  std::vector<int32_t> mid;
  for (int q = 4; q < 92; ++q) mid.push_back(q);
  std::sort(mid.begin(), mid.end(), [](int32_t a, int32_t b) { return score_of(0, 0, a) > score_of(0, 0, b); });
  EXPECT_TRUE(d.kept(0, 0).count(mid[0]) && d.kept(0, 0).count(mid[1]));
  EXPECT_EQ(l.stats().tokens_kept, 24);
  EXPECT_EQ(l.stats().kept_bytes, 24 * s.bytes_per_token());
  // decode steps: the layer total stays G x budget, dead slots never count as rows
  for (int t = 0; t < 40; ++t) {
    d.step(1, 0);
    EXPECT_EQ(s.live_total(), kG * 24);
    for (int g = 0; g < kG; ++g) {
      EXPECT_LE(s.live(g), 48);
      const std::set<int32_t> kept = d.kept(0, g);
      EXPECT_EQ(static_cast<int>(kept.size()), s.live(g));
      EXPECT_TRUE(kept.count(100 + t)) << "newest row " << 100 + t << " head " << g << " live " << s.live(g) << " extent " << s.count();
    }
  }
  // only the score-based policies take it
  for (KvPolicy p : {KvPolicy::kWindow, KvPolicy::kFull}) {
    CacheConfig w = config(p, 24);
    w.head_alloc = HeadAlloc::kAdaptive;
    EXPECT_THROW(validate(w), Error) << kv_policy_name(p);
  }
}

TEST(Policy, WindowKeepsSinksAndTheNewest) {
  Driver d(config(KvPolicy::kWindow, 20, 4));
  d.step(64, 64);
  d.step(5, 0);
  std::set<int32_t> want = {0, 1, 2, 3};
  for (int p = 69 - 16; p < 69; ++p) want.insert(p);
  for (int g = 0; g < kG; ++g) EXPECT_EQ(d.kept(0, g), want);
}

TEST(Policy, SnapKVKeepsThePooledNeighbourhoodOfTheWindowsAttention) {
  CacheConfig c = config(KvPolicy::kSnapKV, 24, 4);
  c.snapkv_window = 8;
  c.pool_kernel = 5;
  Driver d(c, 1);
  // one prompt step of 80 rows; the window's attention fell on position 40 only
  std::normal_distribution<float> nd;
  LayerCache& l = d.sc.layers[0];
  std::vector<float> k(80 * kG * kD), v(k.size());
  for (auto& x : k) x = nd(d.rng);
  std::vector<int32_t> p(80);
  std::iota(p.begin(), p.end(), 0);
  l.append(k.data(), k.data(), p.data(), 80);
  for (int g = 0; g < kG; ++g) l.mass_accumulator()[g * l.storage().capacity() + 40] = 1.0f;
  d.sc.end_step(80);
  for (int g = 0; g < kG; ++g) {
    const std::set<int32_t> kept = d.kept(0, g);
    EXPECT_EQ(kept.size(), 24u);
    for (int q = 38; q <= 42; ++q) EXPECT_TRUE(kept.count(q)) << "pooled neighbour " << q;  // kernel 5 around 40
    for (int q = 72; q < 80; ++q) EXPECT_TRUE(kept.count(q)) << "window " << q;
    for (int q = 0; q < 4; ++q) EXPECT_TRUE(kept.count(q)) << "sink " << q;
  }
}

// Keys for a layer whose prompt keys all point one way (concentration near 1) or anywhere (near 0).
std::vector<float> keys_for(bool concentrated, int T, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(static_cast<size_t>(T) * kG * kD);
  for (size_t i = 0; i < k.size(); ++i) k[i] = concentrated ? 1.0f + 0.01f * nd(rng) : nd(rng);
  return k;
}

// One prompt step of T rows into a squeeze sequence: layer l's keys concentrated or broad
// (keys_for), handed to its meter as the forward pass would; then the step ends.
template <typename Concentrated>
void squeeze_prompt(SequenceCache& sc, int T, Concentrated concentrated, std::mt19937& rng) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  std::iota(p.begin(), p.end(), 0);
  for (int l = 0; l < static_cast<int>(sc.layers.size()); ++l) {
    const std::vector<float> k = keys_for(concentrated(l), T, rng);
    sc.layers[l].meter()->add_keys(k.data(), T, kG, kD);
    sc.layers[l].append(k.data(), k.data(), p.data(), T);
  }
  sc.end_step(T);
}

TEST(Policy, SqueezeGivesConcentratedLayersLessAndKeepsTheTotal) {
  CacheConfig c = config(KvPolicy::kSqueeze, 40, 4);
  c.squeeze_metric = SqueezeMetric::kKeyCosine;  // squeeze_prompt hands the layers keys
  const int L = 4;
  SequenceCache sc = CacheBuilder::for_model(tiny_model(L), c, 256);
  std::mt19937 rng(3);
  squeeze_prompt(sc, 200, [](int l) { return l % 2 == 0; }, rng);
  ASSERT_TRUE(sc.coordinator->is_finalized());
  int total = 0;
  for (int l = 0; l < L; ++l) {
    total += sc.layers[l].budget();
    EXPECT_EQ(sc.layers[l].storage().count(), sc.layers[l].budget()) << "layer " << l;
    EXPECT_EQ(sc.layers[l].meter(), nullptr);  // reported: no more inputs wanted
  }
  EXPECT_EQ(total, L * 40);
  EXPECT_LT(sc.layers[0].budget(), sc.layers[1].budget());
  EXPECT_GT(sc.layers[0].stats().concentration, 0.9);
  EXPECT_LT(sc.layers[1].stats().concentration, 0.2);
}

TEST(Policy, SqueezeCapHandsTheExcessOfShortPromptLayersOn) {
  // 4 layers, average 40, a prompt of 60 tokens: uncapped, the broad layers would get more than 60
  for (bool cap : {true, false}) {
    CacheConfig c = config(KvPolicy::kSqueeze, 40, 4);
    c.squeeze_metric = SqueezeMetric::kKeyCosine;
    c.squeeze_cap = cap;
    const int L = 4;
    SequenceCache sc = CacheBuilder::for_model(tiny_model(L), c, 256);
    std::mt19937 rng(5);
    squeeze_prompt(sc, 60, [](int l) { return l != 0; }, rng);  // only layer 0 is broad
    int total = 0, over = 0;
    for (int l = 0; l < L; ++l) {
      total += sc.layers[l].budget();
      over += sc.layers[l].budget() > 60;
    }
    EXPECT_EQ(total, L * 40) << "cap " << cap;
    if (cap) {
      EXPECT_EQ(over, 0);
      EXPECT_EQ(sc.layers[0].budget(), 60);
    } else {
      EXPECT_GT(sc.layers[0].budget(), 60);  // what the cap prevents: budget no layer can use
    }
  }
}

TEST(Policy, SqueezeResolvesAtTheFirstChunkOrAtThePromptsEnd) {
  for (SqueezeResolve r : {SqueezeResolve::kFirstChunk, SqueezeResolve::kPrompt}) {
    CacheConfig c = config(KvPolicy::kSqueeze, 32, 4);
    c.squeeze_resolve = r;
    Driver d(c, 3);
    d.step(64, 192);  // the first of three chunks of a 192-token prompt
    EXPECT_EQ(d.sc.coordinator->is_finalized(), r == SqueezeResolve::kFirstChunk);
    d.step(64, 192);
    EXPECT_EQ(d.sc.coordinator->is_finalized(), r == SqueezeResolve::kFirstChunk);
    d.step(64, 192);
    EXPECT_TRUE(d.sc.coordinator->is_finalized());
    int total = 0;
    for (const LayerCache& l : d.sc.layers) {
      total += l.budget();
      EXPECT_LE(l.storage().count(), l.budget());
    }
    EXPECT_EQ(total, 3 * 32);
  }
  // a caller that never marks the prompt's end: the first decode step decides
  CacheConfig c = config(KvPolicy::kSqueeze, 32, 4);
  c.squeeze_resolve = SqueezeResolve::kPrompt;
  Driver d(c, 2);
  d.step(64, 10000);
  EXPECT_FALSE(d.sc.coordinator->is_finalized());
  d.step(1, 0);
  EXPECT_TRUE(d.sc.coordinator->is_finalized());
}

TEST(Policy, KvzipHoldsThePromptScoresItThenKeepsTheTopScores) {
  CacheConfig c = config(KvPolicy::kKvzip, 24, 4);
  Driver d(c, 2, 32);
  for (int s = 0; s < 3; ++s) {
    d.step(32, 96);
    for (const LayerCache& l : d.sc.layers) EXPECT_EQ(l.storage().count(), 32 * (s + 1));  // nothing evicted yet
    EXPECT_EQ(d.sc.wants_scoring(), s == 2);
    EXPECT_TRUE(d.sc.records_context());
  }
  // the scoring pass: mass starts at 0, the reconstruction's rows come and go, scores are maxima
  for (LayerCache& l : d.sc.layers) {
    l.begin_scoring();
    const LayerCache::Mark m = l.mark();
    std::vector<float> k(16 * kG * kD, 0.5f);
    std::vector<int32_t> p(16);
    std::iota(p.begin(), p.end(), 96);
    l.append(k.data(), k.data(), p.data(), 16);
    for (int g = 0; g < kG; ++g)
      for (int j = 0; j < 96; ++j) {
        EXPECT_EQ(l.mass_accumulator()[g * l.storage().capacity() + j], 0.0f);
        l.mass_accumulator()[g * l.storage().capacity() + j] = score_of(0, g, l.storage().positions(g)[j]);
      }
    l.drop_since(m);
    EXPECT_EQ(l.storage().count(), 96);
    EXPECT_EQ(l.stats().tokens_seen, 96);
  }
  d.sc.end_scoring();
  EXPECT_FALSE(d.sc.wants_scoring());
  EXPECT_FALSE(d.sc.records_context());
  for (int g = 0; g < kG; ++g) EXPECT_EQ(d.kept(0, g), expected_survivors(96, 24, 4, 0, g)) << "no recent window at scoring";
  // decode: one in, one out, sinks and the recent window kept
  for (int t = 0; t < 30; ++t) d.step(1, 0);
  for (const LayerCache& l : d.sc.layers) EXPECT_EQ(l.storage().count(), 24);
  for (int g = 0; g < kG; ++g) {
    const std::set<int32_t> k = d.kept(0, g);
    for (int p = 0; p < 4; ++p) EXPECT_TRUE(k.count(p));
    for (int p = 126 - 12; p < 126; ++p) EXPECT_TRUE(k.count(p)) << "recent " << p;
  }
  // a prompt within the budget is not scored
  Driver s(c, 1, 32);
  s.step(20, 20);
  EXPECT_FALSE(s.sc.wants_scoring());
  EXPECT_FALSE(s.sc.records_context());
}

// --kv-layer-alloc squeeze: kvzip's layers report the coverage of their reconstruction scores when
// the pass ends, all before any compacts; the coordinator moves budget to the layer whose scores
// are spread widest (the total kept), and at strength 0 every layer keeps exactly what uniform
// kvzip keeps.
TEST(Policy, KvzipLayersShareTheTotalBySqueeze) {
  auto run = [](const CacheConfig& c) {
    auto d = std::make_unique<Driver>(c, 2, 32);
    for (int s = 0; s < 3; ++s) d->step(32, 96);
    EXPECT_TRUE(d->sc.wants_scoring());
    for (size_t li = 0; li < d->sc.layers.size(); ++li) {
      LayerCache& l = d->sc.layers[li];
      l.begin_scoring();
      for (int g = 0; g < kG; ++g)
        for (int j = 0; j < 96; ++j) {  // layer 0: a few rows hold most of the score; layer 1: spread
          const float x = score_of(0, g, l.storage().positions(g)[j]);
          l.mass_accumulator()[g * l.storage().capacity() + j] = li == 0 ? std::pow(x, 12.0f) : 0.5f + 0.5f * x;
        }
    }
    d->sc.end_scoring();
    return d;
  };
  CacheConfig c = config(KvPolicy::kKvzip, 24, 4);
  c.layer_alloc = LayerAlloc::kSqueeze;
  c.squeeze_strength = 1.0;
  const auto sq = run(c);
  ASSERT_NE(sq->sc.coordinator, nullptr);
  ASSERT_TRUE(sq->sc.coordinator->is_finalized());
  const int b0 = sq->sc.layers[0].stats().budget, b1 = sq->sc.layers[1].stats().budget;
  EXPECT_LT(b0, 24);
  EXPECT_GT(b1, 24);
  EXPECT_EQ(b0 + b1, 48);
  EXPECT_GT(sq->sc.layers[0].stats().concentration, sq->sc.layers[1].stats().concentration);
  for (int li = 0; li < 2; ++li)
    for (int g = 0; g < kG; ++g) EXPECT_EQ(sq->kept(li, g).size(), static_cast<size_t>(li == 0 ? b0 : b1)) << li << " " << g;
  for (int t = 0; t < 10; ++t) sq->step(1, 0);  // decode keeps each layer at its own budget
  EXPECT_EQ(sq->sc.layers[0].storage().count(), b0);
  EXPECT_EQ(sq->sc.layers[1].storage().count(), b1);

  c.squeeze_strength = 0.0;
  const auto flat = run(c);
  CacheConfig u = config(KvPolicy::kKvzip, 24, 4);
  const auto uni = run(u);
  EXPECT_EQ(uni->sc.coordinator, nullptr);
  for (int li = 0; li < 2; ++li)
    for (int g = 0; g < kG; ++g) EXPECT_EQ(flat->kept(li, g), uni->kept(li, g)) << "strength 0, layer " << li << " head " << g;

  c.policy = KvPolicy::kH2O;  // only the scorers kvzip and snapkv take it
  EXPECT_THROW(validate(c), Error);
}

// --kv-layer-alloc squeeze over SnapKV's scores: at the prompt step that evicts, every layer
// reports the coverage of its pooled window scores before any compacts; the layer whose scores are
// spread widest gets more of the total, decode keeps each layer at its own budget, and at
// strength 0 every layer keeps exactly what uniform snapkv keeps.
TEST(Policy, SnapKVLayersShareTheTotalBySqueeze) {
  auto run = [](const CacheConfig& c) {
    auto d = std::make_unique<Driver>(c, 2, 128);
    std::normal_distribution<float> nd;
    std::vector<float> k(80 * kG * kD), v(k.size());
    for (auto& x : k) x = nd(d->rng);
    std::vector<int32_t> p(80);
    std::iota(p.begin(), p.end(), 0);
    for (size_t li = 0; li < d->sc.layers.size(); ++li) {
      LayerCache& l = d->sc.layers[li];
      l.append(k.data(), k.data(), p.data(), 80);
      for (int g = 0; g < kG; ++g)
        for (int j = 0; j < 80; ++j) {  // layer 0: a few rows hold most of the score; layer 1: spread
          const float x = score_of(0, g, j);
          l.mass_accumulator()[g * l.storage().capacity() + j] = li == 0 ? std::pow(x, 12.0f) : 0.5f + 0.5f * x;
        }
    }
    d->pos = 80;
    d->sc.end_step(80);
    return d;
  };
  CacheConfig c = config(KvPolicy::kSnapKV, 24, 4);
  c.snapkv_window = 8;
  c.pool_kernel = 1;
  c.layer_alloc = LayerAlloc::kSqueeze;
  c.squeeze_strength = 1.0;
  const auto sq = run(c);
  ASSERT_NE(sq->sc.coordinator, nullptr);
  ASSERT_TRUE(sq->sc.coordinator->is_finalized());
  const int b0 = sq->sc.layers[0].stats().budget, b1 = sq->sc.layers[1].stats().budget;
  EXPECT_LT(b0, 24);
  EXPECT_GT(b1, 24);
  EXPECT_EQ(b0 + b1, 48);
  EXPECT_GT(sq->sc.layers[0].stats().concentration, sq->sc.layers[1].stats().concentration);
  for (int li = 0; li < 2; ++li)
    for (int g = 0; g < kG; ++g) {
      const std::set<int32_t> kept = sq->kept(li, g);
      const int b = li == 0 ? b0 : b1, w = std::min(8, b - 4);  // the window, within the layer's budget
      EXPECT_EQ(kept.size(), static_cast<size_t>(b)) << li << " " << g;
      for (int q = 80 - w; q < 80; ++q) EXPECT_TRUE(kept.count(q)) << "layer " << li << " budget " << b << " window " << q;
    }
  for (int t = 0; t < 10; ++t) sq->step(1, 0);  // decode keeps each layer at its own budget
  EXPECT_EQ(sq->sc.layers[0].storage().count(), b0);
  EXPECT_EQ(sq->sc.layers[1].storage().count(), b1);

  c.squeeze_strength = 0.0;
  const auto flat = run(c);
  CacheConfig u = c;
  u.layer_alloc = LayerAlloc::kUniform;
  const auto uni = run(u);
  EXPECT_EQ(uni->sc.coordinator, nullptr);
  for (int li = 0; li < 2; ++li)
    for (int g = 0; g < kG; ++g) EXPECT_EQ(flat->kept(li, g), uni->kept(li, g)) << "strength 0, layer " << li << " head " << g;

  c.policy = KvPolicy::kPyramidKV;  // keeps its own taper
  EXPECT_THROW(validate(c), Error);
}

TEST(Concentration, KeyCosineIsExactAndMergesAcrossChunks) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  const int T = 50;
  std::vector<float> k(static_cast<size_t>(T) * kG * kD);
  for (auto& x : k) x = nd(rng);
  // the definition: mean over heads of the mean over pairs i != j of cos(k_i, k_j)
  double want = 0.0;
  for (int g = 0; g < kG; ++g) {
    double s = 0.0;
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j) {
        if (i == j) continue;
        const float* a = &k[(static_cast<size_t>(i) * kG + g) * kD];
        const float* b = &k[(static_cast<size_t>(j) * kG + g) * kD];
        double ab = 0, aa = 0, bb = 0;
        for (int d = 0; d < kD; ++d) ab += double(a[d]) * b[d], aa += double(a[d]) * a[d], bb += double(b[d]) * b[d];
        s += ab / std::sqrt(aa * bb);
      }
    want += s / (T * (T - 1.0));
  }
  want /= kG;
  ConcentrationMeter whole(SqueezeMetric::kKeyCosine), parts(SqueezeMetric::kKeyCosine);
  whole.add_keys(k.data(), T, kG, kD);
  parts.add_keys(k.data(), 17, kG, kD);
  parts.add_keys(k.data() + 17 * kG * kD, T - 17, kG, kD);
  EXPECT_NEAR(whole.value(), want, 1e-12);
  EXPECT_NEAR(parts.value(), want, 1e-12);
  std::vector<float> same(static_cast<size_t>(T) * kG * kD, 0.25f);
  ConcentrationMeter one(SqueezeMetric::kKeyCosine);
  one.add_keys(same.data(), T, kG, kD);
  EXPECT_NEAR(one.value(), 1.0, 1e-12);
}

TEST(Concentration, MassCoverageIsTheShareTheBudgetsHeaviestRowsHold) {
  KvStorage s(2, kD, 16, KvType::kF32);
  std::vector<float> k(10 * 2 * kD, 0.1f);
  std::vector<int32_t> p(10);
  std::iota(p.begin(), p.end(), 0);
  s.append(k.data(), k.data(), p.data(), 10);
  float* mass = s.mass_accumulator();
  for (int j = 0; j < 10; ++j) {
    mass[j] = j == 3 ? 6.0f : 0.5f;  // head 0: one heavy row (6 of 10.5)
    mass[16 + j] = 1.0f;             // head 1: flat
  }
  ConcentrationMeter m(SqueezeMetric::kMassCoverage);
  m.add_mass(s, 2);
  EXPECT_NEAR(m.value(), (6.5 / 10.5 + 2.0 / 10.0) / 2, 1e-9);
  ConcentrationMeter all(SqueezeMetric::kMassCoverage);
  all.add_mass(s, 12);  // the budget holds every row
  EXPECT_NEAR(all.value(), 1.0, 1e-9);
}

// The definition, in doubles: per kv head, the h2o survivors at the average budget (sinks,
// recent window, heaviest mass among the rest, ties to the older position); per window row and
// query head, attention over every visible row against attention over the visible survivors.
// The engine's way: the layer's cut_view (the evicted slots dead) through the CPU attention.
TEST(Concentration, EvictionErrorIsTheShareOfOutputEnergyTheCutChanges) {
  constexpr int N = 20, H = 2 * kG, W = 3, kBudget = 8, kSinks = 2, kRecent = 3;
  CacheConfig c = config(KvPolicy::kSqueeze, kBudget, kSinks, kRecent);
  c.snapkv_window = W;
  c.dtype = KvDType::kF32;  // the reference reads the rows as given
  ModelConfig model = tiny_model(1);
  model.n_heads = H;  // two query heads per kv head
  SequenceCache sc = CacheBuilder::for_model(model, c, 32);
  LayerCache& layer = sc.layers[0];
  ConcentrationMeter* meter = layer.meter();
  ASSERT_NE(meter, nullptr);
  EXPECT_EQ(meter->metric(), SqueezeMetric::kEvictionError);  // the default
  EXPECT_EQ(meter->window(), W);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(N * kG * kD), v(k.size());  // [N][G*D]
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<int32_t> p(N);
  std::iota(p.begin(), p.end(), 0);
  EXPECT_FALSE(layer.cut_view(0).has_value());  // nothing held: nothing to cut
  layer.append(k.data(), v.data(), p.data(), N);
  const int cap = layer.storage().capacity();
  std::uniform_real_distribution<float> ud(0.0f, 4.0f);
  for (int g = 0; g < kG; ++g)
    for (int j = 0; j < N; ++j) layer.mass_accumulator()[g * cap + j] = ud(rng);
  std::vector<float> q(W * H * kD);  // [W][H*D]
  for (auto& x : q) x = nd(rng);
  const int32_t qpos[W] = {15, 18, 19};  // the first row sees neither 18 nor 19 (causal)
  double err = 0.0, energy = 0.0;
  for (int g = 0; g < kG; ++g) {
    std::vector<int> order;  // candidates for the heavy rows, heaviest first, ties to the older
    for (int j = kSinks; j < N - kRecent; ++j) order.push_back(j);
    const float* m = layer.storage().mass(g);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return m[a] > m[b]; });
    std::set<int> kept(order.begin(), order.begin() + (kBudget - kSinks - kRecent));
    for (int j = 0; j < kSinks; ++j) kept.insert(j);
    for (int j = N - kRecent; j < N; ++j) kept.insert(j);
    for (int t = 0; t < W; ++t)
      for (int h = g * H / kG; h < (g + 1) * H / kG; ++h) {
        const float* qr = &q[(t * H + h) * kD];
        auto attend = [&](bool only_kept) {
          std::vector<double> out(kD, 0.0);
          double z = 0.0;
          for (int j = 0; j <= qpos[t]; ++j) {
            if (only_kept && !kept.count(j)) continue;
            double d = 0.0;
            for (int i = 0; i < kD; ++i) d += double(qr[i]) * k[(j * kG + g) * kD + i];
            const double w = std::exp(d / std::sqrt(double(kD)));
            z += w;
            for (int i = 0; i < kD; ++i) out[i] += w * v[(j * kG + g) * kD + i];
          }
          for (double& x : out) x /= z;
          return out;
        };
        const std::vector<double> full = attend(false), cut = attend(true);
        for (int i = 0; i < kD; ++i) {
          err += (full[i] - cut[i]) * (full[i] - cut[i]);
          energy += full[i] * full[i];
        }
      }
  }
  ASSERT_GT(err, 0.0);
  const std::optional<KvView> cut = layer.cut_view(0);
  ASSERT_TRUE(cut.has_value());
  auto cpu = make_cpu_backend(1);
  std::vector<float> o(q.size()), o_cut(q.size());
  cpu->attention(o.data(), q.data(), qpos, W, H, layer.view(), nullptr);
  cpu->attention(o_cut.data(), q.data(), qpos, W, H, *cut, nullptr);
  EXPECT_EQ(meter->value(), 0.0);  // no input yet
  meter->add_output_error(o.data(), o_cut.data(), static_cast<int64_t>(o.size()));
  EXPECT_NEAR(meter->value(), energy / (energy + err), 1e-5);
  // steps pool until the report; a step whose cut evicts nothing adds only its energy
  meter->add_output_error(o.data(), o.data(), static_cast<int64_t>(o.size()));
  EXPECT_NEAR(meter->value(), 2 * energy / (2 * energy + err), 1e-5);
  // a first chunk of an input twice as long: the cut keeps half the budget (sinks + recent 2)
  const std::optional<KvView> half = layer.cut_view(2 * N);
  ASSERT_TRUE(half.has_value());
  for (int g = 0; g < kG; ++g) {
    std::set<int32_t> live;
    for (int j = 0; j < half->count; ++j)
      if (half->pos[g * half->capacity + j] != KvStorage::kDeadPos) live.insert(half->pos[g * half->capacity + j]);
    EXPECT_EQ(live, (std::set<int32_t>{0, 1, N - 2, N - 1})) << "head " << g;
  }
  // the cut leaves the layer itself as it was
  EXPECT_EQ(layer.storage().count(), N);
  for (int g = 0; g < kG; ++g)
    for (int j = 0; j < N; ++j) EXPECT_EQ(layer.storage().positions(g)[j], j);
}

TEST(Concentration, EvictionCutKeepsTheBudgetsShareOfTheInputSeen) {
  const EvictionCut c{100, 4, -1, false};
  EXPECT_EQ(c.scaled_budget(512, 0), 100);     // the input ends with these rows
  EXPECT_EQ(c.scaled_budget(512, 512), 100);
  EXPECT_EQ(c.scaled_budget(512, 2048), 25);   // a quarter of the input seen
  EXPECT_EQ(c.scaled_budget(10, 100000), 5);   // at least sinks + 1
  EXPECT_EQ(c.recent_for(25), 12);             // h2o's half of the scaled budget
  const EvictionCut r{100, 4, 10, false};
  EXPECT_EQ(r.recent_for(8), 4);               // a fixed recent window, within the budget less the sinks
}

TEST(Concentration, EntropyAndResidualAreMeansOverRows) {
  ConcentrationMeter e(SqueezeMetric::kAttentionEntropy);
  e.add_entropy(1.5, 2);
  e.add_entropy(0.5, 2);
  EXPECT_DOUBLE_EQ(e.value(), 1.0 - 2.0 / 4.0);
  ConcentrationMeter r(SqueezeMetric::kResidualCosine);
  const float x[4] = {1, 0, 0, 1}, y[4] = {1, 0, 1, 0};  // rows: cos 1 and cos 0
  r.add_residual(x, y, 2, 2);
  EXPECT_DOUBLE_EQ(r.value(), 0.5);
  r.reset();
  EXPECT_EQ(r.value(), 0.0);
}

}  // namespace
}  // namespace squeezekv
