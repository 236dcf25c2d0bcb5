/// @file
/// treeduce-switch's datapath: dp::Core shards on DPDK ports (docs/switch.md).
///
/// One worker per datapath lcore, run to completion: RX bursts from its queue of every port, hand
/// frames whose slot another worker owns to that worker's ring (software steering after RSS; hosts
/// pick the UDP source port from the slot so RSS spreads slots over queues), run its Core shard,
/// build the output mbufs (a multicast is one header mbuf per child chained to one shared payload
/// mbuf), resolve the next hop and buffer TX per port, drained when the RX queues run dry or on a
/// timer. No allocation, lock or log per packet. ARP and ICMP echo are answered on the lcore that
/// receives them.
///
/// The control side (gRPC agent, static config, telemetry, a neighbour thread) changes trees and
/// the neighbour table through RCU: publish, rte_rcu_qsbr_synchronize, free.
///
/// This is the façade; the parts (ports, worker, neighbours, trees) are listed in
/// datapath_impl.h.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "agent.h"
#include "config.h"
#include "stats.h"

namespace treeduce::switchd {

/// Set by SIGINT/SIGTERM (or run_ms / exit_idle_ms): every loop ends and the switch shuts down.
extern std::atomic<bool> g_stop;

class Switch final : public TreeControl, public PortControl {
 public:
  /// Sets up ports, pools, rings, RCU and cores after rte_eal_init(), and installs the static
  /// trees; one sentence when a port is missing or cannot be configured as asked, the EAL has
  /// not the memory, or a static tree is refused.
  static Result<std::unique_ptr<Switch>> create(const SwitchConfig& cfg);
  ~Switch() override;
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;

  /// Runs the workers on their lcores (this thread's lcore included when it is one of them) and
  /// the neighbour thread until g_stop; then drains TX (the ports stop when the switch is
  /// destroyed, after the final counters are read).
  void run();

  Status install(const proto::TreeConfig& t, const std::string& job) override;
  Status remove(std::uint16_t tree_id) override;
  std::vector<Held> held() const override;
  /// Serves the agent's SetPortFault when the configuration allows it (`faults`); logged.
  Status set_port_fault(const std::string& port, const PortFault& f) override;
  /// Captures (capture.cpp): only with `faults`.
  Status start_capture(const std::string& port, const std::string& path) override;
  Status stop_capture(const std::string& port, std::uint64_t* frames) override;

  Snapshot snapshot() const;

  struct Impl;

 private:
  explicit Switch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// DPDK telemetry commands /treeduce/stats, /treeduce/ports, /treeduce/trees, /treeduce/tree,<id>
/// over `sw`'s snapshots, registered at the first call after rte_eal_init(). Call with nullptr
/// before the switch goes away: it waits for a command that is reading it.
void register_telemetry(const Switch* sw);

}  // namespace treeduce::switchd
