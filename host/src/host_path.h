// The host path: host-side reduction (host_reducer.h, Gloo) as the communicator runs it, with
// the check that every rank is at the same operation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "errors.h"
#include "host_reducer.h"
#include "request_queue.h"

namespace treeduce::host {

class HostPath {
 public:
  explicit HostPath(const Options& opt) : opt_(opt) {}

  /// Connects the ranks on first use (every rank reaches this for the same operation, since
  /// their path decisions agree). A failed rendezvous is not retried: it would block every later
  /// operation for its timeout.
  treeduce::Status connect();

  /// Reduces `o` (from `send`, o.send or a kept copy of it) on the hosts; `op_index` is the
  /// operation's position in the stream, the same on every rank.
  treeduce::Status run(const Operation& o, const void* send, std::uint64_t op_index);

 private:
  const Options& opt_;
  std::unique_ptr<HostReducer> reducer_;
  treeduce::Status error_;  // a failed connect(), kept
};

}  // namespace treeduce::host
