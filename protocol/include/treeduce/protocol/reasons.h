/// @file
/// Why a frame was not used: the one list of reason codes of the treeduce protocol.
///
/// A reason's numeric value travels in TdHdr::reason of a NACK and names the switch's drop
/// counters; parse_frame() answers with the first eleven (the framing checks). Append only, never
/// reorder or remove an entry: docs/protocol.md section 6 lists them, and the Wireshark dissector
/// and the hosts read the same numbers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace treeduce::proto {

// clang-format off
/// _(name, nack, description): nack is 1 when a CONTRIB dropped for this reason is answered with a
/// NACK carrying the reason (the sender is a member that can act on it), 0 for silent drops
/// (malformed or stale traffic, and anything that is not a CONTRIB).
#define TREEDUCE_FOREACH_REASON(_)                                                                \
  _(none,              0, "not dropped (reason 0 means no reason in a header)")                   \
  _(too_short,         0, "frame or UDP datagram shorter than the headers up to the treeduce header") \
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
  _(bad_child,         1, "child index out of range for the tree (CONTRIB) or not ours (RESULT)") \
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
  _(unexpected_result, 0, "RESULT at a root, or for a slot that never sent its partial up")       \
  _(nack_received,     0, "a NACK arrived at a switch (counted, not acted on)")                   \
  _(wrong_shard,       0, "slot owned by another datapath thread of the switch (steering bug)")   \
  _(bad_reserved,      1, "reason field not 0 in a CONTRIB or RESULT")
// clang-format on

/// A reason code: why a frame was dropped, and what a NACK says.
enum class Reason : std::uint8_t {
#define TREEDUCE_REASON_ENUM(name, nack, desc) name,
  TREEDUCE_FOREACH_REASON(TREEDUCE_REASON_ENUM)
#undef TREEDUCE_REASON_ENUM
};
inline constexpr std::size_t kNumReasons = 0
#define TREEDUCE_REASON_COUNT(name, nack, desc) +1
    TREEDUCE_FOREACH_REASON(TREEDUCE_REASON_COUNT)
#undef TREEDUCE_REASON_COUNT
    ;

/// Short name ("bad_key") and one-line description of a reason; "?" for out-of-range values.
std::string_view name(Reason r) noexcept;
std::string_view description(Reason r) noexcept;
/// True when a CONTRIB dropped for `r` is answered with a NACK.
bool nacks(Reason r) noexcept;

}  // namespace treeduce::proto
