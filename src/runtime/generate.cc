// Sampler (temperature, top-k, top-p, min-p), the generation loop and chat formatting.
#include "squeezekv/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/sample.h"
#include "squeezekv/error.h"

namespace squeezekv {

void validate(const SamplerConfig& c) {
  if (!std::isfinite(c.temperature) || c.temperature < 0.0f)
    throw Error("--temp: must be a finite number >= 0, got " + std::to_string(c.temperature));
  if (!(c.top_p > 0.0f && c.top_p <= 1.0f)) throw Error("--top-p: must be in (0, 1], got " + std::to_string(c.top_p));
  if (!(c.min_p >= 0.0f && c.min_p < 1.0f)) throw Error("--min-p: must be in [0, 1), got " + std::to_string(c.min_p));
  if (c.top_k < 0) throw Error("--top-k: must be >= 0, got " + std::to_string(c.top_k));
}

Sampler::Sampler(const SamplerConfig& cfg) : cfg_(cfg), rng_(cfg.seed), scratch_(std::make_unique<SampleScratch>()) { validate(cfg); }
Sampler::~Sampler() = default;

SampleParams Sampler::next_params() {
  SampleParams p;
  p.temperature = cfg_.temperature;
  p.top_k = cfg_.top_k;
  p.top_p = cfg_.top_p;
  p.min_p = cfg_.min_p;
  if (p.temperature > 0.0f) p.draw = std::generate_canonical<double, 53>(rng_);  // as uniform_real_distribution draws
  return p;
}

int Sampler::sample(std::span<const float> logits) { return sample_row(logits, next_params(), *scratch_); }

Generation::Generation(const Tokenizer& tok, std::span<const int> prompt, const GenerateOptions& opt,
                       std::function<bool(std::string_view)> on_text)
    : tok_(tok),
      opt_(opt),
      on_text_(std::move(on_text)),
      sampler_(opt.sampler),
      // the stream starts "at the text start" when the prompt is just BOS
      stream_(tok, prompt.size() == 1 && prompt[0] == tok.bos()) {
  if (prompt.empty()) throw Error("generate: empty prompt (nothing to condition on)");
  if (opt.max_tokens < 0) throw Error("-n: must be >= 0");
  for (const auto& s : opt.stop)
    if (s.empty()) throw Error("--stop: empty stop string");
  res_.prompt_tokens = static_cast<int>(prompt.size());
  res_.stop_reason = "length";
  if (opt.max_tokens == 0) finish("length");
}

void Generation::emit(std::string_view s) {
  if (s.empty() || res_.stop_reason == "cancelled") return;
  res_.text += s;
  if (on_text_ && !on_text_(s)) {
    res_.stop_reason = "cancelled";
    done_ = true;
  }
}

void Generation::finish(const std::string& reason) {
  if (done_) return;
  if (reason != "cancelled") {
    emit(held_ + stream_.flush());
    held_.clear();
  }
  if (res_.stop_reason != "cancelled") res_.stop_reason = reason;
  done_ = true;
}

int Generation::pick(std::span<const float> logits) { return done_ ? -1 : sampler_.sample(logits); }

int Generation::next(std::span<const float> logits) { return accept(pick(logits)); }

int Generation::accept(int id) {
  if (done_ || id < 0) return -1;
  if (tok_.is_end_of_generation(id)) {
    finish("eos");
    return -1;
  }
  res_.tokens.push_back(id);
  held_ += stream_.push(id);
  bool stopped = false;
  for (const auto& s : opt_.stop) {
    const size_t at = held_.find(s);
    if (at != std::string::npos) {
      held_.resize(at);
      stopped = true;
    }
  }
  if (stopped) {
    emit(held_);
    held_.clear();
    if (!done_) res_.stop_reason = "stop";
    done_ = true;
    return -1;
  }
  // keep back the longest suffix that could still grow into a stop string
  size_t keep = 0;
  for (const auto& s : opt_.stop)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  emit(std::string_view(held_).substr(0, held_.size() - keep));
  held_.erase(0, held_.size() - keep);
  if (done_) return -1;  // cancelled by on_text
  if (static_cast<int>(res_.tokens.size()) >= opt_.max_tokens) {
    finish("length");
    return -1;
  }
  return id;
}

GenerateResult generate(Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                        const std::function<void(std::string_view)>& on_text, const std::function<void()>& after_prompt) {
  using clock = std::chrono::steady_clock;
  Generation g(session.model().tokenizer(), prompt, opt, [&on_text](std::string_view s) {
    if (on_text) on_text(s);
    return true;
  });
  const auto t0 = clock::now();
  std::span<const float> logits = session.forward(prompt);
  const auto t1 = clock::now();
  if (after_prompt) after_prompt();
  for (int id = g.next(logits); id >= 0; id = g.next(logits)) logits = session.forward(std::span<const int>(&id, 1));
  GenerateResult res = std::move(g.result());
  res.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();
  res.generate_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return res;
}

std::vector<int> encode_prompt(const Model& m, const std::string& text) {
  const Tokenizer& tok = m.tokenizer();
  const bool has_bos_text = tok.bos() >= 0 && text.rfind(tok.token_text(tok.bos()), 0) == 0;
  return tok.encode(text, tok.add_bos() && !has_bos_text);
}

ChatFormat detect_chat_format(const std::string& t) {
  if (t.find("<|im_start|>") != std::string::npos) return ChatFormat::kChatML;
  if (t.find("<|start_header_id|>") != std::string::npos) return ChatFormat::kLlama3;
  return ChatFormat::kPlain;
}

std::string render_chat(ChatFormat f, const std::string& tmpl, const std::vector<ChatMessage>& messages, bool add_generation_prompt) {
  std::string out;
  switch (f) {
    case ChatFormat::kChatML: {
      const bool has_system = !messages.empty() && messages[0].role == "system";
      if (!has_system) {
        // the template's built-in default system message, if it writes one literally
        // (the newline may be written as a real newline or as the two characters \n)
        for (const std::string open : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
          const size_t a = tmpl.find(open);
          const size_t b = a == std::string::npos ? a : tmpl.find("<|im_end|>", a);
          if (b == std::string::npos) continue;
          out += "<|im_start|>system\n" + tmpl.substr(a + open.size(), b - a - open.size()) + "<|im_end|>\n";
          break;
        }
      }
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatFormat::kLlama3:
      out = "<|begin_of_text|>";
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatFormat::kPlain:
      for (const auto& m : messages) out += m.content + "\n";
      return out;
  }
  return out;
}

}  // namespace squeezekv
