// Errors a user can cause (files, arguments, requests). Messages start with the operation's name
// and say which input was wrong and what was expected.
#pragma once
#include <stdexcept>
#include <string>

namespace squeezekv {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a run would hold is above --max-memory. `alone`: the part that was asked for does not fit
// even with nothing else held (a sequence that waits for others to finish would fit when false).
class MemoryLimitError : public Error {
 public:
  MemoryLimitError(const std::string& what, bool alone) : Error(what), alone_(alone) {}
  bool alone() const { return alone_; }

 private:
  bool alone_;
};

// A file that cannot be read or does not follow its format.
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace squeezekv
