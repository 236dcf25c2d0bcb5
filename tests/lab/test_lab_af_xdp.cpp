// The af_xdp transport (docs/host.md, "Transports") on a `treeduce lab` leaf through the real
// treeduce binary: four ranks, each an AF_XDP socket on its namespace's eth0 (a veth whose peer
// the switch reads with net_af_packet), verified allreduces in the network, the manager reached
// over the management interface while the XDP program sits on the data one and ARP for the leaf
// done by the kernel; a configuration the transport cannot start with (no such interface),
// which falls back to the host path loudly and still computes the right result; and the same
// allreduces with jumbo frames (8 KiB payloads over AF_XDP multi-buffer). Needs root.
#include <gtest/gtest.h>

#include <unistd.h>

#include <string>

#include "lab_test_support.h"

namespace {

using namespace treeduce::labtest;

class LabAfXdp : public LabTest {
 protected:
  LabAfXdp() : LabTest("labafxdp") {}
};

// treeduce-perf's rows are all on `path`, every rank verified every element.
void expect_exact(const Result& r, const std::string& path) {
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0] # treeduce-perf: 4 ranks, path " + path), std::string::npos)
      << r.out << r.err;
  EXPECT_NE(r.out.find("[h0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  for (int h = 0; h < 4; ++h) {
    EXPECT_NE(r.err.find("[h" + std::to_string(h) + "] treeduce-perf: rank " + std::to_string(h) +
                         ": 0 failed operations, 0 wrong elements"),
              std::string::npos)
        << r.err;
  }
}

TEST_F(LabAfXdp, FourRanksReduceExactlyOverAfXdpAndABadInterfaceFallsBackLoudly) {
  // name("x"), appended piecewise: GCC 12 warns falsely (-Wrestrict) on the inlined concatenation.
  std::string n = "t";
  n += std::to_string(getpid());
  n += "x";
  Result r = lab({"up", "--leaf", "4", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::vector<std::string> perf = {
      "treeduce-perf", "-b", "1024", "-e", "1048576", "-f", "32", "-d",
      "f32,i32",       "-o", "sum",  "-n", "3",       "-w", "1"};
  std::vector<std::string> run = {"run", "--name", n, "-n", "4", "--"};
  run.insert(run.end(), perf.begin(), perf.end());

  r = lab(run, "TREEDUCE_TRANSPORT=af_xdp TREEDUCE_PATH=network");
  expect_exact(r, "network");
  for (int h = 0; h < 4; ++h) {
    const std::string p = "[h" + std::to_string(h) + "] treeduce: info: af_xdp transport on eth0 ";
    EXPECT_NE(r.err.find(p), std::string::npos) << r.err;
  }
  EXPECT_EQ(r.err.find("falls back"), std::string::npos) << r.err;

  // No such interface: one sentence per rank, and the job reduces on the hosts.
  r = lab(run, "TREEDUCE_TRANSPORT=af_xdp TREEDUCE_XDP_INTERFACE=nosuch0");
  expect_exact(r, "host");
  for (int h = 0; h < 4; ++h) {
    EXPECT_NE(
        r.err.find("[h" + std::to_string(h) + "] treeduce: warning: rank " + std::to_string(h) +
                   " falls back to host-side reduction: the af_xdp transport could not "
                   "start: there is no interface 'nosuch0' on this host"),
        std::string::npos)
        << r.err;
  }
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);

  // Jumbo frames: 8 KiB payloads (from the MTU), three UMEM frames per packet (multi-buffer).
  n += "j";
  r = lab({"up", "--leaf", "4", "--mtu", "8300", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  run[2] = n;
  r = lab(run, "TREEDUCE_TRANSPORT=af_xdp TREEDUCE_PATH=network");
  expect_exact(r, "network");
  EXPECT_NE(r.err.find("[h0] treeduce: info: af_xdp transport on eth0 "), std::string::npos)
      << r.err;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
}

}  // namespace
