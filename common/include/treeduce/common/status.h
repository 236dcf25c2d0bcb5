/// @file
/// The one error type of treeduce: a code and a sentence a person understands.
///
/// Every component reports failures as a Status (or a Result<T>, a value or the Status that
/// explains its absence). It is formatted only at the edges: the CLIs and daemons print
/// to_string() or message(), the gRPC edge casts the code to grpc::StatusCode, libtreeduce's C API
/// maps it to tdr_result_t and keeps the sentence for tdr_last_error(). The per-packet path does
/// not use it: a frame that is not used is counted under a protocol::Reason.
///
/// Modelled on absl::Status (whose codes match gRPC's one for one), so the gRPC edge translates
/// with a cast and nothing below the edge depends on gRPC.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace treeduce {

/// Same numbering as grpc::StatusCode and absl::StatusCode: the edge casts.
enum class Code : int {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  already_exists = 6,
  permission_denied = 7,
  resource_exhausted = 8,
  failed_precondition = 9,
  aborted = 10,
  out_of_range = 11,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
  data_loss = 15,
  unauthenticated = 16,  ///< the call carries no credential (gRPC's UNAUTHENTICATED)
};

/// Lower-case name of a code ("resource_exhausted").
std::string_view code_name(Code c) noexcept;

/// A code plus a message. The message is a whole sentence: it reaches people unchanged.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const noexcept { return code_ == Code::ok; }
  Code code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  /// "resource_exhausted: leaf3 has 23 of 23 trees in use."
  std::string to_string() const;

 private:
  Code code_ = Code::ok;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {Code::invalid_argument, std::move(m)}; }
inline Status not_found(std::string m) { return {Code::not_found, std::move(m)}; }
inline Status already_exists(std::string m) { return {Code::already_exists, std::move(m)}; }
inline Status resource_exhausted(std::string m) { return {Code::resource_exhausted, std::move(m)}; }
inline Status failed_precondition(std::string m) {
  return {Code::failed_precondition, std::move(m)};
}
inline Status unavailable(std::string m) { return {Code::unavailable, std::move(m)}; }
inline Status internal_error(std::string m) { return {Code::internal, std::move(m)}; }
inline Status deadline_exceeded(std::string m) { return {Code::deadline_exceeded, std::move(m)}; }
inline Status permission_denied(std::string m) { return {Code::permission_denied, std::move(m)}; }
inline Status unauthenticated(std::string m) { return {Code::unauthenticated, std::move(m)}; }
inline Status unimplemented(std::string m) { return {Code::unimplemented, std::move(m)}; }

/// A value or the Status that explains its absence (absl::StatusOr-like).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit like absl::StatusOr
  Result(Status s) : v_(std::move(s)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const noexcept { return v_.index() == 0; }
  /// Ok() when a value is held.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace treeduce
