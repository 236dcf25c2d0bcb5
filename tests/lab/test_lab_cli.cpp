// `treeduce lab` through the real treeduce binary (docs/lab.md): up, status, exec, run, down of
// labs of real switch, manager and host-namespace processes; cleanup after kill -9; two labs at
// once; bad input. Needs root. Every lab lives under a state root of its own (TREEDUCE_LAB_ROOT)
// with names carrying this process's pid, so that it never meets a user's lab.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_test_support.h"

namespace {

using namespace treeduce::labtest;

class LabCli : public LabTest {
 protected:
  LabCli() : LabTest("labcli") {}

  static bool process_is(int pid, const std::vector<std::string>& argv) {
    const std::string s = read_file("/proc/" + std::to_string(pid) + "/cmdline");
    std::vector<std::string> v;
    std::size_t b = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\0') {
        v.push_back(s.substr(b, i - b));
        b = i + 1;
      }
    }
    return v == argv;
  }

  void expect_processes_gone(const nlohmann::json& st) {
    for (const auto& p : st["procs"]) {
      EXPECT_FALSE(process_is(p["pid"].get<int>(), p["argv"].get<std::vector<std::string>>()))
          << p["name"] << " still runs";
    }
  }

  /// Everything `st` recorded is gone: processes, namespaces, interfaces, bridge, state dir.
  void expect_gone(const nlohmann::json& st) {
    expect_processes_gone(st);
    for (const auto& ns : st["namespaces"]) {
      EXPECT_FALSE(fs::exists("/run/netns/" + ns.get<std::string>())) << ns;
    }
    for (const auto& l : st["links"]) {
      EXPECT_FALSE(fs::exists("/sys/class/net/" + l.get<std::string>())) << l;
    }
    EXPECT_FALSE(fs::exists("/sys/class/net/" + st["bridge"].get<std::string>()));
    EXPECT_FALSE(fs::exists(root_ + "/" + st["name"].get<std::string>()));
    // And nothing else of the lab: no namespace of its name, no interface of its prefix.
    const std::string prefix = "tl" + std::to_string(st["slot"].get<int>());
    for (const auto& e : fs::directory_iterator("/sys/class/net")) {
      const std::string n = e.path().filename().string();
      if (n.rfind(prefix, 0) == 0 && n.size() > prefix.size()) {
        EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(n[prefix.size()]))) << n << " is left";
      }
    }
    std::error_code ec;
    for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
      EXPECT_NE(
          e.path().filename().string().rfind("tdlab-" + st["name"].get<std::string>() + ".", 0), 0u)
          << e.path();
    }
  }
};

TEST_F(LabCli, LeafOfFourUpStatusExecRunDown) {
  const std::string n = name("a");
  Result r = lab({"up", "--leaf", "4", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("lab '" + n + "' is up"), std::string::npos) << r.out;
  const nlohmann::json st = state(n);
  ASSERT_EQ(st["hosts"].size(), 4u);
  // The switch and the manager stay in our session, so in the ranks' scheduling group (a session
  // of their own was a group the ranks could starve: spawn_detached), each in a process group of
  // its own and deaf to the terminal's hangup.
  for (const auto& p : st["procs"]) {
    const pid_t pid = p["pid"].get<int>();
    EXPECT_EQ(getsid(pid), getsid(0)) << p["name"] << " is in a session of its own";
    EXPECT_EQ(getpgid(pid), pid) << p["name"];
    std::smatch m;
    const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
    ASSERT_TRUE(std::regex_search(status, m, std::regex(R"(SigIgn:\s*([0-9a-f]+))"))) << status;
    EXPECT_EQ(std::stoull(m[1].str(), nullptr, 16) & (1ull << (SIGHUP - 1)), 1ull << (SIGHUP - 1))
        << p["name"] << " does not ignore SIGHUP";
  }

  // status: the switch alive and up at the manager, the hosts.
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  bool leaf_row = false;
  for (const std::string& l : lines(r.out)) {
    if (l.rfind("leaf0 ", 0) == 0 && l.find(" alive ") != std::string::npos &&
        l.find(" up ") != std::string::npos) {
      leaf_row = true;
    }
  }
  EXPECT_TRUE(leaf_row) << r.out;
  for (int h = 0; h < 4; ++h) {
    EXPECT_NE(r.out.find("h" + std::to_string(h) + "    10.1.0." + std::to_string(h + 1)),
              std::string::npos)
        << r.out;
  }

  // exec: a command in one host's namespace sees that host's address.
  r = lab({"exec", "--name", n, "h2", "--", "ip", "-4", "addr"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("inet 10.1.0.3/32"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("10.1.0.1/"), std::string::npos) << r.out;
  r = lab({"exec", "--name", n, "h1", "--", "sh", "-c", "exit 5"});
  EXPECT_EQ(r.status, 5);
  // exec gives what a program needs to join from that host (the manager, the host's address, the
  // lab's job identity): a one-rank job of treeduce-perf runs in the network, exact.
  r = lab({"exec",
           "--name",
           n,
           "h2",
           "--",
           "env",
           "TREEDUCE_JOB=exec-" + n,
           "TREEDUCE_RANK=0",
           "TREEDUCE_WORLD_SIZE=1",
           "treeduce-perf",
           "-b",
           "4096",
           "-e",
           "4096",
           "-n",
           "2",
           "-w",
           "0",
           "-c",
           "1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("# treeduce-perf: 1 ranks, path network"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("# verified: 0 wrong elements"), std::string::npos) << r.out;

  // run: treeduce-perf on four ranks, exact, in the network; every line prefixed by its host.
  r = lab({"run",  "--name", n,   "-n", "4",       "--", "treeduce-perf", "-b", "1024", "-e",
           "4096", "-f",     "4", "-d", "f32,i32", "-o", "sum",           "-n", "2",    "-w",
           "0",    "-c",     "1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0] # treeduce-perf: 4 ranks, path network"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[h0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  for (const std::string& l : lines(r.out)) {
    EXPECT_TRUE(l.rfind("[h0] ", 0) == 0 || l.rfind("[h1] ", 0) == 0 || l.rfind("[h2] ", 0) == 0 ||
                l.rfind("[h3] ", 0) == 0)
        << l;
  }
  for (int h = 0; h < 4; ++h) {
    EXPECT_NE(r.err.find("[h" + std::to_string(h) + "] treeduce-perf: rank " + std::to_string(h) +
                         ": 0 failed operations, 0 wrong elements"),
              std::string::npos)
        << r.err;
  }

  // The environment of a rank, on chosen hosts in the order given.
  r = lab({"run", "--name", n, "--hosts", "h3,h1", "--", "sh", "-c",
           "echo $RANK/$WORLD_SIZE $LOCAL_RANK $TREEDUCE_RANK $TREEDUCE_HOST $MASTER_ADDR "
           "${TREEDUCE_MANAGER:+manager} ${TREEDUCE_JOB:+job}"});
  EXPECT_EQ(r.status, 0) << r.err;
  const std::string master = st["hosts"][3]["mgmt_ip"];
  EXPECT_NE(r.out.find("[h3] 0/2 0 0 10.1.0.4 " + master + " manager job"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[h1] 1/2 0 1 10.1.0.2 " + master + " manager job"), std::string::npos)
      << r.out;

  // A failing rank: its status, and the others are stopped (rank 0 would wait for ever).
  r = lab(
      {"run", "--name", n, "--", "sh", "-c", "if [ $RANK = 2 ]; then exit 7; fi; exec sleep 1000"});
  EXPECT_EQ(r.status, 7) << r.err;
  EXPECT_NE(r.err.find("rank 2 (h2) exited with status 7"), std::string::npos) << r.err;

  // Under mpirun (when Open MPI is installed): the same environment, output by host, the failing
  // rank's status.
  if (std::system("command -v mpirun >/dev/null") == 0) {
    r = lab({"run", "--name", n, "--mpi", "--hosts", "h2,h0", "--", "sh", "-c",
             "echo $RANK/$WORLD_SIZE $TREEDUCE_RANK $TREEDUCE_HOST $TREEDUCE_LAB_HOST "
             "${TREEDUCE_MANAGER:+manager} ${TREEDUCE_JOB:+job}"});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("[h2] 0/2 0 10.1.0.3 h2 manager job"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("[h0] 1/2 1 10.1.0.1 h0 manager job"), std::string::npos) << r.out;
    r = lab({"run", "--name", n, "--mpi", "--", "sh", "-c", "if [ $RANK = 1 ]; then exit 7; fi"});
    EXPECT_EQ(r.status, 7) << r.out << r.err;
  }

  // Bad input: an unknown host, a second lab of the same name.
  r = lab({"exec", "--name", n, "h9", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("has no host 'h9' (hosts: h0, h1, h2, h3)"), std::string::npos) << r.err;
  r = lab({"run", "--name", n, "-n", "5", "--", "true"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("more ranks than lab"), std::string::npos) << r.err;
  r = lab({"up", "--leaf", "2", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("lab '" + n + "' is already up"), std::string::npos) << r.err;
  EXPECT_EQ(state(n)["procs"], st["procs"]) << "the refused up touched the live lab";

  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
  expect_gone(st);
  // Idempotent.
  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no lab named '" + n + "' is up"), std::string::npos) << r.err;
}

TEST_F(LabCli, InterruptStopsEveryRankAndAnUpHalfWay) {
  const std::string n = name("i");
  Result r = lab({"up", "--leaf", "2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const std::string out = root_ + "/.run";
  const pid_t run =
      start({"run", "--name", n, "--", "sh", "-c", "echo started; exec sleep 1000"}, out);
  ASSERT_TRUE(eventually([&] {
    const std::string o = read_file(out);
    return o.find("[h0] started") != std::string::npos &&
           o.find("[h1] started") != std::string::npos;
  })) << read_file(out);
  kill(run, SIGINT);
  EXPECT_EQ(wait_status(run), 130) << read_file(out);
  EXPECT_NE(read_file(out).find("[lab] interrupted: stopping every rank"), std::string::npos);
  // No rank is left in the hosts' namespaces.
  for (const std::string h : {"h0", "h1"}) {
    std::string pids;
    FILE* f = popen(("ip netns pids tdlab-" + n + "." + h).c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[256];
    while (std::fgets(buf, sizeof buf, f) != nullptr) pids += buf;
    pclose(f);
    EXPECT_EQ(pids, "") << h;
  }
  // Every rank exits but leaves a background child holding its stdout: run stops it and returns
  // the ranks' status.
  r = lab({"run", "--name", n, "--", "sh", "-c", "sleep 1000 & echo left"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0] left"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("[lab] every rank exited; stopping what they left running"),
            std::string::npos)
      << r.err;
  for (const std::string h : {"h0", "h1"}) {
    std::string pids;
    FILE* f = popen(("ip netns pids tdlab-" + n + "." + h).c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[256];
    while (std::fgets(buf, sizeof buf, f) != nullptr) pids += buf;
    pclose(f);
    EXPECT_EQ(pids, "") << h;
  }
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);

  // SIGTERM to an up that has begun to make its lab: it removes what it made.
  const std::string m = name("j");
  const pid_t up = start({"up", "--fat-tree", "4", "--name", m}, out);
  ASSERT_TRUE(eventually([&] { return fs::exists(root_ + "/" + m + "/state.json"); }));
  const nlohmann::json st = state(m);
  kill(up, SIGTERM);
  const int status = wait_status(up);
  if (status == 0) {
    // It was done before the signal came: then down removes it.
    EXPECT_EQ(lab({"down", "--name", m}).status, 0);
  } else {
    EXPECT_EQ(status, 1) << read_file(out);
    EXPECT_NE(read_file(out).find("interrupted; what the lab had made is removed."),
              std::string::npos)
        << read_file(out);
  }
  EXPECT_FALSE(fs::exists(root_ + "/" + m));
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/run/netns", ec)) {
    EXPECT_NE(e.path().filename().string().rfind("tdlab-" + m + ".", 0), 0u) << e.path();
  }
  EXPECT_FALSE(fs::exists("/sys/class/net/tl" + std::to_string(st["slot"].get<int>()) + "br"));
}

TEST_F(LabCli, KilledWithSigkillThenDownAndUpAgain) {
  const std::string n = name("k");
  Result r = lab({"up", "--leaf", "2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  nlohmann::json st = state(n);
  ASSERT_EQ(st["procs"].size(), 2u);  // the manager and the switch
  for (const auto& p : st["procs"]) kill(p["pid"].get<int>(), SIGKILL);
  // The kills are asynchronous: wait until the processes are gone (a bound only against a hang).
  for (int i = 0; i < 3000; ++i) {
    bool any = false;
    for (const auto& p : st["procs"]) {
      any |= process_is(p["pid"].get<int>(), p["argv"].get<std::vector<std::string>>());
    }
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("DEAD"), std::string::npos) << r.out;

  // A lab whose processes are all gone is reaped by the next up of its name.
  r = lab({"up", "--leaf", "2", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("removing it first"), std::string::npos) << r.err;
  expect_processes_gone(st);
  EXPECT_NE(state(n)["manager"], st["manager"]);
  st = state(n);
  for (const auto& p : st["procs"]) kill(p["pid"].get<int>(), SIGKILL);
  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
  expect_gone(st);
}

TEST_F(LabCli, UpKilledWithSigkillHalfWayThenDown) {
  // `lab up` killed with -9 half-way: the manager and a switch are started and recorded, the
  // state says "starting". `down` must not take the manager or the switch for the `up` (nor
  // signal up's old pid): it removes everything at once. The switch is a wrapper that holds
  // until the test releases it, so the kill always lands half-way; released, it execs the
  // real switch under the recorded command line, as a real one would run on.
  const std::string n = name("h");
  const std::string out = root_ + "/.uph";
  const std::string release = root_ + "/.uph-release";
  const std::string wrapper = root_ + "/held-switch";
  {
    std::ofstream w(wrapper);
    w << "#!/bin/bash\nwhile [ ! -e '" << release << "' ]; do sleep 0.02; done\n"
      << "exec -a \"$0\" '" << TREEDUCE_SWITCH_BIN << "' \"$@\"\n";
  }
  fs::permissions(wrapper, fs::perms::owner_all);
  const pid_t up =
      start({"up", "--leaf", "2", "--name", n}, out, "TREEDUCE_SWITCH_BIN=" + shq(wrapper));
  const std::string path = root_ + "/" + n + "/state.json";
  nlohmann::json st;
  const bool held = eventually([&] {
    if (!fs::exists(path)) return false;
    st = state(n);
    bool manager = false, sw = false;
    for (const auto& p : st["procs"]) {
      manager = manager || p["role"] == "manager";
      sw = sw || p["role"] == "switch";
    }
    return manager && sw;
  });
  kill(up, SIGKILL);
  EXPECT_EQ(wait_status(up), 128 + SIGKILL) << read_file(out);
  std::ofstream(release).put('\n');
  ASSERT_TRUE(held) << read_file(out);
  st = state(n);
  EXPECT_EQ(st["phase"], "starting");
  // Every switch the up started has exec'd the real switch under its recorded command line.
  ASSERT_TRUE(eventually([&] {
    for (const auto& p : st["procs"]) {
      if (p["role"] != "switch") continue;
      std::error_code ec;
      if (fs::read_symlink("/proc/" + std::to_string(p["pid"].get<int>()) + "/exe", ec) !=
          fs::path(TREEDUCE_SWITCH_BIN))
        return false;
    }
    return true;
  }));
  Result r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("a `lab up` of it failed half-way"), std::string::npos) << r.err;
  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "lab '" + n + "' is down.\n");
  expect_gone(st);
}

TEST_F(LabCli, TwoLabsAtOnce) {
  const std::string a = name("x"), b = name("y");
  Result r = lab({"up", "--leaf", "2", "--name", a});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  // A two-level fat-tree with k=2: two leaves of one host, one spine; every switch port drops a
  // fifth of what it receives, and the results stay exact.
  r = lab({"up", "--fat-tree", "2", "--loss", "0.2", "--name", b});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json sa = state(a), sb = state(b);
  EXPECT_NE(sa["slot"], sb["slot"]);
  EXPECT_NE(sa["manager"], sb["manager"]);
  EXPECT_EQ(sb["switches"].size(), 3u);
  for (const std::string& n : {a, b}) {
    r = lab({"status", "--name", n});
    EXPECT_EQ(r.status, 0) << r.out << r.err;
  }
  // Both reduce in their own network at the same time.
  const std::vector<std::string> perf = {
      "--", "treeduce-perf", "-b", "1024", "-e", "16384", "-d", "f32",
      "-o", "sum",           "-n", "2",    "-w", "0",     "-c", "1"};
  std::vector<std::string> ra = {"run", "--name", a}, rb = {"run", "--name", b};
  ra.insert(ra.end(), perf.begin(), perf.end());
  rb.insert(rb.end(), perf.begin(), perf.end());
  Result out_a;
  std::thread t([&] { out_a = lab(ra); });
  const Result out_b = lab(rb);
  t.join();
  EXPECT_EQ(out_a.status, 0) << out_a.out << out_a.err;
  EXPECT_EQ(out_b.status, 0) << out_b.out << out_b.err;
  EXPECT_NE(out_b.out.find("[h0-0] # treeduce-perf: 2 ranks, path network"), std::string::npos)
      << out_b.out;
  EXPECT_NE(out_b.out.find("[h0-0] # verified: 0 wrong elements"), std::string::npos) << out_b.out;
  r = lab({"status", "--name", b});
  EXPECT_NE(r.out.find(" injected_loss "), std::string::npos) << r.out;
  EXPECT_EQ(lab({"down", "--name", a}).status, 0);
  expect_gone(sa);
  r = lab({"status", "--name", b});
  EXPECT_EQ(r.status, 0) << "taking lab " << a << " down touched lab " << b << ":\n" << r.out;
  EXPECT_EQ(lab({"down", "--name", b}).status, 0);
  expect_gone(sb);
}

// The rail-optimised generator: one group of two servers with two rails each (two rail leaves,
// one spine), each server's rail a host of its own; a job across both rails reduces through the
// spine, exactly.
TEST_F(LabCli, RailOptimisedUpRunDown) {
  const std::string n = name("r");
  Result r = lab({"up", "--rail", "1,2,2,1", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json st = state(n);
  EXPECT_EQ(st["switches"].size(), 3u);
  EXPECT_EQ(st["hosts"].size(), 4u);
  r = lab({"run", "--name", n, "--", "treeduce-perf", "-b", "1024", "-e", "16384", "-d", "i32",
           "-o", "sum", "-n", "2", "-w", "0", "-c", "1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[g0-s0-r0] # treeduce-perf: 4 ranks, path network"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[g0-s0-r0] # verified: 0 wrong elements"), std::string::npos) << r.out;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
  expect_gone(st);
}

// The issue's size: a two-level fabric of 16 hosts (four leaves of four, two spines: the example
// topology of docs/lab.md) up on this machine, one allreduce on all 16 ranks exact in the
// network, and down leaving nothing.
TEST_F(LabCli, SixteenHostLeafSpineUpOneAllreduceDown) {
  const std::string n = name("s");
  Result r = lab(
      {"up", std::string(TREEDUCE_SOURCE_ROOT) + "/lab/examples/leaf-spine-16.yaml", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json st = state(n);
  EXPECT_EQ(st["switches"].size(), 6u);
  EXPECT_EQ(st["hosts"].size(), 16u);
  r = lab({"run", "--name", n, "--", "treeduce-perf", "-b", "65536", "-e", "65536", "-d", "f32",
           "-o", "sum", "-n", "1", "-w", "0", "-c", "1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[h0] # treeduce-perf: 16 ranks, path network"), std::string::npos) << r.out;
  std::smatch m;
  EXPECT_TRUE(std::regex_search(
      r.out, m,
      std::regex(R"(\[h0\] # verified: 0 wrong elements, [1-9][0-9]* ops in the network, 0 on )")))
      << r.out;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
  expect_gone(st);
}

TEST_F(LabCli, BadInputOneSentenceNothingLeft) {
  const std::string n = name("b");
  // A topology error: the parser's sentence with its line.
  const std::string topo = root_ + "/bad.yaml";
  std::ofstream(topo) << "switches:\n  - {name: leaf0, level: 0, data: \"10.0.0.1:47110\"}\n"
                         "hosts:\n  - {name: h0, address: 10.1.0.1, switch: leafX}\n";
  Result r = lab({"up", topo, "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "treeduce lab: " + topo + ": line 4: host 'h0' names unknown switch 'leafX'.\n");
  EXPECT_FALSE(fs::exists(root_ + "/" + n));

  // Names that would go into paths, YAML and namespace names unchecked.
  std::ofstream(topo) << "switches:\n  - {name: \"leaf/0\", level: 0, data: \"10.0.0.1:47110\"}\n"
                         "hosts:\n  - {name: h0, address: 10.1.0.1, switch: \"leaf/0\"}\n";
  r = lab({"up", topo, "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "treeduce lab: switch name 'leaf/0' does not fit a lab (1 to 32 letters, digits, '-' "
            "or '_').\n");
  EXPECT_FALSE(fs::exists(root_ + "/" + n));
  std::ofstream(topo) << "switches:\n  - {name: leaf0, level: 0, data: \"10.0.0.1:47110\"}\n"
                         "hosts:\n  - {name: \"h0: x\", address: 10.1.0.1, switch: leaf0}\n";
  r = lab({"up", topo, "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "treeduce lab: host name 'h0: x' does not fit a lab (1 to 32 letters, digits, '-' or "
            "'_').\n");
  EXPECT_FALSE(fs::exists(root_ + "/" + n));

  r = lab({"up", "--leaf", "2", "--fat-tree", "2", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("give one of"), std::string::npos) << r.err;
  r = lab({"up", "--fat-tree", "3", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("even k"), std::string::npos) << r.err;
  r = lab({"up", "--rail", "1,2", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "treeduce lab: --rail takes GROUPS,SERVERS,RAILS,SPINES, four numbers (for example "
            "1,4,2,1), not '1,2'.\n");
  r = lab({"up", "--rail", "1,2,0,1", "--name", n});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--rail 1,2,0,1: a rail-optimised fabric needs at least one group"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/" + n));

  // A MASTER_PORT no rank could listen on (it was handed to the ranks as it was).
  for (const char* port : {"0", "65536"}) {
    r = lab({"run", "--name", n, "--master-port", port, "--", "true"});
    EXPECT_EQ(r.status, 2) << port;
    EXPECT_NE(r.err.find("--master-port: Value " + std::string(port) + " not in range 1 to 65535"),
              std::string::npos)
        << r.err;
  }

  // No lab of that name.
  r = lab({"exec", "--name", n, "h0", "--", "true"});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no lab named '" + n + "' is up"), std::string::npos) << r.err;
  r = lab({"down", "--name", n});
  EXPECT_EQ(r.status, 0) << r.err;

  // A missing binary is refused before anything is made.
  r = lab({"up", "--leaf", "2", "--name", n}, "TREEDUCE_SWITCH_BIN=/nonexistent/treeduce-switch");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("TREEDUCE_SWITCH_BIN is '/nonexistent/treeduce-switch', which is not an "
                       "executable file."),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/" + n));

  // A switch that fails at start: the half-built lab is removed again.
  r = lab({"up", "--leaf", "2", "--name", n}, "TREEDUCE_SWITCH_BIN=/bin/false");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("treeduce-switch leaf0 exited at start"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/" + n));
  for (const std::string h : {"h0", "h1"}) {
    EXPECT_FALSE(fs::exists("/run/netns/tdlab-" + n + "." + h));
  }

  // A namespace of the lab's names that someone else made: refused, and left alone.
  ASSERT_EQ(std::system(("ip netns add tdlab-" + n + ".h1").c_str()), 0);
  r = lab({"up", "--leaf", "2", "--name", n});
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("network namespace tdlab-" + n + ".h1 already exists"), std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists("/run/netns/tdlab-" + n + ".h1"));
  EXPECT_FALSE(fs::exists("/run/netns/tdlab-" + n + ".h0"));
  EXPECT_FALSE(fs::exists(root_ + "/" + n));
  std::system(("ip netns del tdlab-" + n + ".h1").c_str());

  // Not root.
  const std::string cmd = "env TREEDUCE_LAB_ROOT=" + shq(root_) +
                          " setpriv --reuid=65534 --regid=65534 --clear-groups " +
                          shq(TREEDUCE_CLI_BIN) + " lab status 2>" + shq(root_ + "/.nr");
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 1);
  EXPECT_EQ(read_file(root_ + "/.nr"),
            "treeduce lab needs root for network namespaces; run it as root or with sudo.\n");

  // A bad lab name.
  r = lab({"status", "--name", "a.b"});
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("'a.b' is not a lab name"), std::string::npos) << r.err;
}

}  // namespace
