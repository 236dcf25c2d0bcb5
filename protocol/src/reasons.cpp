#include "treeduce/protocol/reasons.h"

namespace treeduce::proto {

namespace {
struct ReasonInfo {
  std::string_view name;
  bool nack;
  std::string_view desc;
};
constexpr ReasonInfo kReasons[] = {
#define TREEDUCE_REASON_INFO(n, nack, desc) {#n, nack != 0, desc},
    TREEDUCE_FOREACH_REASON(TREEDUCE_REASON_INFO)
#undef TREEDUCE_REASON_INFO
};
}  // namespace

std::string_view name(Reason r) noexcept {
  const auto i = static_cast<std::size_t>(r);
  return i < kNumReasons ? kReasons[i].name : "?";
}
std::string_view description(Reason r) noexcept {
  const auto i = static_cast<std::size_t>(r);
  return i < kNumReasons ? kReasons[i].desc : "?";
}
bool nacks(Reason r) noexcept {
  const auto i = static_cast<std::size_t>(r);
  return i < kNumReasons && kReasons[i].nack;
}

}  // namespace treeduce::proto
