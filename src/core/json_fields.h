// Checked reads of JSON that strangers wrote: a model's config.json, an HTTP request body, an eval
// sweep config. Every value is read as the type asked for and within its range, or the read fails
// with a message that names where the value sits and what was expected ("load: d/config.json:
// hidden_size: expected an integer in [1, 2147483647], got 1e40"); never a conversion out of range
// (nlohmann's own get<int>() of a float beyond int is undefined: found by fuzz_hf).
// The exception is the caller's: a file loader throws FormatError, the server HttpError (400, with
// the field as its param), the sweep planner Error. One reader, parameterised by how it fails.
// Thread safety: a reader is a view over one JSON value; it holds no state of its own.
#pragma once
#include <nlohmann/json.hpp>

#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "squeezekv/error.h"

namespace squeezekv {

class JsonFields {
 public:
  using json = nlohmann::json;
  // Throws for a bad field: key (the field's name, or "" for the value itself) and the whole message.
  using Fail = std::function<void(const std::string& key, const std::string& message)>;

  // obj: usually an object (fields by key); where: the message's prefix ("load: F: ", "").
  JsonFields(const json& obj, std::string where, Fail fail) : j_(obj), where_(std::move(where)), fail_(std::move(fail)) {}

  // The value as the message quotes it: JSON text, bytes that are not UTF-8 replaced (a request
  // may carry them) and cut at 80 characters.
  static std::string quote(const json& v) {
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
  }
  // Fails for key with "<where><key>: expected <what>, got <value>".
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const json* v = lookup(key);
    fail_with(key, where_ + (key.empty() ? "" : key + ": ") + "expected " + what + ", got " + (v != nullptr ? quote(*v) : "nothing"));
  }
  [[noreturn]] void fail_with(const std::string& key, const std::string& message) const {
    fail_(key, message);
    throw Error(message);  // a Fail that returned
  }

  const json& value() const { return j_; }
  // The field, present and not null; null otherwise.
  const json* get(const std::string& key) const {
    const json* v = lookup(key);
    return v != nullptr && !v->is_null() ? v : nullptr;
  }
  bool has(const std::string& key) const { return get(key) != nullptr; }
  // The field where ok(value) holds (else a failure naming `what`); null when absent.
  template <class Ok>
  const json* get(const std::string& key, Ok ok, const std::string& what) const {
    const json* v = get(key);
    if (v != nullptr && !ok(*v)) fail(key, what);
    return v;
  }
  // The field, an object, as a reader of its own (where: its messages' prefix).
  JsonFields at(const std::string& key, const std::string& where) const {
    const json* v = get(key, [](const json& x) { return x.is_object(); }, "an object");
    if (v == nullptr) fail(key, "an object");
    return JsonFields(*v, where, fail_);
  }

  // Integers: JSON integers, or floats with an integral value (Python writes 4096.0), in [lo, hi].
  int64_t int64(const std::string& key, int64_t def, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    const json* v = get(key);
    return v == nullptr ? def : int64_of(*v, key, lo, hi);
  }
  int integer(const std::string& key, int def, int lo = INT_MIN, int hi = INT_MAX) const {
    return static_cast<int>(int64(key, def, lo, hi));
  }
  int required_integer(const std::string& key, int lo = INT_MIN, int hi = INT_MAX) const {
    if (!has(key)) fail(key, "an integer");
    return integer(key, 0, lo, hi);
  }
  // A finite number in [lo, hi].
  double number(const std::string& key, double def, double lo = -DBL_MAX, double hi = DBL_MAX) const {
    const json* v = get(key);
    return v == nullptr ? def : number_of(*v, key, lo, hi);
  }
  // A number that fits a float.
  float real(const std::string& key, float def) const { return static_cast<float>(number(key, def, -FLT_MAX, FLT_MAX)); }
  float required_real(const std::string& key) const {
    if (!has(key)) fail(key, "a number");
    return real(key, 0.0f);
  }
  bool boolean(const std::string& key, bool def) const {
    const json* v = get(key, [](const json& x) { return x.is_boolean(); }, "true or false");
    return v == nullptr ? def : v->get<bool>();
  }
  std::string text(const std::string& key, const std::string& def) const {
    const json* v = get(key, [](const json& x) { return x.is_string(); }, "a string");
    return v == nullptr ? def : v->get<std::string>();
  }
  std::string required_text(const std::string& key) const {
    if (!has(key)) fail(key, "a string");
    return text(key, "");
  }
  // A non-empty array of numbers in [lo, hi]; empty when absent and not required.
  std::vector<double> numbers(const std::string& key, double lo, double hi, bool required) const {
    const json* v = get(key);
    if (v == nullptr && !required) return {};
    const std::string what = "a non-empty list of numbers in [" + fmt(lo) + ", " + fmt(hi) + "]";
    if (v == nullptr || !v->is_array() || v->empty()) fail(key, what);
    std::vector<double> out;
    for (const json& e : *v) {
      if (!e.is_number() || !(e.get<double>() >= lo && e.get<double>() <= hi)) fail(key, what);
      out.push_back(e.get<double>());
    }
    return out;
  }
  // A non-empty array of integers in [lo, hi].
  std::vector<int> integers(const std::string& key, int lo, int hi) const {
    const json* v = get(key);
    const std::string what = "a non-empty list of integers in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    if (v == nullptr || !v->is_array() || v->empty()) fail(key, what);
    std::vector<int> out;
    for (const json& e : *v) {
      if (!integral(e, lo, hi)) fail(key, what);
      out.push_back(static_cast<int>(as_int64(e)));
    }
    return out;
  }

  // One value (an array's element, the reader's own value): what says what it is in the message.
  int64_t int64_of(const json& v, const std::string& what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) const {
    if (!integral(v, lo, hi)) {
      const std::string range = lo == INT64_MIN && hi == INT64_MAX ? "an integer"
                                : hi == INT64_MAX                  ? "an integer >= " + std::to_string(lo)
                                                                   : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
      fail_with(what, where_ + (what.empty() ? "" : what + ": ") + "expected " + range + ", got " + quote(v));
    }
    return as_int64(v);
  }
  double number_of(const json& v, const std::string& what, double lo = -DBL_MAX, double hi = DBL_MAX) const {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() >= lo && v.get<double>() <= hi)) {
      const std::string range = lo == -DBL_MAX && hi == DBL_MAX ? "a finite number" : "a number in [" + fmt(lo) + ", " + fmt(hi) + "]";
      fail_with(what, where_ + (what.empty() ? "" : what + ": ") + "expected " + range + ", got " + quote(v));
    }
    return v.get<double>();
  }

 private:
  const json* lookup(const std::string& key) const {
    if (key.empty()) return &j_;
    if (!j_.is_object()) return nullptr;
    const auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  // An integral JSON number within [lo, hi]: integers of either sign (unsigned beyond int64
  // included), or floats whose value is a whole number of at most 2^53.
  static bool integral(const json& v, int64_t lo, int64_t hi) {
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      return hi >= 0 && u <= static_cast<uint64_t>(hi) && (lo <= 0 || u >= static_cast<uint64_t>(lo));
    }
    if (v.is_number_integer()) return v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
    if (v.is_number_float()) {
      const double d = v.get<double>();
      return std::isfinite(d) && d == std::floor(d) && std::fabs(d) <= 9.0e15 && d >= static_cast<double>(lo) &&
             d <= static_cast<double>(hi);
    }
    return false;
  }
  static int64_t as_int64(const json& v) {
    return v.is_number_float() ? static_cast<int64_t>(v.get<double>()) : v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                                                                                 : v.get<int64_t>();
  }
  static std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%g", x);
    return b;
  }

  const json& j_;
  std::string where_;
  Fail fail_;
};

}  // namespace squeezekv
