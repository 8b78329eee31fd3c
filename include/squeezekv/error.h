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

// A file that cannot be read or does not follow its format.
class FormatError : public Error {
 public:
  using Error::Error;
};

}  // namespace squeezekv
