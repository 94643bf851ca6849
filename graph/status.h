// Status and Expected<T>: errors in graph/, importer/ and planner/ are values.
// A message names the thing at fault (file, node, op, opset or value); tools print it as
// one line `error: <message>` and exit with code 2.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace oases {

class Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) {
    Status s;
    s.message_ = std::move(message);
    s.failed_ = true;
    return s;
  }
  bool is_ok() const { return !failed_; }
  explicit operator bool() const { return !failed_; }
  const std::string& message() const { return message_; }
  // Prefix the message with context, e.g. the file name: "model.onnx: <message>".
  Status with_context(const std::string& context) const {
    if (!failed_) return *this;
    return error(context + ": " + message_);
  }

 private:
  std::string message_;
  bool failed_ = false;
};

template <class... Args>
Status error(fmt::format_string<Args...> f, Args&&... args) {
  return Status::error(fmt::format(f, std::forward<Args>(args)...));
}

template <class T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}        // NOLINT: implicit on purpose
  Expected(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).is_ok()) throw std::logic_error("Expected constructed from an OK status");
  }
  bool is_ok() const { return v_.index() == 0; }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    if (!is_ok()) throw std::runtime_error(std::get<Status>(v_).message());
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!is_ok()) throw std::runtime_error(std::get<Status>(v_).message());
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!is_ok()) throw std::runtime_error(std::get<Status>(v_).message());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

// Raised where an error cannot be returned as a value (kernels, device faults, lazily loaded
// tensors). Tools catch it at the top and report it like a Status.
class OasesError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw OasesError(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace oases

#define OASES_CONCAT_INNER(a, b) a##b
#define OASES_CONCAT(a, b) OASES_CONCAT_INNER(a, b)

// Return the status from the enclosing function if it is an error.
#define OASES_RETURN_IF_ERROR(expr)                   \
  do {                                                \
    ::oases::Status oases_status_ = (expr);           \
    if (!oases_status_.is_ok()) return oases_status_; \
  } while (0)

#define OASES_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.is_ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

// OASES_ASSIGN_OR_RETURN(auto x, f()) declares x from an Expected or returns its error.
#define OASES_ASSIGN_OR_RETURN(lhs, expr) OASES_ASSIGN_OR_RETURN_IMPL(OASES_CONCAT(oases_expected_, __LINE__), lhs, expr)
