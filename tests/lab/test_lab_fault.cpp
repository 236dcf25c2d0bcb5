// `treeduce lab fault` and `treeduce lab capture` through the real treeduce binary (docs/lab.md,
// "Faults and captures"): on a --fat-tree 2 lab (leaf0 and leaf1 under spine0, hosts h0-0 and
// h1-0), loss, delay and rate on links with exact runs, a link down (fallback or a loud failure,
// never a wrong result) and up again, a switch killed and restarted, the manager restarted, a
// capture decoded by tshark with the dissector, and bad input. Needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_test_support.h"
#include "treeduce/aggregation/dtype.h"

extern char** environ;

namespace {

using namespace treeduce::labtest;

/// The row of the LINK table for link `name`.
std::string link_row(const std::string& text, const std::string& name) {
  for (const std::string& l : lines(text)) {
    if (l.rfind(name + " ", 0) == 0 && (l.find(" memif ") != std::string::npos ||
                                        l.find(" veth/af_packet ") != std::string::npos)) {
      return l;
    }
  }
  return "";
}

class LabFault : public LabTest {
 protected:
  LabFault() : LabTest("labfault") {}

  /// treeduce-perf on both hosts: 2 ranks, 1 KiB to 16 KiB.
  Result perf(const std::string& n, const std::string& dtype = "f32",
              const std::string& op = "sum") {
    return lab({"run", "--name", n,     "--",    "treeduce-perf",
                "-b",  "1024",   "-e",  "16384", "-f",
                "4",   "-d",     dtype, "-o",    op,
                "-n",  "2",      "-w",  "0",     "-c",
                "1"});
  }
  /// The same on a fabric with a fault on the path: a chunk is given up after 30
  /// retransmissions (3.3 to 3.8 s of silence) instead of the default 80 (about 10 s).
  Result perf_faulted(const std::string& n) {
    return lab({"run", "--name", n,     "--",    "env", kFaultRetries, "treeduce-perf",
                "-b",  "1024",   "-e",  "16384", "-f",  "4",           "-d",
                "f32", "-o",     "sum", "-n",    "2",   "-w",          "0",
                "-c",  "1"});
  }
  static constexpr const char* kFaultRetries = "TREEDUCE_MAX_RETRIES=30";

  /// Waits until the switch says `port` ("leaf0:net_memif0 ") of lab `n` is captured by child
  /// `cap` (a `lab capture`): "" then, else what went wrong (`cap` exited, or a hang of 120 s,
  /// after which `cap` is stopped and reaped).
  std::string wait_capturing(pid_t cap, const std::string& n, const std::string& port) {
    int st = 0;
    bool exited = false;
    const bool done = eventually([&] {
      exited = waitpid(cap, &st, WNOHANG) == cap;
      return exited ||
             line_of(lab({"status", "--name", n}).out, port).find("capturing") != std::string::npos;
    });
    if (exited) return "lab capture exited before " + port + "was captured";
    if (!done) {
      kill(cap, SIGTERM);
      reap_child(cap, st);
      return port + "was not captured within 120 s";
    }
    return "";
  }
};

/// A daemon counter of one switch in `lab status` ("SWITCH  COUNTER  N"), 0 if not listed.
double daemon_counter(const std::string& status, const std::string& sw, const std::string& c) {
  for (const std::string& l : lines(status)) {
    std::istringstream in(l);
    std::string a, b;
    double v = 0;
    if (in >> a >> b >> v && a == sw && b == c) return v;
  }
  return 0;
}

TEST_F(LabFault, FaultsCapturesRestartsOnAFatTree) {
  const std::string n = "f" + std::to_string(getpid());
  Result r = lab({"up", "--fat-tree", "2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;

  // Links by their names, healthy.
  r = lab({"status", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(link_row(r.out, "leaf0-spine0").find("leaf0:net_memif0 spine0:net_memif0"),
            std::string::npos)
      << r.out;
  EXPECT_NE(link_row(r.out, "h0-0").find("leaf0:net_af_packet0"), std::string::npos) << r.out;
  EXPECT_TRUE(state(n)["faults"].empty());

  // Loss on a switch link, both ends: exact, and the switches count what they dropped.
  r = lab({"fault", "set", "leaf0-spine0", "--loss", "0.2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link leaf0-spine0: leaf0:net_memif0 loss 0.2; spine0:net_memif0 loss 0.2.\n");
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;
  r = lab({"status", "--name", n});
  EXPECT_NE(
      link_row(r.out, "leaf0-spine0").find("leaf0:net_memif0 loss 0.2; spine0:net_memif0 loss 0.2"),
      std::string::npos)
      << r.out;
  EXPECT_NE(line_of(r.out, "spine0:net_memif0 ").find("loss 0.2"), std::string::npos) << r.out;
  EXPECT_GT(daemon_counter(r.out, "leaf0", "injected_loss") +
                daemon_counter(r.out, "spine0", "injected_loss"),
            0)
      << r.out;
  EXPECT_EQ(state(n)["faults"].size(), 2u);

  // A straggler: h1-0's link delayed and slowed, on top of the loss; shown, exact.
  r = lab({"fault", "set", "h1-0", "--delay-us", "2000", "--rate-mbps", "50", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link h1-0: leaf1:net_af_packet0 delay 2000 us, rate 50 Mb/s.\n");
  r = lab({"status", "--name", n});
  EXPECT_NE(link_row(r.out, "h1-0").find("delay 2000 us, rate 50 Mb/s"), std::string::npos)
      << r.out;
  EXPECT_NE(line_of(r.out, "leaf1:net_af_packet0 ").find("delay 2000 us, rate 50 Mb/s"),
            std::string::npos)
      << r.out;
  r = perf(n, "i32", "max");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;

  // clear one link, then all.
  r = lab({"fault", "clear", "h1-0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link h1-0: leaf1:net_af_packet0 healthy.\n");
  r = lab({"fault", "clear", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(state(n)["faults"].empty());
  r = lab({"status", "--name", n});
  const std::string healed = link_row(r.out, "leaf0-spine0");
  EXPECT_EQ(healed.substr(healed.size() - 3), "  -") << r.out;
  EXPECT_EQ(line_of(r.out, "spine0:net_memif0 ").find("loss"), std::string::npos) << r.out;

  // A link down: the ranks fall back to the hosts, or fail saying so; never a wrong result.
  r = lab({"fault", "down", "leaf0-spine0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  r = lab({"status", "--name", n});
  EXPECT_NE(line_of(r.out, "leaf0:net_memif0 ").find("down"), std::string::npos) << r.out;
  r = perf_faulted(n);
  if (r.status == 0) {
    EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;
  } else {
    EXPECT_NE(r.err.find("failed"), std::string::npos) << r.out << r.err;
  }
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
  // Held to the network path, the ranks fail loudly, with no wrong element. One row: every failed
  // operation waits out its retransmissions (3.3-3.8 s), and so do the barrier before the row and
  // the sums of the counts after it; the six dtypes' rows took a minute.
  const std::vector<std::string> one_row = {"-b",  "1024", "-e", "1024", "-d", "f32", "-o",
                                            "sum", "-n",   "1",  "-w",   "0",  "-c",  "1"};
  std::vector<std::string> held = {
      "run", "--name", n, "--", "env", "TREEDUCE_PATH=network", kFaultRetries, "treeduce-perf"};
  held.insert(held.end(), one_row.begin(), one_row.end());
  r = lab(held);
  EXPECT_NE(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("FAILED"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(" failed operations, 0 wrong elements"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(": 0 failed operations"), std::string::npos) << r.err;
  // up: in the network again.
  r = lab({"fault", "up", "leaf0-spine0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link leaf0-spine0: leaf0:net_memif0 healthy; spine0:net_memif0 healthy.\n");
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;

  // Kill the spine: status says so; restart it (and its memif clients, the leaves) with its
  // fault reapplied; a run is in the network again.
  r = lab({"fault", "set", "spine0:net_memif1", "--loss", "0.1", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  const int spine_pid = [&] {
    const nlohmann::json st = state(n);
    for (const auto& p : st["procs"]) {
      if (p["name"] == "spine0") return p["pid"].get<int>();
    }
    return -1;
  }();
  r = lab({"fault", "kill", "spine0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(line_of(r.out, "spine0 ").find(" DEAD "), std::string::npos) << r.out;
  EXPECT_NE(link_row(r.out, "leaf1-spine0").find("loss 0.1"), std::string::npos) << r.out;
  // A link with a dead end is refused whole: its live end is left as it was.
  r = lab({"fault", "set", "leaf0-spine0", "--loss", "0.3", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "treeduce lab: switch spine0 of lab '" + n +
                       "' does not run (`treeduce lab fault restart spine0 --name " + n +
                       "` starts it again).\n");
  EXPECT_EQ(state(n)["faults"].size(), 1u);
  // Without the spine: on the hosts, exactly, or a loud failure.
  r = perf_faulted(n);
  if (r.status == 0) {
    EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;
  } else {
    EXPECT_FALSE(r.err.empty()) << r.out;
  }
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
  r = lab({"fault", "restart", "spine0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("switch spine0 restarted"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("and leaf0, leaf1 (its memif clients"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 fault reapplied"), std::string::npos) << r.out;
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(line_of(r.out, "spine0 ").find(std::to_string(spine_pid)), std::string::npos);
  EXPECT_NE(line_of(r.out, "spine0:net_memif1 ").find("loss 0.1"), std::string::npos) << r.out;
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;
  // A leaf alone: a memif client, nothing else restarts.
  r = lab({"fault", "restart", "leaf1", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out.find("memif clients"), std::string::npos) << r.out;
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;

  // The manager: killed, then restarted on its port and database; runs go on in the network.
  r = lab({"fault", "kill", "manager", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("DEAD"), std::string::npos) << r.out;
  r = lab({"fault", "restart", "manager", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("state restored from"), std::string::npos) << r.out;
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out;
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;

  // A capture of leaf0-spine0 (at leaf0) during an i32 max run, to a relative path, stopped by
  // SIGTERM; tshark decodes it with the dissector.
  const std::string cwd = root_ + "/cwd";
  fs::create_directories(cwd);
  const std::string out = root_ + "/.capture.out";
  std::string cmd = "cd " + shq(cwd) + " && exec " + command() +
                    " capture leaf0-spine0 -o up.pcap --name " + shq(n) + " >" + shq(out) + " 2>&1";
  pid_t cap = -1;
  const char* argv[] = {"sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&cap, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  // Started once the switch says the port is captured.
  ASSERT_EQ(wait_capturing(cap, n, "leaf0:net_memif0 "), "") << read_file(out);
  r = perf(n, "i32", "max");
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find(", 0 on the hosts"), std::string::npos) << r.out;
  kill(cap, SIGTERM);
  int st = 0;
  ASSERT_TRUE(reap_child(cap, st)) << "lab capture did not end on SIGTERM: " << read_file(out);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(out);
  const std::string pcap = cwd + "/up.pcap";
  std::smatch m;
  const std::string said = read_file(out);
  ASSERT_TRUE(std::regex_search(said, m,
                                std::regex("([0-9]+) frames captured on leaf0:net_memif0 "
                                           "\\(link leaf0-spine0\\) into " +
                                           pcap)))
      << said;
  const int frames = std::stoi(m[1]);
  EXPECT_GT(frames, 0);
  EXPECT_TRUE(fs::exists(pcap));
  std::string fields;
  {
    const std::string tcmd = "tshark -n -r " + shq(pcap) +
                             " -X lua_script:" TREEDUCE_DISSECTOR
                             " -o treeduce.port:4791 -T fields -E separator=/t"
                             " -e treeduce.opcode -e treeduce.dtype "
                             "-e treeduce.op -e treeduce.tree_id 2>/dev/null";
    FILE* p = popen(tcmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[4096];
    for (std::size_t k; (k = fread(buf, 1, sizeof buf, p)) > 0;) fields.append(buf, k);
    EXPECT_EQ(pclose(p), 0);
  }
  const auto rows = lines(fields);
  EXPECT_EQ(int(rows.size()), frames);
  std::set<std::string> opcodes, trees;
  int treeduce_rows = 0, max_rows = 0, sum_rows = 0;
  const std::string want_dtype = std::to_string(int(treeduce::DType::i32));
  const std::string want_op = std::to_string(int(treeduce::ReduceOp::max));
  const std::string want_sum = std::to_string(int(treeduce::ReduceOp::sum));
  for (const std::string& row : rows) {
    std::istringstream in(row);
    std::string opc, dt, op, tree;
    if (!std::getline(in, opc, '\t') || opc.empty()) continue;  // ARP, ICMP
    std::getline(in, dt, '\t');
    std::getline(in, op, '\t');
    std::getline(in, tree, '\t');
    ++treeduce_rows;
    opcodes.insert(opc);
    trees.insert(tree);
    // The run's i32 max, and treeduce-perf's own i32 sums of the ranks' wrong counts.
    EXPECT_EQ(dt, want_dtype) << row;
    max_rows += op == want_op;
    sum_rows += op == want_sum;
    EXPECT_TRUE(op == want_op || op == want_sum) << row;
  }
  EXPECT_GT(treeduce_rows, 0) << fields;
  EXPECT_GT(max_rows, sum_rows) << fields;
  // Partials going up (CONTRIB, 1) and results coming down (RESULT, 2), of one tree.
  EXPECT_EQ(opcodes, (std::set<std::string>{"1", "2"})) << fields;
  EXPECT_EQ(trees.size(), 1u) << fields;

  // --count: stops by itself once the port has seen that many frames (the run makes them).
  const std::string out2 = root_ + "/.capture2.out";
  // Run as if by sudo from uid 65534: the file is handed to that user.
  cmd = "exec env SUDO_UID=65534 SUDO_GID=65534 " + command() + " capture h0-0 -o " +
        shq(root_ + "/h0.pcap") + " --count 10 --name " + shq(n) + " >" + shq(out2) + " 2>&1";
  const char* argv2[] = {"sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&cap, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv2), environ), 0);
  ASSERT_EQ(wait_capturing(cap, n, "leaf0:net_af_packet0 "), "") << read_file(out2);
  r = perf(n);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  ASSERT_TRUE(reap_child(cap, st)) << "lab capture --count 10 did not end: " << read_file(out2);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << read_file(out2);
  EXPECT_NE(read_file(out2).find(" frames captured on leaf0:net_af_packet0 (link h0-0)"),
            std::string::npos)
      << read_file(out2);
  struct stat sb {};
  ASSERT_EQ(stat((root_ + "/h0.pcap").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_uid, 65534u);
  EXPECT_EQ(sb.st_mode & 0777, 0644u);

  // A capture whose `lab capture` was killed with -9 keeps running: a second one is refused
  // with the way out, --stop.
  cmd = "exec " + command() + " capture leaf1-spine0 -o " + shq(root_ + "/l1.pcap") + " --name " +
        shq(n) + " >/dev/null 2>&1";
  const char* argv3[] = {"sh", "-c", cmd.c_str(), nullptr};
  ASSERT_EQ(posix_spawn(&cap, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv3), environ), 0);
  ASSERT_EQ(wait_capturing(cap, n, "leaf1:net_memif0 "), "");
  kill(cap, SIGKILL);
  ASSERT_TRUE(reap_child(cap, st));
  r = lab({"capture", "leaf1-spine0", "-o", root_ + "/l1b.pcap", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "treeduce lab: leaf1:net_memif0 (link leaf1-spine0) is being captured already; "
            "stop that capture with Ctrl-C, or with `treeduce lab capture leaf1-spine0 "
            "--stop --name " +
                n + "` if its `lab capture` is gone.\n");
  r = lab({"capture", "leaf1-spine0", "--stop", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find(" frames captured on leaf1:net_memif0 (link leaf1-spine0); the capture is "
                       "stopped"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(line_of(lab({"status", "--name", n}).out, "leaf1:net_memif0 ").find("capturing"),
            std::string::npos);
  r = lab({"capture", "leaf1-spine0", "--stop", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "treeduce lab: no capture runs on leaf1:net_memif0 (link leaf1-spine0).\n");

  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(LabFault, UpLossStaysUnderFaultsAndComesBackOnClear) {
  // `lab up --loss` is every port's base: a fault on a port starts from it, `clear` restores it,
  // and status (what was asked) agrees with the switch (its treeduce_port_fault_rx_loss).
  const std::string n = "l" + std::to_string(getpid());
  Result r = lab({"up", "--leaf", "2", "--loss", "0.05", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  r = lab({"fault", "set", "h0", "--delay-us", "500", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link h0: leaf0:net_af_packet0 loss 0.05, delay 500 us.\n");
  r = lab({"status", "--name", n});
  EXPECT_NE(link_row(r.out, "h0").find("loss 0.05, delay 500 us"), std::string::npos) << r.out;
  EXPECT_NE(line_of(r.out, "leaf0:net_af_packet0 ").find("loss 0.05, delay 500 us"),
            std::string::npos)
      << r.out;
  EXPECT_NE(line_of(r.out, "leaf0:net_af_packet1 ").find("loss 0.05"), std::string::npos) << r.out;
  r = lab({"fault", "clear", "h0", "--name", n});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "link h0: leaf0:net_af_packet0 loss 0.05 (lab up --loss).\n");
  EXPECT_TRUE(state(n)["faults"].empty());
  r = lab({"status", "--name", n});
  const std::string port = line_of(r.out, "leaf0:net_af_packet0 ");
  EXPECT_NE(port.find("loss 0.05"), std::string::npos) << r.out;
  EXPECT_EQ(port.find("delay"), std::string::npos) << r.out;
  EXPECT_NE(link_row(r.out, "h0").find("loss 0.05"), std::string::npos) << r.out;
  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(LabFault, BadInputOneSentence) {
  const std::string n = "b" + std::to_string(getpid());
  Result r = lab({"fault", "down", "h0", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no lab named '" + n + "' is up"), std::string::npos) << r.err;
  r = lab({"up", "--leaf", "2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  r = lab({"fault", "down", "h7", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: lab '" + n +
                       "' has no link 'h7' (links: h0, h1; or one switch end as SWITCH:PORT, as "
                       "`lab status` lists them).\n");
  r = lab({"fault", "set", "leaf0:net_tap3", "--loss", "0.1", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: switch 'leaf0' of lab '" + n +
                       "' has no port 'net_tap3' (its ports: net_af_packet0, net_af_packet1).\n");
  r = lab({"fault", "kill", "spine9", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: lab '" + n +
                       "' has no switch 'spine9' (switches: leaf0; or manager).\n");
  r = lab({"fault", "set", "h0", "--loss", "1.5", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--loss"), std::string::npos) << r.err;
  r = lab({"fault", "set", "h0", "--delay-us", "2000000", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--delay-us"), std::string::npos) << r.err;
  r = lab({"fault", "set", "h0", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "treeduce lab: give what to set: --loss F, --delay-us D and/or --rate-mbps R.\n");
  r = lab({"capture", "h0", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: give the file to write with -o FILE.pcap (or --stop).\n");
  r = lab({"capture", "h0", "-o", root_, "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: " + root_ + " is a directory; give a file name.\n");
  // Nothing was changed by any of it.
  EXPECT_TRUE(state(n)["faults"].empty());
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out;
}

}  // namespace
