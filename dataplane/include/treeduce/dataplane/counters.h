/// @file
/// The switch core's counters: one per reason code (drops, protocol/reasons.h) and one per event
/// (VPP's foreach_*_error style).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "treeduce/protocol/reasons.h"

namespace treeduce::dp {

/// Why the core dropped a frame: the protocol's reason codes (protocol/reasons.h), one list for
/// drop counters and NACKs.
using DropReason = proto::Reason;
inline constexpr std::size_t kNumDropReasons = proto::kNumReasons;
using proto::description;
using proto::nacks;
using proto::name;

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
  _(nack_suppressed,  "NACKs not sent: the core's NACK budget was spent (nack_rate)") \
  _(slot_reused,      "slot versions that held a chunk, reset for a newer chunk")   \
  _(tx_deferred,      "frames left for the next burst: their slot's payload was still unsent")
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
