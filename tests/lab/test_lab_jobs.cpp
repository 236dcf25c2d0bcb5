// Jobs on `treeduce lab` labs through the real treeduce binary (docs/lab.md, "Several jobs"):
// two jobs at once sharing a switch, each exact and each with its own tree and counters; jobs on
// a fat-tree until the manager refuses one for lack of switch resources, which then reduces on
// the hosts, exactly; a rank program of one's own on the documented C API, built with pkg-config
// against the build tree; the main job's topology (scripts/main.sh) with its settings. Needs root.
// Every lab lives under a state root of its own (TREEDUCE_LAB_ROOT) with names carrying this
// process's pid, so that it never meets a user's lab.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_test_support.h"

namespace {

using namespace treeduce::labtest;

/// GET http://127.0.0.1:port/metrics (a switch's Prometheus endpoint): the body.
std::string get_metrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string r;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) r.append(buf, std::size_t(n));
    }
  }
  close(fd);
  const std::size_t body = r.find("\r\n\r\n");
  return body == std::string::npos ? "" : r.substr(body + 4);
}

/// treeduce_tree_events_total of a switch: tree id -> (job, event -> count).
struct TreeCounters {
  std::string job;
  std::map<std::string, double> events;
};
std::map<int, TreeCounters> tree_events(const std::string& metrics) {
  std::map<int, TreeCounters> out;
  const std::string family = "treeduce_tree_events_total{";
  auto label = [](const std::string& l, const std::string& key) {
    const std::size_t b = l.find(key + "=\"");
    if (b == std::string::npos) return std::string();
    const std::size_t v = b + key.size() + 2;
    return l.substr(v, l.find('"', v) - v);
  };
  for (const std::string& l : lines(metrics)) {
    if (l.rfind(family, 0) != 0) continue;
    const std::size_t close = l.rfind("} ");
    if (close == std::string::npos) continue;
    TreeCounters& t = out[std::stoi(label(l, "tree"))];
    t.job = label(l, "job");
    t.events[label(l, "event")] = std::stod(l.substr(close + 2));
  }
  return out;
}

/// The job name `treeduce lab run` announces on stderr ("[lab] job NAME: N ranks on ...").
std::string job_of(const std::string& out) {
  std::smatch m;
  static const std::regex re(R"(\[lab\] job (\S+): \d+ ranks)");
  return std::regex_search(out, m, re) ? std::string(m[1]) : "";
}

/// A row of `lab status`'s jobs or trees table whose first column is `first`: its columns.
std::vector<std::string> row(const std::string& status, const std::string& first) {
  for (const std::string& l : lines(status)) {
    std::istringstream in(l);
    std::vector<std::string> cols;
    for (std::string c; in >> c;) cols.push_back(c);
    if (!cols.empty() && cols[0] == first) return cols;
  }
  return {};
}

class LabJobs : public LabTest {
 protected:
  LabJobs() : LabTest("labjobs") {}

  /// Ranks still held by a failed test go before the labs.
  void before_down() override {
    std::ofstream(root_ + "/release");
    for (pid_t p : background_) {
      kill(p, SIGTERM);
      wait_status(p);
    }
  }

  /// `treeduce lab ARGS...` in the background, stdout and stderr to `out`; its pid (reaped by
  /// finish() or, after a failure, by TearDown).
  pid_t start(const std::vector<std::string>& args, const std::string& out) {
    const pid_t pid = LabTest::start(args, out);
    background_.push_back(pid);
    return pid;
  }
  int finish(pid_t pid) {
    std::erase(background_, pid);
    return wait_status(pid);
  }

  /// tests/lab/lab_job_rank.c built as a user builds a program on libtreeduce (docs/host.md,
  /// "Build"): cc with pkg-config's flags from the build tree's treeduce-uninstalled.pc.
  std::string rank_program() {
    const std::string bin = root_ + "/lab_job_rank";
    const std::string cmd = "PKG_CONFIG_PATH=" + shq(TREEDUCE_PKGCONFIG_DIR) + " sh -c 'cc " +
                            TREEDUCE_SANITIZE +
                            " -O2 -Wall -Wextra -Werror \"$0\" $(pkg-config --cflags "
                            "--libs treeduce) -o \"$1\"' " +
                            shq(std::string(TREEDUCE_SOURCE_ROOT) + "/tests/lab/lab_job_rank.c") +
                            " " + shq(bin) + " >" + shq(root_ + "/.cc") + " 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(rc, 0) << read_file(root_ + "/.cc");
    return bin;
  }

  /// Waits until `out` (a background lab run's output) has "[host] rank R: held" for each host;
  /// false at once when the run ended instead.
  bool held(const std::string& out, const std::vector<std::string>& hosts) {
    bool all = false;
    eventually([&] {
      const std::string o = read_file(out);
      all = true;
      for (std::size_t r = 0; r < hosts.size(); ++r) {
        all &= has(o, "[" + hosts[r] + "] rank " + std::to_string(r) + ": held");
      }
      return all ||
             std::regex_search(o, std::regex(R"(\[lab\] job \S+: (exit status|every rank))"));
    });
    return all;
  }

  std::vector<pid_t> background_;
};

/// Every rank of a treeduce-perf run in `out` (stdout and stderr of `lab run`) reported an exact
/// run; rank 0's summary is `0 wrong elements` with operations on `path` only. Returns rank 0's
/// count of in-network operations.
long expect_perf_exact(const std::string& out, const std::vector<std::string>& hosts,
                       const std::string& path) {
  const std::string h0 = "[" + hosts[0] + "] ";
  EXPECT_TRUE(
      has(out, h0 + "# treeduce-perf: " + std::to_string(hosts.size()) + " ranks, path " + path))
      << out;
  for (std::size_t r = 0; r < hosts.size(); ++r) {
    EXPECT_TRUE(has(out, "[" + hosts[r] + "] treeduce-perf: rank " + std::to_string(r) +
                             ": 0 failed operations, 0 wrong elements"))
        << out;
  }
  std::smatch m;
  const std::regex re(
      std::regex_replace(h0, std::regex(R"([\[\]])"), R"(\$&)") +
      R"(# verified: 0 wrong elements, (\d+) ops in the network, (\d+) on the hosts)");
  if (!std::regex_search(out, m, re)) {
    ADD_FAILURE() << "no verified summary from " << hosts[0] << ":\n" << out;
    return -1;
  }
  const long network = std::stol(m[1]), host = std::stol(m[2]);
  if (path == "network") {
    EXPECT_GT(network, 0) << out;
    EXPECT_EQ(host, 0) << out;
  } else {
    EXPECT_EQ(network, 0) << out;
    EXPECT_GT(host, 0) << out;
  }
  // Every row of the table took that path.
  int rows = 0;
  for (const std::string& l : lines(out)) {
    // A row: "[h0]  " and the right-aligned size (stderr's lines start with a word).
    if (l.rfind(h0, 0) != 0 || l.size() <= h0.size() || l[h0.size()] != ' ') continue;
    ++rows;
    EXPECT_TRUE(has(l, " " + path + " ")) << l;
  }
  EXPECT_GT(rows, 0) << out;
  return network;
}

TEST_F(LabJobs, TwoJobsShareALeafEachExactWithItsOwnTree) {
  const std::string n = name("s");
  // Standard frames: 1 KiB payloads, for which libtreeduce's default window is 64 slots.
  Result r = lab({"up", "--leaf", "4", "--name", n, "--mtu", "1500"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  const nlohmann::json st = state(n);

  // Two treeduce-perf jobs at once on the same switch: h0,h1 and h2,h3. Every rank waits at a
  // gate until all four have started, so that the jobs run side by side.
  const std::string gate = root_ + "/gate";
  fs::create_directories(gate);
  const std::string gated =
      "touch \"$0/$TREEDUCE_LAB_HOST\"; until [ -e \"$0/go\" ]; do sleep 0.01; done; exec "
      "\"$@\"";
  const std::vector<std::vector<std::string>> perf = {
      {"-b", "1024", "-e", "65536", "-f", "4", "-d", "f32", "-o", "sum", "-n", "3", "-w", "1"},
      {"-b", "4096", "-e", "262144", "-f", "8", "-d", "i32,bf16", "-o", "max", "-n", "5", "-w",
       "1"}};
  const std::vector<std::vector<std::string>> hosts = {{"h0", "h1"}, {"h2", "h3"}};
  std::vector<pid_t> runs;
  for (int j = 0; j < 2; ++j) {
    std::vector<std::string> args = {
        "run", "--name", n,    "--hosts",        hosts[j][0] + "," + hosts[j][1], "--", "sh",
        "-c",  gated,    gate, TREEDUCE_PERF_BIN};
    args.insert(args.end(), perf[j].begin(), perf[j].end());
    runs.push_back(start(args, root_ + "/perf" + std::to_string(j)));
  }
  ASSERT_TRUE(eventually([&] {
    for (const std::string h : {"h0", "h1", "h2", "h3"}) {
      if (!fs::exists(gate + "/" + h)) return false;
    }
    return true;
  }));
  std::ofstream(gate + "/go");
  std::string jobs[2];
  long network_ops[2];
  for (int j = 0; j < 2; ++j) {
    const int status = finish(runs[std::size_t(j)]);
    const std::string out = read_file(root_ + "/perf" + std::to_string(j));
    EXPECT_EQ(status, 0) << out;
    network_ops[j] = expect_perf_exact(out, hosts[std::size_t(j)], "network");
    jobs[j] = job_of(out);
    // Only its own hosts spoke in a job's output.
    for (const std::string& l : lines(out)) {
      EXPECT_TRUE(l.rfind("[lab] ", 0) == 0 || l.rfind("[" + hosts[j][0] + "] ", 0) == 0 ||
                  l.rfind("[" + hosts[j][1] + "] ", 0) == 0)
          << l;
    }
  }
  EXPECT_NE(jobs[0], jobs[1]);
  // Each counts its own operations: 4 sizes x 1 pair x 3 timed against 3 sizes x 2 pairs x 5
  // timed (and their warm-ups and checks): different sweeps, different counts.
  EXPECT_NE(network_ops[0], network_ops[1]);

  // Each job's tree and counters, while both hold their trees: two jobs of our own program
  // with different amounts of work, held after their allreduces until we let them go.
  const std::string rank = rank_program();
  const std::string release = root_ + "/release";
  const int count[2] = {512, 2048}, iters[2] = {3, 5};
  std::vector<pid_t> held_runs;
  for (int j = 0; j < 2; ++j) {
    held_runs.push_back(start({"run", "--name", n, "--hosts", hosts[j][0] + "," + hosts[j][1], "--",
                               rank, "--count", std::to_string(count[j]), "--iters",
                               std::to_string(iters[j]), "--path", "network", "--hold", release},
                              root_ + "/held" + std::to_string(j)));
  }
  for (int j = 0; j < 2; ++j) {
    ASSERT_TRUE(held(root_ + "/held" + std::to_string(j), hosts[std::size_t(j)]))
        << read_file(root_ + "/held" + std::to_string(j));
    jobs[j] = job_of(read_file(root_ + "/held" + std::to_string(j)));
  }
  ASSERT_NE(jobs[0], jobs[1]);
  // The manager: both jobs running with their two ranks, on trees of their own.
  r = lab({"status", "--name", n});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  std::set<std::string> trees;
  std::map<std::string, int> tree_of;
  std::map<std::string, long> payload_of;
  for (int j = 0; j < 2; ++j) {
    const std::vector<std::string> job = row(r.out, jobs[j]);  // JOB STATE RANKS TREE REASON
    ASSERT_EQ(job.size(), 5u) << r.out;
    EXPECT_EQ(job[1], "running") << r.out;
    EXPECT_EQ(job[2], "2/2") << r.out;
    trees.insert(job[3]);
    tree_of[jobs[j]] = std::stoi(job[3]);
    const std::vector<std::string> tree = row(r.out, job[3]);  // TREE JOB DEPTH SLOTS PAYLOAD ..
    ASSERT_EQ(tree.size(), 6u) << r.out;
    EXPECT_EQ(tree[1], jobs[j]);
    EXPECT_EQ(tree[5], "leaf0");
    payload_of[jobs[j]] = std::stol(tree[4]);
    // No TREEDUCE_SLOTS: libtreeduce's window for the payload the MTU gives (docs/host.md).
    EXPECT_EQ(payload_of[jobs[j]], 1024) << r.out;
    EXPECT_EQ(tree[3], "64") << r.out;
  }
  EXPECT_EQ(trees.size(), 2u) << r.out;
  // The switch: one set of per-tree counters per job, each with its own job's work only. A
  // chunk is completed once (result_multicast) from one contribution of each of the two ranks.
  const std::map<int, TreeCounters> counters =
      tree_events(get_metrics(st["switches"][0]["metrics_port"].get<int>()));
  // (A tree of the treeduce-perf jobs above may still be on its way out: any other tree is
  // another job's.)
  for (const auto& [id, c] : counters) {
    if (id != tree_of[jobs[0]] && id != tree_of[jobs[1]]) {
      EXPECT_NE(c.job, jobs[0]);
      EXPECT_NE(c.job, jobs[1]);
    }
  }
  for (int j = 0; j < 2; ++j) {
    auto it = counters.find(tree_of[jobs[j]]);
    ASSERT_NE(it, counters.end()) << jobs[j];
    EXPECT_EQ(it->second.job, jobs[j]);
    const long payload = payload_of[jobs[j]];
    const long chunks = iters[j] * ((count[j] * 4 + payload - 1) / payload);
    EXPECT_EQ(it->second.events.at("result_multicast"), chunks) << jobs[j];
    EXPECT_EQ(it->second.events.at("contrib_accepted"), 2 * chunks) << jobs[j];
  }
  std::ofstream(release).put('\n');
  for (int j = 0; j < 2; ++j) {
    const int status = finish(held_runs[std::size_t(j)]);
    const std::string out = read_file(root_ + "/held" + std::to_string(j));
    EXPECT_EQ(status, 0) << out;
    for (int k = 0; k < 2; ++k) {
      EXPECT_TRUE(has(out, "[" + hosts[j][k] + "] rank " + std::to_string(k) +
                               " of 2: " + std::to_string(iters[j]) + " allreduces of " +
                               std::to_string(count[j]) + " i32 exact, path network"))
          << out;
      EXPECT_TRUE(has(out, "[" + hosts[j][k] + "] rank " + std::to_string(k) +
                               ": released, one more allreduce exact, path network"))
          << out;
    }
  }
  r = lab({"status", "--name", n});
  EXPECT_TRUE(has(r.out, "jobs: none")) << r.out;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
}

TEST_F(LabJobs, FatTreeRefusesAJobWhenItsSpinesAreFullAndItReducesOnTheHosts) {
  const std::string n = name("f");
  // Four leaves of two hosts under two spines that hold one tree each (a profile of the
  // topology file, docs/manager.md): two jobs across leaves take both, the third is refused.
  const std::string topo = root_ + "/scarce.yaml";
  {
    std::ofstream y(topo);
    y << "profiles:\n  - {name: one-tree, base: server, max_trees: 1}\nswitches:\n";
    for (int l = 0; l < 4; ++l) {
      y << "  - {name: leaf" << l << ", level: 0, data: \"10.0.0." << l + 1
        << ":47110\", profile: server, ports: 4}\n";
    }
    for (int s = 0; s < 2; ++s) {
      y << "  - {name: spine" << s << ", level: 1, data: \"10.0.1." << s + 1
        << ":47110\", profile: one-tree, ports: 4}\n";
    }
    y << "hosts:\n";
    for (int h = 0; h < 8; ++h) {
      y << "  - {name: h" << h << ", address: 10.1." << h / 2 << "." << h % 2 + 1
        << ", switch: leaf" << h / 2 << ", port: " << h % 2 + 1 << "}\n";
    }
    y << "links:\n";
    for (int l = 0; l < 4; ++l) {
      for (int s = 0; s < 2; ++s) {
        y << "  - {a: leaf" << l << ", a_port: " << 3 + s << ", b: spine" << s
          << ", b_port: " << l + 1 << "}\n";
      }
    }
  }
  Result r = lab({"up", topo, "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;

  const std::string rank = rank_program();
  const std::string release = root_ + "/release";
  // Job 1 on leaves 0 and 1, job 2 on leaves 2 and 3: each needs a spine, and gets one.
  const std::vector<std::vector<std::string>> hosts = {{"h0", "h2"}, {"h4", "h6"}};
  std::vector<pid_t> runs;
  std::string jobs[2];
  for (int j = 0; j < 2; ++j) {
    const std::string out = root_ + "/held" + std::to_string(j);
    runs.push_back(
        start({"run", "--name", n, "--hosts", hosts[j][0] + "," + hosts[j][1], "--", rank,
               "--count", "3000", "--iters", "2", "--path", "network", "--hold", release},
              out));
    ASSERT_TRUE(held(out, hosts[std::size_t(j)])) << read_file(out);
    jobs[j] = job_of(read_file(out));
  }
  r = lab({"status", "--name", n});
  std::set<std::string> roots;
  for (int j = 0; j < 2; ++j) {
    const std::vector<std::string> job = row(r.out, jobs[j]);
    ASSERT_EQ(job.size(), 5u) << r.out;
    EXPECT_EQ(job[1], "running") << r.out;
    const std::vector<std::string> tree = row(r.out, job[3]);
    ASSERT_EQ(tree.size(), 6u) << r.out;
    EXPECT_EQ(tree[2], "1") << r.out;  // a spine over two leaves
    const std::string leaves = j == 0 ? ",leaf0,leaf1" : ",leaf2,leaf3";
    const std::string root = tree[5].substr(0, tree[5].find(','));
    EXPECT_EQ(tree[5], root + leaves) << r.out;
    roots.insert(root);
  }
  EXPECT_EQ(roots, (std::set<std::string>{"spine0", "spine1"})) << r.out;

  // Job 3 on leaves 0 and 2: no spine has a tree left. The manager refuses it, and treeduce-perf
  // runs on the host path, saying why, exact all the same.
  r = lab({"run",     "--name", n,     "--hosts", "h1,h5", "--", TREEDUCE_PERF_BIN,
           "-b",      "1024",   "-e",  "16384",   "-f",    "4",  "-d",
           "f32,i32", "-o",     "sum", "-n",      "2",     "-w", "0"});
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.status, 0) << all;
  expect_perf_exact(all, {"h1", "h5"}, "host");
  const std::string refused = job_of(r.err);
  const std::regex reason("gave the job no tree: no tree for job '" + refused +
                          "': switch spine[01] \\(one-tree\\) is out of trees: 1/1 trees");
  for (const std::string& l : lines(all)) {
    if (l.rfind("[h1] # treeduce-perf: 2 ranks, path host: ", 0) == 0) {
      EXPECT_TRUE(std::regex_search(l, reason)) << l;
    }
  }
  for (const std::string& h : {std::string("[h1] "), std::string("[h5] ")}) {
    bool warned = false;
    for (const std::string& l : lines(r.err)) {
      if (l.rfind(h + "treeduce: warning: rank ", 0) == 0 &&
          has(l, "falls back to host-side reduction: ")) {
        warned = std::regex_search(l, reason);
      }
    }
    EXPECT_TRUE(warned) << h << "\n" << r.err;
  }

  // The admitted jobs were not touched: one more allreduce each, exact, in the network.
  std::ofstream(release).put('\n');
  for (int j = 0; j < 2; ++j) {
    const int status = finish(runs[std::size_t(j)]);
    const std::string out = read_file(root_ + "/held" + std::to_string(j));
    EXPECT_EQ(status, 0) << out;
    for (int k = 0; k < 2; ++k) {
      EXPECT_TRUE(has(out, "[" + hosts[j][k] + "] rank " + std::to_string(k) +
                               " of 2: 2 allreduces of 3000 i32 exact, path network"))
          << out;
      EXPECT_TRUE(has(out, "[" + hosts[j][k] + "] rank " + std::to_string(k) +
                               ": released, one more allreduce exact, path network"))
          << out;
    }
  }
  // With the spines free again, a job across leaves is admitted.
  r = lab(
      {"run", "--name", n, "--hosts", "h1,h5", "--", rank, "--count", "3000", "--path", "network"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
}

TEST_F(LabJobs, OwnProgramOnTheCApiBuiltWithPkgConfig) {
  const std::string rank = rank_program();
  ASSERT_TRUE(fs::exists(rank));
  const std::string n = name("c");
  Result r = lab({"up", "--leaf", "4", "--name", n});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  // Four ranks, tdr_comm_rank/tdr_comm_size checked against RANK/WORLD_SIZE, every element of
  // every result checked by the program itself: its exit status says.
  r = lab({"run", "--name", n, "--", rank, "--count", "5000", "--iters", "4", "--path", "network"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(has(r.out, "[h" + std::to_string(k) + "] rank " + std::to_string(k) +
                               " of 4: 4 allreduces of 5000 i32 exact, path network"))
        << r.out;
  }
  // The same program on chosen hosts in the order given: ranks follow --hosts.
  r = lab({"run", "--name", n, "--hosts", "h3,h0,h2", "--", rank, "--count", "100"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "[h3] rank 0 of 3: 1 allreduces of 100 i32 exact")) << r.out;
  EXPECT_TRUE(has(r.out, "[h2] rank 2 of 3: 1 allreduces of 100 i32 exact")) << r.out;
  // And it can fail: asked for the host path, every rank says it took the network and exits 1.
  r = lab({"run", "--name", n, "-n", "2", "--", rank, "--path", "host"});
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_TRUE(has(r.err, "path network")) << r.err;
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
}

TEST_F(LabJobs, TheMainJobsTopologyWithItsSettings) {
  // scripts/main.sh brings this file up; a run of the script itself (deps, build, the whole
  // sweep) is too slow for the suite, so its lab and run are done here as it does them.
  const std::string topo = std::string(TREEDUCE_SOURCE_ROOT) + "/lab/examples/main-two-level.yaml";
  ASSERT_TRUE(has(read_file(std::string(TREEDUCE_SOURCE_ROOT) + "/scripts/main.sh"),
                  "lab/examples/main-two-level.yaml"));
  const std::string n = name("m");
  Result r = lab({"up", topo, "--name", n, "--mtu", "8300"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(has(r.out, "3 switches, 4 hosts")) << r.out;
  const nlohmann::json st = state(n);
  ASSERT_EQ(st["switches"].size(), 3u);
  // UDP GSO: each host's veth cuts the super-datagrams (main.sh turns the offload off).
  for (const std::string h : {"h0", "h1", "h2", "h3"}) {
    r = lab({"exec", "--name", n, h, "--", "ethtool", "-K", "eth0", "tx-udp-segmentation", "off"});
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  r = lab({"run",          "--name", n,         "--hosts", "h0,h1,h2,h3", "--", TREEDUCE_PERF_BIN,
           "-b",           "4096",   "-e",      "262144",  "-f",          "8",  "-d",
           "f32,bf16,i32", "-o",     "sum,max", "-n",      "2",           "-w", "1"},
          "TREEDUCE_PAYLOAD_BYTES=8192 TREEDUCE_SLOTS=64 TREEDUCE_UDP_GSO=1");
  const std::string all = r.out + r.err;
  EXPECT_EQ(r.status, 0) << all;
  expect_perf_exact(all, {"h0", "h1", "h2", "h3"}, "network");
  EXPECT_EQ(lab({"down", "--name", n}).status, 0);
  EXPECT_FALSE(fs::exists(root_ + "/" + n));
}

}  // namespace
