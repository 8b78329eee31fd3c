// Fuzz target: chat-template detection and rendering. The input is a template text, then a NUL,
// then messages as role \x01 content pairs separated by \x02. Detection must classify any text and
// rendering must give a string or an Error, never a crash; a rendering contains every message's
// content.
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "squeezekv/error.h"
#include "squeezekv/generate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string tmpl(in.substr(0, nul));
  std::vector<squeezekv::ChatMessage> messages;
  if (nul != std::string_view::npos) {
    std::string_view rest = in.substr(nul + 1);
    while (!rest.empty()) {
      const size_t end = rest.find('\x02');
      const std::string_view one = rest.substr(0, end);
      const size_t sep = one.find('\x01');
      messages.push_back({std::string(one.substr(0, sep)), sep == std::string_view::npos ? "" : std::string(one.substr(sep + 1))});
      if (end == std::string_view::npos) break;
      rest.remove_prefix(end + 1);
    }
  }
  const squeezekv::ChatFormat f = squeezekv::detect_chat_format(tmpl);
  try {
    const std::string out = squeezekv::render_chat(f, tmpl, messages);
    for (const auto& m : messages)
      if (out.find(m.content) == std::string::npos) __builtin_trap();
  } catch (const squeezekv::Error&) {
  }
  return 0;
}
