#include "treeduce/common/status.h"

namespace treeduce {

std::string_view code_name(Code c) noexcept {
  switch (c) {
    case Code::ok:
      return "ok";
    case Code::cancelled:
      return "cancelled";
    case Code::unknown:
      return "unknown";
    case Code::invalid_argument:
      return "invalid_argument";
    case Code::deadline_exceeded:
      return "deadline_exceeded";
    case Code::not_found:
      return "not_found";
    case Code::already_exists:
      return "already_exists";
    case Code::permission_denied:
      return "permission_denied";
    case Code::resource_exhausted:
      return "resource_exhausted";
    case Code::failed_precondition:
      return "failed_precondition";
    case Code::aborted:
      return "aborted";
    case Code::out_of_range:
      return "out_of_range";
    case Code::unimplemented:
      return "unimplemented";
    case Code::internal:
      return "internal";
    case Code::unavailable:
      return "unavailable";
    case Code::data_loss:
      return "data_loss";
    case Code::unauthenticated:
      return "unauthenticated";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(code_name(code_)) + ": " + message_;
}

}  // namespace treeduce
