// Typed enums and their names at the edge (CLI flags, files, requests): each enum has one table
// of {name, value} rows, read both ways, so a name and its parse never drift apart. A value may
// have several names (an alias after the canonical one); enum_name gives the first.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "squeezekv/error.h"

namespace squeezekv {

template <class E>
struct EnumName {
  const char* name;
  E value;
};

// The names of a table's rows (anything with a `name`), joined by sep.
template <class Row, size_t N>
std::string names_of(const Row (&rows)[N], const char* sep = ", ") {
  std::string s;
  for (const Row& r : rows) s += (s.empty() ? "" : sep) + std::string(r.name);
  return s;
}

// The row named `name`; else Error "<flag>: unknown value '<name>' (expected one of: ...)".
template <class Row, size_t N>
const Row& find_named(std::string_view flag, std::string_view name, const Row (&rows)[N]) {
  for (const Row& r : rows)
    if (name == r.name) return r;
  throw Error(std::string(flag) + ": unknown value '" + std::string(name) + "' (expected one of: " + names_of(rows) + ")");
}

template <class E, size_t N>
E parse_enum(std::string_view flag, std::string_view name, const EnumName<E> (&rows)[N]) {
  return find_named(flag, name, rows).value;
}

// The first name of v ("?" for a value the table lacks).
template <class E, size_t N>
const char* enum_name(E v, const EnumName<E> (&rows)[N]) {
  for (const EnumName<E>& r : rows)
    if (r.value == v) return r.name;
  return "?";
}

}  // namespace squeezekv
