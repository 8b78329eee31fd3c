// The server's request parsing (request.h): OpenAI request JSON -> a validated generation request.
#include "server/request.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/kv_json.h"
#include "core/json_fields.h"
#include "squeezekv/tokenizer.h"

namespace squeezekv::server {

using json = nlohmann::json;

namespace {

// The automatic cache_prefix of a chat: the tokens of every message but the last (a document or
// a system prompt that later questions share), where they begin the prompt's tokens; 0 for one
// message, and for the query-aware policies (snapkv and pyramidkv choose the rows to keep by the
// prompt's last queries, which would be the prefix's own instead of the question's).
int chat_prefix(const std::vector<ChatMessage>& chat, const GenerationRequest& r, const RequestLimits& lim) {
  if (chat.size() < 2) return 0;
  const KvPolicy p = r.cache.policy;
  if (p == KvPolicy::kSnapKV || p == KvPolicy::kPyramidKV || p == KvPolicy::kCustom) return 0;
  const std::vector<ChatMessage> head(chat.begin(), chat.end() - 1);
  const std::vector<int> ids = encode_prompt(*lim.model, render_chat(lim.chat_format, lim.model->chat_template(), head, false));
  if (ids.empty() || ids.size() >= r.prompt.size() || !std::equal(ids.begin(), ids.end(), r.prompt.begin())) return 0;
  return static_cast<int>(ids.size());
}

}  // namespace

ParsedRequest parse_request(std::string_view text_in, RequestKind kind, const RequestLimits& lim) {
  // JSON text is UTF-8 (RFC 8259); naming the first bad byte here beats the parser's message,
  // which would echo the byte itself
  if (const size_t bad = first_invalid_utf8(text_in); bad < text_in.size()) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", static_cast<unsigned char>(text_in[bad]));
    throw HttpError(400, "request body is not valid UTF-8: byte " + std::string(hex) + " at offset " + std::to_string(bad) +
                             " does not start a UTF-8 character");
  }
  json body;
  try {
    body = json::parse(text_in);
  } catch (const json::exception& e) {  // syntax, and numbers too large for a double (found by fuzz_request)
    throw HttpError(400, std::string("request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw HttpError(400, "request body: expected a JSON object");
  // every field read through one checked reader (core/json_fields.h): a 400 naming the field
  const JsonFields f(body, "", [](const std::string& key, const std::string& message) {
    throw HttpError(400, message, "invalid_request_error", key);
  });
  ParsedRequest out;
  out.kind = kind;
  f.text("model", "");
  std::string text;
  std::vector<ChatMessage> chat;
  if (kind == RequestKind::kChat) {
    const json* msgs = f.get("messages", [](const json& v) { return v.is_array(); }, "an array of messages");
    if (msgs == nullptr || msgs->empty()) throw HttpError(400, "messages: expected a non-empty array of messages", "invalid_request_error", "messages");
    for (size_t i = 0; i < msgs->size(); ++i) {
      const json& m = (*msgs)[i];
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
        throw HttpError(400, where + ": expected an object with a string \"role\"", "invalid_request_error", "messages");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer")
        throw HttpError(400, where + ".role: expected system, developer, user or assistant, got '" + role + "'", "invalid_request_error", "messages");
      std::string content;
      const json c = m.value("content", json(nullptr));
      if (c.is_string()) {
        content = c.get<std::string>();
      } else if (c.is_array()) {  // content parts: text only
        for (const json& part : c) {
          if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
            throw HttpError(400, where + ".content: only text parts ({\"type\": \"text\", \"text\": ...}) are supported", "invalid_request_error", "messages");
          content += part["text"].get<std::string>();
        }
      } else {
        throw HttpError(400, where + ".content: expected a string or an array of text parts", "invalid_request_error", "messages");
      }
      chat.push_back({role == "developer" ? "system" : role, content});
    }
    text = render_chat(lim.chat_format, lim.model->chat_template(), chat);
  } else {
    const json* p = f.get("prompt", [](const json& v) { return v.is_string() || (v.is_array() && v.size() == 1 && v[0].is_string()); },
                          "a string (or an array of one string)");
    if (p == nullptr) throw HttpError(400, "prompt: required", "invalid_request_error", "prompt");
    text = p->is_string() ? p->get<std::string>() : (*p)[0].get<std::string>();
  }
  GenerationRequest& r = out.request;
  r.prompt = encode_prompt(*lim.model, text);
  if (r.prompt.empty()) {
    if (lim.model->tokenizer().bos() < 0) throw HttpError(400, "prompt: empty, and the model has no BOS token to start from", "invalid_request_error", "prompt");
    r.prompt.push_back(lim.model->tokenizer().bos());
  }
  if (static_cast<int>(r.prompt.size()) > lim.max_prompt)
    throw HttpError(400, "prompt: " + std::to_string(r.prompt.size()) + " tokens exceed the limit of " + std::to_string(lim.max_prompt) +
                             " (--max-prompt-tokens)", "invalid_request_error", kind == RequestKind::kChat ? "messages" : "prompt");
  // sampling: the API's defaults (temperature 1, top_p 1, no top-k or min-p) unless given
  SamplerConfig& s = r.options.sampler;
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.top_k = 0;
  s.min_p = 0.0f;
  s.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  // numbers are compared before any cast (1e300 does not fit a float)
  s.temperature = static_cast<float>(f.number("temperature", s.temperature, 0.0, 2.0));
  if (const json* v = f.get("top_p", [](const json& x) { return x.is_number() && x.get<double>() > 0.0 && x.get<double>() <= 1.0; },
                            "a number in (0, 1]"))
    s.top_p = static_cast<float>(v->get<double>());
  s.top_k = static_cast<int>(std::min<int64_t>(f.int64("top_k", 0, 0), 1 << 30));
  if (const json* v = f.get("min_p", [](const json& x) { return x.is_number() && x.get<double>() >= 0.0 && x.get<double>() < 1.0; },
                            "a number in [0, 1)"))
    s.min_p = static_cast<float>(v->get<double>());
  if (f.has("seed")) s.seed = static_cast<uint64_t>(f.int64("seed", 0));
  if (const int64_t n = f.int64("n", 1); n != 1) f.fail_with("n", "n: only 1 choice per request is supported, got " + std::to_string(n));
  r.options.max_tokens = lim.ctx - static_cast<int>(r.prompt.size());  // up to the context when not given
  for (const char* name : {"max_tokens", "max_completion_tokens"})
    r.options.max_tokens = static_cast<int>(std::min<int64_t>(f.int64(name, r.options.max_tokens, 0), 1 << 30));
  if (const json* v = f.get("stop", [](const json& x) { return x.is_string() || x.is_array(); }, "a string or an array of strings")) {
    const json list = v->is_string() ? json::array({*v}) : *v;
    if (list.size() > 4) throw HttpError(400, "stop: at most 4 stop strings, got " + std::to_string(list.size()), "invalid_request_error", "stop");
    for (const json& x : list) {
      if (!x.is_string() || x.get<std::string>().empty()) f.fail("stop", "non-empty strings");
      r.options.stop.push_back(x.get<std::string>());
    }
  }
  out.stream = f.boolean("stream", false);
  if (f.has("stream_options")) out.include_usage = f.at("stream_options", "stream_options.").boolean("include_usage", false);
  // the KV extension: {"kv": {"policy": "squeeze", "budget": 256, ...}} over the server's defaults
  r.cache = lim.kv_defaults;
  std::optional<int64_t> cache_prefix;
  if (const json* v = f.get("kv", [](const json& x) { return x.is_object(); }, "an object of KV settings")) {
    try {
      tools::kv_from_json(*v, r.cache, "kv", {"cache_prefix"});
    } catch (const Error& e) {
      throw HttpError(400, e.what(), "invalid_request_error", "kv");
    }
    const JsonFields kv(*v, "kv.", [](const std::string&, const std::string& message) { throw HttpError(400, message, "invalid_request_error", "kv"); });
    if (kv.has("cache_prefix")) {
      cache_prefix = kv.int64("cache_prefix", 0, 0);
      if (*cache_prefix >= static_cast<int64_t>(r.prompt.size()))
        throw HttpError(400, "kv.cache_prefix: " + std::to_string(*cache_prefix) + " tokens; the prompt has " + std::to_string(r.prompt.size()) +
                                 " (expected 0, none, to " + std::to_string(r.prompt.size() - 1) + ")",
                        "invalid_request_error", "kv");
    }
    if (r.cache.max_tokens == 0) r.cache.max_tokens = lim.ctx;
    if (r.cache.budget > lim.ctx)
      throw HttpError(400, "kv.budget: " + std::to_string(r.cache.budget) + " exceeds the context of " + std::to_string(lim.ctx) + " tokens (--ctx)",
                      "invalid_request_error", "kv");
  }
  if (cache_prefix) r.cache_prefix = static_cast<int>(*cache_prefix);
  else if (lim.prompt_cache && kind == RequestKind::kChat) r.cache_prefix = chat_prefix(chat, r, lim);
  validate(r.options.sampler);
  return out;
}

}  // namespace squeezekv::server
