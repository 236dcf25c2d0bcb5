// The af_xdp transport (docs/host.md, "Transports") on a `treeduce lab` leaf through the real
// treeduce binary: four ranks, each an AF_XDP socket on its namespace's eth0 (a veth whose peer
// the switch reads with net_af_packet), verified allreduces in the network, the manager reached
// over the management interface while the XDP program sits on the data one and ARP for the leaf
// done by the kernel; a configuration the transport cannot start with (no such interface),
// which falls back to the host path loudly and still computes the right result; and the same
// allreduces with jumbo frames (8 KiB payloads over AF_XDP multi-buffer); and the switch's side
// on AF_XDP (`lab up --switch-ports af_xdp`). Needs root.
#include <gtest/gtest.h>

#include <unistd.h>

#include <sstream>
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

// `lab up --switch-ports af_xdp`: the leaf reads the hosts' veths with net_af_xdp instead of
// net_af_packet. Kernel UDP ranks reduce exactly through it, `lab status` names the port type,
// and an MTU its page-sized UMEM frames cannot hold is refused in the switch's words, nothing
// left behind.
TEST_F(LabAfXdp, SwitchPortsAfXdpCarryExactAllreducesUpToTheirMtu) {
  std::string n = "t";
  n += std::to_string(getpid());
  n += "s";
  Result r = lab({"up", "--leaf", "4", "--switch-ports", "af_xdp", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  r = lab({"run",     "--name", n,     "-n",      "4",  "--", "treeduce-perf",
           "-b",      "1024",   "-e",  "1048576", "-f", "32", "-d",
           "f32,i32", "-o",     "sum", "-n",      "3",  "-w", "1"},
          "TREEDUCE_PATH=network");
  expect_exact(r, "network");
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // Each host's link, "h0  leaf0:net_af_xdp0  veth/af_xdp  -" (columns padded).
  std::istringstream lines(r.out);
  int links = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("veth/af_xdp") == std::string::npos) continue;
    ++links;
    EXPECT_NE(line.find("leaf0:net_af_xdp"), std::string::npos) << line;
  }
  EXPECT_EQ(links, 4) << r.out;
  EXPECT_EQ(r.out.find("net_af_packet"), std::string::npos) << r.out;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);

  n += "j";
  r = lab({"up", "--leaf", "2", "--switch-ports", "af_xdp", "--mtu", "8300", "--name", n});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("give it an MTU of at most"), std::string::npos) << r.out << r.err;
  r = lab({"down", "--name", n});
  EXPECT_NE((r.out + r.err).find("no lab named"), std::string::npos) << r.out << r.err;

  r = lab({"up", "--leaf", "2", "--switch-ports", "af_xdpp", "--name", n});
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--switch-ports"), std::string::npos) << r.err;
}

}  // namespace
