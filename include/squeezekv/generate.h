// Sampling, generation loop and chat formatting on top of a Session.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "squeezekv/sampling.h"
#include "squeezekv/session.h"
#include "squeezekv/tokenizer.h"

namespace squeezekv {

struct SamplerConfig {
  float temperature = 0.8f;  // <= 0: greedy
  int top_k = 40;            // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  uint64_t seed = 0;
};

void validate(const SamplerConfig& c);  // throws Error naming the flag

struct SampleScratch;  // src/core/sample.h

// Picks the next token from logits [V] (the pick src/core/sample.h defines), drawing from its own
// generator seeded by SamplerConfig::seed. Buffers are reused across calls.
// Thread safety: one sampler per sequence.
class Sampler {
 public:
  explicit Sampler(const SamplerConfig& cfg);
  ~Sampler();
  int sample(std::span<const float> logits);
  // The settings and the next draw for a pick made elsewhere (Engine::decode_sampled): what
  // sample() would use next (a greedy sampler draws nothing).
  SampleParams next_params();

 private:
  SamplerConfig cfg_;
  std::mt19937_64 rng_;
  std::unique_ptr<SampleScratch> scratch_;
};

struct GenerateOptions {
  int max_tokens = 128;
  SamplerConfig sampler;
  std::vector<std::string> stop;  // stop strings (not printed)
};

struct GenerateResult {
  std::string text;
  std::vector<int> tokens;  // generated ids
  int prompt_tokens = 0;
  int cached_tokens = 0;  // of them, taken from a prompt cache instead of run (Scheduler)
  double prompt_seconds = 0.0;
  double generate_seconds = 0.0;
  std::string stop_reason;  // "eos", "stop", "length" (max_tokens or a full context), "cancelled" (on_text said stop), "error"
  std::string error;        // what failed, when stop_reason is "error"
  // The request itself cannot run as asked (a cache larger than the KV memory could ever hold, a
  // prompt that leaves no room in its context): the client's to change, not the server's fault.
  bool request_error = false;
};

// One sequence's generation: samples from the logits of each step, stops at an end-of-generation
// token, a stop string or max_tokens, and emits text in whole UTF-8 characters (holding back what
// may begin a stop string). generate() and the Scheduler (engine.h) both drive it.
// Thread safety: one thread at a time.
class Generation {
 public:
  // Validates the options (Error naming the flag). on_text may be empty; when it returns false
  // the generation ends with stop_reason "cancelled".
  Generation(const Tokenizer& tok, std::span<const int> prompt, const GenerateOptions& opt,
             std::function<bool(std::string_view)> on_text = {});
  // Takes the logits [V] after the last step; returns the token to run next, or -1 when finished.
  int next(std::span<const float> logits);
  // next() in two halves: pick samples the token (this generation's sampler alone: generations
  // may pick at once on different threads; -1 when finished), accept takes it (text, stop
  // strings, on_text, the length limit) and returns what next() would.
  int pick(std::span<const float> logits);
  int accept(int id);
  // Whether accept(id) certainly ends the generation: finished already, an end-of-generation
  // token, or the last token max_tokens allows. (A stop string that id completes, or on_text
  // asking to stop, ends it too, which only accept finds out.)
  bool ends_with(int id) const {
    return done_ || id < 0 || tok_.is_end_of_generation(id) || static_cast<int64_t>(res_.tokens.size()) + 1 >= opt_.max_tokens;
  }
  // pick made elsewhere: the settings and draw for this generation's next token
  // (Engine::decode_sampled), then accept(the token picked).
  SampleParams next_params() { return sampler_.next_params(); }
  // Ends the generation early (context full: "length"; "cancelled"; "error"), emitting held text
  // unless cancelled.
  void finish(const std::string& reason);
  bool done() const { return done_; }
  GenerateResult& result() { return res_; }

 private:
  void emit(std::string_view s);

  const Tokenizer& tok_;
  GenerateOptions opt_;
  std::function<bool(std::string_view)> on_text_;
  Sampler sampler_;
  TextStream stream_;
  std::string held_;  // text not yet emitted because it may begin a stop string
  GenerateResult res_;
  bool done_ = false;
};

// Prefills the prompt, then samples until an end-of-generation token, a stop string or
// max_tokens. on_text receives text as it is produced (whole UTF-8 characters); after_prompt, when
// given, runs once the prompt has run and before the first token is sampled (the CLI's --save-kv).
GenerateResult generate(Session& session, std::span<const int> prompt, const GenerateOptions& opt,
                        const std::function<void(std::string_view)>& on_text = {},
                        const std::function<void()>& after_prompt = {});

// Prompt text -> token ids: BOS first when the model adds one, unless the text already opens with
// BOS's text (a chat rendering that writes it).
std::vector<int> encode_prompt(const Model& model, const std::string& text);

// Chat formats detected from a model's template text.
enum class ChatFormat : uint8_t { kPlain, kChatML, kLlama3 };
ChatFormat detect_chat_format(const std::string& chat_template);

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

// Renders messages, ending with the generation prompt for the assistant unless
// add_generation_prompt is false (then the messages alone: the text a longer conversation begins
// with). For ChatML the template's built-in default system message is used when none is given.
std::string render_chat(ChatFormat f, const std::string& chat_template, const std::vector<ChatMessage>& messages,
                        bool add_generation_prompt = true);

}  // namespace squeezekv
