// Fuzz target: the server's request parsing (tools/server/request.cc) on any body, as a chat and as
// a completion request, with the default model's tokenizer and chat template. It must end in a
// request (its cache_prefix, given or worked out from a chat's messages, within its prompt) or an
// HttpError / Error (a 400 naming the field); any other exception or a sanitizer report is a
// finding.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "server/request.h"
#include "squeezekv/model.h"

namespace {

const squeezekv::server::RequestLimits& limits() {
  static std::unique_ptr<squeezekv::Model> m = [] {
    const char* p = std::getenv("SQUEEZEKV_FUZZ_MODEL");
    return squeezekv::Model::load(p != nullptr ? p : SQUEEZEKV_DEFAULT_MODEL);
  }();
  static squeezekv::server::RequestLimits l = [] {
    squeezekv::server::RequestLimits r;
    r.model = m.get();
    r.ctx = 1024;
    r.max_prompt = 1023;
    r.chat_format = squeezekv::detect_chat_format(m->chat_template());
    r.prompt_cache = true;  // a chat's automatic cache_prefix is worked out too
    return r;
  }();
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto kind : {squeezekv::server::RequestKind::kChat, squeezekv::server::RequestKind::kCompletion}) {
    try {
      const auto r = squeezekv::server::parse_request(body, kind, limits());
      if (r.request.prompt.empty() || static_cast<int>(r.request.prompt.size()) > limits().max_prompt) __builtin_trap();
      if (r.request.cache_prefix < 0 || r.request.cache_prefix >= static_cast<int>(r.request.prompt.size())) __builtin_trap();
    } catch (const squeezekv::Error&) {  // HttpError is an Error
    }
  }
  return 0;
}
