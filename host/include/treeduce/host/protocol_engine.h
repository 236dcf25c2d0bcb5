/// @file
/// The host side of the treeduce protocol, free of I/O: window, slot reuse, retransmission timers
/// with exponential backoff, and result checking. The host library's transports and the simulated
/// fabric in tests/sim both drive it: they feed it received packets and the time, and send what
/// poll() returns. docs/protocol.md, "Host behaviour", is the specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/protocol/reasons.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {

/// What the Aggregation Manager tells a rank about its tree.
struct EngineConfig {
  std::uint16_t tree_id = 0;
  std::uint64_t key = 0;
  std::uint16_t child_index = 0;             ///< this host's child index at its leaf switch
  std::uint16_t world = 1;                   ///< hosts in the tree: every RESULT must say so
  std::uint32_t slots = 8;                   ///< window: power of two, as installed on the switches
  std::uint32_t payload_bytes = 1024;        ///< per packet, as installed on the switches
  std::uint64_t rto_initial_ns = 1'000'000;  ///< first retransmission timeout
  std::uint64_t rto_max_ns = 64'000'000;     ///< backoff doubles up to this
  std::uint32_t max_retries = 30;            ///< per chunk; then the collective fails
};

/// State of the current collective.
enum class Status : std::uint8_t {
  idle = 0,        ///< nothing started, or the last collective completed
  running = 1,     ///< in progress
  done = 2,        ///< completed; every chunk's result checked and written
  timeout = 3,     ///< a chunk ran out of retries
  refused = 4,     ///< a switch sent a NACK; nack_reason() says why
  bad_result = 5,  ///< a RESULT failed its checks (wrong count of contributions, length, ...)
  invalid = 6,     ///< start() arguments wrong (the engine state is unchanged)
};

/// A packet to send: header (network order) plus a payload pointing into the caller's send
/// buffer. Valid until the next start().
struct OutPacket {
  proto::TdHdr td;
  const std::uint8_t* payload;
  std::uint32_t payload_len;
};

struct EngineStats {
  std::uint64_t sent = 0;  ///< first transmissions
  std::uint64_t retransmits = 0;
  std::uint64_t results = 0;     ///< results accepted
  std::uint64_t duplicates = 0;  ///< results for chunks already done (harmless)
  std::uint64_t ignored = 0;     ///< packets for another tree, key, collective or chunk
};

class ProtocolEngine {
 public:
  explicit ProtocolEngine(const EngineConfig& cfg);

  /// Start an allreduce of `count` elements of `dtype` from `send` into `recv` (both caller-owned
  /// until the collective ends; they may be the same buffer). Allowed when no collective is
  /// running. Every host of the tree must start the same sequence of collectives with the same
  /// counts. Returns running, or invalid (count 0, a collective running, bad dtype/op).
  Status start(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);

  /// Packets due at time `now` (ns, any epoch, monotonic): new chunks the window allows and
  /// retransmissions whose timer expired. Writes at most `cap` to `out`; returns how many.
  std::size_t poll(std::uint64_t now, OutPacket* out, std::size_t cap);

  /// A received treeduce packet (header as on the wire, payload after it).
  void on_packet(const proto::TdHdr& td, const std::uint8_t* payload, std::size_t len);

  /// Earliest time poll() has something to do; UINT64_MAX when nothing is pending.
  std::uint64_t next_deadline() const noexcept;

  Status status() const noexcept { return status_; }
  /// The reason of the NACK that failed the collective (DropReason::none otherwise).
  proto::Reason nack_reason() const noexcept { return nack_reason_; }
  const EngineStats& stats() const noexcept { return stats_; }
  const EngineConfig& config() const noexcept { return cfg_; }
  /// Collective sequence number of the current (or last) collective.
  std::uint32_t seq() const noexcept { return seq_; }
  /// Stream position of the next chunk: continuous across collectives (slots reuse).
  std::uint32_t next_chunk() const noexcept { return base_ + static_cast<std::uint32_t>(nchunks_); }

 private:
  struct SlotState {
    bool active = false;
    std::uint32_t chunk = 0;
    std::size_t index = 0;  // chunk - base_: position in the collective
    std::uint64_t deadline = 0;
    std::uint64_t rto = 0;
    std::uint32_t retries = 0;
    bool need_send = false;  // queued for a first transmission
  };
  OutPacket make_packet(const SlotState& s) const;
  void finish(Status st);

  EngineConfig cfg_;
  std::uint32_t slot_mask_;
  std::vector<SlotState> slots_;
  Status status_ = Status::idle;
  proto::Reason nack_reason_ = proto::Reason::none;
  EngineStats stats_;
  const std::uint8_t* send_ = nullptr;
  std::uint8_t* recv_ = nullptr;
  std::size_t count_ = 0;
  DType dtype_ = DType::f32;
  ReduceOp op_ = ReduceOp::sum;
  std::size_t elems_per_chunk_ = 0;
  std::size_t nchunks_ = 0;
  std::size_t next_index_ = 0;  // next chunk of the collective not yet given a slot
  std::size_t completed_ = 0;
  std::uint32_t base_ = 0;  // stream position of the collective's chunk 0
  std::uint32_t seq_ = 0;
  bool started_once_ = false;
};

}  // namespace treeduce::host
