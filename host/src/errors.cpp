// The edge between the host library's errors (treeduce::Status) and its API's Result values.
#include "errors.h"

namespace treeduce::host {

const char* to_string(Result r) noexcept {
  switch (r) {
    case Result::ok:
      return "ok";
    case Result::in_progress:
      return "in_progress";
    case Result::invalid_argument:
      return "invalid_argument";
    case Result::unavailable:
      return "unavailable";
    case Result::timeout:
      return "timeout";
    case Result::refused:
      return "refused";
    case Result::failed:
      return "failed";
    case Result::internal:
      return "internal";
  }
  return "unknown";
}

Result to_result(const treeduce::Status& s) noexcept {
  switch (s.code()) {
    case Code::ok:
      return Result::ok;
    case Code::invalid_argument:
    case Code::out_of_range:
    case Code::not_found:
      return Result::invalid_argument;
    case Code::unavailable:
    case Code::unimplemented:
      return Result::unavailable;
    case Code::deadline_exceeded:
      return Result::timeout;
    case Code::failed_precondition:
    case Code::permission_denied:
    case Code::unauthenticated:
    case Code::resource_exhausted:
    case Code::already_exists:
      return Result::refused;
    case Code::aborted:
    case Code::cancelled:
      return Result::failed;
    case Code::internal:
    case Code::unknown:
    case Code::data_loss:
      return Result::internal;
  }
  return Result::internal;
}

Code to_code(Result r) noexcept {
  switch (r) {
    case Result::ok:
    case Result::in_progress:
      return Code::ok;
    case Result::invalid_argument:
      return Code::invalid_argument;
    case Result::unavailable:
      return Code::unavailable;
    case Result::timeout:
      return Code::deadline_exceeded;
    case Result::refused:
      return Code::failed_precondition;
    case Result::failed:
      return Code::aborted;
    case Result::internal:
      return Code::internal;
  }
  return Code::internal;
}

std::string as_phrase(std::string s) {
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s.size() > 1 && s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'a' && s[1] <= 'z') {
    s[0] = static_cast<char>(s[0] - 'A' + 'a');
  }
  return s;
}

std::string capitalise(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
  return s;
}

}  // namespace treeduce::host
