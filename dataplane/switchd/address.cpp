#include "address.h"

#include <charconv>
#include <system_error>

namespace treeduce::switchd {

std::optional<std::uint32_t> parse_ipv4(const std::string& s) {
  std::uint32_t ip = 0;
  const char* p = s.data();
  const char* end = s.data() + s.size();
  for (int octet = 0; octet < 4; ++octet) {
    if (octet > 0 && (p == end || *p++ != '.')) return std::nullopt;
    unsigned v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    // Leading zeros are refused: inet_aton() would read "010" as octal 8.
    if (ec != std::errc() || v > 255 || (*p == '0' && next - p > 1)) return std::nullopt;
    ip = ip << 8 | v;
    p = next;
  }
  if (p != end) return std::nullopt;
  return ip;
}

std::optional<MetricsListen> parse_metrics_listen(std::string_view s) {
  const std::size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return std::nullopt;
  MetricsListen m{std::string(s.substr(0, colon)), 0};
  if (m.host != "localhost" && !parse_ipv4(m.host)) return std::nullopt;
  const std::string_view port = s.substr(colon + 1);
  const char* end = port.data() + port.size();
  const auto [p, ec] = std::from_chars(port.data(), end, m.port);  // decimal; above 65535: ec
  if (port.empty() || ec != std::errc() || p != end) return std::nullopt;
  return m;
}

}  // namespace treeduce::switchd
