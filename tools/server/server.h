// `squeezekv serve`: an OpenAI-compatible HTTP server (cpp-httplib) on the library's Engine and
// Scheduler (include/squeezekv/engine.h). HTTP threads parse and validate requests and stream
// answers; one engine thread owns the Scheduler and runs every step, so all sequences share one
// batch per decode step.
#pragma once
#include <cstdint>
#include <string>

#include "squeezekv/model.h"
#include "squeezekv/session.h"

namespace squeezekv::server {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;              // 0: any free port (the line "listening on http://HOST:PORT" names it)
  int parallel = 4;             // sequences decoded together
  int queue = 64;               // requests waiting for a slot; beyond it, 503 with Retry-After
  int max_prompt_tokens = 0;    // 0: the context less one
  int64_t prompt_cache_bytes = 0;  // --prompt-cache: compressed prompt prefixes kept for reuse (0: none)
  std::string api_key;          // empty: no authentication
  std::string model_name;       // the id /v1/models reports
  SessionOptions session;       // device, threads, chunk, arithmetic; session.cache: the KV defaults
};

// Validates the options (Error naming the flag), listens, and serves until SIGINT or SIGTERM.
// Returns the process exit code.
int serve(const Model& model, const ServeOptions& options);

}  // namespace squeezekv::server
