/// @file
/// The host side of the treeduce protocol, free of I/O: window, slot reuse, retransmission timers
/// with exponential backoff, and result checking. The host library's transports and the simulated
/// fabric in tests/sim both drive it: they feed it received packets and the time, and send what
/// poll() returns. docs/protocol.md, "Host behaviour", is the specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/host/rto_estimator.h"
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
  std::uint64_t rto_initial_ns = 1'000'000;  ///< first retransmission timeout (fixed timer)
  std::uint64_t rto_max_ns = 64'000'000;     ///< backoff doubles up to this
  std::uint32_t max_retries = 30;            ///< per chunk; then the collective fails
  /// Adaptive timer: a chunk's first timeout is the RtoEstimator's (fed by this engine's
  /// per-chunk latency samples, `rto`'s initial value, floor and ceiling) instead of
  /// rto_initial_ns. The backoff after a timeout is the same.
  bool adaptive_rto = false;
  RtoConfig rto;
};

/// State of the engine's collectives (with several queued: of them all, the first failure).
enum class Status : std::uint8_t {
  idle = 0,        ///< nothing started, or the last collective completed
  running = 1,     ///< in progress (at least one collective not complete)
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
  /// NACKs for a chunk in flight whose MAC did not verify (spoofed, or from a switch that
  /// predates the MAC): ignored, the chunk's timer runs on.
  std::uint64_t nack_unverified = 0;
  /// Latency samples given to the adaptive timer.
  std::uint64_t rto_samples = 0;
  /// Retransmissions found needless (their RESULT came back sooner than a round trip).
  std::uint64_t spurious = 0;
  /// Timeouts that found the chunk waiting its turn (the last RESULT of a chunk sent once came
  /// since its timer started and less than a timeout ago, none of a later chunk came): its timer
  /// started again from that RESULT, nothing was sent.
  std::uint64_t held = 0;
};

class ProtocolEngine {
 public:
  explicit ProtocolEngine(const EngineConfig& cfg);

  /// Start an allreduce of `count` elements of `dtype` from `send` into `recv` (both caller-owned
  /// until the collective ends; they may be the same buffer). Allowed when no collective is
  /// running. Every host of the tree must start the same sequence of collectives with the same
  /// counts. Returns running, or invalid (count 0, a collective running, bad dtype/op).
  Status start(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  /// Queue an allreduce behind the collectives running (pipelining): its chunks take the slots
  /// earlier collectives free, in stream order, so collectives stream through the window back
  /// to back; they complete in the order they were queued (completed() counts them). Allowed
  /// in any state but a failure's; same arguments and result as start(). A failure (timeout,
  /// refused, bad_result) ends every queued collective: the stream cannot resume.
  Status enqueue(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op);
  /// Collectives completed since the engine was made, in queue order: collective number k
  /// (0-based, counting start() and enqueue() calls that returned running) is complete once
  /// completed() > k.
  std::uint64_t completed() const noexcept { return done_total_; }
  /// Collectives queued and not complete.
  std::size_t in_flight() const noexcept { return colls_.size(); }

  /// Packets due at time `now` (ns, any epoch, monotonic): new chunks the window allows and
  /// retransmissions whose timer expired. Writes at most `cap` to `out`; returns how many.
  /// `next`, when given, receives what next_deadline() returns right after this call, found in
  /// the same pass over the slots (a loop that polls and then waits scans them once).
  std::size_t poll(std::uint64_t now, OutPacket* out, std::size_t cap,
                   std::uint64_t* next = nullptr);

  /// Time unknown: on_packet() takes no latency sample.
  static constexpr std::uint64_t kNoTime = ~std::uint64_t{0};
  /// A received treeduce packet (header as on the wire, payload after it), received at `now`
  /// (the clock of poll(); kNoTime: no latency sample for the adaptive timer, and a RESULT that
  /// holds no chunk waiting its turn).
  void on_packet(const proto::TdHdr& td, const std::uint8_t* payload, std::size_t len,
                 std::uint64_t now = kNoTime);

  /// Earliest time poll() has something to do; UINT64_MAX when nothing is pending.
  std::uint64_t next_deadline() const noexcept;
  /// Earliest retransmission timer of a chunk sent and not answered; UINT64_MAX when none.
  std::uint64_t next_timeout() const noexcept;

  Status status() const noexcept { return status_; }
  /// The reason of the NACK that failed the collective (DropReason::none otherwise).
  proto::Reason nack_reason() const noexcept { return nack_reason_; }
  const EngineStats& stats() const noexcept { return stats_; }
  const EngineConfig& config() const noexcept { return cfg_; }
  /// The adaptive timer's state (fed only with EngineConfig::adaptive_rto).
  const RtoEstimator& rto_estimator() const noexcept { return rto_est_; }
  /// Collective sequence number of the last collective started or queued.
  std::uint32_t seq() const noexcept { return seq_; }
  /// Stream position of the next collective's first chunk: continuous across collectives.
  std::uint32_t next_chunk() const noexcept { return next_base_; }

 private:
  struct SlotState {
    bool active = false;
    std::uint32_t chunk = 0;
    std::uint32_t seq = 0;  // of the collective the chunk belongs to
    std::size_t index = 0;  // chunk - base: position in its collective
    std::uint64_t deadline = 0;
    std::uint64_t rto = 0;
    std::uint32_t retries = 0;
    bool need_send = false;  // queued for a first transmission
    // First transmission, and the last retransmission (the adaptive timer's samples).
    std::uint64_t sent_at = 0;
    std::uint64_t retx_at = 0;
    bool deferred = false;  // its timer ran out once while the stream was stalled
    bool held = false;      // its timer ran out while it waited its turn
  };
  // One queued collective; colls_ holds them in stream order, the oldest incomplete first.
  struct Coll {
    const std::uint8_t* send = nullptr;
    std::uint8_t* recv = nullptr;
    std::size_t count = 0;
    DType dtype = DType::f32;
    ReduceOp op = ReduceOp::sum;
    std::size_t elems_per_chunk = 0;
    std::size_t nchunks = 0;
    std::size_t next_index = 0;  // next chunk not yet given a slot
    std::size_t completed = 0;
    std::uint32_t base = 0;  // stream position of chunk 0
    std::uint32_t seq = 0;
  };
  OutPacket make_packet(const SlotState& s) const;
  const Coll* coll_of(std::uint32_t seq) const noexcept;
  void finish(Status st);
  void take_sample(const SlotState& s, std::uint64_t now, bool overtaken);
  /// Whether a chunk later in the stream than `chunk` has had its RESULT.
  bool answered_after(std::uint32_t chunk) const noexcept;

  EngineConfig cfg_;
  std::uint32_t slot_mask_;
  std::vector<SlotState> slots_;
  Status status_ = Status::idle;
  proto::Reason nack_reason_ = proto::Reason::none;
  EngineStats stats_;
  std::deque<Coll> colls_;
  std::size_t feed_ = 0;         // colls_ index of the first collective with chunks to assign
  std::uint32_t next_base_ = 0;  // stream position of the next collective's chunk 0
  std::uint32_t seq_ = 0;        // of the last collective queued
  std::uint64_t done_total_ = 0;
  bool started_once_ = false;
  RtoEstimator rto_est_;
  std::uint32_t newest_answered_ = 0;  // stream position of the latest chunk whose RESULT came
  bool answered_any_ = false;
  std::uint64_t last_result_at_ = kNoTime;  // the last RESULT of a chunk sent once came then
  // The adaptive timer's probe: the last chunk retransmitted, until any RESULT comes.
  bool probe_active_ = false;
  std::uint32_t probe_chunk_ = 0;
};

}  // namespace treeduce::host
