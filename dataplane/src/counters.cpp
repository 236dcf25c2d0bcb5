#include "treeduce/dataplane/counters.h"

namespace treeduce::dp {

namespace {
struct EventInfo {
  std::string_view name;
  std::string_view desc;
};
constexpr EventInfo kEvents[] = {
#define TREEDUCE_EVENT_INFO(n, desc) {#n, desc},
    TREEDUCE_FOREACH_EVENT(TREEDUCE_EVENT_INFO)
#undef TREEDUCE_EVENT_INFO
};
}  // namespace

std::string_view name(Event e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kNumEvents ? kEvents[i].name : "?";
}
std::string_view description(Event e) noexcept {
  const auto i = static_cast<std::size_t>(e);
  return i < kNumEvents ? kEvents[i].desc : "?";
}

std::uint64_t Counters::total_drops() const noexcept {
  std::uint64_t s = 0;
  for (std::size_t i = 1; i < kNumDropReasons; ++i) s += drops[i];
  return s;
}

namespace {
template <std::size_t N>
void add_relaxed(const std::array<std::uint64_t, N>& from, std::array<std::uint64_t, N>& to) {
  for (std::size_t i = 0; i < N; ++i) to[i] += __atomic_load_n(&from[i], __ATOMIC_RELAXED);
}
}  // namespace

void load_counters(const Counters& from, Counters* to) noexcept {
  *to = Counters{};
  add_counters(from, to);
}

void add_counters(const Counters& from, Counters* to) noexcept {
  add_relaxed(from.drops, to->drops);
  add_relaxed(from.events, to->events);
}

}  // namespace treeduce::dp
