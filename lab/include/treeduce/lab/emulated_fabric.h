// The emulated fabric of the integration tests, the main job and the allreduce benchmark: two
// leaf switches and a spine (treeduce-switch processes, memif between them), four hosts in their
// own network namespaces on veth pairs to the leaves' net_af_packet ports, and optionally a
// treeduce-manager. The switches and the manager run in the calling process's namespace, so they
// meet on 127.0.0.1; hosts reach their leaf by ARP through a default route.
//
//   two_level:  h0 h1 -- leaf0 (10.0.0.1) --memif--+
//                                                  spine (10.0.0.3)
//               h2 h3 -- leaf1 (10.0.0.2) --memif--+
//
//   one_leaf:   h0 h1 h2 h3 -- leaf0 (10.0.0.1)   (the tree a 4-host job gets under one ToR)
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "treeduce/lab/netns.h"

namespace treeduce::lab {

enum class FabricShape { two_level, one_leaf };
/// How the host ranks reach their leaf: kernel UDP sockets over a veth pair to the leaf's
/// net_af_packet port; libtreeduce's AF_XDP transport on that same veth (its XDP program on the
/// host's end, the kernel keeping ARP; every shape); or libtreeduce's DPDK transport on a memif
/// link (kernel bypass, as RDMA hosts do; only with one_leaf).
enum class HostTransport { udp, dpdk, af_xdp };

struct FabricOptions {
  std::string switch_bin;       ///< treeduce-switch
  std::string manager_bin;      ///< treeduce-manager; empty: static trees in the switches' configs
  double leaf_uplink_loss = 0;  ///< rx_loss on each leaf's memif port (RESULTs coming down)
  double spine_loss = 0;        ///< rx_loss on the spine's memif ports (partials going up)
  double host_port_loss = 0;    ///< rx_loss on the leaves' host ports (CONTRIBs from hosts)
  FabricShape shape = FabricShape::two_level;
  /// MTU of every data link (the hosts' veth pairs, the switches' af_packet and memif ports):
  /// above 1500 a treeduce payload of up to 8 KiB fits in one frame. At most 8400 (the
  /// switch's af_packet ring frames are as large as its mbufs).
  int mtu = 1500;
  HostTransport host_transport = HostTransport::udp;
  /// The leaves' ports to the hosts' veths are net_af_xdp (an AF_XDP socket on the veth, native
  /// XDP in copy mode) instead of net_af_packet. Its UMEM frames are a page without hugepages,
  /// so the MTU is at most 3442 with 4 KiB pages (the switch refuses a larger one, naming the
  /// limit).
  bool switch_af_xdp = false;
  /// Kernel UDP hosts send with UDP GSO (TREEDUCE_UDP_GSO=1), their veth segmenting in software
  /// as a NIC with USO would in hardware. Ignored for the other transports.
  bool host_gso = false;
  /// DPDK hosts' memif ports in DPDK's zero-copy mode (client `zero-copy=yes`, the EAL with
  /// --single-file-segments): the switch reads and writes the ranks' own mbufs (docs/host.md,
  /// "Transports"); the ranks' transport then copies payloads on TX.
  bool host_memif_zero_copy = false;
  /// The window and payload each rank asks the manager for (TREEDUCE_SLOTS,
  /// TREEDUCE_PAYLOAD_BYTES); 0 = libtreeduce's defaults.
  std::uint32_t slots = 0;
  std::uint32_t payload_bytes = 0;
  /// The ranks' first retransmission timeout (TREEDUCE_RTO_US); 0 = libtreeduce's (adaptive).
  std::uint32_t rto_us = 0;
  /// Static trees only (with a manager, the job asks for it).
  bool deterministic = false;
  /// Datapath lcores of each switch (both ends of a memif link need the same number of queues).
  int lcores = 1;
  /// idle_sleep_us of the switches: they share the machine with the hosts.
  int idle_sleep_us = 200;
  /// idle_yield_us of the switches: how long an idle lcore yields its CPU before it sleeps.
  int idle_yield_us = 1000;
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

/// The EAL arguments of a lab switch without hugepages or PCI: `bin`, `-m mem_mb`, its own
/// `--file-prefix`, `lcores` lcores floating over CPUs 0-1 (switches and hosts share a small
/// machine). The vdevs, `--` and treeduce's own arguments go after them. Shared by Fabric and
/// `treeduce lab` (lab_cli.h).
std::vector<std::string> switch_eal_argv(const std::string& bin, const std::string& file_prefix,
                                         int mem_mb, int lcores);
/// `--vdev=` of a net_af_packet port named `port` on interface `iface`, with `qpairs` queue pairs
/// and ring frames that hold `mtu`.
std::string af_packet_vdev(const std::string& port, const std::string& iface, int qpairs, int mtu);
/// `--vdev=` of a net_af_xdp port named `port` on interface `iface`: its queue 0 (a veth has one
/// unless made with more, and a switch's lcores share it). The switch gives it page-sized UMEM
/// frames, so it carries an MTU of at most 3442 with 4 KiB pages (the switch says so otherwise).
std::string af_xdp_vdev(const std::string& port, const std::string& iface);
/// True when a switch's log says DPDK refused its af_packet port's PACKET_FANOUT group (another
/// switch of the namespace has it): a new process, with a new pid, gets another group.
bool packet_fanout_lost(const std::string& log);

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
  /// Kills switch i (SIGKILL) and starts it again with the same arguments, waiting until it is
  /// ready; "" or what went wrong. switches()[i] is then the new process.
  std::string restart_switch(std::size_t i);

  static std::string host_ip(int h) { return "10.1." + std::to_string(h) + ".1"; }
  /// Host h's address on the management network.
  static std::string host_mgmt_ip(int h) { return "198.18.255." + std::to_string(10 + h); }
  /// Host h's leaf in the two-level shape (in one_leaf it is always 10.0.0.1:47110).
  static std::string leaf_address(int h) {
    return "10.0.0." + std::to_string(h / 2 + 1) + ":47110";
  }
  /// The topology the manager knows (docs/manager.md format): hosts h0..h3.
  static std::string topology_yaml(FabricShape shape = FabricShape::two_level);
  const std::string& host_netns(int h) const { return hosts_.at(static_cast<std::size_t>(h)); }
  /// "address:port" of the manager ("" without one): 127.0.0.1, or the management bridge's.
  std::string manager_address() const;
  /// `env VAR=... ` for host h's rank of `job` under libtreeduce: the manager, the rank, its data
  /// address and port, the host-side fallback's store and management address. Put the program
  /// and its arguments after it and spawn it in host_netns(h).
  std::vector<std::string> rank_env(int h, const std::string& job) const;
  /// leaf0, leaf1, spine (two_level) or leaf0 (one_leaf).
  const std::vector<Proc*>& switches() const { return switches_; }
  /// Where switch i writes its final counters (Prometheus text) when it stops.
  std::string final_stats(std::size_t i) const;

 private:
  Proc& start_switch(const std::string& name, const std::string& cfg,
                     const std::vector<std::string>& vdevs);
  /// Waits for switch *p's "ready" line, starting it again when DPDK refused its af_packet
  /// port's PACKET_FANOUT group (*p then points at the new process); "" or what went wrong.
  std::string wait_ready(Proc** p);
  std::string start_manager(const std::string& listen);
  std::string start_two_level(bool static_trees);
  std::string start_one_leaf(bool static_trees);
  std::string host_port_name(int index) const;  ///< a leaf's port to a host, by its index there
  std::string host_port_vdev(int index, int h) const;  ///< its `--vdev=`, to host h's veth
  /// The memif vdev arguments of a host's link to the leaf, both ends (after id=).
  std::string host_memif_args() const;
  static std::string host_mac(int h) { return "02:7d:00:00:01:0" + std::to_string(h); }
  static std::string leaf_port_mac(int h) { return "02:7d:00:00:00:0" + std::to_string(h); }
  std::string port_if(int h) const { return lab_.prefix() + "p" + std::to_string(h); }

  Lab& lab_;
  FabricOptions opt_;
  std::vector<std::string> hosts_;
  std::vector<Proc*> switches_;
  std::map<const Proc*, std::vector<std::string>> switch_argv_;  // to start one again
  Proc* manager_ = nullptr;
  std::string manager_ip_ = "127.0.0.1";
  int manager_port_ = 0;
};

}  // namespace treeduce::lab
