// The path policy: which path a communicator, or one operation, takes, and why. One function,
// so that "network only: an error; otherwise fall back to host-side reduction, loudly" is
// written once (docs/host.md, "Paths and fallback").
#pragma once

#include <optional>
#include <string>

#include "errors.h"

namespace treeduce::host {

/// Why the network path cannot take the communicator, or one operation: a code and a phrase
/// (lower case, no full stop) that becomes the fallback's reason or, as a sentence, the error.
struct Obstacle {
  Code code = Code::unavailable;
  std::string why;
  /// An error on every path (a wrong request, the communicator going away, a stream abandoned
  /// midway): no fallback can help.
  bool fatal = false;
  /// Only this operation (the tree cannot reduce its type and operation): others stay in the
  /// network.
  bool this_call_only = false;
  /// The error sentence adds ", and the path is network." (the obstacle is not an error in
  /// itself, only because no fallback was allowed).
  bool say_path = false;
};

enum class Verdict {
  network,         ///< in the network
  host,            ///< host-side reduction was asked for
  fall_back,       ///< host-side reduction from now on, with a warning
  fall_back_once,  ///< this operation on the hosts, with a warning; the next ones in the network
  fail,            ///< an error, no fallback
};

struct PathDecision {
  Verdict verdict = Verdict::network;
  std::string reason;      ///< why, when not network (path_reason(), the warning, Stats)
  treeduce::Status error;  ///< when fail: the sentence for create() or last_error()
};

/// The path for `asked` when `obstacle` (none: nothing stands in the network path's way).
PathDecision decide_path(Path asked, const std::optional<Obstacle>& obstacle);

}  // namespace treeduce::host
