/// @file
/// The switch core: what a treeduce switch does with every frame, independent of any I/O library.
///
/// Datapath: Core::process_burst() takes a burst of received frames and produces frames to send.
/// Control: install_tree() / remove_tree() between bursts, or, from another thread while the
/// datapath runs, install_tree() / unpublish_tree() with a grace period before destroy_tree() (RCU;
/// the DPDK daemon uses rte_rcu_qsbr). The core allocates only in the control calls; the
/// per-packet path does not allocate, throw, lock or log. Slot semantics follow
/// docs/protocol.md section "Switch behaviour"; design and measured costs are in
/// docs/switch-core.md.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/common/status.h"
#include "treeduce/dataplane/counters.h"
#include "treeduce/dataplane/probe_log.h"
#include "treeduce/protocol/tree.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::dp {

// The protocol's vocabulary (protocol/wire.h, protocol/tree.h), which the switch core and its
// daemon use unqualified.
using proto::be16;
using proto::be32;
using proto::be64;
using proto::bswap_be;
using proto::build_frame;
using proto::ChildConfig;
using proto::Endpoint;
using proto::EtherHdr;
using proto::inet_checksum;
using proto::ipv4_checksum;
using proto::Ipv4Hdr;
using proto::kDefaultUdpPort;
using proto::kFrameHeaderBytes;
using proto::kMaxChildren;
using proto::kMaxFrameBytes;
using proto::kMaxPayloadBytes;
using proto::kMaxSlots;
using proto::kMinPayloadBytes;
using proto::kProtocolVersion;
using proto::load_header;
using proto::Opcode;
using proto::parse_frame;
using proto::Parsed;
using proto::Role;
using proto::serial_after;
using proto::store_header;
using proto::TdHdr;
using proto::TreeConfig;
using proto::UdpHdr;
using proto::valid_payload_bytes;
using proto::validate_tree;
using proto::write_l2_l4;

/// A received frame: the bytes stay owned by the caller.
struct RxFrame {
  const std::uint8_t* data;
  std::size_t len;
};

/// TxFrame::hop and NextHop::tag of a destination the caller resolves itself.
constexpr std::uint16_t kNoHop = 0xFFFF;

/// A resolved next hop of a tree's parent or child, set by the caller (Core::set_next_hops()):
/// the Ethernet addresses its frames carry and the caller's tag for the way out (the DPDK daemon:
/// the port id). tag kNoHop: not resolved, the frame carries the configured MACs.
struct NextHop {
  std::uint8_t dst_mac[6] = {};
  std::uint8_t src_mac[6] = {};
  std::uint16_t tag = kNoHop;
};

/// A frame to send: its own 74 header bytes followed by a payload that may be shared by several
/// TxFrames (multicast). `payload` points into the core's slot memory and stays valid, with the
/// bytes it had when the frame was made, until the next process_burst(), install_tree() or
/// remove_tree() call: transmit (or copy) before that.
/// A DPDK backend maps it to a header mbuf chained to an indirect payload mbuf.
struct TxFrame {
  std::uint8_t hdr[kFrameHeaderBytes];
  const std::uint8_t* payload;
  std::uint32_t payload_len;
  /// The tag of the tree's next hop whose Ethernet addresses `hdr` already carries (NextHop), or
  /// kNoHop: `hdr` carries the configured MACs (a tree hop not resolved yet) or the sender's (a
  /// NACK), and the caller finds the way out itself.
  std::uint16_t hop;
  std::uint32_t len() const noexcept { return kFrameHeaderBytes + payload_len; }
};

/// State of one slot version (docs/protocol.md).
enum class SlotState : std::uint8_t {
  empty = 0,           ///< never used since install
  accumulating = 1,    ///< waiting for children
  waiting_parent = 2,  ///< all children in, partial sent up, waiting for the RESULT (non-root)
  done = 3,            ///< result held: multicast done, kept for duplicate requests
};

/// A copy of a slot version's bookkeeping, for tests and introspection.
struct SlotView {
  SlotState state = SlotState::empty;
  std::uint32_t chunk = 0;
  std::uint32_t seq = 0;
  std::uint64_t bitmap = 0;    ///< children whose contribution is in
  std::uint16_t arrived = 0;   ///< popcount(bitmap)
  std::uint32_t ncontrib = 0;  ///< hosts folded into the accumulator (RESULT's count when done)
  std::uint16_t count = 0;     ///< elements
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
};

/// Switch-wide settings.
struct CoreConfig {
  Endpoint self;  ///< this switch's MAC, IPv4 address and UDP port
  /// Slot sharding across datapath threads: this core owns the slots s with s % shards == shard
  /// and allocates memory for those only. A frame for another shard's slot is dropped as
  /// wrong_shard (the daemon steers frames to the owner first, so that counter stays 0).
  std::uint32_t shard = 0;
  std::uint32_t shards = 1;
};

struct Tree;      // defined in core.cpp
struct TreeHops;  // a tree's output headers per next hop, defined in core.cpp

/// One switch's aggregation engine (or one shard of it). One datapath thread calls
/// process_burst(); the tree table may be changed by one control thread at the same time through
/// install_tree() and unpublish_tree(): lookups are acquire loads of one pointer per frame.
class Core {
 public:
  explicit Core(const CoreConfig& cfg);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  /// OK, or what install_tree() would refuse `cfg` with: invalid_argument and the sentence of
  /// proto::validate_tree() after "tree N: ".
  static Status check_config(const TreeConfig& cfg);
  /// Install a tree. Fails with invalid_argument (what proto::validate_tree() says, e.g. "tree 7:
  /// slots must be a power of two from 1 to 4096, got 12."), already_exists (id in use) or
  /// resource_exhausted (memory). Allocates all slot memory (this shard's) and output headers of
  /// the tree, then publishes it with one release store: safe while another thread runs
  /// process_burst().
  Status install_tree(const TreeConfig& cfg);
  /// Remove a tree and free its memory at once; not_found when there is none. Frames for it are
  /// then dropped as unknown_tree. Only when no other thread is inside process_burst().
  Status remove_tree(std::uint16_t tree_id);
  /// Take a tree out of the table without freeing it (nullptr when there is none): frames that
  /// look it up from now on see unknown_tree, but a process_burst() already running may still
  /// use it. Free it with destroy_tree() once every datapath thread has passed a quiescent point.
  Tree* unpublish_tree(std::uint16_t tree_id) noexcept;
  static void destroy_tree(Tree* t) noexcept;
  /// Resolve a tree's next hops: `children` (one per child, in order) and `parent` (ignored at a
  /// root) give the Ethernet addresses its frames carry from now on and the tag they are marked
  /// with (TxFrame::hop). The core rebuilds the tree's header templates (IPv4 checksum included)
  /// once here, so no frame needs a neighbour lookup or a MAC write. Safe while another thread
  /// runs process_burst() (one release store), but not concurrently with unpublish_tree() or
  /// another set_next_hops() of the tree: `*old` receives the replaced set, to free with
  /// destroy_hops() once every datapath thread has passed a quiescent point. not_found (no tree)
  /// or invalid_argument (not one hop per child); then `*old` is nullptr.
  Status set_next_hops(std::uint16_t tree_id, std::span<const NextHop> children,
                       const NextHop& parent, TreeHops** old);
  static void destroy_hops(TreeHops* h) noexcept;
  /// Number of installed trees (control thread).
  std::size_t tree_count() const noexcept;
  /// The configuration a tree was installed with, or nullptr (control thread).
  const TreeConfig* tree_config(std::uint16_t tree_id) const noexcept;
  /// Slot versions this core holds for a tree of `slots` slots (its shard's share).
  std::uint32_t local_slots(std::uint32_t slots) const noexcept;

  /// Process up to `n_rx` received frames. Writes up to `tx_cap` frames to `tx` and their number
  /// to `*n_tx`. Returns how many received frames were consumed: fewer than `n_rx` when `tx` has
  /// no room for the worst case of the next frame (as many frames as the tree has children), or
  /// when the next frame would overwrite slot memory that a frame already in `tx` points at (a
  /// slot version completing chunk c + 2S while chunk c's RESULT or partial is still unsent). The
  /// caller sends what it got and calls again with the rest. Never fails on bad input: every
  /// frame not used is counted under a DropReason.
  std::size_t process_burst(const RxFrame* rx, std::size_t n_rx, TxFrame* tx, std::size_t tx_cap,
                            std::size_t* n_tx) noexcept;

  /// Switch-wide counters (every frame).
  const Counters& counters() const noexcept { return counters_; }
  /// A tree's counters (frames that named an installed tree), or nullptr. From another thread
  /// than the datapath's, read them with load_counters() (they are written without atomics).
  const Counters* tree_counters(std::uint16_t tree_id) const noexcept;
  /// A slot version's bookkeeping. Returns 0, -ENOENT (no tree) or -EINVAL (slot/ver range).
  int slot_view(std::uint16_t tree_id, std::uint32_t slot, unsigned ver, SlotView* out) const;

  const CoreConfig& config() const noexcept { return cfg_; }

  /// Refusals that may be someone probing (bad_key, bad_source) since the last clear_probes(),
  /// in order: where each frame claimed to come from, for the caller's rate-limited log
  /// (probe_log.h). At most kMaxProbes (more than one process_burst() call can refuse); the
  /// rest only counted (probes_lost()). Same thread as process_burst().
  static constexpr std::size_t kMaxProbes = 256;
  std::span<const Probe> probes() const noexcept { return {probes_.data(), nprobes_}; }
  std::uint64_t probes_lost() const noexcept { return probes_lost_; }
  void clear_probes() noexcept { nprobes_ = 0; }

  /// The NACKs this core may send until the next call (none are limited before the first). A
  /// refusal beyond the budget is counted (its drop reason and Event::nack_suppressed) and
  /// answered with nothing: a flood of refused CONTRIBs then costs a parse and a count each, not
  /// a MAC and a frame. The daemon refills it every 100 ms (switch config `nack_rate`). Same
  /// thread as process_burst().
  void refill_nacks(std::uint64_t budget) noexcept { nack_budget_ = budget; }

 private:
  struct Chunk;  // a CONTRIB's or RESULT's checked header fields and its slot version

  // The stages of one frame, in order (docs/switch-core.md): parse and look up, check the header
  // against the tree, then the CONTRIB or RESULT state machine (complete() when a slot version
  // has every child), which builds frames with send_up(), send_down() or refuse(). Each returns the
  // number of frames written to `tx`.
  std::size_t handle(const std::uint8_t* data, std::size_t len, TxFrame* tx, std::size_t tx_room,
                     bool* consumed) noexcept;
  [[gnu::always_inline]] inline DropReason check_chunk(Tree& t, const Parsed& p, Chunk* c) noexcept;
  [[gnu::always_inline]] inline std::size_t on_contrib(Tree& t, const Parsed& p, Chunk& c,
                                                       TxFrame* tx, bool* consumed) noexcept;
  [[gnu::always_inline]] inline std::size_t complete(Tree& t, Chunk& c, TxFrame* tx) noexcept;
  [[gnu::always_inline]] inline std::size_t on_result(Tree& t, const Parsed& p, Chunk& c,
                                                      TxFrame* tx, bool* consumed) noexcept;
  [[gnu::always_inline]] inline std::size_t send_up(Tree& t, const Chunk& c, TxFrame* tx) noexcept;
  [[gnu::always_inline]] inline std::size_t send_down(Tree& t, const Chunk& c, std::uint16_t first,
                                                      std::uint16_t n, TxFrame* tx) noexcept;
  std::size_t refuse(Tree* t, const Parsed& p, DropReason r, TxFrame* tx) noexcept;
  void drop(Tree* t, DropReason r) noexcept;
  void event(Tree* t, Event e, std::uint64_t n = 1) noexcept;

  CoreConfig cfg_;
  Counters counters_;
  /// process_burst() calls so far (mod 2^32, never 0): frames in `tx` point at slot buffers
  /// stamped with it.
  std::uint32_t burst_ = 0;
  /// Indexed by tree id: a lookup is one load. 512 KiB of pointers per core. Owning: a published
  /// Tree is deleted by remove_tree(), destroy_tree() after unpublish_tree(), or ~Core().
  std::unique_ptr<std::atomic<Tree*>[]> trees_;
  std::size_t ntrees_ = 0;
  std::array<Probe, kMaxProbes> probes_{};
  std::size_t nprobes_ = 0;
  std::uint64_t probes_lost_ = 0;
  std::uint64_t nack_budget_ = ~std::uint64_t{0};  ///< refill_nacks()
};

}  // namespace treeduce::dp
