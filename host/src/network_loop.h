// The network loop: operations on the in-network path, one or several streamed back to back. It
// drives the protocol engine (protocol_engine.h) with a transport (transport.h) until the engine
// is done or gives up, an operation's time runs out, or the communicator goes away.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "path_policy.h"
#include "request_queue.h"
#include "transport.h"
#include "treeduce/host/protocol_engine.h"

namespace treeduce::host {

/// How long a chunk that gets no answer is retransmitted before the collective fails, in ms:
/// the first timeout `first_ns`, doubling up to `max_ns`, 1 + `retries` timeouts in all
/// (docs/host.md, "Failures"). The default 80 retries (Options::max_retries) give about 10 s of
/// silence, so that ranks and a switch descheduled for seconds on a shared machine are not taken
/// for dead (30, about 3.5 s, was not enough on 2 busy vCPUs).
constexpr std::uint64_t silence_ms(std::uint64_t first_ns, std::uint64_t max_ns,
                                   std::uint32_t retries) {
  std::uint64_t sum = 0, t = first_ns;
  for (std::uint32_t i = 0; i <= retries; ++i, t = t * 2 > max_ns ? max_ns : t * 2) sum += t;
  return sum / 1'000'000;
}
static_assert(silence_ms(2'000'000, 128'000'000, 80) == 9726);
static_assert(silence_ms(32'000'000, 128'000'000, 80) == 10208);

/// Where a stream of operations comes from and where their completions go.
class StreamSource {
 public:
  virtual ~StreamSource() = default;
  /// The next operation to queue behind those in flight, taken, or false (none now, or the next
  /// one does not go to the network). Never blocks.
  virtual bool next(Operation* o) = 0;
  /// The oldest operation queued and not yet done has its result in its recv.
  virtual void done() = 0;
};

/// Operations a stream holds in the engine at most.
inline constexpr std::size_t kMaxStream = 1024;

class NetworkLoop {
 public:
  /// `leaf_address` names the leaf in sentences; `peers` says what is known of the other ranks
  /// (a phrase: "all 4 ranks joined at the Aggregation Manager at am:7000"), for the sentence of
  /// a network that stopped answering; `stop` is read during an operation.
  NetworkLoop(std::unique_ptr<Transport> transport, const EngineConfig& engine,
              std::string leaf_address, std::string peers, std::uint32_t op_timeout_ms,
              const std::atomic<bool>& stop);

  /// Runs `o` in the network: nullopt when its result is in o.recv, else why not (a phrase and
  /// a code; the path policy decides what follows).
  std::optional<Obstacle> run(const Operation& o);
  /// Runs the source's operations through the engine back to back (pipelining): while some are
  /// in flight it queues the next ones the source gives, and calls done() for each in order.
  /// Returns when the source has nothing more and all are done (nullopt), or why the stream
  /// stopped: then the oldest operation not done and every later one taken did not complete.
  /// An operation's op_timeout_ms counts from when it becomes the oldest one not done.
  std::optional<Obstacle> run_stream(StreamSource& src);

  /// The loop cannot run another operation: one was abandoned midway (the engine cannot abandon
  /// a collective, and the ranks may disagree on how far the stream got).
  bool broken() const noexcept { return broken_; }
  void set_broken() noexcept { broken_ = broken_ || engine_.status() == Status::running; }
  std::uint64_t retransmits() const noexcept { return engine_.stats().retransmits; }
  /// Makes a receive() blocked in run() return (any thread).
  void wake() noexcept { transport_->wake(); }

 private:
  static constexpr std::size_t kMaxBatch = 64;

  /// Why a chunk got no result, and what to check (docs/host.md, "Logging").
  std::string no_answer() const;

  std::unique_ptr<Transport> transport_;
  ProtocolEngine engine_;
  const std::string leaf_address_;
  const std::string peers_;
  const std::uint32_t op_timeout_ms_;
  const std::atomic<bool>& stop_;
  bool broken_ = false;
  std::array<OutPacket, kMaxBatch> out_{};
};

}  // namespace treeduce::host
