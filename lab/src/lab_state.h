// What a lab made, as its state file (<root>/<name>/state.json) records it: every process with
// its command line and start time, every namespace and root-namespace interface, the switches,
// hosts and links. Written before each thing is made, so that `lab down` can undo a lab whatever
// happened to it since (its processes killed with -9, `lab up` itself killed half-way).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace treeduce::lab {

/// A detached process of the lab. It is ours only while /proc/<pid>/cmdline is `argv` and its
/// start time (clock ticks after boot, /proc/<pid>/stat field 22) is `start`: a recycled pid is
/// never signalled.
struct ProcRec {
  std::string role;  ///< manager, switch
  std::string name;
  pid_t pid = -1;
  std::vector<std::string> argv;
  unsigned long long start = 0;
  std::string log;
};

struct HostRec {
  std::string name;
  std::string ns;         ///< network namespace
  std::string ip;         ///< data address (the topology's)
  std::string mgmt_ip;    ///< on the lab's management bridge
  std::string leaf;       ///< leaf switch
  std::string leaf_data;  ///< leaf's data address, "a.b.c.d:port"
  std::string port_if;    ///< the veth end in the root namespace that the leaf's af_packet reads
  std::string mgmt_if;    ///< the veth end on the bridge
};

struct PortRec {
  std::string name;  ///< DPDK port name: net_af_packet<i>, net_memif<i>
  std::string peer;  ///< a host's name, or "switch:port"
};

struct SwitchRec {
  std::string name;
  int level = 0;
  std::string data;
  int metrics_port = 0;
  std::vector<PortRec> ports;
};

struct LinkRec {
  std::string a, a_port, b, b_port;  ///< b is the memif server (the upper level)
};

/// A fault set with `treeduce lab fault` on one switch port (the port's whole fault state, as
/// SetPortFault takes it; its rx_loss starts from `lab up --loss`). Reapplied when the switch is
/// restarted; removed when back to the base (no fault but up's --loss).
struct FaultRec {
  std::string sw;    ///< switch
  std::string port;  ///< its DPDK port name
  double rx_loss = 0;
  bool down = false;
  std::uint32_t delay_us = 0;
  std::uint32_t rate_mbps = 0;
};

struct State {
  std::string name;
  int slot = -1;      ///< management subnet 198.19.<slot>.0/24 and interface prefix tl<slot>
  std::string phase;  ///< starting, up
  pid_t up_pid = -1;  ///< the `lab up` that is making it (while phase is starting)
  unsigned long long up_start = 0;
  int mtu = 1500;
  double base_loss = 0;  ///< `lab up --loss`: rx_loss of every switch port when no fault is set
  std::string bridge;
  std::string mgmt_ip;
  std::string manager;  ///< "a.b.c.d:port" once the manager listens
  double up_seconds = 0;
  std::vector<std::string> namespaces;
  std::vector<std::string> links;          ///< interfaces of the root namespace (veth ends)
  std::vector<std::string> dpdk_prefixes;  ///< EAL --file-prefix of each switch
  std::vector<std::string> sockets;        ///< memif socket files (in the state directory)
  std::vector<ProcRec> procs;
  std::vector<HostRec> hosts;
  std::vector<SwitchRec> switches;
  std::vector<LinkRec> switch_links;
  std::vector<FaultRec> faults;  ///< ports with a fault set (never one equal to the base)
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ProcRec, role, name, pid, argv, start, log)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(HostRec, name, ns, ip, mgmt_ip, leaf, leaf_data,
                                                port_if, mgmt_if)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PortRec, name, peer)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SwitchRec, name, level, data, metrics_port, ports)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(LinkRec, a, a_port, b, b_port)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(FaultRec, sw, port, rx_loss, down, delay_us,
                                                rate_mbps)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(State, name, slot, phase, up_pid, up_start, mtu,
                                                base_loss, bridge, mgmt_ip, manager, up_seconds,
                                                namespaces, links, dpdk_prefixes, sockets, procs,
                                                hosts, switches, switch_links, faults)

}  // namespace treeduce::lab
