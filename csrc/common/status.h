// A success-or-error value passed between engine parts instead of exceptions
// across thread and C API boundaries.
#pragma once

#include <string>
#include <utility>

#include "common/common.h"

namespace hvdlite {

class Status {
 public:
  Status() = default;
  static Status OK() { return Status(); }
  static Status Error(ErrorKind kind, std::string message) {
    Status s;
    s.kind_ = kind;
    s.message_ = std::move(message);
    return s;
  }
  static Status InvalidArgument(std::string message) {
    return Error(ErrorKind::kInvalidArgument, std::move(message));
  }
  bool ok() const { return kind_ == ErrorKind::kNone; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_ = ErrorKind::kNone;
  std::string message_;
};

}  // namespace hvdlite
