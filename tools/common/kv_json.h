// KV settings from a JSON object (the server's per-request "kv" object, an eval sweep policy),
// read through the one table of KV options (kv_options()). Errors name the JSON field
// ("kv.budget: ..."), not the CLI flag.
#pragma once
#include <nlohmann/json.hpp>

#include <string>

#include "core/json_fields.h"
#include "squeezekv/error.h"
#include "squeezekv/kv_cache.h"

namespace squeezekv::tools {

// A message from the KV code with every CLI flag of the table replaced by where.key.
inline std::string kv_message_in(const std::string& where, std::string msg) {
  for (const KvOption& o : kv_options()) {
    const std::string flag = o.flag, field = where + "." + o.key;
    for (size_t at = msg.find(flag); at != std::string::npos; at = msg.find(flag, at + field.size())) {
      const char after = at + flag.size() < msg.size() ? msg[at + flag.size()] : ' ';
      if (after == '-' || after == '_' || std::isalnum(static_cast<unsigned char>(after))) continue;  // a longer flag
      msg.replace(at, flag.size(), field);
    }
  }
  return msg;
}

// Sets c from obj's keys (a table key or flag name each; `skip` keys are left to the caller),
// then validates the whole config unless the caller completes it later. Throws Error naming
// where.key.
inline void kv_from_json(const nlohmann::json& obj, CacheConfig& c, const std::string& where,
                         std::initializer_list<const char*> skip = {}, bool validate_config = true) {
  if (!obj.is_object()) throw Error(where + ": expected an object of KV settings");
  for (const auto& [key, value] : obj.items()) {
    bool skipped = false;
    for (const char* s : skip) skipped = skipped || key == s;
    if (skipped) continue;
    const KvOption* o = find_kv_option(key);
    if (o == nullptr) {
      std::string known;
      for (const KvOption& k : kv_options()) known += (known.empty() ? "" : ", ") + std::string(k.key);
      for (const char* k : skip) known += std::string(", ") + k;
      throw Error(where + ": unknown setting '" + key + "' (expected one of: " + known + ")");
    }
    const std::string field = where + "." + o->key;
    const JsonFields check(value, "", [](const std::string&, const std::string& m) { throw Error(m); });
    std::string text;
    switch (o->kind) {
      case KvOption::Kind::kInt: text = std::to_string(check.int64_of(value, field)); break;
      case KvOption::Kind::kReal:
        check.number_of(value, field);
        text = value.dump();
        break;
      case KvOption::Kind::kName:
        if (!value.is_string()) check.fail_with(field, field + ": expected a string, got " + JsonFields::quote(value));
        text = value.get<std::string>();
        break;
    }
    try {
      o->set(c, text);
    } catch (const Error& e) {
      throw Error(kv_message_in(where, e.what()));
    }
  }
  if (!validate_config) return;
  try {
    validate(c);
  } catch (const Error& e) {
    throw Error(kv_message_in(where, e.what()));
  }
}

}  // namespace squeezekv::tools
