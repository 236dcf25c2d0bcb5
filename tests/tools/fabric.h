// The emulated fabric of the integration tests and of the main job: two leaf switches and a
// spine (treeduce-switch processes, memif between them), four hosts in their own network
// namespaces on veth pairs to the leaves' net_af_packet ports, and optionally a treeduce-manager.
// The switches and the manager run in the calling process's namespace, so they meet on
// 127.0.0.1; hosts reach their leaf by ARP through a default route.
//
//   h0 h1 -- leaf0 (10.0.0.1) --memif--+
//                                      spine (10.0.0.3)
//   h2 h3 -- leaf1 (10.0.0.2) --memif--+
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lab.h"

namespace treeduce::testing {

struct FabricOptions {
  std::string switch_bin;       ///< treeduce-switch
  std::string manager_bin;      ///< treeduce-manager; empty: static trees in the switches' configs
  double leaf_uplink_loss = 0;  ///< rx_loss on each leaf's memif port (RESULTs coming down)
  double spine_loss = 0;        ///< rx_loss on the spine's memif ports (partials going up)
  double host_port_loss = 0;    ///< rx_loss on the leaves' host ports (CONTRIBs from hosts)
  /// Static trees only (with a manager, the job asks for it).
  bool deterministic = false;
  /// Datapath lcores of each switch (both ends of a memif link need the same number of queues).
  int lcores = 1;
  /// idle_sleep_us of the switches: they share the machine with the hosts.
  int idle_sleep_us = 200;
  /// A management network: a bridge in this namespace (198.18.255.1/24, RFC 2544's benchmarking
  /// range) with every host on it (198.18.255.10+h) through a second veth pair, so that the
  /// hosts' libtreeduce reaches the manager and host-side reduction has a network. The manager
  /// then listens on the bridge's address.
  bool management_network = false;
  /// The manager keeps its state in a SQLite file (--db), so that restart_manager() restores it.
  bool manager_db = false;
  /// The manager's rank lease: a job whose ranks stop heartbeating loses its tree after it.
  std::uint32_t rank_lease_ms = 5000;
};

/// Tree 1 of the static configuration.
inline constexpr std::uint64_t kStaticKey = 0x7d0c0ffee1234567ull;
inline constexpr std::uint32_t kStaticSlots = 16;
inline constexpr std::uint32_t kStaticPayload = 1024;
inline constexpr std::uint16_t kHostPort = 50000;

class Fabric {
 public:
  static constexpr int kHosts = 4;
  Fabric(Lab& lab, const FabricOptions& opt) : lab_(lab), opt_(opt) {}

  /// Brings everything up and waits until every process is ready; "" or what went wrong (with
  /// the failing process's log).
  std::string up();
  /// Stops the switches (SIGTERM) and the manager; the switches' exit statuses, in switches()
  /// order. Their final counters are in final_stats(i).
  std::vector<int> stop();
  /// Kills the manager (SIGKILL) and starts it again on the same address; "" or what went wrong.
  std::string restart_manager();

  static std::string host_ip(int h) { return "10.1." + std::to_string(h) + ".1"; }
  /// Host h's address on the management network.
  static std::string host_mgmt_ip(int h) { return "198.18.255." + std::to_string(10 + h); }
  static std::string leaf_address(int h) {
    return "10.0.0." + std::to_string(h / 2 + 1) + ":47110";
  }
  /// The topology the manager knows (docs/manager.md format): hosts h0..h3.
  static std::string topology_yaml();
  const std::string& host_netns(int h) const { return hosts_.at(static_cast<std::size_t>(h)); }
  /// "address:port" of the manager ("" without one): 127.0.0.1, or the management bridge's.
  std::string manager_address() const;
  /// `env VAR=... ` for host h's rank of `job` under libtreeduce: the manager, the rank, its data
  /// address and port, the host-side fallback's store and management address. Put the program
  /// and its arguments after it and spawn it in host_netns(h).
  std::vector<std::string> rank_env(int h, const std::string& job) const;
  /// leaf0, leaf1, spine.
  const std::vector<Proc*>& switches() const { return switches_; }
  /// Where switch i writes its final counters (Prometheus text) when it stops.
  std::string final_stats(std::size_t i) const;

 private:
  Proc& start_switch(const std::string& name, const std::string& cfg,
                     const std::vector<std::string>& vdevs);
  std::string start_manager(const std::string& listen);
  std::string port_if(int h) const { return lab_.prefix() + "p" + std::to_string(h); }

  Lab& lab_;
  FabricOptions opt_;
  std::vector<std::string> hosts_;
  std::vector<Proc*> switches_;
  Proc* manager_ = nullptr;
  std::string manager_ip_ = "127.0.0.1";
  int manager_port_ = 0;
};

}  // namespace treeduce::testing
