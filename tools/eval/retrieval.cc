// Synthetic long-context retrieval in the style of RULER (Hsieh et al. 2024): a haystack (filler
// sentences or real text), needles at stated depths, a question at the end, a greedy answer scored
// by exact match. The context is prefilled (and compressed) first; the question is run after it.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <set>
#include <sstream>

#include "eval/eval.h"
#include "eval/progress.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"

namespace squeezekv::eval {
namespace {

const char* kFiller = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* kWords[] = {"apple",  "river",  "castle", "violin", "meadow", "lantern", "harbor", "pepper",
                        "falcon", "marble", "orchid", "canyon", "copper", "willow", "saddle", "thunder"};
// The qa task's facts: a person's relation kept an animal with a name; the name is the answer.
const char* kPeople[] = {"Mr. Ashcombe", "Mrs. Pendleton", "Miss Harwood", "Captain Fairleigh", "Dr. Marlow", "Lady Thornbury",
                         "Mr. Quenby", "Mrs. Ellerby"};
const char* kRelations[] = {"cousin", "aunt", "uncle", "godmother", "neighbour", "grandfather"};
const char* kAnimals[] = {"parrot", "spaniel", "pony", "tortoise", "canary", "ferret", "goat", "greyhound"};
const char* kPetNames[] = {"Juniper", "Biscuit", "Marmalade", "Clover", "Nutmeg", "Pumpkin", "Pebble", "Saffron",
                           "Bramble", "Cobalt", "Muffin", "Tinder", "Sprocket", "Quill", "Thistle", "Waffle"};
const char* kPreamble =
    "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there.\n\n";

struct Needle {
  double depth;
  std::string text;
};

struct Ask {
  std::string question;
  std::string answer_prefix;  // plain (no chat template) prompts: the start of the answer
  std::vector<std::string> expected;
};

struct Built {
  std::string context, question;  // question: what follows the context in a plain prompt
  std::vector<std::string> expected;
  std::vector<Needle> needles;
  std::string answer_prefix;  // plain (no chat template) prompts: the start of the answer
  std::vector<Ask> others;    // niah-multikey: the other keys' questions (asked with RetrievalOptions::reuse)
};

std::string number(std::mt19937_64& rng, int digits) {
  std::uniform_int_distribution<int> d(0, 9), first(1, 9);
  std::string s(1, static_cast<char>('0' + first(rng)));
  while (static_cast<int>(s.size()) < digits) s += static_cast<char>('0' + d(rng));
  return s;
}

Built make_task(RetrievalTask task, double depth, std::mt19937_64& rng) {
  Built b;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::string> words(std::begin(kWords), std::end(kWords));
  std::shuffle(words.begin(), words.end(), rng);
  switch (task) {
    case RetrievalTask::kPasskey: {
      const std::string k = number(rng, 5);
      b.needles.push_back({depth, "The pass key is " + k + ". Remember it. " + k + " is the pass key."});
      b.expected = {k};
      b.question = "What is the pass key?";
      b.answer_prefix = "The pass key is";
      break;
    }
    case RetrievalTask::kMultiKey: {
      for (int i = 0; i < 4; ++i) {
        const std::string v = number(rng, 7);
        b.needles.push_back({i == 0 ? depth : u(rng), "One of the special magic numbers for " + words[i] + " is: " + v + "."});
        if (i == 0) b.expected = {v};
        else b.others.push_back({"What is the special magic number for " + words[i] + " mentioned in the provided text?",
                                 "The special magic number for " + words[i] + " mentioned in the provided text is", {v}});
      }
      b.question = "What is the special magic number for " + words[0] + " mentioned in the provided text?";
      b.answer_prefix = "The special magic number for " + words[0] + " mentioned in the provided text is";
      break;
    }
    case RetrievalTask::kMultiValue: {
      for (int i = 0; i < 4; ++i) {
        const std::string v = number(rng, 7);
        b.needles.push_back({i == 0 ? depth : u(rng), "One of the special magic numbers for " + words[0] + " is: " + v + "."});
        b.expected.push_back(v);
      }
      b.question = "What are all the special magic numbers for " + words[0] + " mentioned in the provided text?";
      b.answer_prefix = "The special magic numbers for " + words[0] + " mentioned in the provided text are";
      break;
    }
    case RetrievalTask::kQa: {
      auto pick = [&rng](const auto& list) {
        return std::string(list[std::uniform_int_distribution<size_t>(0, std::size(list) - 1)(rng)]);
      };
      const std::string who = pick(kPeople), rel = pick(kRelations), animal = pick(kAnimals), name = pick(kPetNames);
      b.needles.push_back({depth, who + "'s " + rel + " had a " + animal + " called " + name + ". Everyone in the village knew " +
                                      name + " the " + animal + "."});
      b.expected = {name};
      b.question = "What was the name of the " + animal + "?";
      b.answer_prefix = "The " + animal + " was called";
      break;
    }
  }
  return b;
}

std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i] == '\n' || text[i] == '\r' ? ' ' : text[i];
    if (c == ' ' && (cur.empty() || cur.back() == ' ')) continue;
    cur += c;
    if ((c == '.' || c == '!' || c == '?') && (i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '\n')) {
      out.push_back(cur);
      cur.clear();
    }
  }
  return out;
}

}  // namespace

RetrievalTask parse_task(const std::string& name) {
  if (name == "passkey") return RetrievalTask::kPasskey;
  if (name == "niah-multikey") return RetrievalTask::kMultiKey;
  if (name == "niah-multivalue") return RetrievalTask::kMultiValue;
  if (name == "qa") return RetrievalTask::kQa;
  throw Error("--task: unknown task '" + name + "' (expected passkey, niah-multikey, niah-multivalue or qa)");
}

const char* task_name(RetrievalTask t) {
  switch (t) {
    case RetrievalTask::kPasskey: return "passkey";
    case RetrievalTask::kMultiKey: return "niah-multikey";
    case RetrievalTask::kMultiValue: return "niah-multivalue";
    case RetrievalTask::kQa: return "qa";
  }
  return "?";
}

void validate(const RetrievalOptions& o) {
  if (o.ctx < 64) throw Error("--ctx: must be at least 64 tokens, got " + std::to_string(o.ctx));
  if (o.depths.empty()) throw Error("--depths: give at least one depth in [0, 1]");
  for (double d : o.depths)
    if (!(d >= 0.0 && d <= 1.0)) throw Error("--depths: depth " + std::to_string(d) + " is outside [0, 1]");
  if (o.samples < 1) throw Error("--samples: must be at least 1, got " + std::to_string(o.samples));
  if (o.max_answer_tokens < 1) throw Error("--answer-tokens: must be at least 1");
  if (o.reuse && o.question_aware)
    throw Error("--reuse: the context is compressed before any question to be reused; not with --question-aware");
  if (!o.haystack_file.empty() && !std::ifstream(o.haystack_file))
    throw Error("--haystack: cannot read '" + o.haystack_file + "'");
}

bool answer_matches(const std::string& answer, const std::vector<std::string>& expected) {
  // the answer's whole runs of digits, and of letters (lower case)
  std::set<std::string> numbers, words;
  auto runs = [&answer](std::set<std::string>& out, auto in_run) {
    std::string cur;
    for (char c : answer + " ") {
      if (in_run(c)) {
        cur += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      } else if (!cur.empty()) {
        out.insert(cur);
        cur.clear();
      }
    }
  };
  runs(numbers, [](char c) { return c >= '0' && c <= '9'; });
  runs(words, [](char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; });
  for (const auto& e : expected) {
    const bool digits = !e.empty() && std::all_of(e.begin(), e.end(), [](char c) { return c >= '0' && c <= '9'; });
    std::string low = e;
    for (char& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!(digits ? numbers : words).count(low)) return false;
  }
  return !expected.empty();
}

namespace {

// The positions of the answer's tokens in the prompt: each expected value inside a needle's span
// of `context` (distractor needles hold none), as the tokens of `prompt` (the ids of prompt_text)
// from the first that the text before the value does not already give to the last that the text
// through the value does.
std::vector<int32_t> needle_answer_positions(const Tokenizer& tok, const std::string& prompt_text, const std::vector<int>& prompt,
                                             const std::string& context, size_t ctx_offset,
                                             const std::vector<std::pair<size_t, size_t>>& spans, const std::vector<std::string>& expected) {
  auto agreeing = [&](size_t bytes) {  // tokens of prompt_text[0, bytes) that the whole prompt's ids share
    const std::vector<int> part = tok.encode(prompt_text.substr(0, bytes), tok.add_bos());
    size_t n = 0;
    while (n < part.size() && n < prompt.size() && part[n] == prompt[n]) ++n;
    return static_cast<int32_t>(n);
  };
  std::vector<int32_t> out;
  for (const auto& [a, e] : spans)
    for (const std::string& want : expected) {
      const size_t at = context.substr(a, e - a).find(want);
      if (at == std::string::npos) continue;
      const size_t from = ctx_offset + a + at;
      const int32_t first = agreeing(from), last = std::max(first + 1, agreeing(from + want.size()));
      for (int32_t p = first; p < last; ++p) out.push_back(p);
    }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Follows token positions through a sequence's compactions (Session::trace_evictions): for each
// layer, kv head and position, whether a compaction dropped it and its rank by the policy's score
// at the last one that held it.
class NeedleTracer {
 public:
  void begin(std::vector<int32_t> positions, int L, int G) {
    pos_ = std::move(positions);
    L_ = L, G_ = G;
    state_.assign(static_cast<size_t>(L) * G * pos_.size(), {});
  }
  void see(const EvictionEvent& e) {
    for (int g = 0; g < G_ && g < static_cast<int>(e.positions.size()); ++g) {
      const std::vector<int32_t>& P = e.positions[g];
      const std::vector<float>& S = e.scores[g];
      for (size_t i = 0; i < pos_.size(); ++i) {
        State& st = state_[(static_cast<size_t>(e.layer) * G_ + g) * pos_.size() + i];
        if (st.dropped) continue;
        const auto it = std::find(P.begin(), P.end(), pos_[i]);
        if (it == P.end()) continue;  // not appended yet
        const size_t j = static_cast<size_t>(it - P.begin());
        const auto higher = std::count_if(S.begin(), S.end(), [&](float v) { return v > S[j]; });
        st.rank = P.size() > 1 ? static_cast<double>(higher) / static_cast<double>(P.size() - 1) : 0.0;
        st.ranked = true;
        st.dropped = e.kept[g][j] == 0;
      }
    }
  }
  std::vector<std::vector<NeedleFate>> fates() const {
    std::vector<std::vector<NeedleFate>> out(static_cast<size_t>(L_), std::vector<NeedleFate>(static_cast<size_t>(G_)));
    for (int l = 0; l < L_; ++l)
      for (int g = 0; g < G_; ++g) {
        NeedleFate& f = out[l][g];
        std::vector<double> ranks;
        for (size_t i = 0; i < pos_.size(); ++i) {
          const State& st = state_[(static_cast<size_t>(l) * G_ + g) * pos_.size() + i];
          f.kept += st.dropped ? 0 : 1;
          if (st.ranked) ranks.push_back(st.rank);
        }
        f.tokens = static_cast<int>(pos_.size());
        f.rank = median(ranks);
      }
    return out;
  }

 private:
  struct State {
    bool dropped = false, ranked = false;
    double rank = 0.0;
  };
  static double median(std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  }
  std::vector<int32_t> pos_;
  int L_ = 0, G_ = 0;
  std::vector<State> state_;  // [L][G][positions]
};

}  // namespace

RetrievalResult run_retrieval(const Model& m, const SessionOptions& so_in, const RetrievalOptions& o) {
  validate(o);
  const Tokenizer& tok = m.tokenizer();
  std::vector<std::string> hay;
  if (o.haystack_file.empty()) {
    hay = split_sentences(kFiller);
  } else {
    std::ifstream in(o.haystack_file);
    std::stringstream ss;
    ss << in.rdbuf();
    hay = split_sentences(ss.str());
    if (hay.size() < 10) throw Error("--haystack: '" + o.haystack_file + "' has too few sentences");
  }
  std::vector<int> hay_tokens(hay.size());  // tokens of " " + sentence
  for (size_t i = 0; i < hay.size(); ++i) hay_tokens[i] = static_cast<int>(tok.encode(" " + hay[i], false).size());
  const ChatFormat fmt = detect_chat_format(m.chat_template());
  SessionOptions so = so_in;
  so.cache.max_tokens = o.ctx + o.max_answer_tokens + 256;
  Session s(m, so);
  RetrievalResult r;
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_run = 0;
  Progress bar(std::string("retrieval ") + task_name(o.task), static_cast<int64_t>(o.depths.size()) * o.samples, o.progress);
  int64_t done = 0;
  for (size_t di = 0; di < o.depths.size(); ++di) {
    int correct = 0;
    for (int k = 0; k < o.samples; ++k) {
      std::mt19937_64 rng(o.seed * 1000003ULL + di * 1009ULL + static_cast<uint64_t>(k));
      Built b = make_task(o.task, o.depths[di], rng);
      // prompt pieces around the haystack
      std::string needles_text;
      for (const auto& nd : b.needles) needles_text += nd.text + " ";
      const char* instruction = o.task == RetrievalTask::kMultiValue ? " Answer with the numbers only."
                                : o.task == RetrievalTask::kQa         ? " Answer with the name only."
                                                                       : " Answer with the number only.";
      std::string prefix_text, suffix_text;
      // the prompt around `context` for one question: the context's part (the same for every
      // question) and the question's
      auto render_for = [&](const std::string& context, const std::string& question, const std::string& answer_prefix) {
        const std::string tail = "\n\n" + question + instruction;
        if (fmt == ChatFormat::kPlain) {
          prefix_text = context;
          suffix_text = "\n\n" + question + " " + answer_prefix;
        } else {
          const std::string full = render_chat(fmt, m.chat_template(), {{"user", context + tail}});
          const size_t at = full.rfind(tail);
          prefix_text = full.substr(0, at);
          suffix_text = full.substr(at);
        }
      };
      auto render = [&](const std::string& context) { render_for(context, b.question, b.answer_prefix); };
      render(std::string(kPreamble) + needles_text);
      const int overhead = static_cast<int>(tok.encode(prefix_text, tok.add_bos()).size() + tok.encode(suffix_text, false).size());
      if (overhead >= o.ctx)
        throw Error("--ctx: " + std::to_string(o.ctx) + " tokens cannot hold the task's instructions, needles and question (" +
                    std::to_string(overhead) + " tokens with this tokenizer)");
      // haystack sentences up to the token target, from a seeded start
      std::vector<std::string> sent;
      size_t i = std::uniform_int_distribution<size_t>(0, hay.size() - 1)(rng);
      for (int have = 0; have < o.ctx - overhead && sent.size() < 1000000; i = (i + 1) % hay.size()) {
        sent.push_back(hay[i]);
        have += hay_tokens[i];
      }
      // needles at sentence boundaries by depth (later needles first so indices stay valid)
      std::vector<std::pair<size_t, std::string>> inserts;
      for (const auto& nd : b.needles) inserts.emplace_back(static_cast<size_t>(std::lround(nd.depth * sent.size())), nd.text);
      std::stable_sort(inserts.begin(), inserts.end(), [](const auto& a, const auto& c) { return a.first > c.first; });
      for (const auto& [at, text] : inserts) sent.insert(sent.begin() + static_cast<std::ptrdiff_t>(at), text);
      std::string context = kPreamble;
      std::vector<std::pair<size_t, size_t>> spans;  // byte spans of the needles in context
      for (size_t j = 0; j < sent.size(); ++j) {
        if (j) context += ' ';
        const bool is_needle = std::any_of(b.needles.begin(), b.needles.end(), [&](const Needle& nd) { return nd.text == sent[j]; });
        if (is_needle) spans.emplace_back(context.size(), context.size() + sent[j].size());
        context += sent[j];
      }
      render(context);
      const size_t ctx_offset = prefix_text.find(context);
      const std::vector<int> prefix = tok.encode(prefix_text, tok.add_bos());
      const std::vector<int> suffix = tok.encode(suffix_text, false);
      s.reset();
      NeedleTracer tracer;
      if (o.trace_needles) {
        tracer.begin(needle_answer_positions(tok, prefix_text, prefix, context, ctx_offset, spans, b.expected), m.config().n_layers,
                     m.config().n_kv_heads);
        s.trace_evictions([&tracer](const EvictionEvent& e) { tracer.see(e); });
      }
      const auto cold_start = std::chrono::steady_clock::now();
      std::vector<int> rest = suffix;  // what generation starts from
      if (o.question_aware) {  // one prompt: the context, the question and all but its last token
        std::vector<int> prompt = prefix;
        prompt.insert(prompt.end(), suffix.begin(), suffix.end() - 1);
        s.forward(prompt);
        rest.assign(suffix.end() - 1, suffix.end());
      } else {
        s.forward(prefix);
      }
      const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - cold_start).count();
      // needle kept: the tokens strictly inside each needle's span survive in every layer and head
      bool kept = true;
      for (const auto& [a, e] : spans) {
        const int first = static_cast<int>(tok.encode(prefix_text.substr(0, ctx_offset + a), tok.add_bos()).size()) + 1;
        const int last = static_cast<int>(tok.encode(prefix_text.substr(0, ctx_offset + e), tok.add_bos()).size()) - 1;
        for (int l = 0; l < m.config().n_layers && kept; ++l)
          for (int g = 0; g < m.config().n_kv_heads && kept; ++g) {
            const auto pos = s.kv_positions(l, g);
            for (int p = first; p < last && kept; ++p) kept = std::binary_search(pos.begin(), pos.end(), p);
          }
      }
      GenerateOptions go;
      go.max_tokens = o.max_answer_tokens;
      go.sampler.temperature = 0.0f;
      if (fmt == ChatFormat::kPlain) go.stop = {"\n"};
      const std::vector<uint8_t> saved = o.reuse ? s.save_kv(prefix) : std::vector<uint8_t>{};
      // one question from the cache as it stands: its answer and the time from `start` to its first pick
      auto ask = [&](const std::vector<int>& question_ids, std::chrono::steady_clock::time_point start, double* ttft) {
        const GenerateResult res = generate(s, question_ids, go, {}, [&] {
          *ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        });
        tokens_run += static_cast<int64_t>(question_ids.size() + res.tokens.size());
        return res;
      };
      double question_s = 0.0;
      const GenerateResult gr = ask(rest, std::chrono::steady_clock::now(), &question_s);
      if (o.trace_needles) s.trace_evictions({});
      tokens_run += static_cast<int64_t>(prefix.size());
      RetrievalSample rs;
      rs.depth = o.depths[di];
      rs.question = b.question;
      rs.expected = b.expected;
      rs.answer = gr.text;
      rs.prompt_ids = prefix;
      if (o.question_aware) rs.prompt_ids.insert(rs.prompt_ids.end(), suffix.begin(), suffix.end() - 1);
      rs.continue_ids = rest;
      rs.correct = answer_matches(gr.text, b.expected);
      rs.needle_kept = kept;
      if (o.trace_needles) rs.needle_trace = tracer.fates();
      rs.ttft_s = prefill_s + question_s;
      if (o.reuse) {  // the same question, then the other keys', each from a restored copy
        std::vector<Ask> asks = {{b.question, b.answer_prefix, b.expected}};
        asks.insert(asks.end(), b.others.begin(), b.others.end());
        for (const Ask& a : asks) {
          render_for(context, a.question, a.answer_prefix);
          RetrievalReask rq;
          rq.question = a.question;
          rq.expected = a.expected;
          const auto start = std::chrono::steady_clock::now();
          s.load_kv(saved, "the sample's saved context");
          rq.answer = ask(tok.encode(suffix_text, false), start, &rq.ttft_s).text;
          rq.correct = answer_matches(rq.answer, a.expected);
          rs.reasked.push_back(rq);
        }
      }
      correct += rs.correct;
      r.samples.push_back(rs);
      r.cost.add(s.kv_stats());
      bar.update(++done);
    }
    r.by_depth.emplace_back(o.depths[di], static_cast<double>(correct) / o.samples);
  }
  bar.finish();
  const int64_t n = static_cast<int64_t>(r.samples.size());
  r.cost.finish(n);
  int64_t c = 0;
  for (const auto& smp : r.samples) c += smp.correct;
  r.accuracy = static_cast<double>(c) / static_cast<double>(n);
  auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  std::vector<double> cold, warm;
  for (const auto& smp : r.samples) {
    cold.push_back(smp.ttft_s);
    for (size_t j = 0; j < smp.reasked.size(); ++j) {
      const RetrievalReask& q = smp.reasked[j];
      warm.push_back(q.ttft_s);
      ++r.reasked;
      r.reasked_correct += q.correct;
      if (j == 0) r.reuse_equal += q.answer == smp.answer;
    }
  }
  r.ttft_cold_s = median(cold);
  r.ttft_warm_s = median(warm);
  r.cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.cost.tokens_per_second = static_cast<double>(tokens_run) / r.cost.seconds;
  return r;
}

std::vector<NeedleLayerSummary> summarize_needle_trace(const RetrievalResult& r) {
  std::vector<NeedleLayerSummary> out;
  for (const RetrievalSample& smp : r.samples) {
    if (out.size() < smp.needle_trace.size()) out.resize(smp.needle_trace.size());
  }
  for (size_t l = 0; l < out.size(); ++l) {
    NeedleLayerSummary& o = out[l];
    o.layer = static_cast<int>(l);
    int kept[2] = {0, 0}, tokens[2] = {0, 0};
    std::vector<double> ranks[2];
    for (const RetrievalSample& smp : r.samples) {
      if (l >= smp.needle_trace.size()) continue;
      const int c = smp.correct ? 0 : 1;
      (smp.correct ? o.hits : o.misses) += 1;
      for (const NeedleFate& f : smp.needle_trace[l]) {
        kept[c] += f.kept;
        tokens[c] += f.tokens;
        if (f.rank >= 0) ranks[c].push_back(f.rank);
      }
    }
    auto median = [](std::vector<double> v) {
      if (v.empty()) return -1.0;
      std::sort(v.begin(), v.end());
      return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    o.kept_hit = tokens[0] ? static_cast<double>(kept[0]) / tokens[0] : 0.0;
    o.kept_miss = tokens[1] ? static_cast<double>(kept[1]) / tokens[1] : 0.0;
    o.rank_hit = median(ranks[0]);
    o.rank_miss = median(ranks[1]);
  }
  return out;
}

}  // namespace squeezekv::eval
