/// @file
/// The switch's counters as one snapshot, and their two exports: the Prometheus text format (an
/// HTTP endpoint, loopback by default) and DPDK telemetry (/treeduce/... commands). The datapath
/// never formats anything: the control side takes a snapshot and renders it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "agent.h"
#include "treeduce/dataplane/counters.h"

namespace treeduce::switchd {

// clang-format off
/// Drops and events of the daemon around the core (the core's own are dp::DropReason /
/// dp::Event): _(name, description).
#define TREEDUCE_FOREACH_SWITCHD_COUNTER(_)                                                   \
  _(rx_multiseg,        "received frames in several segments, linearised before the core")   \
  _(rx_too_long,        "received frames longer than the largest treeduce frame (dropped here, not offered to the core)") \
  _(steered,            "frames handed to the lcore that owns their slot")                  \
  _(steer_ring_full,    "frames dropped because the owning lcore's ring was full")           \
  _(arp_requests_in,    "ARP requests received")                                           \
  _(arp_replies_out,    "ARP replies sent")                                                \
  _(echo_replies_out,   "ICMP echo replies sent")                                          \
  _(neighbor_ignored,   "ARP or ICMP frames not for the switch (ignored)")                  \
  _(neighbor_malformed, "malformed ARP or ICMP frames (dropped)")                           \
  _(tx_unresolved,      "frames dropped because the next hop's MAC is not known yet")      \
  _(tx_no_mbuf,         "frames dropped because no mbuf was free")                          \
  _(tx_queue_full,      "frames the port would not take (dropped)")                         \
  _(ctl_ring_full,      "learn/resolve messages to the control thread lost (ring full)")    \
  _(probe_ring_full,    "bad_key/bad_source refusals not logged (the log's ring was full)") \
  _(injected_loss,      "received frames dropped on purpose (rx_loss fault injection)")    \
  _(injected_down,      "frames dropped on a port set down (fault injection)")             \
  _(fault_delayed,      "received frames held by a port's delay_us or rate_mbps fault")     \
  _(fault_queue_full,   "received frames dropped because a delayed port's queue was full")  \
  _(capture_dropped,    "frames a capture missed (no mbuf for the copy, or its ring full)") \
  _(tx_port_restarting, "frames dropped because their port was being restarted (link down)")
// clang-format on

enum class SwitchdCounter : std::uint8_t {
#define TREEDUCE_SWITCHD_ENUM(name, desc) name,
  TREEDUCE_FOREACH_SWITCHD_COUNTER(TREEDUCE_SWITCHD_ENUM)
#undef TREEDUCE_SWITCHD_ENUM
};
inline constexpr std::size_t kNumSwitchdCounters = 0
#define TREEDUCE_SWITCHD_COUNT(name, desc) +1
    TREEDUCE_FOREACH_SWITCHD_COUNTER(TREEDUCE_SWITCHD_COUNT)
#undef TREEDUCE_SWITCHD_COUNT
    ;
std::string_view name(SwitchdCounter c) noexcept;
std::string_view description(SwitchdCounter c) noexcept;

struct PortStats {
  std::string name;  ///< PortConfig::name
  std::uint16_t port_id = 0;
  std::uint64_t rx_packets = 0, rx_bytes = 0, tx_packets = 0, tx_bytes = 0;
  std::uint64_t rx_missed = 0, rx_errors = 0, tx_errors = 0;  ///< from rte_eth_stats
  PortFault fault;       ///< injected faults now (all zero: healthy)
  std::string capture;   ///< the file the port's frames are captured to; empty: none
  bool link_up = false;  ///< as the neighbour thread last saw it (rte_eth_link_get_nowait)
  std::uint64_t link_changes = 0;   ///< up/down transitions after the first look
  std::uint64_t link_restarts = 0;  ///< restarts of a memif client whose link stayed down
};

struct TreeStats {
  std::uint16_t tree_id = 0;
  std::string job;
  dp::Counters counters;  ///< summed over lcores
};

struct LcoreStats {
  unsigned lcore = 0;
  std::uint64_t polls = 0, busy_polls = 0, sleeps = 0, yields = 0;
};

struct Snapshot {
  std::string switch_name;
  double uptime_s = 0;
  dp::Counters core;  ///< switch-wide, summed over lcores
  std::array<std::uint64_t, kNumSwitchdCounters> switchd{};
  std::vector<PortStats> ports;
  std::vector<TreeStats> trees;
  std::vector<LcoreStats> lcores;
};

/// Prometheus text exposition format 0.0.4: every counter with HELP/TYPE lines, labels
/// switch="...", and port="..." / tree="..." / job="..." / reason="..." / event="..." / lcore="..."
/// where they apply. Metric names: treeduce_switch_drops_total{reason},
/// treeduce_switch_events_total{event}, treeduce_switch_daemon_total{counter},
/// treeduce_port_{rx,tx}_{packets,bytes}_total{port},
/// treeduce_port_{rx_missed,rx_errors,tx_errors}_total{port},
/// treeduce_tree_drops_total{tree,job,reason}, treeduce_tree_events_total{tree,job,event},
/// treeduce_lcore_{polls,busy_polls,sleeps,yields}_total{lcore}, treeduce_switch_uptime_seconds,
/// treeduce_switch_trees.
std::string render_prometheus(const Snapshot& s);

/// A one-line-per-counter human summary printed at shutdown (non-zero counters only).
std::string render_summary(const Snapshot& s);

/// Serves GET /metrics (render_prometheus of a fresh snapshot) on `listen` ("addr:port", port 0
/// picks one) from its own thread; anything else is 404.
class MetricsServer {
 public:
  using SnapshotFn = std::function<Snapshot()>;
  /// Returns nullptr and sets `*error` to a sentence when the address is bad or cannot be bound.
  static std::unique_ptr<MetricsServer> start(const std::string& listen, SnapshotFn fn,
                                              std::string* error);
  ~MetricsServer();
  int port() const noexcept;
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace treeduce::switchd
