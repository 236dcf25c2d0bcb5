// libtreeduce's DPDK transport: CPU time of send() per packet, payloads copied into mbufs against
// zero-copy TX (docs/performance.md, "Issue 16: fewer copies on the DPDK transport"). One process,
// one lcore: a memif server port and a memif client port on one socket; the transport sends on
// the client, the server drains its ring between batches (not timed). The payloads come from a
// 16 MiB buffer walked in order, as an allreduce's chunks do: out of cache. The figure is the
// calling thread's CPU time (CLOCK_THREAD_CPUTIME_ID) inside send(), which includes memif's own
// copy into its ring: a ratio in one run, robust to other processes' load.
//
//   treeduce-bench-dpdk-tx [--payload BYTES] [--batches N] [--reps N]
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <time.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <string>
#include <vector>

#include "dpdk_transport.h"

namespace {

using treeduce::host::DpdkTransportOptions;
using treeduce::host::OutPacket;

double thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  unsigned payload = 8192;
  int batches = 4000, reps = 3;
  CLI::App app{
      "CPU time of libtreeduce's DPDK transport send() per packet on memif: copy "
      "against zero-copy TX"};
  app.add_option("--payload", payload, "payload bytes per packet")->check(CLI::Range(256, 8192));
  app.add_option("--batches", batches, "batches of 32 packets per measurement")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--reps", reps, "measurements per mode")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);

  const std::string sock = "/tmp/treeduce-bench-dpdk-tx." + std::to_string(getpid()) + ".sock";
  const std::string prefix = "--file-prefix=tdbtx" + std::to_string(getpid());
  std::vector<std::string> eal = {
      argv[0],
      "--no-huge",
      "-m",
      "512",
      "--no-pci",
      "--no-telemetry",
      prefix,
      "--log-level=lib.eal:warning",
      "--vdev=net_memif0,role=server,socket-abstract=no,bsize=16384,socket=" + sock,
      "--vdev=net_memif1,role=client,socket-abstract=no,bsize=16384,socket=" + sock};
  std::vector<char*> eargv;
  for (std::string& s : eal) eargv.push_back(s.data());
  if (rte_eal_init(static_cast<int>(eargv.size()), eargv.data()) < 0) {
    std::fprintf(stderr, "treeduce-bench-dpdk-tx: the EAL did not start\n");
    return 1;
  }
  rte_mempool* mp = rte_pktmbuf_pool_create("srv", 4095, 256, 0, 16384 + 128, SOCKET_ID_ANY);
  std::uint16_t srv = 0, cli = 0;
  rte_eth_conf conf{};
  if (mp == nullptr || rte_eth_dev_get_port_by_name("net_memif0", &srv) != 0 ||
      rte_eth_dev_get_port_by_name("net_memif1", &cli) != 0 ||
      rte_eth_dev_configure(srv, 1, 1, &conf) != 0 ||
      rte_eth_rx_queue_setup(srv, 0, 1024, SOCKET_ID_ANY, nullptr, mp) != 0 ||
      rte_eth_tx_queue_setup(srv, 0, 1024, SOCKET_ID_ANY, nullptr) != 0 ||
      rte_eth_dev_start(srv) != 0) {
    std::fprintf(stderr, "treeduce-bench-dpdk-tx: the memif server port did not start\n");
    return 1;
  }
  std::vector<std::uint8_t> buf(16 << 20);
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::uint8_t>(i * 13);
  int rc = 0;
  std::printf("# payload %u bytes, %d x 32 packets per measurement\n", payload, batches);
  for (const auto mode :
       {DpdkTransportOptions::TxMode::copy, DpdkTransportOptions::TxMode::automatic}) {
    const char* label = mode == DpdkTransportOptions::TxMode::copy ? "copy" : "zero-copy";
    for (int rep = 0; rep < reps; ++rep) {
      DpdkTransportOptions o;
      o.port_name = "net_memif1";
      o.local_address = "10.0.0.2";
      o.local_port = 5000;
      o.leaf_address = "10.0.0.1:47110";
      o.leaf_mac = "02:00:00:00:00:01";
      o.payload_bytes = payload;
      o.tx_mode = mode;
      std::string err;
      auto t = treeduce::host::make_dpdk_transport(o, &err);
      if (!t) {
        std::fprintf(stderr, "treeduce-bench-dpdk-tx: %s\n", err.c_str());
        return 1;
      }
      rte_eth_link link{};
      for (int i = 0; i < 500 && link.link_status == 0; ++i) {
        rte_eth_link_get_nowait(cli, &link);
        if (link.link_status == 0) usleep(10000);  // the client connects in an interrupt thread
      }
      std::vector<OutPacket> p(32);
      std::size_t off = 0;
      double ns = 0;
      std::array<rte_mbuf*, 64> r{};
      for (int b = 0; b < batches; ++b) {
        for (OutPacket& q : p) {
          q = OutPacket{{}, buf.data() + off, payload};
          off = (off + payload) % buf.size();
        }
        const double start = thread_cpu_ns();
        if (std::string e = t->send(p.data(), p.size()); !e.empty()) {
          std::fprintf(stderr, "treeduce-bench-dpdk-tx: %s\n", e.c_str());
          return 1;
        }
        ns += thread_cpu_ns() - start;
        while (const std::uint16_t n = rte_eth_rx_burst(srv, 0, r.data(), r.size()))
          rte_pktmbuf_free_bulk(r.data(), n);
      }
      const auto sent = t->stats().sent, lost = t->stats().send_errors;
      std::printf("%-9s %8.0f ns CPU per packet in send()  (%llu sent, %llu lost)\n", label,
                  ns / (static_cast<double>(batches) * 32), static_cast<unsigned long long>(sent),
                  static_cast<unsigned long long>(lost));
      if (lost != 0) rc = 1;  // a full ring would time the drain bound, not the copies
    }
  }
  return rc;
}
