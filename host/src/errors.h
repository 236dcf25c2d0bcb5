// Errors inside the host library: treeduce::Status (common/include/treeduce/common/status.h), a
// code and a sentence. They become the C++ API's host::Result (and, by value, the C API's
// tdr_result_t) only at the API's edge, through to_result(); the sentence is kept for
// last_error(). Note: inside treeduce::host, plain `Status` is the protocol engine's state
// (protocol_engine.h); the error type is always written treeduce::Status here.
#pragma once

#include <string>

#include "treeduce/common/status.h"
#include "treeduce/host/communicator.h"

namespace treeduce::host {

using treeduce::Code;
/// A value or the error that explains its absence.
template <typename T>
using StatusOr = treeduce::Result<T>;

/// The one mapping from the error type to the API's Result: ok, invalid_argument, unavailable,
/// deadline_exceeded -> timeout, failed_precondition/permission_denied/resource_exhausted ->
/// refused, aborted/cancelled -> failed, anything else -> internal.
Result to_result(const treeduce::Status& s) noexcept;

/// The error type of an outcome another part reports as a Result (the manager client), and the
/// code each Result is made from (the inverse of to_result() on these codes).
Code to_code(Result r) noexcept;

/// A sentence of another layer ("Binding ... failed: ...") as a phrase to embed in ours.
std::string as_phrase(std::string s);
/// A phrase as the start of a sentence.
std::string capitalise(std::string s);

}  // namespace treeduce::host
