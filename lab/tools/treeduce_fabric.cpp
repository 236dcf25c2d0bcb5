// treeduce-fabric: the allreduce benchmark's fabric (scripts/bench.sh); the main job was it before
// it moved to `treeduce lab` (scripts/main.sh).
// Brings up a whole emulated fabric on this machine (a treeduce-manager, treeduce-switch
// processes, four host ranks in their own network namespaces), runs treeduce-perf on the four
// ranks (libtreeduce: the ranks join the job through the manager, which installs the tree on the
// switches), streams rank 0's table as it runs, and tears everything down on success, failure
// and Ctrl-C: no namespace, process, bridge or socket is left behind.
//
// With --compare, treeduce-perf runs Gloo's ring allreduce and/or Open MPI's MPI_Allreduce on the
// same ranks, interleaved with treeduce's (docs/performance.md). Gloo and MPI go over TCP on the
// hosts' management network (veth pairs on a Linux bridge); with mpi the ranks are launched by
// mpirun, whose "rsh agent" enters each host's namespace to start its orted there, on a host
// named after the namespace.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "treeduce/common/cpu_time.h"
#include "treeduce/lab/emulated_fabric.h"

namespace {

using namespace treeduce::lab;

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A word for /bin/sh, quoted.
std::string quoted(const std::string& w) {
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The ranks under mpirun: an rsh agent that starts each "node" (a host namespace) inside that
// namespace, and a per-rank script that picks the rank's libtreeduce environment by namespace.
// Returns mpirun's argv.
std::vector<std::string> mpirun_argv(Lab& lab, const Fabric& fab,
                                     const std::vector<std::string>& perf) {
  // Each node also gets its own host name (a UTS namespace): orteds that all call themselves by
  // the machine's name share one session directory (/tmp/ompi.NAME.UID/...), and two of them
  // starting at once then fail to create it ("File exists") and mpirun gives up on the job.
  const std::string agent = lab.write(
      "rsh-agent.sh",
      "#!/bin/sh\n# mpirun's rsh agent: HOST CMD -> CMD inside network namespace HOST, on a "
      "host named HOST.\nhost=$1; shift\n"
      "exec ip netns exec \"$host\" unshare --uts /bin/sh -c "
      "'hostname \"$1\" && exec /bin/sh -c \"$2\"' rsh-agent \"$host\" \"$*\"\n");
  std::string script = "#!/bin/sh\nns=$(ip netns identify $$)\ncase \"$ns\" in\n";
  std::string hosts;
  for (int h = 0; h < Fabric::kHosts; ++h) {
    script += "  " + fab.host_netns(h) + ") exec";
    for (const std::string& w : fab.rank_env(h, "main")) script += " " + quoted(w);
    script += " " + quoted(TREEDUCE_PERF_BIN) + " \"$@\";;\n";
    hosts += (h ? "," : "") + fab.host_netns(h);
  }
  script += "esac\necho \"rank.sh: not in a host namespace ($ns)\" >&2\nexit 1\n";
  const std::string rank = lab.write("rank.sh", script);
  chmod(agent.c_str(), 0755);
  chmod(rank.c_str(), 0755);
  const std::string mgmt = "198.18.255.0/24";
  std::vector<std::string> argv = {
      "env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1", "mpirun", "-np",
      std::to_string(Fabric::kHosts), "--host", hosts, "--map-by", "node", "--bind-to", "none",
      "--mca", "plm_rsh_agent", agent,
      // Four ranks share two CPUs here: wait by yielding, as Open MPI does by itself when it
      // knows a node is oversubscribed (it cannot: each namespace is a node of one slot).
      "--mca", "mpi_yield_when_idle", "1",
      // The orteds share one machine: hwloc's shared-memory topology segfaults them.
      "--mca", "rtc", "^hwloc",
      // Control and MPI traffic on the management network, TCP only (no shared memory).
      "--mca", "oob_tcp_if_include", mgmt, "--mca", "btl", "tcp,self", "--mca",
      "btl_tcp_if_include", mgmt, "/bin/sh", rank};
  argv.insert(argv.end(), perf.begin(), perf.end());
  return argv;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "treeduce-fabric: an emulated fabric (manager, treeduce-switch processes, 4 host ranks in "
      "network namespaces) running treeduce-perf; the allreduce benchmark's fabric"};
  double loss = 0;
  std::string topology = "two-level", hosts = "udp", switch_ports = "af_packet", json_out;
  std::vector<std::string> baselines;
  FabricOptions fo{TREEDUCE_SWITCH_BIN, TREEDUCE_MANAGER_BIN};
  // Defaults: jumbo frames, the protocol's largest payload, a 64-slot window and GSO, the
  // configuration that is 10x faster than standard frames on this kind of machine
  // (docs/performance.md); --mtu 1500 gives standard frames and 1 KiB payloads.
  fo.mtu = 8300;
  fo.slots = 64;
  fo.host_gso = true;
  // dpdk hosts: memif's zero-copy mode, one copy fewer per byte received (7-15% faster at
  // 1-16 MiB on this machine, and back to back since the ranks' progress threads are lcores:
  // docs/performance.md).
  fo.host_memif_zero_copy = true;
  bool keep_logs = false;
  std::vector<std::string> perf_args = {
      "-b", "4096",    "-e", "4194304", "-f", "8", "-d", "f32,bf16,f16,e4m3,e5m2,i32",
      "-o", "sum,max", "-n", "5",       "-w", "1"};
  app.add_option("--loss", loss, "drop this fraction of the frames every switch port receives")
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--topology", topology, "two-level (2 leaves + spine) or leaf (one switch)")
      ->check(CLI::IsMember({"two-level", "leaf"}))
      ->capture_default_str();
  app.add_option("--hosts", hosts,
                 "udp: kernel sockets on veth to af_packet ports; af_xdp: libtreeduce's AF_XDP "
                 "transport on those veths (when built with it); dpdk: libtreeduce's DPDK "
                 "transport on memif (kernel bypass; leaf only)")
      ->check(CLI::IsMember({"udp", "af_xdp", "dpdk"}))
      ->capture_default_str();
  app.add_option("--mtu", fo.mtu, "MTU of the data links (jumbo: 8300 carries 8 KiB payloads)")
      ->check(CLI::Range(1500, 8400))
      ->capture_default_str();
  // What libtreeduce accepts (docs/host.md), checked here before a fabric is brought up for it.
  const CLI::Validator pow2_or_0(
      [](std::string& v) {
        const unsigned long x = std::strtoul(v.c_str(), nullptr, 10);
        return x == 0 || (x & (x - 1)) == 0 ? std::string() : "must be 0 or a power of two";
      },
      "0 or a power of two");
  app.add_option("--slots", fo.slots, "window each rank asks for (0: libtreeduce's default)")
      ->check(CLI::Range(0, 4096) & pow2_or_0)
      ->capture_default_str();
  app.add_option("--payload", fo.payload_bytes,
                 "payload bytes per packet each rank asks for, 256 to 8192 (default: the "
                 "largest that fits the MTU)")
      ->check(CLI::Range(256, 8192) & pow2_or_0);
  app.add_option("--rto-us", fo.rto_us,
                 "the ranks' first retransmission timeout (0: libtreeduce's, adaptive)")
      ->check(CLI::Range(0, 128000));
  app.add_option("--idle-sleep-us", fo.idle_sleep_us,
                 "the switches' longest idle sleep (0: busy polling; they share the CPUs with "
                 "the ranks)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  app.add_option("--idle-yield-us", fo.idle_yield_us,
                 "how long an idle switch lcore yields its CPU before it starts sleeping (0: "
                 "sleeps at once)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--gso,!--no-gso", fo.host_gso,
               "udp hosts send with UDP GSO, segmented by their veth (default on)");
  app.add_option("--switch-ports", switch_ports,
                 "the leaves' ports to udp and af_xdp hosts' veths: af_packet (DPDK's "
                 "net_af_packet) or af_xdp (net_af_xdp: an AF_XDP socket, MTU at most 3442 with "
                 "4 KiB pages and no hugepages)")
      ->check(CLI::IsMember({"af_packet", "af_xdp"}))
      ->capture_default_str();
  app.add_flag("--memif-zero-copy,!--no-memif-zero-copy", fo.host_memif_zero_copy,
               "dpdk hosts' memif ports in zero-copy mode (the switch reads and writes the ranks' "
               "mbufs; the ranks then copy payloads on TX; default on)");
  app.add_option("--compare", baselines,
                 "also run these on the same ranks, interleaved: gloo (ring), mpi (Open MPI)")
      ->delimiter(',')
      ->check(CLI::IsMember({"gloo", "mpi"}));
  app.add_option("--json-out", json_out, "rank 0 appends one JSON object per row to this file");
  app.add_flag("--keep-logs", keep_logs, "keep the lab directory (logs, configs) afterwards");
  app.set_help_flag("-h,--help", "this help; treeduce-perf's arguments go after --");
  app.allow_extras(false);
  app.prefix_command(false);
  // Everything after "--" is treeduce-perf's.
  std::vector<std::string> own;
  bool rest = false;
  std::vector<std::string> given;
  for (int i = 1; i < argc; ++i) {
    if (!rest && std::strcmp(argv[i], "--") == 0) {
      rest = true;
      continue;
    }
    (rest ? given : own).push_back(argv[i]);
  }
  if (rest) perf_args = given;
  std::reverse(own.begin(), own.end());
  try {
    app.parse(own);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints the help or the error
    return rc == 0 ? 0 : 2;
  }
  fo.shape = topology == "leaf" ? FabricShape::one_leaf : FabricShape::two_level;
  fo.host_transport = hosts == "dpdk"     ? HostTransport::dpdk
                      : hosts == "af_xdp" ? HostTransport::af_xdp
                                          : HostTransport::udp;
#ifndef TREEDUCE_HAVE_AF_XDP
  if (fo.host_transport == HostTransport::af_xdp) {
    std::fprintf(stderr,
                 "treeduce-fabric: --hosts af_xdp needs libtreeduce's af_xdp transport, which "
                 "this build does not have (it needs libxdp, libbpf and clang: install "
                 "libxdp-dev, libbpf-dev and clang, as scripts/deps.sh does, and reconfigure).\n");
    return 2;
  }
#endif
  if (fo.host_transport == HostTransport::dpdk && fo.shape != FabricShape::one_leaf) {
    std::fprintf(stderr, "treeduce-fabric: --hosts dpdk needs --topology leaf.\n");
    return 2;
  }
  if (fo.host_transport != HostTransport::udp && app.count("--gso") != 0 && fo.host_gso) {
    std::fprintf(stderr, "treeduce-fabric: --gso is for kernel UDP hosts, not --hosts %s.\n",
                 hosts.c_str());
    return 2;
  }
  // GSO is the kernel UDP hosts' default only.
  if (fo.host_transport != HostTransport::udp) fo.host_gso = false;
  fo.switch_af_xdp = switch_ports == "af_xdp";
  if (fo.switch_af_xdp && fo.host_transport == HostTransport::dpdk) {
    std::fprintf(stderr,
                 "treeduce-fabric: --switch-ports is for udp and af_xdp hosts (dpdk hosts reach "
                 "the leaf over memif).\n");
    return 2;
  }
  if (fo.host_transport != HostTransport::dpdk && app.count("--memif-zero-copy") != 0 &&
      fo.host_memif_zero_copy) {
    std::fprintf(stderr, "treeduce-fabric: --memif-zero-copy is for --hosts dpdk.\n");
    return 2;
  }
  if (fo.host_transport != HostTransport::dpdk) fo.host_memif_zero_copy = false;
  // IPv4 + UDP + the treeduce header around the payload: every datagram goes with DF set.
  constexpr std::uint32_t kOverhead = 20 + 8 + 32;
  if (app.count("--payload") == 0) {
    fo.payload_bytes = 8192;
    while (fo.payload_bytes + kOverhead > static_cast<std::uint32_t>(fo.mtu)) {
      fo.payload_bytes /= 2;
    }
  } else if (fo.payload_bytes + kOverhead > static_cast<std::uint32_t>(fo.mtu)) {
    std::fprintf(stderr,
                 "treeduce-fabric: a %u-byte payload needs an MTU of at least %u; --mtu is %d.\n",
                 fo.payload_bytes, fo.payload_bytes + kOverhead, fo.mtu);
    return 2;
  }
  const bool mpi = std::find(baselines.begin(), baselines.end(), "mpi") != baselines.end();
  std::string compare;
  for (const std::string& b : baselines) compare += (compare.empty() ? "" : ",") + b;
  if (!compare.empty()) {
    perf_args.insert(perf_args.begin(), {"--compare", compare});
  }
  if (!json_out.empty()) perf_args.insert(perf_args.begin(), {"--json-out", json_out});
  if (keep_logs) setenv("TREEDUCE_KEEP_LAB", "1", 1);
  if (geteuid() != 0) {
    std::fprintf(stderr,
                 "treeduce-fabric: network namespaces and veth pairs need root (run it with "
                 "sudo).\n");
    return 2;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  int rc = 0;
  {
    Lab lab("m");  // everything it made goes when it is destroyed, whatever happened
    fo.host_port_loss = loss;
    fo.leaf_uplink_loss = loss;
    fo.spine_loss = loss;
    fo.management_network = true;
    Fabric fab(lab, fo);
    auto t = std::chrono::steady_clock::now();
    const bool leaf = fo.shape == FabricShape::one_leaf;
    char loss_text[64] = "";
    if (loss > 0)
      std::snprintf(loss_text, sizeof loss_text, ", %g %% loss on every link", loss * 100);
    const char* host_text =
        fo.host_transport == HostTransport::dpdk
            ? (fo.host_memif_zero_copy ? "libtreeduce's DPDK transport on memif, zero-copy"
                                       : "libtreeduce's DPDK transport on memif")
        : fo.host_transport == HostTransport::af_xdp ? "libtreeduce's AF_XDP transport on veth"
        : fo.host_gso                                ? "kernel UDP with GSO on veth"
                                                     : "kernel UDP on veth";
    std::printf(
        "[1/3] fabric: manager, %s, 4 host namespaces (%s%s, MTU %d, %u-byte payloads)%s ...\n",
        leaf ? "leaf0 (treeduce-switch)" : "leaf0 + leaf1 + spine (treeduce-switch)", host_text,
        fo.host_transport == HostTransport::dpdk ? ""
        : fo.switch_af_xdp                       ? " to af_xdp"
                                                 : " to af_packet",
        fo.mtu, fo.payload_bytes, loss_text);
    if (const std::string e = fab.up(); !e.empty()) {
      std::fprintf(stderr, "treeduce-fabric: %s\n", e.c_str());
      return 1;
    }
    std::printf("      up in %.1f s; manager %s; logs in %s\n", seconds_since(t),
                fab.manager_address().c_str(), lab.dir().c_str());
    std::printf(
        "[2/3] allreduce: 4 ranks of treeduce-perf (libtreeduce)%s%s, every result "
        "checked\n",
        compare.empty() ? "" : " side by side with ", compare.c_str());
    t = std::chrono::steady_clock::now();
    std::vector<double> switch_cpu;  // each switch's CPU time when the ranks start
    for (const Proc* sw : fab.switches())
      switch_cpu.push_back(treeduce::process_cpu_seconds(sw->pid));
    const treeduce::MachineCpu machine_cpu = treeduce::MachineCpu::now();
    // ranks[0]'s log has rank 0's table: its own, or mpirun's (all ranks' output merged).
    std::vector<Proc*> ranks;
    if (mpi) {
      ranks.push_back(&lab.spawn("mpirun", "", mpirun_argv(lab, fab, perf_args)));
    } else {
      for (int h = 0; h < Fabric::kHosts; ++h) {
        std::vector<std::string> argv_h = fab.rank_env(h, "main");
        argv_h.push_back(TREEDUCE_PERF_BIN);
        argv_h.insert(argv_h.end(), perf_args.begin(), perf_args.end());
        ranks.push_back(&lab.spawn("rank" + std::to_string(h), fab.host_netns(h), argv_h));
      }
    }
    // Stream rank 0's output as it grows: the table is the progress.
    std::size_t shown = 0;
    bool all_done = false;
    while (!all_done && !g_interrupted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::string log = Lab::read_log(*ranks[0]);
      const std::size_t end = log.rfind('\n');
      if (end != std::string::npos && end + 1 > shown) {
        std::fwrite(log.data() + shown, 1, end + 1 - shown, stdout);
        shown = end + 1;
      }
      all_done = true;
      for (Proc* p : ranks) all_done &= lab.wait(*p, std::chrono::milliseconds(0));
      if (seconds_since(t) > 900) {
        std::fprintf(stderr, "treeduce-fabric: the ranks did not finish in 15 minutes.\n");
        break;
      }
    }
    const std::string log = Lab::read_log(*ranks[0]);
    if (log.size() > shown) std::fwrite(log.data() + shown, 1, log.size() - shown, stdout);
    if (g_interrupted) {
      std::printf("\ninterrupted: tearing down\n");
      rc = 130;
    }
    for (std::size_t h = 0; h < ranks.size(); ++h) {
      Proc* p = ranks[h];
      if (!p->done) lab.stop(*p);
      if (p->status != 0 && rc == 0) {
        rc = 1;
        std::fprintf(stderr, "treeduce-fabric: %s exited with %d:\n%s\n", p->name.c_str(),
                     p->status, Lab::read_log(*p).c_str());
      }
    }
    // What the switches' datapaths cost while the ranks ran (scripts/bench.sh's report sets it
    // beside the ranks' own CPU time).
    const double ran = seconds_since(t);
    std::string cpu;
    for (std::size_t i = 0; i < fab.switches().size() && i < switch_cpu.size(); ++i) {
      const double now = treeduce::process_cpu_seconds(fab.switches()[i]->pid);
      if (now < 0 || switch_cpu[i] < 0) continue;
      char one[128];
      std::snprintf(one, sizeof one, "%s%s %.2f s (%.0f%% of one CPU)", cpu.empty() ? "" : ", ",
                    fab.switches()[i]->name.c_str(), now - switch_cpu[i],
                    ran > 0 ? 100 * (now - switch_cpu[i]) / ran : 0.0);
      cpu += one;
    }
    if (!cpu.empty()) std::printf("      switch CPU while the ranks ran: %s\n", cpu.c_str());
    if (const std::string m = treeduce::cpu_split_text(machine_cpu, treeduce::MachineCpu::now());
        !m.empty())
      std::printf("      machine CPU while the ranks ran: %s\n", m.c_str());
    std::printf("[3/3] teardown (%.1f s of allreduce)\n", ran);
    const std::vector<int> status = fab.stop();
    for (std::size_t i = 0; i < status.size(); ++i) {
      if (status[i] != 0 && rc == 0) {
        rc = 1;
        std::fprintf(stderr, "treeduce-fabric: %s exited with %d\n",
                     fab.switches()[i]->name.c_str(), status[i]);
      }
    }
  }
  std::printf("main job: %s; fabric removed\n", rc == 0     ? "every allreduce verified"
                                                : rc == 130 ? "interrupted"
                                                            : "FAILED (see above)");
  return rc;
}
