// libtreeduce-mpi in a lab (docs/mpi.md), through `treeduce lab run --mpi`: an MPI program built
// with mpicc (tests/mpi/mpi_check.c) and an mpi4py script (tests/mpi/mpi_check.py), neither of
// which knows treeduce, run with and without LD_PRELOAD: every result checked by the programs,
// the integer results' digests identical with and without, the counters saying what was
// offloaded and why the rest passed through; bad variables; a switch killed mid-run, after which
// every rank redoes the call through MPI and passes through. One lab for the whole suite. Needs
// root; not parallel with the other fabric tests.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../lab/lab_test_util.h"

namespace {

namespace fs = std::filesystem;
using treeduce::labtest::has;
using treeduce::labtest::read_file;
using treeduce::labtest::shq;
using treeduce::labtest::wait_status;

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

/// The digests the ranks printed ("PROG: rank R: N checks, 0 wrong, digest D"): one per rank
/// that had no wrong result, and every one of them equal (they are of allreduced results). A
/// line may follow another rank's on the same output line (mpirun forwards the ranks' writes as
/// they come: "...digest D1[1,0]<stdout>:PROG: rank 0: ..."), so PROG is found wherever a word
/// starts, not at the start of a line.
std::set<std::string> digests(const std::string& out, const std::string& prog, int ranks) {
  std::set<std::string> d;
  const std::regex re("(?:^|[^A-Za-z0-9_./-])" +
                      std::regex_replace(prog, std::regex(R"(\.)"), R"(\.)") +
                      R"(: rank (\d+): \d+ checks, 0 wrong, digest ([0-9a-f]+))");
  int n = 0;
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    d.insert((*it)[2]);
    ++n;
  }
  EXPECT_EQ(n, ranks) << out;
  return d;
}

class MpiLab : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (geteuid() != 0) return;
    char tmpl[] = "/tmp/treeduce-mpilab-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = new std::string(tmpl);
    chmod(root_->c_str(), 0755);
    const Result up = lab({"up", "--name", name()});
    ASSERT_EQ(up.status, 0) << up.out;
    // The program is built as its users build it: mpicc, no treeduce header or library.
    const std::string cc = "mpicc -O2 -Wall -Wextra -Werror " +
                           shq(std::string(TREEDUCE_SOURCE_ROOT) + "/tests/mpi/mpi_check.c") +
                           " -o " + shq(*root_ + "/mpi_check") + " -lm >" + shq(*root_ + "/.cc") +
                           " 2>&1";
    ASSERT_EQ(std::system(cc.c_str()), 0) << read_file(*root_ + "/.cc");
  }
  static void TearDownTestSuite() {
    if (root_ == nullptr) return;
    lab({"down", "--name", name()});
    std::error_code ec;
    fs::remove_all(*root_, ec);
    delete root_;
    root_ = nullptr;
  }
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    ASSERT_NE(root_, nullptr);
  }

  static std::string name() { return "mpi" + std::to_string(getpid()); }

  static std::string command(const std::vector<std::string>& args) {
    std::string cmd = "env TREEDUCE_LAB_ROOT=";
    cmd += shq(*root_);
    cmd += " ";
    cmd += shq(TREEDUCE_CLI_BIN);
    cmd += " lab";
    for (const auto& a : args) {
      cmd += ' ';
      cmd += shq(a);
    }
    return cmd;
  }

  static Result lab(const std::vector<std::string>& args) {
    static int calls = 0;
    const std::string out = *root_ + "/.out" + std::to_string(calls++);
    const int rc = std::system((command(args) + " >" + shq(out) + " 2>&1 </dev/null").c_str());
    return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_file(out)};
  }

  /// `lab run --mpi` of `prog` on the lab's 4 hosts, with libtreeduce-mpi preloaded when `env`
  /// is not empty (then with `env`'s variables too).
  static std::vector<std::string> run_args(const std::vector<std::string>& prog,
                                           const std::vector<std::string>& env) {
    std::vector<std::string> a = {"run", "--name", name(), "--mpi", "--", "env"};
    if (!env.empty()) a.push_back(std::string("LD_PRELOAD=") + TREEDUCE_MPI_LIB);
    a.insert(a.end(), env.begin(), env.end());
    a.insert(a.end(), prog.begin(), prog.end());
    return a;
  }
  static Result run(const std::vector<std::string>& prog, const std::vector<std::string>& env) {
    return lab(run_args(prog, env));
  }

  static std::string* root_;
};

std::string* MpiLab::root_ = nullptr;

const std::vector<std::string> kStats = {"TREEDUCE_MPI_STATS=1", "TREEDUCE_MPI_MIN_BYTES=64"};

TEST_F(MpiLab, CProgramGivesTheSameResultsWithAndWithoutTheInterposer) {
  const std::vector<std::string> prog = {*root_ + "/mpi_check"};
  const Result plain = run(prog, {});
  ASSERT_EQ(plain.status, 0) << plain.out;
  EXPECT_FALSE(has(plain.out, "treeduce-mpi"));
  const Result offl = run(prog, kStats);
  ASSERT_EQ(offl.status, 0) << offl.out;
  const auto a = digests(plain.out, "mpi_check", 4), b = digests(offl.out, "mpi_check", 4);
  EXPECT_EQ(a.size(), 1u) << plain.out;
  EXPECT_EQ(a, b) << offl.out;
  // Rank 0 of each communicator prints its counters: the world, and each half of the split and
  // its duplicate (h0 is rank 0 of one half, h1 of the other).
  EXPECT_TRUE(std::regex_search(
      offl.out,
      std::regex(
          R"(\[h0\] treeduce-mpi: stats: MPI_COMM_WORLD \(4 ranks, treeduce job '\S+'\): offloaded 24 \(MPI_Allreduce 13, MPI_Bcast 4, MPI_Iallreduce 6, MPI_Reduce 1\); passed through 4)")))
      << offl.out;
  for (const char* h : {"[h0]", "[h1]"}) {
    EXPECT_TRUE(has(offl.out, std::string(h) + " treeduce-mpi: stats: MPI_Comm_split #1 of "
                                               "MPI_COMM_WORLD (2 ranks"))
        << offl.out;
    EXPECT_TRUE(has(offl.out, std::string(h) + " treeduce-mpi: stats: MPI_Comm_dup #2 of "
                                               "MPI_Comm_split #1 of MPI_COMM_WORLD (2 ranks"))
        << offl.out;
  }
  // The communicator of the overlapped MPI_Allreduce and the crossed MPI_Iallreduce (mpi_check.c's
  // overlapped()): every request offloaded, none redone (no rank's request waited for another's).
  EXPECT_TRUE(std::regex_search(
      offl.out,
      std::regex(
          R"(\[h0\] treeduce-mpi: stats: MPI_Comm_dup #3 of MPI_COMM_WORLD \(4 ranks, treeduce job '\S+'\): offloaded 2 \(MPI_Allreduce 1, MPI_Iallreduce 1\); passed through 0)")))
      << offl.out;
  // Every passed-through case, with its reason.
  for (const char* why :
       {"MPI_Allreduce 1: 4 bytes, below TREEDUCE_MPI_MIN_BYTES=64",
        "MPI_Allreduce 1: MPI_LONG_DOUBLE has no treeduce type",
        "MPI_Allreduce 1: a user-defined operation is not one of MPI's predefined reductions",
        "MPI_Barrier 1: 0 bytes, below TREEDUCE_MPI_MIN_BYTES=64"}) {
    EXPECT_TRUE(has(offl.out, std::string("[h0] treeduce-mpi: stats:   ") + why)) << why;
  }
  EXPECT_FALSE(has(offl.out, "warning")) << offl.out;
}

/// The float digests mpi_check's ranks printed ("..., float digest D"), one per rank.
std::vector<std::string> float_digests(const std::string& out) {
  std::vector<std::string> d;
  static const std::regex re(
      R"(mpi_check: rank \d+: \d+ checks, 0 wrong, digest [0-9a-f]+, float digest ([0-9a-f]+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it)
    d.push_back((*it)[1]);
  return d;
}

// TREEDUCE_DETERMINISTIC=1 reaches libtreeduce through the interposer: the tree adds in child
// order, so two runs give the float sums bit for bit (every rank the same bits).
TEST_F(MpiLab, DeterministicTreesGiveBitIdenticalFloatSumsRunAfterRun) {
  const std::vector<std::string> prog = {*root_ + "/mpi_check"};
  std::vector<std::string> runs;
  for (int i = 0; i < 2; ++i) {
    const Result r = run(prog, {"TREEDUCE_DETERMINISTIC=1", "TREEDUCE_MPI_MIN_BYTES=64"});
    ASSERT_EQ(r.status, 0) << r.out;
    EXPECT_FALSE(has(r.out, "warning")) << r.out;
    const std::vector<std::string> d = float_digests(r.out);
    ASSERT_EQ(d.size(), 4u) << r.out;
    EXPECT_EQ(std::set<std::string>(d.begin(), d.end()).size(), 1u) << r.out;
    runs.push_back(d[0]);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

TEST_F(MpiLab, Mpi4pyScriptGivesTheSameResultsWithAndWithoutTheInterposer) {
  const std::vector<std::string> prog = {
      "/usr/bin/python3", std::string(TREEDUCE_SOURCE_ROOT) + "/tests/mpi/mpi_check.py"};
  const Result plain = run(prog, {});
  ASSERT_EQ(plain.status, 0) << plain.out;
  const Result offl = run(prog, {"TREEDUCE_MPI_STATS=1"});
  ASSERT_EQ(offl.status, 0) << offl.out;
  const auto a = digests(plain.out, "mpi_check.py", 4), b = digests(offl.out, "mpi_check.py", 4);
  EXPECT_EQ(a.size(), 1u) << plain.out;
  EXPECT_EQ(a, b) << offl.out;
  EXPECT_TRUE(has(offl.out,
                  "): offloaded 7 (MPI_Allreduce 3, MPI_Barrier 1, MPI_Bcast 1, MPI_Iallreduce 1, "
                  "MPI_Reduce 1); passed through 0"))
      << offl.out;
  EXPECT_EQ(occurrences(offl.out, "treeduce-mpi: stats: MPI_Comm_split #1 of MPI_COMM_WORLD"), 2u)
      << offl.out;
}

TEST_F(MpiLab, OffAndBadVariablesPassEverythingThrough) {
  const std::vector<std::string> prog = {*root_ + "/mpi_check"};
  const Result off = run(prog, {"TREEDUCE_MPI=off", "TREEDUCE_MPI_STATS=1"});
  ASSERT_EQ(off.status, 0) << off.out;
  EXPECT_TRUE(has(off.out, "MPI_COMM_WORLD (4 ranks): offloaded 0; passed through 28")) << off.out;
  EXPECT_TRUE(has(off.out, "[h0] treeduce-mpi: stats:   MPI_Allreduce 16: TREEDUCE_MPI=off"))
      << off.out;
  // The thresholds: the halves of the split are too small, the larger messages too large.
  const Result thr =
      run(prog, {"TREEDUCE_MPI_STATS=1", "TREEDUCE_MPI_MIN_RANKS=3", "TREEDUCE_MPI_MAX_BYTES=64K"});
  ASSERT_EQ(thr.status, 0) << thr.out;
  EXPECT_EQ(digests(thr.out, "mpi_check", 4), digests(off.out, "mpi_check", 4));
  EXPECT_TRUE(has(thr.out,
                  "[h0] treeduce-mpi: stats:   MPI_Allreduce 13: 2 ranks, below "
                  "TREEDUCE_MPI_MIN_RANKS=3"))
      << thr.out;
  EXPECT_TRUE(has(thr.out,
                  "[h0] treeduce-mpi: stats:   MPI_Allreduce 2: 280000 bytes, above "
                  "TREEDUCE_MPI_MAX_BYTES=65536"))
      << thr.out;
  EXPECT_TRUE(has(thr.out,
                  "[h0] treeduce-mpi: stats:   MPI_Bcast 1: 100000 bytes, above "
                  "TREEDUCE_MPI_MAX_BYTES=65536"))
      << thr.out;
  // A bad value: one sentence from the rank that has it, and every rank passes through.
  const Result bad = run({"sh", "-c",
                          "if [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then export "
                          "TREEDUCE_MPI_MIN_BYTES=4X; fi; exec \"$0\"",
                          *root_ + "/mpi_check"},
                         {"TREEDUCE_MPI_STATS=1"});
  ASSERT_EQ(bad.status, 0) << bad.out;
  EXPECT_EQ(occurrences(bad.out, "treeduce-mpi: error:"), 1u) << bad.out;
  EXPECT_TRUE(has(bad.out,
                  "[h2] treeduce-mpi: error: rank 2: TREEDUCE_MPI_MIN_BYTES is '4X'; it must be a "
                  "number of bytes, optionally followed by K, M or G. Every rank passes its "
                  "collectives through to MPI."))
      << bad.out;
  EXPECT_TRUE(has(bad.out, "MPI_COMM_WORLD (4 ranks): offloaded 0; passed through 28")) << bad.out;
  EXPECT_TRUE(has(bad.out,
                  "[h0] treeduce-mpi: stats:   MPI_Allreduce 16: a TREEDUCE_MPI "
                  "variable is malformed on another rank"))
      << bad.out;
  EXPECT_EQ(digests(bad.out, "mpi_check", 4).size(), 1u);
}

// Last: it kills the lab's switch. 30 retransmissions: the dead switch is noticed after 3.3 to
// 3.8 s of silence instead of the default's 9.7 to 10.3 s.
TEST_F(MpiLab, SwitchKilledMidRunEveryRankRedoesThroughMpiAndPassesThrough) {
  const std::string go = *root_ + "/go", out = *root_ + "/kill.out";
  std::vector<std::string> env = kStats;
  env.push_back("TREEDUCE_MAX_RETRIES=30");
  const std::string cmd = command(run_args({*root_ + "/mpi_check", "--hold", go, "30"}, env)) +
                          " >" + shq(out) + " 2>&1 </dev/null";
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Ten rounds in the network, then every rank waits (rank 0 for the file, the others in a
  // barrier) while the switch dies; the bound only turns a hang into a failure.
  bool held = false;
  for (int i = 0; i < 12000 && !held; ++i) {
    held = has(read_file(out), "mpi_check: held");
    if (!held) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(held) << read_file(out);
  const Result kill = lab({"fault", "kill", "leaf0", "--name", name()});
  EXPECT_EQ(kill.status, 0) << kill.out;
  std::ofstream(go).put('1');
  ASSERT_EQ(wait_status(pid), 0) << read_file(out);
  const std::string o = read_file(out);
  EXPECT_EQ(digests(o, "mpi_check", 4).size(), 1u) << o;
  for (const char* h : {"[h0]", "[h1]", "[h2]", "[h3]"}) {
    EXPECT_TRUE(has(o, std::string(h) + " treeduce-mpi: warning: rank ")) << h << o;
  }
  // The first round after the kill is an MPI_Iallreduce: completed in MPI_Wait, redone there.
  EXPECT_EQ(occurrences(o,
                        "every collective passes through to MPI from now on: the network path "
                        "failed in MPI_Iallreduce on a rank; redone through MPI"),
            4u)
      << o;
  EXPECT_TRUE(has(o, "offloaded 10 (MPI_Allreduce 5, MPI_Iallreduce 5); passed through 21")) << o;
  EXPECT_TRUE(has(o, "MPI_Iallreduce 1: the network path failed; redone through MPI")) << o;
  EXPECT_TRUE(has(o, "MPI_Allreduce 10: the network path failed in MPI_Iallreduce")) << o;
}

}  // namespace
