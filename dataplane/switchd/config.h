/// @file
/// treeduce-switch configuration: what the YAML file and the command line say
/// (docs/switch-config.md).
/// Parsing is separate from DPDK so that every error path is unit-tested without an EAL.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "address.h"  // parse_ipv4, parse_metrics_listen
#include "agent.h"
#include "treeduce/dataplane/core.h"

namespace treeduce::switchd {

/// One DPDK port of the switch.
struct PortConfig {
  std::string name;      ///< DPDK device name as probed (e.g. "net_memif0", "0000:3b:00.0")
  std::uint32_t ip = 0;  ///< the port's own IPv4 address (host order); answered by ARP/ICMP
  std::uint8_t prefix =
      24;  ///< on-link prefix length of `ip`: neighbours in it are ARPed here only
  std::optional<std::array<std::uint8_t, 6>> mac;  ///< unset: the port's own MAC
  std::uint32_t mtu = 0;                           ///< 0: leave the port's MTU
  /// Fault injection for tests: drop this fraction (0..1) of received frames, pseudo-randomly
  /// from SwitchConfig::seed. Counted as injected_loss.
  double rx_loss = 0;
  /// Fault injection for tests: hold received frames this long (at most kMaxFaultDelayUs), and
  /// release them no faster than rate_mbps (0: line rate). Counted as fault_delayed.
  std::uint32_t delay_us = 0;
  std::uint32_t rate_mbps = 0;
};

/// A neighbour the switch does not need to resolve with ARP.
struct StaticNeighbor {
  std::uint32_t ip = 0;
  std::array<std::uint8_t, 6> mac{};
  std::string port;  ///< PortConfig::name
};

/// A tree installed at start (static mode, no manager).
struct StaticTree {
  dp::TreeConfig tree;
  std::string job;  ///< for logs and counters; may be empty
};

struct SwitchConfig {
  std::string name = "switch";  ///< the switch's name in the manager's topology
  /// The switch's treeduce address: the IPv4 address and UDP port hosts and other switches send
  /// to (the manager's `data`). Answered by ARP/ICMP on every port. MAC unused (per-port MACs).
  dp::Endpoint data{{}, 0, dp::kDefaultUdpPort};
  std::vector<PortConfig> ports;  ///< at least one
  std::vector<StaticNeighbor> neighbors;
  std::vector<StaticTree> trees;
  /// EAL lcores that run the datapath; empty: every lcore the EAL was given.
  std::vector<unsigned> lcores;
  /// 0: busy polling. Otherwise an idle lcore sleeps up to this long between polls (it backs off
  /// from 1 us after 64 empty polls), so that a switch shares a small machine.
  std::uint32_t idle_sleep_us = 0;
  /// With idle_sleep_us: an idle lcore first yields its CPU (sched_yield) between polls for this
  /// long before it starts sleeping; 0: it sleeps at once. A yield costs a runnable neighbour
  /// nothing, and the next packet finds the lcore awake.
  std::uint32_t idle_yield_us = 1000;
  std::uint32_t burst = 32;         ///< RX/TX burst size, 1..64
  std::uint32_t tx_drain_us = 100;  ///< TX buffers are flushed at least this often
  /// NACKs each datapath lcore sends per second at most (dp::Core::refill_nacks every 100 ms);
  /// 0: no limit.
  std::uint32_t nack_rate = 10'000;
  std::uint32_t mbufs = 8192;  ///< mbufs in the RX/payload pool (per switch)
  std::uint32_t rx_desc = 1024, tx_desc = 1024;
  /// Prometheus text endpoint "addr:port"; empty disables it. Loopback by default.
  std::string metrics_listen = "127.0.0.1:9470";
  /// The Aggregation Manager "host:port"; empty: static mode only.
  std::string manager;
  /// Where this switch serves SwitchAgent ("addr:port"; port 0 picks one).
  std::string agent_listen = "127.0.0.1:0";
  /// What to tell the manager as the agent address; empty: agent_listen with the picked port.
  std::string agent_advertise;
  std::uint32_t heartbeat_ms = 1000;
  bool deterministic_allowed = true;  ///< accept deterministic trees (static or installed)
  std::string log_level = "info";     ///< trace, debug, info, warn, error
  /// Stop after this long (0 = run until SIGINT/SIGTERM). For tests and benchmarks.
  std::uint32_t run_ms = 0;
  /// Stop once no packet arrived for this long after the first one (0 = off). For pcap tests.
  std::uint32_t exit_idle_ms = 0;
  /// At shutdown, write the final counters here in the Prometheus text format (--final-stats).
  std::string final_stats;
  std::uint64_t seed = 1;  ///< for rx_loss
  /// Serve the agent's SetPortFault (`treeduce lab fault`): the ports' faults change at run time.
  /// Off by default: a production switch takes no faults from the network.
  bool faults = false;
  /// Mutual TLS with the manager (docs/deploy.md, "TLS"): the CA, the switch's certificate (its
  /// CN is the switch's name: the manager takes registrations under that name only) and key.
  std::string tls_ca, tls_cert, tls_key;
  /// With TLS, the name the manager's certificate carries when the host of `manager` is not it.
  std::string tls_server_name;
  /// With TLS, who may call the agent: the manager's and the admin's certificate names.
  std::string tls_manager_name = tls::kDefaultManagerName;
  std::string tls_admin_name = tls::kDefaultAdminName;
  /// No TLS: required, explicitly, to run without certificates when the switch has a manager or
  /// serves its agent beyond loopback (labs and tests only).
  bool insecure = false;
};

/// A parse result: the config, or one sentence saying what is wrong and where.
struct ConfigResult {
  std::optional<SwitchConfig> config;
  std::string error;
  bool help = false;  ///< --help or --version was asked for; `error` holds the text to print
};

/// Load a YAML file (docs/switch-config.md). Errors name the file and line.
ConfigResult load_config_file(const std::string& path);
/// Parse YAML text; `origin` names it in errors.
ConfigResult parse_config_yaml(const std::string& text, const std::string& origin);

/// Parse treeduce's own arguments (those after the EAL's "--"): `--config FILE` first, then
/// flags that override it (--name, --data, --port NAME[,ip=A/P][,mac=M], --lcores, --idle-sleep-us,
/// --metrics, --manager, --agent-listen, --agent-advertise, --run-ms, --exit-idle-ms,
/// --log-level). argv[0] is the program name.
ConfigResult parse_args(int argc, const char* const* argv);

/// Checks that need the whole config (ports named once, trees valid for dp::Core, neighbours on
/// known ports, lcores distinct). Empty string when fine.
std::string validate(const SwitchConfig& c);

/// "aa:bb:cc:dd:ee:ff" -> bytes; nullopt when malformed.
std::optional<std::array<std::uint8_t, 6>> parse_mac(const std::string& s);
std::string format_ipv4(std::uint32_t ip);
std::string format_mac(const std::uint8_t* mac);

}  // namespace treeduce::switchd
