// Addresses in the switch's configuration, parsed without the configuration's dependencies: the
// config's checks and the metrics server (stats.cpp) share these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace treeduce::switchd {

/// "a.b.c.d" -> host-order address; nullopt when malformed.
std::optional<std::uint32_t> parse_ipv4(const std::string& s);
/// Where the metrics endpoint listens: a host the HTTP server can bind without a resolver.
struct MetricsListen {
  std::string host;    ///< dotted IPv4, or "localhost"
  std::uint16_t port;  ///< 0: any free port
};
/// "A.B.C.D:PORT" or "localhost:PORT", PORT decimal from 0 to 65535; nullopt otherwise. The one
/// parser of the metrics address: the config's check (`metrics:`, --metrics) and
/// MetricsServer::start() (stats.h).
std::optional<MetricsListen> parse_metrics_listen(std::string_view s);

}  // namespace treeduce::switchd
