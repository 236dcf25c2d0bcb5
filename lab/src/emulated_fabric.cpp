#include "treeduce/lab/emulated_fabric.h"

#include <signal.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace treeduce::lab {

namespace {

std::string tree_yaml(const std::string& role, const std::string& parent, int index,
                      const std::vector<std::pair<std::string, int>>& children, bool det) {
  std::ostringstream y;
  y << "trees:\n  - tree: 1\n    job: fabric-test\n    key: " << kStaticKey
    << "\n    role: " << role << "\n";
  if (!parent.empty()) y << "    parent: " << parent << "\n    index_at_parent: " << index << "\n";
  y << "    children:\n";
  for (const auto& [addr, hosts] : children) {
    y << "      - {addr: " << addr << ", hosts: " << hosts << "}\n";
  }
  y << "    slots: " << kStaticSlots << "\n    payload_bytes: " << kStaticPayload
    << "\n    deterministic: " << (det ? "true" : "false") << "\n";
  return y.str();
}

std::string port_yaml(const std::string& name, const std::string& ip, double loss, int mtu) {
  std::ostringstream y;
  y << "  - {name: " << name << ", ip: " << ip;
  if (mtu != 1500) y << ", mtu: " << mtu;
  if (loss > 0) y << ", rx_loss: " << loss;
  y << "}\n";
  return y.str();
}

}  // namespace

std::vector<std::string> switch_eal_argv(const std::string& bin, const std::string& file_prefix,
                                         int mem_mb, int lcores) {
  // Lcores that float over both CPUs: three switches and four hosts share a 2-core machine.
  std::string lc = "--lcores=";
  for (int i = 0; i < lcores; ++i) lc += (i ? "," : "") + std::to_string(i) + "@(0-1)";
  return {bin,        "--no-huge",
          "-m",       std::to_string(mem_mb),
          "--no-pci", "--file-prefix=" + file_prefix,
          lc,         "--log-level=lib.eal:warning"};
}

std::string af_packet_vdev(const std::string& port, const std::string& iface, int qpairs, int mtu) {
  std::string v = "--vdev=" + port + ",iface=" + iface + ",qpairs=" + std::to_string(qpairs);
  // The kernel copies each frame into one ring frame, and the PMD copies a ring frame into one
  // mbuf: ring frames as large as the switch's mbuf data room allows (8448 bytes + the PMD's
  // 32-byte header), which holds MTU 8400. The PMD walks its ring at framesz strides, so a block
  // must hold a whole number of frames: 128 of them make it a whole number of pages too.
  if (mtu > 1500) v += ",framesz=8480,blocksz=1085440,framecnt=512";
  return v;
}

std::string af_xdp_vdev(const std::string& port, const std::string& iface) {
  return "--vdev=" + port + ",iface=" + iface + ",start_queue=0,queue_count=1";
}

bool packet_fanout_lost(const std::string& log) {
  return log.find("could not set PACKET_FANOUT") != std::string::npos;
}

std::string Fabric::topology_yaml(FabricShape shape) {
  std::ostringstream y;
  y << "switches:\n";
  if (shape == FabricShape::one_leaf) {
    y << "  - {name: leaf0, level: 0, data: \"10.0.0.1:47110\", profile: server, ports: " << kHosts
      << "}\nhosts:\n";
    for (int h = 0; h < kHosts; ++h) {
      y << "  - {name: h" << h << ", address: " << host_ip(h) << ", switch: leaf0, port: " << h + 1
        << "}\n";
    }
    return y.str();
  }
  for (int l = 0; l < 2; ++l) {
    y << "  - {name: leaf" << l << ", level: 0, data: \"10.0.0." << l + 1
      << ":47110\", profile: server, ports: 3}\n";
  }
  y << "  - {name: spine, level: 1, data: \"10.0.0.3:47110\", profile: server, ports: 2}\n"
    << "hosts:\n";
  for (int h = 0; h < kHosts; ++h) {
    y << "  - {name: h" << h << ", address: " << host_ip(h) << ", switch: leaf" << h / 2
      << ", port: " << h % 2 + 1 << "}\n";
  }
  y << "links:\n";
  for (int l = 0; l < 2; ++l) {
    y << "  - {a: leaf" << l << ", a_port: 3, b: spine, b_port: " << l + 1 << "}\n";
  }
  return y.str();
}

std::string Fabric::manager_address() const {
  return manager_ == nullptr ? "" : manager_ip_ + ":" + std::to_string(manager_port_);
}

std::vector<std::string> Fabric::rank_env(int h, const std::string& job) const {
  std::vector<std::string> env = {
      "env", "TREEDUCE_MANAGER=" + manager_address(),
      // The emulated fabric's control plane is plain gRPC (the
      // `treeduce lab` one is mutual TLS).
      "TREEDUCE_INSECURE=1", "TREEDUCE_JOB=" + job, "TREEDUCE_RANK=" + std::to_string(h),
      "TREEDUCE_WORLD_SIZE=" + std::to_string(kHosts), "TREEDUCE_HOST=" + host_ip(h),
      "TREEDUCE_BIND=" + host_ip(h), "TREEDUCE_PORT=" + std::to_string(kHostPort),
      "TREEDUCE_FALLBACK_STORE=" + lab_.dir() + "/gloo-" + job,
      "TREEDUCE_FALLBACK_ADDRESS=" + host_mgmt_ip(h)};
  if (opt_.slots != 0) env.push_back("TREEDUCE_SLOTS=" + std::to_string(opt_.slots));
  if (opt_.payload_bytes != 0) {
    env.push_back("TREEDUCE_PAYLOAD_BYTES=" + std::to_string(opt_.payload_bytes));
  }
  if (opt_.rto_us != 0) env.push_back("TREEDUCE_RTO_US=" + std::to_string(opt_.rto_us));
  if (opt_.host_transport == HostTransport::dpdk) {
    // The library starts the EAL itself (TREEDUCE_DPDK_EAL): a memif client of the leaf's port h,
    // no hugepages, its own file prefix. No ARP on this transport: both MACs are given. memif's
    // zero-copy client shares the EAL's memory with the switch: it needs that memory in one
    // file per segment list (--single-file-segments; --no-huge memory is then a memfd).
    env.push_back("TREEDUCE_TRANSPORT=dpdk");
    env.push_back("TREEDUCE_DPDK_EAL=--no-huge -m 128 --no-pci --no-telemetry --file-prefix=" +
                  lab_.prefix() + "rank" + std::to_string(h) + " --log-level=lib.eal:warning " +
                  (opt_.host_memif_zero_copy ? "--single-file-segments " : "") +
                  "--vdev=net_memif0,role=client,id=" + std::to_string(h) + host_memif_args() +
                  (opt_.host_memif_zero_copy ? ",zero-copy=yes" : ""));
    env.push_back("TREEDUCE_DPDK_PORT=net_memif0");
    env.push_back("TREEDUCE_LOCAL_MAC=" + host_mac(h));
    env.push_back("TREEDUCE_LEAF_MAC=" + leaf_port_mac(h));
  } else if (opt_.host_transport == HostTransport::af_xdp) {
    // An AF_XDP socket on eth0, the interface of the route to the leaf; the kernel answers ARP
    // and carries the management traffic beside it (docs/host.md, "Transports"). Above an MTU
    // of about a page the transport loads its program with multi-buffer frames (frags), which
    // native XDP on veth then accepts: nothing to set on the veths.
    env.push_back("TREEDUCE_TRANSPORT=af_xdp");
  } else if (opt_.host_gso) {
    env.push_back("TREEDUCE_UDP_GSO=1");
  }
  return env;
}

std::string Fabric::final_stats(std::size_t i) const {
  return lab_.dir() + "/" + switches_.at(i)->name + ".prom";
}

std::string Fabric::up() {
  for (int h = 0; h < kHosts; ++h) {
    hosts_.push_back(lab_.netns("h" + std::to_string(h)));
    if (!lab_.veth(hosts_.back(), "eth0", "", port_if(h))) return "cannot create veth pairs.";
    const std::string gw = "10.1." + std::to_string(h) + ".254";
    if (lab_.in(hosts_.back(), "ip addr add " + host_ip(h) + "/24 dev eth0") != 0 ||
        lab_.in(hosts_.back(), "ip route add default via " + gw) != 0) {
      return "cannot address host " + std::to_string(h) + ".";
    }
    // Both ends: a veth drops what is longer than its peer's MTU.
    if (opt_.mtu != 1500 &&
        (lab_.in(hosts_.back(), "ip link set eth0 mtu " + std::to_string(opt_.mtu)) != 0 ||
         lab_.in("", "ip link set " + port_if(h) + " mtu " + std::to_string(opt_.mtu)) != 0)) {
      return "cannot set host " + std::to_string(h) + "'s MTU to " + std::to_string(opt_.mtu) + ".";
    }
  }
  // A NIC with UDP segmentation offload cuts a GSO send into frames; a veth passes the super-
  // frame on whole (and the leaf's af_packet ring would truncate it): segment in software.
  if (opt_.host_gso && opt_.host_transport == HostTransport::udp) {
    for (const std::string& ns : hosts_) {
      if (lab_.in(ns, "ethtool -K eth0 tx-udp-segmentation off") != 0) {
        return "cannot turn UDP segmentation offload off on a host's veth (is ethtool installed?).";
      }
    }
  }
  if (opt_.management_network) {
    const std::string br = lab_.prefix() + "mb";
    manager_ip_ = "198.18.255.1";
    // Two bridges with this address (another fabric running) would make the hosts' management
    // traffic go astray, and MPI and Gloo fail in ways that do not say why.
    if (lab_.in("", "ip -o -4 addr show | grep -q ' 198\\.18\\.255\\.1/'") == 0) {
      return "198.18.255.1, the management network's address, is already on an interface of this "
             "machine (`ip -o addr | grep 198.18.255.1`): is another treeduce fabric running?";
    }
    if (!lab_.bridge(br, manager_ip_ + "/24")) return "cannot create the management bridge.";
    for (int h = 0; h < kHosts; ++h) {
      const std::string end = lab_.prefix() + "m" + std::to_string(h);
      if (!lab_.veth(hosts_[static_cast<std::size_t>(h)], "mgmt0", "", end) ||
          !lab_.attach(end, br) ||
          lab_.in(hosts_[static_cast<std::size_t>(h)],
                  "ip addr add " + host_mgmt_ip(h) + "/24 dev mgmt0") != 0) {
        return "cannot attach host " + std::to_string(h) + " to the management network.";
      }
    }
  }
  if (!opt_.manager_bin.empty()) {
    if (std::string e = start_manager(manager_ip_ + ":0"); !e.empty()) return e;
  }
  const bool static_trees = manager_ == nullptr;
  if (opt_.host_transport == HostTransport::dpdk && opt_.shape != FabricShape::one_leaf) {
    return "DPDK hosts are only wired in the one-leaf fabric.";
  }
  if (std::string e = opt_.shape == FabricShape::one_leaf ? start_one_leaf(static_trees)
                                                          : start_two_level(static_trees);
      !e.empty()) {
    return e;
  }
  for (Proc*& p : switches_) {
    if (std::string e = wait_ready(&p); !e.empty()) return e;
  }
  return "";
}

std::string Fabric::wait_ready(Proc** p) {
  // DPDK 22.11's af_packet PMD puts a port's sockets in PACKET_FANOUT group (pid XOR ifindex)
  // & 0xffff. Two switches in one network namespace, started one after the other, have close
  // pids and close ifindexes, so their XORs meet more often than chance would say; the kernel
  // then refuses the second switch's group (EINVAL: one group, two interfaces), its port is not
  // probed and it exits. A new process has a new pid: start it again, up to 3 times.
  for (int attempt = 0;; ++attempt) {
    if (lab_.wait_log(**p, " ready: ", std::chrono::seconds(30))) return "";
    const std::string log = Lab::read_log(**p);
    if (attempt == 3 || !(*p)->done || !packet_fanout_lost(log)) {
      return (*p)->name + " did not start:\n" + log;
    }
    std::fprintf(stderr, "fabric: %s lost a PACKET_FANOUT group to another switch; again\n",
                 (*p)->name.c_str());
    const std::vector<std::string> argv = switch_argv_.at(*p);
    *p = &lab_.spawn((*p)->name, "", argv);
    switch_argv_[*p] = argv;
  }
}

std::string Fabric::host_port_name(int index) const {
  return (opt_.switch_af_xdp ? "net_af_xdp" : "net_af_packet") + std::to_string(index);
}

std::string Fabric::host_port_vdev(int index, int h) const {
  if (opt_.switch_af_xdp) return lab::af_xdp_vdev(host_port_name(index), port_if(h));
  return lab::af_packet_vdev(host_port_name(index), port_if(h), opt_.lcores, opt_.mtu);
}

std::string Fabric::host_memif_args() const {
  // The socket is a file: an abstract one (memif's default) lives in one network namespace. 256
  // descriptors hold a 64-slot window with room, and are few enough that every buffer has been
  // touched (page-faulted) after the first few operations; with jumbo frames each holds a whole
  // frame.
  return ",socket=" + lab_.dir() + "/hosts.sock,socket-abstract=no,rsize=8" +
         (opt_.mtu > 1500 ? ",bsize=16384" : "");
}

std::string Fabric::start_one_leaf(bool static_trees) {
  std::ostringstream y;
  y << "name: leaf0\ndata: 10.0.0.1:47110\nports:\n";
  std::vector<std::string> vdevs;
  std::vector<std::pair<std::string, int>> children;
  const bool dpdk = opt_.host_transport == HostTransport::dpdk;
  for (int h = 0; h < kHosts; ++h) {
    const std::string ip = "10.1." + std::to_string(h) + ".254/24";
    if (dpdk) {
      // The leaf serves every host's memif link on one socket, told apart by id.
      y << "  - {name: net_memif" << h << ", ip: " << ip << ", mac: \"" << leaf_port_mac(h)
        << "\", mtu: " << opt_.mtu
        << (opt_.host_port_loss > 0 ? ", rx_loss: " + std::to_string(opt_.host_port_loss)
                                    : std::string())
        << "}\n";
      vdevs.push_back("--vdev=net_memif" + std::to_string(h) +
                      ",role=server,id=" + std::to_string(h) + host_memif_args());
    } else {
      y << port_yaml(host_port_name(h), ip, opt_.host_port_loss, opt_.mtu);
      vdevs.push_back(host_port_vdev(h, h));
    }
    children.push_back({host_ip(h) + ":" + std::to_string(kHostPort), 1});
  }
  if (dpdk) {
    // The DPDK hosts answer no ARP.
    y << "neighbors:\n";
    for (int h = 0; h < kHosts; ++h) {
      y << "  - {ip: " << host_ip(h) << ", mac: \"" << host_mac(h) << "\", port: net_memif" << h
        << "}\n";
    }
  }
  y << "seed: 11\n";
  if (static_trees) y << tree_yaml("root", "", 0, children, opt_.deterministic);
  switches_.push_back(&start_switch("leaf0", lab_.write("leaf0.yaml", y.str()), vdevs));
  return "";
}

std::string Fabric::start_two_level(bool static_trees) {
  const std::string d = lab_.dir();
  const std::string spine_data = "10.0.0.3:47110";
  // memif buffers hold a whole jumbo frame (no chained buffers through the ring).
  const std::string bsize = opt_.mtu > 1500 ? ",bsize=16384" : "";
  // The spine first, and ready (its ports started) before the leaves connect: DPDK's memif
  // server listens from the EAL's start but refuses a client ("ID not found") until its port is
  // started, and a refused client only comes back when its switch restarts the port (after
  // 500 ms down, docs/switch.md "Links"). Starting in order keeps the fabric's start fast.
  std::ostringstream ys;
  ys << "name: spine\ndata: " << spine_data << "\nports:\n"
     << port_yaml("net_memif0", "10.2.0.2/30", opt_.spine_loss, opt_.mtu)
     << port_yaml("net_memif1", "10.2.1.2/30", opt_.spine_loss, opt_.mtu) << "seed: 13\n";
  if (static_trees) {
    ys << tree_yaml("root", "", 0, {{"10.0.0.1:47110", 2}, {"10.0.0.2:47110", 2}},
                    opt_.deterministic);
  }
  // The spine serves both memif links on one socket, told apart by id.
  Proc* spine =
      &start_switch("spine", lab_.write("spine.yaml", ys.str()),
                    {"--vdev=net_memif0,role=server,id=0,socket=" + d + "/memif.sock" + bsize,
                     "--vdev=net_memif1,role=server,id=1,socket=" + d + "/memif.sock" + bsize});
  if (std::string e = wait_ready(&spine); !e.empty()) return e;
  for (int l = 0; l < 2; ++l) {
    std::ostringstream y;
    y << "name: leaf" << l << "\ndata: 10.0.0." << l + 1 << ":47110\nports:\n"
      << port_yaml(host_port_name(0), "10.1." + std::to_string(2 * l) + ".254/24",
                   opt_.host_port_loss, opt_.mtu)
      << port_yaml(host_port_name(1), "10.1." + std::to_string(2 * l + 1) + ".254/24",
                   opt_.host_port_loss, opt_.mtu)
      << port_yaml("net_memif0", "10.2." + std::to_string(l) + ".1/30", opt_.leaf_uplink_loss,
                   opt_.mtu)
      << "seed: " << 11 + l << "\n";
    if (static_trees) {
      const std::string port = ":" + std::to_string(kHostPort);
      y << tree_yaml("leaf", spine_data, l,
                     {{host_ip(2 * l) + port, 1}, {host_ip(2 * l + 1) + port, 1}},
                     opt_.deterministic);
    }
    const std::string cfg = lab_.write("leaf" + std::to_string(l) + ".yaml", y.str());
    switches_.push_back(&start_switch("leaf" + std::to_string(l), cfg,
                                      {host_port_vdev(0, 2 * l), host_port_vdev(1, 2 * l + 1),
                                       "--vdev=net_memif0,role=client,id=" + std::to_string(l) +
                                           ",socket=" + d + "/memif.sock" + bsize}));
  }
  switches_.push_back(spine);  // switches_ is leaf0, leaf1, spine
  return "";
}

std::string Fabric::start_manager(const std::string& listen) {
  const std::string topo = lab_.write("topology.yaml", topology_yaml(opt_.shape));
  const std::string port_file = lab_.dir() + "/manager.port";
  std::remove(port_file.c_str());
  std::vector<std::string> argv = {opt_.manager_bin,
                                   "-t",
                                   topo,
                                   "-l",
                                   listen,
                                   "--port-file",
                                   port_file,
                                   "--insecure",
                                   "--lease-ms",
                                   std::to_string(opt_.rank_lease_ms),
                                   "--switch-lease-ms",
                                   "5000"};
  if (opt_.manager_db) {
    argv.push_back("--db");
    argv.push_back(lab_.dir() + "/manager.db");
  }
  manager_ = &lab_.spawn("manager", "", argv);
  if (!lab_.wait_log(*manager_, "listening on port", std::chrono::seconds(20))) {
    return "the manager did not start:\n" + Lab::read_log(*manager_);
  }
  std::ifstream(port_file) >> manager_port_;
  return "";
}

std::string Fabric::restart_manager() {
  if (manager_ == nullptr) return "there is no manager.";
  kill(manager_->pid, SIGKILL);
  lab_.wait(*manager_, std::chrono::seconds(5));
  return start_manager(manager_address());
}

std::string Fabric::restart_switch(std::size_t i) {
  Proc* p = switches_.at(i);
  kill(p->pid, SIGKILL);
  lab_.wait(*p, std::chrono::seconds(5));
  const std::vector<std::string> argv = switch_argv_.at(p);
  p = &lab_.spawn(p->name, "", argv);
  switch_argv_[p] = argv;
  if (std::string e = wait_ready(&p); !e.empty()) return e;
  switches_[i] = p;
  return "";
}

Proc& Fabric::start_switch(const std::string& name, const std::string& cfg,
                           const std::vector<std::string>& vdevs) {
  std::vector<std::string> argv =
      switch_eal_argv(opt_.switch_bin, lab_.prefix() + name, 256, opt_.lcores);
  argv.insert(argv.end(), vdevs.begin(), vdevs.end());
  for (const std::string& a :
       {std::string("--"), std::string("--config"), cfg, std::string("--idle-sleep-us"),
        std::to_string(opt_.idle_sleep_us), std::string("--idle-yield-us"),
        std::to_string(opt_.idle_yield_us), std::string("--metrics"), std::string("127.0.0.1:0"),
        std::string("--final-stats"), lab_.dir() + "/" + name + ".prom",
        // A lab's switches take faults at run time (SetPortFault, `treeduce lab fault`).
        std::string("--faults"), std::string("true"),
        // Plain gRPC to the manager and at the agent (the test fabric's own choice).
        std::string("--insecure")}) {
    argv.push_back(a);
  }
  if (manager_ != nullptr) {
    for (const std::string& a : {std::string("--manager"), manager_address(),
                                 std::string("--heartbeat-ms"), std::string("200")}) {
      argv.push_back(a);
    }
  }
  Proc& p = lab_.spawn(name, "", argv);
  switch_argv_[&p] = argv;
  return p;
}

std::vector<int> Fabric::stop() {
  std::vector<int> status;
  // 30 s: on a loaded 2-CPU machine closing a switch's af_packet ports (munmap of the rings)
  // has been seen to take seconds, and SIGKILL would fail a test that did nothing wrong.
  for (Proc* p : switches_) status.push_back(lab_.stop(*p, std::chrono::seconds(30)));
  if (manager_ != nullptr) lab_.stop(*manager_);
  return status;
}

}  // namespace treeduce::lab
