// The torch.distributed backend "treeduce" (docs/pytorch.md) on a `treeduce lab` of one leaf and
// four hosts, through the real treeduce binary and /usr/bin/python3 with the build tree's package
// (PYTHONPATH): every operation and dtype against Gloo on 4 and 2 ranks
// (tests/python/check_ops.py); DDP training against the same training on Gloo, plain and with
// the bf16 and FP8 hooks (tests/python/check_ddp.py); two runs on a deterministic tree give
// bit-identical parameters; a rank killed mid-training gives every other rank an error; a switch
// killed mid-training: training goes on on the host path and says so. One lab for all cases,
// under a state root of its own. Needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_test_util.h"

// GCC 12 at -O3 misreports `"literal" + std::string&&` as an overlapping memcpy (GCC bug 105329).
#pragma GCC diagnostic ignored "-Wrestrict"

namespace {

namespace fs = std::filesystem;
using treeduce::labtest::has;
using treeduce::labtest::read_file;
using treeduce::labtest::shq;

/// Waits until `pred` holds (a training run: up to 180 s before it counts as a hang).
template <typename F>
bool eventually(F pred) {
  return treeduce::labtest::eventually(pred, std::chrono::seconds(180));
}

int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

struct Outcome {
  int status = -1;
  std::string out;
};

/// The first line of `out` that holds a JSON object after "[h0] " (rank 0's summary).
nlohmann::json summary(const std::string& out) {
  std::istringstream in(out);
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("[h0] {", 0) == 0) return nlohmann::json::parse(l.substr(5));
  }
  return nullptr;
}

std::string python_path() { return std::string(TREEDUCE_PYTHON_SITE); }
std::string source(const std::string& rel) { return std::string(TREEDUCE_SOURCE_ROOT) + "/" + rel; }

class LabTorch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    char tmpl[] = "/tmp/treeduce-labtorch-XXXXXX";
    if (!mkdtemp(tmpl)) return;
    root_ = tmpl;
    chmod(root_.c_str(), 0755);
    name_ = "t" + std::to_string(getpid());
    const Outcome r = lab({"up", "--leaf", "4", "--name", name_});
    up_ = r.status == 0;
    if (!up_) std::fprintf(stderr, "lab up failed:\n%s\n", r.out.c_str());
  }
  static void TearDownTestSuite() {
    if (root_.empty()) return;
    lab({"down", "--name", name_});
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    ASSERT_TRUE(up_) << "the lab did not come up";
  }

  /// `treeduce lab ARGS...`, stdout and stderr together.
  static Outcome lab(const std::vector<std::string>& args, const std::string& env = "") {
    std::string cmd =
        "env TREEDUCE_LAB_ROOT=" + shq(root_) + " " + env + " " + shq(TREEDUCE_CLI_BIN) + " lab";
    for (const auto& a : args) cmd += " " + shq(a);
    static int calls = 0;
    const std::string out = root_ + "/.out" + std::to_string(calls++);
    cmd += " >" + shq(out) + " 2>&1 </dev/null";
    const int rc = std::system(cmd.c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out)};
  }

  /// /usr/bin/python3 SCRIPT ARGS on the first `n` hosts under `lab run`. Gloo's own groups
  /// (the reference) bind to the management interface.
  static Outcome python(int n, const std::vector<std::string>& script,
                        const std::string& env = "") {
    std::vector<std::string> args = {"run",
                                     "--name",
                                     name_,
                                     "-n",
                                     std::to_string(n),
                                     "--",
                                     "env",
                                     "GLOO_SOCKET_IFNAME=mgmt0",
                                     "PYTHONPATH=" + python_path(),
                                     "/usr/bin/python3",
                                     "-W",
                                     "ignore"};
    args.insert(args.end(), script.begin(), script.end());
    return lab(args, env);
  }

  static std::string root_, name_;
  static bool up_;
};
std::string LabTorch::root_, LabTorch::name_;
bool LabTorch::up_ = false;

TEST_F(LabTorch, EveryOperationAndTypeAgainstGlooOn4And2Ranks) {
  for (int n : {4, 2}) {
    const Outcome r = python(n, {source("tests/python/check_ops.py")});
    EXPECT_EQ(r.status, 0) << r.out;
    const nlohmann::json s = summary(r.out);
    ASSERT_TRUE(s.is_object()) << r.out;
    EXPECT_EQ(s["failures"], 0) << r.out;
    EXPECT_GT(s["checks"].get<int>(), 100);
    EXPECT_EQ(s["info"]["path"], "network") << r.out;
    EXPECT_GT(s["info"]["network_ops"].get<long>(), 100) << r.out;
    EXPECT_EQ(s["info"]["fallback_ops"], 0) << r.out;
    // The operations that are Gloo's are said once, by name.
    EXPECT_TRUE(has(r.out, "[h0] treeduce: info: allgather goes through Gloo")) << r.out;
  }
}

TEST_F(LabTorch, DdpTrainingMatchesGlooPlainBf16AndFp8) {
  for (const std::string hook : {"none", "bf16", "fp8", "fp8-e5m2"}) {
    const Outcome r = python(4, {source("tests/python/check_ddp.py"), hook, "8"});
    EXPECT_EQ(r.status, 0) << r.out;
    const nlohmann::json s = summary(r.out);
    ASSERT_TRUE(s.is_object()) << r.out;
    EXPECT_TRUE(s["ok"].get<bool>()) << r.out;
    EXPECT_EQ(s["path"], "network") << r.out;
    // The FP8 hooks' Gloo run computes the switch's arithmetic: bit-identical.
    if (hook.rfind("fp8", 0) == 0) {
      EXPECT_EQ(s["max_diff"].get<double>(), 0.0) << r.out;
    }
  }
}

TEST_F(LabTorch, DeterministicTreeTrainsBitIdenticallyTwice) {
  std::vector<std::string> sha;
  for (int i = 0; i < 2; ++i) {
    const Outcome r =
        python(4, {source("tests/python/check_ddp.py"), "none", "8"}, "TREEDUCE_DETERMINISTIC=1");
    EXPECT_EQ(r.status, 0) << r.out;
    const nlohmann::json s = summary(r.out);
    ASSERT_TRUE(s.is_object()) << r.out;
    EXPECT_EQ(s["path"], "network") << r.out;
    sha.push_back(s["sha256"]);
  }
  EXPECT_EQ(sha[0], sha[1]);
}

// On a Quantum-2-like leaf, which does not reduce FP8, the FP8 hook's sums run on the host path,
// said on every call with the switch model, and the training is still the switch's arithmetic
// (bit-identical to the hook on Gloo); everything else stays in the network.
TEST_F(LabTorch, Fp8OnASwitchWithoutFp8GoesToTheHostsLoudlyAndExactly) {
  const std::string q2 = name_ + "q";
  const Outcome up = lab({"up", source("tests/lab/torch-quantum2.yaml"), "--name", q2});
  ASSERT_EQ(up.status, 0) << up.out;
  const Outcome r = lab({"run", "--name", q2, "--", "env", "GLOO_SOCKET_IFNAME=mgmt0",
                         "PYTHONPATH=" + python_path(), "/usr/bin/python3", "-W", "ignore",
                         source("tests/python/check_ddp.py"), "fp8", "4"});
  lab({"down", "--name", q2});
  EXPECT_EQ(r.status, 0) << r.out;
  const nlohmann::json s = summary(r.out);
  ASSERT_TRUE(s.is_object()) << r.out;
  EXPECT_EQ(s["max_diff"].get<double>(), 0.0) << r.out;
  EXPECT_EQ(s["path"], "network") << r.out;
  for (const char* h : {"h0", "h1"}) {
    EXPECT_TRUE(std::regex_search(
        r.out,
        std::regex(
            std::string(R"(\[)") + h +
            R"(\] treeduce: warning: rank \d: allreduce of \d+ e4m3 sum on the host path: switch 'leaf0' \(profile quantum2\) does not reduce e4m3 sum)")))
        << r.out;
  }
}

// A rank SIGKILLs itself at step 3. The ranks run under `lab exec` with the variables `lab run`
// gives (`lab run` would stop the others at once, as torchrun does), so that each survivor shows
// what it gets: an error from its collective, and an exit of its own. On the network path a
// dead rank is a chunk that gets no result: 3.3 to 3.8 s with 30 retransmissions (the default's
// 80 wait 9.7 to 10.3 s).
TEST_F(LabTorch, RankKilledMidTrainingEveryOtherRankGetsAnError) {
  const Outcome env = lab({"run", "--name", name_, "--", "env"});
  ASSERT_EQ(env.status, 0) << env.out;
  std::map<std::string, std::string> vars;  // host -> "VAR=value ..."
  std::istringstream in(env.out);
  static const std::regex re(
      R"(^\[(h\d)\] ((RANK|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|TREEDUCE_(BIND|HOST|MANAGER|FALLBACK_ADDRESS|TLS_CA|TLS_CERT|TLS_KEY))=\S+)$)");
  for (std::string l; std::getline(in, l);) {
    std::smatch m;
    if (std::regex_match(l, m, re)) vars[m[1]] += " " + shq(m[2]);
  }
  ASSERT_EQ(vars.size(), 4u) << env.out;
  const std::string store = root_ + "/kill-store";
  fs::create_directories(store);
  std::vector<pid_t> pids;
  for (int h = 0; h < 4; ++h) {
    const std::string host = "h" + std::to_string(h);
    const std::string cmd =
        "exec env TREEDUCE_LAB_ROOT=" + shq(root_) + " " + shq(TREEDUCE_CLI_BIN) +
        " lab exec --name " + name_ + " " + host + " -- env" + vars[host] + " TREEDUCE_JOB=kill-" +
        name_ + " TREEDUCE_PATH=network TREEDUCE_FALLBACK_STORE=" + shq(store) +
        " TREEDUCE_MAX_RETRIES=30 PYTHONPATH=" + shq(python_path()) +
        " /usr/bin/python3 -W ignore " + shq(source("examples/ddp_train.py")) +
        " --epochs 2 --steps 5 --hidden 128 --die-at-step 3 --die-rank 1 --timeout 20 >" +
        shq(root_ + "/kill." + host) + " 2>&1 </dev/null";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> status;
  for (pid_t p : pids) {
    int st = 0;
    const bool ended = eventually([&] { return waitpid(p, &st, WNOHANG) == p; });
    if (!ended) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
    }
    EXPECT_TRUE(ended) << "a rank still runs after 180 s";
    status.push_back(WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  EXPECT_EQ(status[1], 137) << read_file(root_ + "/kill.h1");
  for (int h : {0, 2, 3}) {
    const std::string out = read_file(root_ + "/kill.h" + std::to_string(h));
    EXPECT_EQ(status[h], 3) << out;
    EXPECT_TRUE(has(out, "rank " + std::to_string(h) + ": training stopped: treeduce: rank " +
                             std::to_string(h) + ": allreduce of 1 tensor(s) with SUM failed"))
        << out;
  }
}

// Last: it kills the leaf (and restarts it for whatever runs after). Every rank waits at step 7
// for a file; the test kills the switch, then lets them go on (on the host path 3.3 to 3.8 s
// later, with 30 retransmissions).
TEST_F(LabTorch, SwitchKilledMidTrainingGoesOnOnTheHostPathLoudly) {
  const std::string pause = root_ + "/pause";
  const std::string out = root_ + "/switch-kill.out";
  const std::string cmd = "exec env TREEDUCE_LAB_ROOT=" + shq(root_) + " " + shq(TREEDUCE_CLI_BIN) +
                          " lab run --name " + name_ +
                          " -- env TREEDUCE_MAX_RETRIES=30 PYTHONPATH=" + shq(python_path()) +
                          " /usr/bin/python3 -W ignore " + shq(source("examples/ddp_train.py")) +
                          " --epochs 4 --steps 5 --hidden 128 --pause-at-step 7 --pause-file " +
                          shq(pause) + " >" + shq(out) + " 2>&1 </dev/null";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const bool ready = eventually([&] {
    for (int r = 0; r < 4; ++r) {
      if (!fs::exists(pause + ".ready." + std::to_string(r))) return false;
    }
    return true;
  });
  EXPECT_TRUE(ready) << read_file(out);
  const Outcome k = lab({"fault", "kill", "leaf0", "--name", name_});
  EXPECT_EQ(k.status, 0) << k.out;
  std::ofstream(pause + ".go");
  const int status = wait_status(pid);
  const std::string o = read_file(out);
  EXPECT_EQ(status, 0) << o;
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(has(o, "[h" + std::to_string(r) + "] treeduce: warning: rank " + std::to_string(r) +
                           " falls back to host-side reduction"))
        << o;
  }
  EXPECT_TRUE(has(o, "[h0] epoch   3  loss")) << o;
  EXPECT_TRUE(has(o, "[h0] treeduce: {\"offloaded\": true, \"path\": \"host\"")) << o;
  const Outcome rs = lab({"fault", "restart", "leaf0", "--name", name_});
  EXPECT_EQ(rs.status, 0) << rs.out;
}

}  // namespace
