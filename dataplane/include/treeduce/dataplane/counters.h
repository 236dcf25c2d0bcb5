/// @file
/// Named drop reasons and event counters of the switch core (VPP's foreach_*_error style).
///
/// A DropReason's numeric value also travels in TdHdr::reason of a NACK: append only, never
/// reorder or remove an entry (docs/protocol.md lists them).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace treeduce::dp {

// clang-format off
/// _(name, nack, description): nack is 1 when a CONTRIB dropped for this reason is answered with a
/// NACK carrying the reason (the sender is a member that can act on it), 0 for silent drops
/// (malformed or stale traffic, and anything that is not a CONTRIB).
#define TREEDUCE_FOREACH_DROP(_)                                                                  \
  _(none,              0, "not dropped (reason 0 means no reason in a header)")                   \
  _(too_short,         0, "frame shorter than Ethernet+IPv4+UDP+treeduce headers")                \
  _(not_ipv4,          0, "EtherType is not IPv4")                                                \
  _(ip_bad_header,     0, "IPv4 version or header length unsupported (options)")                 \
  _(ip_bad_checksum,   0, "IPv4 header checksum wrong")                                           \
  _(ip_bad_length,     0, "IPv4 total length disagrees with the frame")                           \
  _(ip_fragment,       0, "IPv4 fragment")                                                        \
  _(not_udp,           0, "IP protocol is not UDP")                                               \
  _(wrong_port,        0, "UDP destination port is not the switch's")                             \
  _(udp_bad_length,    0, "UDP length disagrees with the IPv4 length")                            \
  _(not_for_us,        0, "destination IPv4 address is not the switch's")                         \
  _(bad_version,       1, "treeduce protocol version not supported")                              \
  _(bad_length,        1, "payload length is not count x element size")                           \
  _(bad_opcode,        0, "unknown opcode")                                                       \
  _(unknown_tree,      1, "no such tree on this switch")                                          \
  _(bad_key,           1, "job key does not match the tree's")                                    \
  _(bad_child,         1, "child index out of range for the tree")                                \
  _(bad_source,        1, "source address is not the child's (or the parent's)")                  \
  _(bad_dtype_op,      1, "dtype or op not allowed on this tree")                                 \
  _(bad_count,         1, "element count is 0 or exceeds the tree's payload size")                \
  _(bad_slot,          1, "slot or slot version does not follow from the chunk number")           \
  _(bad_ncontrib,      1, "contribution count differs from the hosts under the child")            \
  _(chunk_mismatch,    1, "dtype, op or count differs from the chunk's first contribution")       \
  _(stale_chunk,       0, "chunk older than the one in the slot version")                         \
  _(stale_seq,         0, "collective sequence older than (or different from) the slot's")        \
  _(duplicate_pending, 0, "duplicate contribution while the slot still waits for other children") \
  _(stale_result,      0, "RESULT for a chunk the slot version does not hold")                    \
  _(duplicate_result,  0, "RESULT for a slot version that already has it")                        \
  _(unexpected_result, 0, "RESULT at a root, or for a slot that never sent its partial up")      \
  _(nack_received,     0, "a NACK arrived at a switch (counted, not acted on)")                  \
  _(wrong_shard,       0, "slot owned by another datapath thread of the switch (steering bug)")
// clang-format on

/// Why the core dropped a frame.
enum class DropReason : std::uint8_t {
#define TREEDUCE_DROP_ENUM(name, nack, desc) name,
  TREEDUCE_FOREACH_DROP(TREEDUCE_DROP_ENUM)
#undef TREEDUCE_DROP_ENUM
};
inline constexpr std::size_t kNumDropReasons = 0
#define TREEDUCE_DROP_COUNT(name, nack, desc) +1
    TREEDUCE_FOREACH_DROP(TREEDUCE_DROP_COUNT)
#undef TREEDUCE_DROP_COUNT
    ;

/// Short name ("bad_key") and one-line description of a reason; "?" for out-of-range values.
std::string_view name(DropReason r) noexcept;
std::string_view description(DropReason r) noexcept;
/// True when a CONTRIB dropped for `r` is answered with a NACK.
bool nacks(DropReason r) noexcept;

// clang-format off
/// Events that are not drops: _(name, description).
#define TREEDUCE_FOREACH_EVENT(_)                                                    \
  _(rx_frames,        "frames offered to the core")                                  \
  _(tx_frames,        "frames produced by the core")                                 \
  _(contrib_accepted, "contributions added to an accumulator (never a duplicate)")   \
  _(partial_sent,     "partials sent up when a slot version completed")              \
  _(partial_resent,   "partials re-sent up on a duplicate while waiting on the parent") \
  _(result_multicast, "RESULTs multicast to all children (one per chunk and switch)") \
  _(result_unicast,   "RESULTs re-sent to one child on a duplicate contribution")    \
  _(nack_sent,        "NACKs sent")                                                  \
  _(slot_reused,      "slot versions reset for a newer chunk")
// clang-format on

enum class Event : std::uint8_t {
#define TREEDUCE_EVENT_ENUM(name, desc) name,
  TREEDUCE_FOREACH_EVENT(TREEDUCE_EVENT_ENUM)
#undef TREEDUCE_EVENT_ENUM
};
inline constexpr std::size_t kNumEvents = 0
#define TREEDUCE_EVENT_COUNT(name, desc) +1
    TREEDUCE_FOREACH_EVENT(TREEDUCE_EVENT_COUNT)
#undef TREEDUCE_EVENT_COUNT
    ;

std::string_view name(Event e) noexcept;
std::string_view description(Event e) noexcept;

/// Plain counters, written only by the thread that runs the core.
struct Counters {
  std::array<std::uint64_t, kNumDropReasons> drops{};
  std::array<std::uint64_t, kNumEvents> events{};

  std::uint64_t drop(DropReason r) const noexcept { return drops[static_cast<std::size_t>(r)]; }
  std::uint64_t event(Event e) const noexcept { return events[static_cast<std::size_t>(e)]; }
  /// Sum of all drop counters.
  std::uint64_t total_drops() const noexcept;
};

/// Copy counters that another thread is writing (plain increments on x86-64 are single aligned
/// stores, so relaxed atomic loads see whole values; the sum may be a few packets behind).
void load_counters(const Counters& from, Counters* to) noexcept;
/// `*to += from`, element-wise, with load_counters()' semantics for `from`.
void add_counters(const Counters& from, Counters* to) noexcept;

}  // namespace treeduce::dp
