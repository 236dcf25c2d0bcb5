// treeduce-fabric, the benchmark's fabric, as a user runs it (the built
// binary): one leaf switch with jumbo frames and 8 KiB payloads, kernel UDP hosts with GSO,
// AF_XDP hosts (libtreeduce's af_xdp transport on the same veths) and kernel-bypass hosts
// (libtreeduce's DPDK transport on memif), and treeduce-perf's Gloo and Open MPI baselines launched
// by mpirun inside the host namespaces. Every row must be verified on every backend and treeduce's
// must have gone through the switch. Needs root (namespaces).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace {

struct Outcome {
  int status = -1;
  std::string output;
};

Outcome run(const std::string& args) {
  Outcome r;
  const std::string cmd = std::string(TREEDUCE_FABRIC_BIN) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

std::vector<nlohmann::json> rows(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  }
  return out;
}

class BenchFabric : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
    char tmpl[] = "/tmp/treeduce-benchfab-XXXXXX";
    const int fd = mkstemp(tmpl);
    ASSERT_NE(fd, -1);
    close(fd);
    json_ = tmpl;
  }
  void TearDown() override {
    if (!json_.empty()) std::remove(json_.c_str());
  }
  std::string json_;
};

// Every row of `path`: in the network, right on every backend in `backends`.
void expect_verified(const std::vector<nlohmann::json>& rs, std::size_t want_rows,
                     const std::set<std::string>& backends) {
  ASSERT_EQ(rs.size(), want_rows);
  for (const nlohmann::json& r : rs) {
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["ranks"], 4);
    EXPECT_EQ(r["treeduce"]["path"], "network");
    EXPECT_EQ(r["treeduce"]["wrong"], 0);
    EXPECT_EQ(r["treeduce"]["fallbacks"], 0);
    for (const std::string& b : backends) {
      ASSERT_TRUE(r.contains(b));
      EXPECT_EQ(r[b]["wrong"], 0);
      EXPECT_GT(r[b]["time_us"].get<double>(), 0);
    }
  }
}

TEST_F(BenchFabric, KernelBypassHostsWithGlooAndMpiBaselinesUnderMpirun) {
#ifndef TREEDUCE_HAVE_MPIRUN
  GTEST_SKIP() << "built without MPI or without mpirun (libopenmpi-dev, openmpi-bin)";
#endif
  const Outcome r =
      run("--topology leaf --hosts dpdk --mtu 8300 --payload 8192 --slots 64 "
          "--rto-us 10000 --compare gloo,mpi --json-out " +
          json_ + " -- -b 4096 -e 65536 -f 16 -d f32,bf16 -o sum,max -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("every allreduce verified"), std::string::npos) << r.output;
  // memif's zero-copy mode on the ranks' side by default (their EAL with --single-file-segments,
  // the switch a plain memif server): each rank's port says it copies on TX there.
  EXPECT_NE(r.output.find("DPDK transport on memif, zero-copy"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("memif with zero-copy=yes"), std::string::npos) << r.output;
  expect_verified(rows(json_), 2 * 2 * 2, {"gloo", "mpi"});
}

// --no-memif-zero-copy: memif's copy mode, in which the ranks send from the caller's buffer
// (a header mbuf chained to an external-buffer mbuf) and memif copies into its ring.
TEST_F(BenchFabric, KernelBypassHostsWithoutMemifZeroCopy) {
  const Outcome r =
      run("--topology leaf --hosts dpdk --no-memif-zero-copy --mtu 8300 --payload 8192 "
          "--slots 64 --rto-us 10000 --json-out " +
          json_ + " -- -b 4096 -e 1048576 -f 16 -d f32 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output.find("zero-copy=yes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TX zero-copy: a header mbuf chained to an external-buffer mbuf"),
            std::string::npos)
      << r.output;
  expect_verified(rows(json_), 3, {});
}

TEST_F(BenchFabric, JumboUdpHostsWithGso) {
#ifndef TREEDUCE_HAVE_ETHTOOL
  GTEST_SKIP() << "no ethtool: --gso turns UDP segmentation offload off on the hosts' veths";
#endif
  // 8 KiB payloads in one frame: a datagram too long for a link would fail the send and the
  // rows would have fallen back to the hosts.
  const Outcome r =
      run("--topology leaf --mtu 8300 --payload 8192 --slots 64 --gso --compare gloo "
          "--json-out " +
          json_ + " -- -b 4096 -e 1048576 -f 16 -d f32,e4m3 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  expect_verified(rows(json_), 3 * 2, {"gloo"});
  // The switch's CPU time while the ranks ran, for scripts/bench.sh's report.
  EXPECT_NE(r.output.find("switch CPU while the ranks ran: leaf0 "), std::string::npos) << r.output;
  // And the machine's, the kernel's interrupt work included.
  EXPECT_NE(r.output.find("machine CPU while the ranks ran: user "), std::string::npos) << r.output;
}

// AF_XDP hosts: 8 KiB payloads in multi-buffer frames through one leaf beside Gloo's ring (the
// benchmark's configuration), then through two leaves and the spine; every rank's transport is
// af_xdp (it says so once), not kernel UDP.
TEST_F(BenchFabric, AfXdpHostsWithJumboFramesOnEitherTopology) {
#ifndef TREEDUCE_HAVE_AF_XDP
  GTEST_SKIP() << "built without the af_xdp transport (libxdp, libbpf, clang)";
#endif
  Outcome r =
      run("--topology leaf --hosts af_xdp --mtu 8300 --payload 8192 --slots 64 "
          "--rto-us 10000 --compare gloo --json-out " +
          json_ + " -- -b 4096 -e 1048576 -f 16 -d f32 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(libtreeduce's AF_XDP transport on veth"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("treeduce: info: af_xdp transport on eth0 "), std::string::npos)
      << r.output;
  expect_verified(rows(json_), 3, {"gloo"});
  std::remove(json_.c_str());
  r = run("--topology two-level --hosts af_xdp --mtu 8300 --json-out " + json_ +
          " -- -b 65536 -e 1048576 -f 16 -d f32 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("treeduce: info: af_xdp transport on eth0 "), std::string::npos)
      << r.output;
  expect_verified(rows(json_), 2, {});
}

// The leaves' host ports as DPDK's net_af_xdp (an AF_XDP socket on the veth, its UMEM the
// port's own pool of page-sized mbufs) at the standard MTU: kernel UDP hosts through one leaf
// beside Gloo, then AF_XDP hosts (an XDP program on both ends of each veth) through two leaves
// and the spine. Jumbo frames do not fit a page: the switch refuses the port, naming the most
// it takes.
TEST_F(BenchFabric, SwitchAfXdpPortsAtTheStandardMtu) {
  Outcome r =
      run("--topology leaf --hosts udp --switch-ports af_xdp --mtu 1500 --compare gloo "
          "--json-out " +
          json_ + " -- -b 4096 -e 1048576 -f 16 -d f32 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(kernel UDP with GSO on veth to af_xdp, MTU 1500, 1024-byte payloads)"),
            std::string::npos)
      << r.output;
  expect_verified(rows(json_), 3, {"gloo"});
#ifdef TREEDUCE_HAVE_AF_XDP
  std::remove(json_.c_str());
  r = run("--topology two-level --hosts af_xdp --switch-ports af_xdp --mtu 1500 --json-out " +
          json_ + " -- -b 65536 -e 1048576 -f 16 -d f32 -o sum -n 2 -w 1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("treeduce: info: af_xdp transport on eth0 "), std::string::npos)
      << r.output;
  expect_verified(rows(json_), 2, {});
#endif
  r = run("--topology leaf --switch-ports af_xdp --mtu 8300 -- -b 4096 -e 4096 -n 1 -w 0");
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("port 'net_af_xdp0' (net_af_xdp) takes frames of at most "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("but its MTU is 8300: give it an MTU of at most "), std::string::npos)
      << r.output;
}

TEST_F(BenchFabric, RefusesWhatItCannotBuild) {
  Outcome r = run("--topology two-level --hosts dpdk");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--hosts dpdk needs --topology leaf"), std::string::npos) << r.output;
  r = run("--topology leaf --hosts dpdk --gso");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--gso is for kernel UDP hosts"), std::string::npos) << r.output;
  r = run("--topology leaf --hosts dpdk --switch-ports af_xdp");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--switch-ports is for udp and af_xdp hosts"), std::string::npos)
      << r.output;
  r = run("--topology leaf --memif-zero-copy");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--memif-zero-copy is for --hosts dpdk"), std::string::npos) << r.output;
#ifdef TREEDUCE_HAVE_AF_XDP
  r = run("--hosts af_xdp --gso");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--gso is for kernel UDP hosts, not --hosts af_xdp"), std::string::npos)
      << r.output;
  r = run("--hosts af_xdp --memif-zero-copy");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--memif-zero-copy is for --hosts dpdk"), std::string::npos) << r.output;
#else
  r = run("--hosts af_xdp");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("--hosts af_xdp needs libtreeduce's af_xdp transport"), std::string::npos)
      << r.output;
#endif
  r = run("--mtu 1500 --payload 8192");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("needs an MTU of at least 8252"), std::string::npos) << r.output;
  for (const char* bad :
       {"--mtu 9000", "--hosts rdma", "--slots 48", "--payload 1000", "--payload 128", "--loss 1.5",
        "--compare gloo,nccl", "--switch-ports tap", "--frobnicate"}) {
    r = run(bad);
    EXPECT_EQ(r.status, 2) << bad << "\n" << r.output;
    const std::string flag = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(r.output.find(flag), std::string::npos) << bad << "\n" << r.output;
  }
  EXPECT_EQ(run("--help").status, 0);
}

}  // namespace
