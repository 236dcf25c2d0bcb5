// The host library's client of the Aggregation Manager's JobService (control/api/manager.proto):
// Join (blocking until every rank is in), heartbeats on a thread at the lease the manager gives,
// Leave. The only gRPC in the host library.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "treeduce/host/communicator.h"

namespace treeduce::host {

struct JoinRequest {
  std::string job;
  std::uint32_t rank = 0, world_size = 1;
  std::string host;  ///< topology host name or data IPv4
  std::uint16_t port = 0;
  std::uint32_t slots = 16, payload_bytes = 1024;
  /// Pairs the job needs in the network (manager.proto JoinRequest); 0, 0 = none required.
  std::uint32_t dtype_mask = 0, op_mask = 0;
  bool deterministic = false;
  std::uint32_t wait_ms = 30000;
};

/// What Join said: a tree (ok), or why not (refused: the manager has no tree for the job, the
/// rank falls back; unavailable: no manager; invalid_argument: the request was wrong).
struct JoinOutcome {
  Result result = Result::internal;
  TreeAssignment tree;  ///< when ok
  std::string reason;   ///< when not ok: the manager's sentence (or the transport's)
};

class ManagerClient {
 public:
  /// Does not connect yet. `address` is "host:port". With `ca`, `cert` and `key` (PEM files)
  /// the channel is mutual TLS, checking the manager's certificate against `server_name` when
  /// given (else the host of `address`); without them, no TLS (the caller checked that this was
  /// asked for). A file that cannot be read makes every call fail with its sentence.
  static std::unique_ptr<ManagerClient> make(const std::string& address, const std::string& ca = {},
                                             const std::string& cert = {},
                                             const std::string& key = {},
                                             const std::string& server_name = {});
  virtual ~ManagerClient() = default;  ///< stops heartbeats (does not Leave)
  /// Blocks up to req.wait_ms (+ a margin). Starts heartbeats when it returns ok.
  virtual JoinOutcome join(const JoinRequest& req) = 0;
  /// The job's state from the last heartbeat: false once the manager said FAILED or REFUSED (a
  /// switch of the tree died), with the reason; the communicator then falls back.
  virtual bool tree_usable(std::string* reason) const = 0;
  virtual void leave() = 0;
  /// This rank cannot start (JobService.Abort): the manager fails `job` for every rank with
  /// `why`, a sentence naming the variable. `rank` unknown when its own variable is the bad one.
  /// "" when the manager took it, else why not (a phrase). Bounded by a 2 s deadline.
  virtual std::string abort(const std::string& job, std::optional<std::uint32_t> rank,
                            const std::string& why) = 0;

  /// Heartbeats since the last join: sent, and answered by the manager (any state). Progress a
  /// caller can wait on instead of sleeping: a heartbeat counted as answered renewed the lease.
  struct HeartbeatCounts {
    std::uint64_t sent = 0, answered = 0;
  };
  virtual HeartbeatCounts heartbeats() const = 0;
};

}  // namespace treeduce::host
