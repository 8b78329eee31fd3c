// Synthetic long-context retrieval in the style of RULER (Hsieh et al. 2024): a haystack (filler
// sentences or real text), needles at stated depths, a question at the end, a greedy answer scored
// by exact match. The context is prefilled (and compressed) first; the question is run after it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
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
  throw Error("--task: unknown task '" + name + "' (expected passkey, niah-multikey or niah-multivalue)");
}

const char* task_name(RetrievalTask t) {
  return t == RetrievalTask::kPasskey ? "passkey" : t == RetrievalTask::kMultiKey ? "niah-multikey" : "niah-multivalue";
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
  std::set<std::string> numbers;
  std::string cur;
  for (char c : answer + " ") {
    if (c >= '0' && c <= '9') {
      cur += c;
    } else if (!cur.empty()) {
      numbers.insert(cur);
      cur.clear();
    }
  }
  for (const auto& e : expected)
    if (!numbers.count(e)) return false;
  return !expected.empty();
}

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
      const char* instruction = o.task == RetrievalTask::kMultiValue ? " Answer with the numbers only." : " Answer with the number only.";
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

}  // namespace squeezekv::eval
