// The server's request parsing, apart from HTTP so that tests and the fuzz target call it: an
// OpenAI chat or completion request body -> a validated generation request, or an HttpError that
// names the field and carries the status.
// Thread safety: parse_request is reentrant (the model is only read).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "squeezekv/engine.h"
#include "squeezekv/error.h"
#include "squeezekv/generate.h"
#include "squeezekv/model.h"

namespace squeezekv::server {

// A request the client got wrong: answered with `status` in the OpenAI error shape.
struct HttpError : Error {
  int status;
  std::string type, param;
  HttpError(int s, const std::string& msg, std::string t = "invalid_request_error", std::string p = {})
      : Error(msg), status(s), type(std::move(t)), param(std::move(p)) {}
};

enum class RequestKind : uint8_t { kChat, kCompletion };

// What a request is checked against and completed with.
struct RequestLimits {
  const Model* model = nullptr;
  CacheConfig kv_defaults;  // the server's KV flags; a request's "kv" object overrides them
  int ctx = 0;              // tokens a sequence may hold (--ctx)
  int max_prompt = 0;       // --max-prompt-tokens
  ChatFormat chat_format = ChatFormat::kPlain;
  // The server keeps a prompt cache (--prompt-cache): a chat of several messages whose request
  // names no kv.cache_prefix gets one at the start of its last message (query-agnostic policies).
  bool prompt_cache = false;
};

struct ParsedRequest {
  RequestKind kind = RequestKind::kChat;
  GenerationRequest request;  // prompt ids, sampling and stop options, cache config (callbacks unset)
  bool stream = false;
  bool include_usage = false;
};

// Throws HttpError (status 400, the field named) for anything a client can get wrong.
ParsedRequest parse_request(std::string_view body, RequestKind kind, const RequestLimits& limits);

}  // namespace squeezekv::server
