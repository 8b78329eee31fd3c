// Saved KV caches (docs/kv_file.md) on the default model: a cache saved after a document and
// restored continues bit for bit as the session that saved it (every policy, f16, q8_0 and rotated
// 4-bit rows, a Session and an Engine), and every damaged, mismatched or unsaveable cache is
// refused with a message that names what is wrong, before the sequence is touched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <cstring>
#include <string>
#include <vector>

#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"
#include "squeezekv/session.h"
#include "test_paths.h"

namespace squeezekv {
namespace {

const Model& smollm2() {
  static auto m = Model::load(test::default_model());
  return *m;
}

std::vector<int> austen(int n, int from) {
  std::ifstream in(test::shared_dir() + "/data/austen/emma.txt");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  std::vector<int> ids = smollm2().tokenizer().encode(text.substr(from, 20000), false);
  ids.resize(static_cast<size_t>(n));
  return ids;
}

SessionOptions options(KvPolicy p, int budget, KvDType k = KvDType::kF16, KvDType v = KvDType::kF16) {
  SessionOptions so;
  so.threads = 2;
  so.prefill_chunk = 96;
  so.decode_activations = DecodeActivations::kInt8;
  so.cache.policy = p;
  so.cache.budget = budget;
  so.cache.dtype = k;
  so.cache.dtype_v = v;
  so.cache.max_tokens = 400;
  return so;
}

// Greedy steps from `first` (logits of every step, concatenated).
std::vector<float> continue_greedy(Session& s, std::span<const int> question, int steps) {
  std::vector<float> out;
  auto l = s.forward(question);
  for (int i = 0; i < steps; ++i) {
    out.insert(out.end(), l.begin(), l.end());
    const int next = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
    l = s.forward(std::span<const int>(&next, 1));
  }
  return out;
}

TEST(KvFile, ARestoredCacheContinuesBitForBitUnderEveryPolicy) {
  const std::vector<int> doc = austen(200, 0), question = austen(8, 9000);
  struct Case {
    KvPolicy p;
    int budget;
    KvDType k, v;
    LayerAlloc layers = LayerAlloc::kUniform;
    int recent_f16 = 0;  // --kv-recent-f16: the ring's f16 rows travel with the cache
  };
  const Case cases[] = {{KvPolicy::kFull, 0, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kWindow, 64, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kH2O, 64, KvDType::kQ8_0, KvDType::kQ8_0},
                        {KvPolicy::kSnapKV, 64, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kPyramidKV, 64, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kSqueeze, 64, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kSqueeze, 64, KvDType::kQ4_0, KvDType::kQ4_1},
                        {KvPolicy::kFull, 0, KvDType::kQ4_1, KvDType::kQ4_1, LayerAlloc::kUniform, 48},
                        {KvPolicy::kH2O, 64, KvDType::kQ8_0, KvDType::kF16, LayerAlloc::kUniform, 24},
                        {KvPolicy::kKvzip, 64, KvDType::kF16, KvDType::kF16},
                        {KvPolicy::kKvzip, 64, KvDType::kF16, KvDType::kF16, LayerAlloc::kSqueeze},
                        {KvPolicy::kSnapKV, 64, KvDType::kF16, KvDType::kF16, LayerAlloc::kSqueeze}};
  for (const Case& c : cases) {
    SessionOptions so = options(c.p, c.budget, c.k, c.v);
    so.cache.layer_alloc = c.layers;
    so.cache.recent_f16 = c.recent_f16;
    const std::string what = std::string(kv_policy_name(c.p)) + " " + kv_dtype_name(c.k) + "/" + kv_dtype_name(c.v) + " layers " +
                             layer_alloc_name(c.layers) + " recent f16 " + std::to_string(c.recent_f16);
    Session a(smollm2(), so);
    a.forward(doc);
    const std::vector<uint8_t> bytes = a.save_kv(doc);
    std::vector<std::vector<int32_t>> held;
    for (int l = 0; l < 30; ++l)
      for (int g = 0; g < 3; ++g) held.push_back(a.kv_positions(l, g));
    const std::vector<float> want = continue_greedy(a, question, 4);

    Session b(smollm2(), so);
    b.forward(austen(50, 4000));  // whatever it held is replaced
    EXPECT_EQ(b.load_kv(bytes), doc) << what;
    EXPECT_EQ(b.position(), 200) << what;
    for (int l = 0; l < 30; ++l)
      for (int g = 0; g < 3; ++g) ASSERT_EQ(b.kv_positions(l, g), held[static_cast<size_t>(l) * 3 + g]) << what << " layer " << l;
    const std::vector<float> got = continue_greedy(b, question, 4);
    EXPECT_EQ(got, want) << what << ": the restored session's logits differ";

    // the same through an Engine sequence (the cache settings come from the bytes)
    Engine e(smollm2(), so, 2);
    std::vector<int> covered;
    const SequenceId id = e.load_sequence(bytes, &covered);
    EXPECT_EQ(covered, doc);
    auto l = e.prefill(id, question, 208);
    std::vector<float> eng(l.begin(), l.end());
    EXPECT_TRUE(std::equal(eng.begin(), eng.end(), want.begin())) << what << ": the engine's first logits differ";
    const auto stats = e.kv_stats(id);
    EXPECT_EQ(stats[0].tokens_seen, 208) << what;
  }
}

TEST(KvFile, SavedBytesRoundTripToAFileAndKeepTheSchedule) {
  const std::vector<int> doc = austen(300, 0);
  const SessionOptions so = options(KvPolicy::kSqueeze, 48);
  Session a(smollm2(), so);
  a.forward(doc);
  const std::string path = (std::filesystem::temp_directory_path() / "squeezekv_kv_file_test.kv").string();
  a.save_kv_file(path, doc);
  Session b(smollm2(), so);
  EXPECT_EQ(b.load_kv_file(path), doc);
  std::filesystem::remove(path);
  const auto sa = a.kv_stats(), sb = b.kv_stats();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t l = 0; l < sa.size(); ++l) {
    EXPECT_EQ(sa[l].budget, sb[l].budget) << "layer " << l;  // the squeeze schedule
    EXPECT_EQ(sa[l].tokens_kept, sb[l].tokens_kept) << "layer " << l;
    EXPECT_EQ(sa[l].concentration, sb[l].concentration) << "layer " << l;
  }
  EXPECT_THROW(b.load_kv_file(path), Error);  // gone
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(KvFile, DamagedMismatchedAndUnsaveableCachesAreRefused) {
  const std::vector<int> doc = austen(200, 0);
  const SessionOptions so = options(KvPolicy::kH2O, 64);
  Session a(smollm2(), so);
  a.forward(doc);
  const std::vector<uint8_t> bytes = a.save_kv(doc);
  Session b(smollm2(), so);
  b.forward(austen(20, 5000));
  auto refuses = [&](std::vector<uint8_t> bad, const std::string& needle) {
    const std::string m = message_of([&] { b.load_kv(bad, "bad.kv"); });
    EXPECT_NE(m.find(needle), std::string::npos) << "expected '" << needle << "' in: " << m;
    EXPECT_EQ(b.position(), 20) << "a refused cache touched the sequence";
  };
  refuses({}, "no SQKV magic");
  refuses(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 10), "no SQKV magic");
  std::vector<uint8_t> v2 = bytes;
  v2[4] = 2;
  refuses(v2, "format version 2");
  for (size_t cut : {bytes.size() - 1, bytes.size() / 2, size_t{40}})
    refuses(std::vector<uint8_t>(bytes.begin(), bytes.begin() + cut), "bad.kv");
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  refuses(longer, "truncated or damaged");
  std::string text(bytes.begin(), bytes.end());
  auto patched = [&](const std::string& from, const std::string& to) {
    std::string t = text;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    t.replace(at, from.size(), to);
    return std::vector<uint8_t>(t.begin(), t.end());
  };
  refuses(patched("\"fingerprint\":\"", "\"fingerprint\":\"f"), "bad.kv");  // a header of another length: damaged
  refuses(patched("\"budget\":\"64\"", "\"budget\":\"32\""), "bad.kv");
  // settings that differ from the run's, named by flag
  SessionOptions other = so;
  other.cache.budget = 32;
  Session c(smollm2(), other);
  EXPECT_NE(message_of([&] { c.load_kv(bytes); }).find("--kv-budget: the cache was saved with 64, this run asks 32"),
            std::string::npos);
  other = so;
  other.cache.max_tokens = 300;
  Session d(smollm2(), other);
  EXPECT_NE(message_of([&] { d.load_kv(bytes); }).find("--ctx"), std::string::npos);
  // another model
  auto tiny = Model::load(test::tinystories());
  SessionOptions tso = so;
  tso.cache.max_tokens = 256;
  Session t(*tiny, tso);
  EXPECT_NE(message_of([&] { t.load_kv(bytes); }).find("saved for another model"), std::string::npos);
  // what cannot be saved
  EXPECT_NE(message_of([&] { a.save_kv(std::vector<int>(doc.begin(), doc.begin() + 5)); }).find("200 tokens"), std::string::npos);
  // a squeeze schedule still being measured (the first chunk of a prompt that goes on, with the
  // schedule decided at the prompt's end); kvzip in its prompt saves (the input it will score is
  // saved with it)
  SessionOptions sq = options(KvPolicy::kSqueeze, 64);
  sq.cache.squeeze_resolve = SqueezeResolve::kPrompt;
  Engine e(smollm2(), sq, 1);
  const SequenceId id = e.add_sequence(sq.cache);
  const std::vector<int> part(doc.begin(), doc.begin() + 96);
  e.prefill(id, part, 200);
  EXPECT_NE(message_of([&] { e.save_sequence(id, part); }).find("save once the prompt has run"), std::string::npos);
  const SequenceId z = e.add_sequence(options(KvPolicy::kKvzip, 64).cache);
  e.prefill(z, part, 200);
  const std::vector<uint8_t> mid = e.save_sequence(z, part);
  const SequenceId z2 = e.load_sequence(mid);
  for (SequenceId q : {z, z2}) {  // the rest of the prompt: both score it at its end
    e.prefill(q, std::span<const int>(doc).subspan(96, 96), 200);
    e.prefill(q, std::span<const int>(doc).subspan(192, 8), 200);
  }
  EXPECT_EQ(e.kv_positions(z, 5, 1), e.kv_positions(z2, 5, 1));
  struct Keep final : KvScorer {
    void score(const KvScoreInput& in, float* out) override {
      for (int i = 0; i < in.n_kv_heads * in.rows; ++i) out[i] = 0.0f;
    }
  };
  SessionOptions cu = options(KvPolicy::kCustom, 64);
  cu.cache.scorer = std::make_shared<Keep>();
  Session custom(smollm2(), cu);
  custom.forward(doc);
  EXPECT_NE(message_of([&] { custom.save_kv(doc); }).find("custom"), std::string::npos);
}

// A byte flipped anywhere in a saved cache gives a clear refusal or a cache that still decodes;
// never a crash (the sanitizer build runs this too; tests/fuzz/fuzz_kv_file.cc goes further).
// A cache saved with the newest rows in f16 (--kv-recent-f16) is refused, naming what is wrong,
// when the run asks another ring, when a ring slot holds a position that is not its own, or when
// a ring row is not finite. The file ends with the last layer's ring: its V rows (f16), then the
// position of each slot (i32).
TEST(KvFile, RecentF16RowsMismatchedOrDamagedAreRefused) {
  const std::vector<int> doc = austen(120, 0);
  SessionOptions so = options(KvPolicy::kH2O, 64, KvDType::kQ4_1, KvDType::kQ4_1);
  so.cache.recent_f16 = 16;
  Session a(smollm2(), so);
  a.forward(doc);
  const std::vector<uint8_t> bytes = a.save_kv(doc);
  SessionOptions other = so;
  other.cache.recent_f16 = 8;
  Session b(smollm2(), other);
  EXPECT_NE(message_of([&] { b.load_kv(bytes); }).find("--kv-recent-f16: the cache was saved with 16, this run asks 8"),
            std::string::npos)
      << message_of([&] { b.load_kv(bytes); });
  // (found while the layers are restored, KvStorage::restore, as a damaged row's position or
  // value is: the session holding a sequence of its own keeps it, the same logits after the
  // refusal as a session that never saw the bad cache)
  const std::vector<int> own = austen(40, 3000), next = austen(3, 9000);
  Session c(smollm2(), so), untouched(smollm2(), so);
  c.forward(own);
  untouched.forward(own);
  auto refuses = [&](const std::vector<uint8_t>& bad, const std::string& needle) {
    const std::string m = message_of([&] { c.load_kv(bad, "bad.kv"); });
    EXPECT_NE(m.find(needle), std::string::npos) << "expected '" << needle << "' in: " << m;
    EXPECT_EQ(c.position(), 40) << "a refused cache touched the sequence";
  };
  std::vector<uint8_t> moved = bytes;  // slot 15 says it holds position 0 (0 % 16 is slot 0)
  const int32_t zero = 0;
  std::memcpy(moved.data() + moved.size() - sizeof(int32_t), &zero, sizeof(int32_t));
  refuses(moved, "the recent f16 rows' index 15 holds position 0, not one of its own");
  std::vector<uint8_t> inf = bytes;  // the last V ring value: f16 infinity
  const uint16_t f16_inf = 0x7c00;
  std::memcpy(inf.data() + inf.size() - 16 * sizeof(int32_t) - sizeof(uint16_t), &f16_inf, sizeof(uint16_t));
  refuses(inf, "a recent f16 row holds a value that is not finite");
  const std::vector<float> kept = continue_greedy(c, next, 2), want = continue_greedy(untouched, next, 2);
  EXPECT_EQ(kept, want) << "the session's own sequence changed under a refused cache";
  Session d(smollm2(), so);
  d.load_kv(bytes);  // the undamaged cache restores
  EXPECT_EQ(d.position(), 120);
}

TEST(KvFile, FlippedBytesNeverCrash) {
  const std::vector<int> doc = austen(150, 0);
  const SessionOptions so = options(KvPolicy::kH2O, 48, KvDType::kQ8_0, KvDType::kQ8_0);
  Session a(smollm2(), so);
  a.forward(doc);
  const std::vector<uint8_t> bytes = a.save_kv(doc);
  Session b(smollm2(), so);
  std::mt19937 rng(3);
  int refused = 0, restored = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bad = bytes;
    const size_t at = i < 150 ? rng() % std::min<size_t>(bad.size(), 4000) : rng() % bad.size();  // the header, then anywhere
    bad[at] ^= static_cast<uint8_t>(1 + rng() % 255);
    try {
      b.load_kv(bad);
      const int next = 11;
      b.forward(std::span<const int>(&next, 1));
      ++restored;
    } catch (const Error&) {
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(restored, 0);  // most of the payload is row bytes: a flip there still decodes
}

}  // namespace
}  // namespace squeezekv
