// treeduce-perf --compare: the built binary, run as real processes on this machine with
// TREEDUCE_PATH=host (no switch: the treeduce column is libtreeduce's host path), side by side
// with Gloo's ring allreduce and MPI_Allreduce. Four ranks under mpirun reduce every dtype x op
// and every backend's result must be right; the JSON Lines file is parsed and checked for every
// row and key. Also: an unknown baseline is refused with exit 2, and --compare gloo runs without
// mpirun, its two ranks started directly with TREEDUCE_RANK/TREEDUCE_WORLD_SIZE.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

extern char** environ;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::vector<std::string> kAllTypes = {"f32", "f16", "bf16", "e4m3", "e5m2", "i32"};

// A scratch directory of this test's own, removed at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/treeduce-perfcmp-XXXXXX";
    path_ = mkdtemp(tmpl) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The environment children get: ours without any rank or job variable a launcher may have left
// (they would override the test's), plus `extra` ("NAME=value").
std::vector<std::string> child_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string v = *e;
    if (v.rfind("TREEDUCE_", 0) == 0 || v.rfind("RANK=", 0) == 0 ||
        v.rfind("WORLD_SIZE=", 0) == 0 || v.rfind("OMPI_COMM_WORLD_", 0) == 0)
      continue;
    // A variable `extra` sets replaces ours (getenv finds the first of two).
    const std::string name = v.substr(0, v.find('=') + 1);
    if (std::any_of(extra.begin(), extra.end(),
                    [&](const std::string& x) { return x.rfind(name, 0) == 0; }))
      continue;
    env.push_back(v);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

// A child process in its own process group, stdout and stderr into files.
struct Child {
  pid_t pid = -1;
  std::string out, err;
  int status = -1;  // exit code; 128 + signal when killed; -1 while running or on a time-out
};

Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& log_prefix) {
  Child c;
  c.out = log_prefix + ".out";
  c.err = log_prefix + ".err";
  // Everything exec needs is built before fork.
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  c.pid = fork();
  if (c.pid == 0) {
    setpgid(0, 0);  // so that a time-out kills mpirun's ranks too
    const int o = open(c.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(c.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (o < 0 || e < 0) _exit(126);
    dup2(o, 1);
    dup2(e, 2);
    execve(args[0], args.data(), envp.data());
    _exit(127);
  }
  return c;
}

// Waits for `c` up to `limit`; on time-out kills its process group. True when it ended by itself.
bool wait_for(Child& c, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    int st = 0;
    const pid_t r = waitpid(c.pid, &st, WNOHANG);
    if (r == c.pid) {
      c.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(-c.pid, SIGKILL);
  waitpid(c.pid, nullptr, 0);
  return false;
}

std::string logs(const Child& c) {
  return "--- stdout:\n" + read_file(c.out) + "--- stderr:\n" + read_file(c.err);
}

// "a b c" -> {"a", "b", "c"}: command lines that read as they would be typed.
std::vector<std::string> words(const std::string& line) {
  std::vector<std::string> out;
  std::istringstream in(line);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

std::string unique_job(const std::string& what) {
  return "perfcmp-" + what + "-" + std::to_string(getpid());
}

std::vector<json> read_json_lines(const std::string& path) {
  std::vector<json> rows;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) rows.push_back(json::parse(line));  // throws (fails the test) if not JSON
  }
  return rows;
}

// Every row of a run: the keys, the backends compared, no wrong element anywhere, and speed-ups
// that are the ratio of the times they are printed next to.
void check_rows(const std::vector<json>& rows, const std::vector<std::string>& baselines,
                int ranks) {
  const std::set<std::string> top = {"size",  "count", "type",   "op",
                                     "ranks", "iters", "warmup", "treeduce"};
  const std::set<std::string> td_keys = {"time_us",     "min_us",        "cpu_us", "algbw_GBps",
                                         "busbw_GBps",  "path",          "wrong",  "fallbacks",
                                         "retransmits", "cpu_ms_per_MiB"};
  const std::set<std::string> base_keys = {"time_us",    "min_us", "cpu_us",  "algbw_GBps",
                                           "busbw_GBps", "wrong",  "speedup", "cpu_ms_per_MiB"};
  auto keys = [](const json& o) {
    std::set<std::string> k;
    for (auto it = o.begin(); it != o.end(); ++it) k.insert(it.key());
    return k;
  };
  for (const json& r : rows) {
    SCOPED_TRACE(r.dump());
    std::set<std::string> want = top;
    want.insert(baselines.begin(), baselines.end());
    EXPECT_EQ(keys(r), want);
    EXPECT_EQ(r["ranks"].get<int>(), ranks);
    const json& td = r["treeduce"];
    EXPECT_EQ(keys(td), td_keys);
    EXPECT_EQ(td["wrong"].get<long>(), 0);
    EXPECT_EQ(td["path"].get<std::string>(), "host");
    EXPECT_GT(td["time_us"].get<double>(), 0);
    EXPECT_LE(td["min_us"].get<double>(), td["time_us"].get<double>() + 0.002);
    EXPECT_GT(td["cpu_us"].get<double>(), 0);
    for (const std::string& b : baselines) {
      const json& o = r[b];
      EXPECT_EQ(keys(o), base_keys) << b;
      EXPECT_EQ(o["wrong"].get<long>(), 0) << b;
      ASSERT_TRUE(o["time_us"].is_number()) << b << " failed";
      const double t = o["time_us"].get<double>(), t0 = td["time_us"].get<double>();
      EXPECT_GT(t, 0) << b;
      EXPECT_LE(o["min_us"].get<double>(), t + 0.002) << b;
      // Both times are printed to 1 ns, the speed-up to 5 decimals.
      EXPECT_NEAR(o["speedup"].get<double>(), t / t0, 1e-3 * (t / t0) + 1e-4) << b;
      // Ring busbw, nccl-tests' 2(n-1)/n.
      EXPECT_NEAR(o["busbw_GBps"].get<double>(),
                  o["algbw_GBps"].get<double>() * 2.0 * (ranks - 1) / ranks, 2e-4)
          << b;
    }
  }
}

// (size, type, op) of every row, to compare with the sweep asked for.
std::set<std::tuple<long, std::string, std::string>> cases_of(const std::vector<json>& rows) {
  std::set<std::tuple<long, std::string, std::string>> s;
  for (const json& r : rows)
    s.insert({r["size"].get<long>(), r["type"].get<std::string>(), r["op"].get<std::string>()});
  return s;
}

std::set<std::tuple<long, std::string, std::string>> sweep(const std::vector<long>& sizes,
                                                           const std::vector<std::string>& types,
                                                           const std::vector<std::string>& ops) {
  std::set<std::tuple<long, std::string, std::string>> s;
  for (long b : sizes)
    for (const std::string& t : types)
      for (const std::string& o : ops) s.insert({b, t, o});
  return s;
}

// Table rows (not '#' lines) of rank 0's stdout, split on blanks.
std::vector<std::vector<std::string>> table_rows(const std::string& out) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream l(line);
    std::vector<std::string> cols;
    for (std::string w; l >> w;) cols.push_back(w);
    rows.push_back(cols);
  }
  return rows;
}

TEST(PerfCompare, UnknownBaselineIsRefusedWithASentence) {
  TempDir dir;
  Child c = spawn({TREEDUCE_PERF_BIN, "--compare", "gloo,foo"}, child_env({}), dir.path() + "/x");
  ASSERT_TRUE(wait_for(c, std::chrono::seconds(30))) << logs(c);
  EXPECT_EQ(c.status, 2) << logs(c);
  const std::string err = read_file(c.err);
  EXPECT_NE(err.find("'foo'"), std::string::npos) << err;
  EXPECT_EQ(err.substr(err.size() - 2), ".\n") << err;
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// Every usage error is exit code 2 with a sentence naming the option, CLI11's (a value out of
// range, an unknown option) as well as treeduce-perf's own; --help is 0.
TEST(PerfCompare, UsageErrorsExitWithTwo) {
  TempDir dir;
  int i = 0;
  for (const auto& [args, needle] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"-n", "0"}, "--iters"},
           {{"-f", "1"}, "--stepfactor"},
           {{"--no-such-option"}, "no-such-option"},
           {{"-b", "0"}, "--minbytes must be at least 1"},
           {{"-d", "f128"}, "f128"}}) {
    std::vector<std::string> argv = {TREEDUCE_PERF_BIN};
    argv.insert(argv.end(), args.begin(), args.end());
    Child c = spawn(argv, child_env({}), dir.path() + "/u" + std::to_string(i++));
    ASSERT_TRUE(wait_for(c, std::chrono::seconds(30))) << logs(c);
    EXPECT_EQ(c.status, 2) << args[0] << ": " << logs(c);
    EXPECT_NE(read_file(c.err).find(needle), std::string::npos) << logs(c);
  }
  Child help = spawn({TREEDUCE_PERF_BIN, "--help"}, child_env({}), dir.path() + "/help");
  ASSERT_TRUE(wait_for(help, std::chrono::seconds(30))) << logs(help);
  EXPECT_EQ(help.status, 0) << logs(help);
}

/// Two treeduce-perf ranks on the host path (no switch, no mpirun) with `args`, started
/// directly in `dir`, and waited for: each must exit 0.
std::vector<Child> run_two_host_ranks(const TempDir& dir, const std::string& tag,
                                      const std::string& args) {
  std::vector<Child> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(
        spawn(std::vector<std::string>{TREEDUCE_PERF_BIN} + words(args),
              child_env({"TREEDUCE_JOB=" + unique_job(tag), "TREEDUCE_RANK=" + std::to_string(r),
                         "TREEDUCE_WORLD_SIZE=2", "TREEDUCE_PATH=host",
                         "TREEDUCE_FALLBACK_STORE=" + dir.path() + "/store"}),
              dir.path() + "/rank" + std::to_string(r)));
  }
  for (Child& c : ranks) {
    EXPECT_TRUE(wait_for(c, std::chrono::seconds(240))) << logs(c);
    EXPECT_EQ(c.status, 0) << logs(c);
  }
  return ranks;
}

// Gloo alone needs no mpirun: two ranks started directly. --json (rank 0's stdout) and
// --json-out (the file) must carry the same objects.
TEST(PerfCompare, GlooWithoutMpirun) {
  TempDir dir;
  const std::string jsonl = dir.path() + "/rows.jsonl";
  const std::vector<Child> ranks = run_two_host_ranks(
      dir, "gloo",
      "-b 1024 -e 16384 -f 16 -d f32,e4m3,i32 -o sum,max -n 2 -w 1 --compare gloo --json "
      "--json-out " +
          jsonl);
  if (HasFailure()) return;
  const std::vector<json> rows = read_json_lines(jsonl);
  check_rows(rows, {"gloo"}, 2);
  EXPECT_EQ(cases_of(rows), sweep({1024, 16384}, {"f32", "e4m3", "i32"}, {"sum", "max"}));
  // --json: the same objects on rank 0's stdout, and nothing else there but the summary.
  std::vector<json> printed;
  std::istringstream out(read_file(ranks[0].out));
  for (std::string line; std::getline(out, line);)
    if (!line.empty() && line[0] == '{') printed.push_back(json::parse(line));
  EXPECT_EQ(printed.size(), rows.size());
  for (std::size_t i = 0; i < std::min(printed.size(), rows.size()); ++i) {
    EXPECT_EQ(printed[i], rows[i]);
  }
  EXPECT_EQ(read_file(ranks[1].out), "");
  // The baseline's rendezvous keys are gone, like libtreeduce's own.
  EXPECT_TRUE(fs::is_empty(dir.path() + "/store"));
}

// --back-to-back: two ranks on the host path, 8 allreduces per iteration non-blocking and then
// sequential; both groups verified, and the JSON row has both with a speed-up.
TEST(PerfCompare, BackToBack) {
  TempDir dir;
  const std::string jsonl = dir.path() + "/rows.jsonl";
  const std::vector<Child> ranks = run_two_host_ranks(
      dir, "b2b", "-b 4096 -e 4096 -d i32 -o sum -n 2 -w 1 --back-to-back 8 --json-out " + jsonl);
  if (HasFailure()) return;
  const std::vector<json> rows = read_json_lines(jsonl);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].value("back_to_back", 0), 8) << rows[0].dump();
  EXPECT_EQ(rows[0]["treeduce"]["wrong"].get<long>(), 0);
  EXPECT_EQ(rows[0]["sequential"]["wrong"].get<long>(), 0);
  EXPECT_FALSE(rows[0]["sequential"]["speedup"].is_null());
  const std::string out = read_file(ranks[0].out);
  EXPECT_NE(out.find("# sequential: verified: 0 wrong elements"), std::string::npos) << out;
  // --compare and --back-to-back do not mix: one sentence, exit code 2.
  Child bad = spawn({TREEDUCE_PERF_BIN, "--back-to-back", "4", "--compare", "gloo"}, child_env({}),
                    dir.path() + "/bad");
  ASSERT_TRUE(wait_for(bad, std::chrono::seconds(30))) << logs(bad);
  EXPECT_EQ(bad.status, 2) << logs(bad);
}

// The whole comparison: four ranks under mpirun, every dtype x sum/min/max, libtreeduce (host
// path), Gloo's ring and MPI_Allreduce on each row; every element of every backend right.
TEST(PerfCompare, GlooAndMpiUnderMpirun) {
#ifndef TREEDUCE_PERF_HAVE_MPI
  GTEST_SKIP() << "This build has no MPI (meson found none), so treeduce-perf has no mpi "
                  "baseline to test.";
#else
  if (std::string(TREEDUCE_MPIRUN).empty())
    GTEST_SKIP() << "mpirun was not found when the build was configured.";
  TempDir dir;
  const std::string jsonl = dir.path() + "/rows.jsonl";
  // Open MPI on TCP over loopback only: its shared-memory transport would not be a network.
  const std::vector<std::string> mpirun =
      std::vector<std::string>{TREEDUCE_MPIRUN} +
      words(
          "--allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self "
          "--mca btl_tcp_if_include lo -x TREEDUCE_JOB -x TREEDUCE_PATH "
          "-x TREEDUCE_FALLBACK_STORE -x ASAN_OPTIONS");
  Child c = spawn(
      mpirun + std::vector<std::string>{TREEDUCE_PERF_BIN} +
          words("-b 1024 -e 65536 -f 64 -d f32,f16,bf16,e4m3,e5m2,i32 -o sum,min,max -n 2 -w 1 "
                "--compare gloo,mpi --json-out " +
                jsonl),
      child_env({"TREEDUCE_JOB=" + unique_job("mpi"), "TREEDUCE_PATH=host",
                 "TREEDUCE_FALLBACK_STORE=" + dir.path() + "/store", "OMPI_ALLOW_RUN_AS_ROOT=1",
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                 // In the sanitizer build: Open MPI 4.1 leaves allocations at MPI_Finalize and
                 // unloads the components that made them, so LeakSanitizer can neither be
                 // satisfied nor told whose they are. Memory errors are still caught, and
                 // treeduce-perf's own leaks by the test without MPI above.
                 "ASAN_OPTIONS=detect_leaks=0:abort_on_error=1"}),
      dir.path() + "/mpirun");
  ASSERT_TRUE(wait_for(c, std::chrono::seconds(400))) << logs(c);
  ASSERT_EQ(c.status, 0) << logs(c);
  const std::vector<json> rows = read_json_lines(jsonl);
  check_rows(rows, {"gloo", "mpi"}, 4);
  EXPECT_EQ(rows.size(), 2u * 6 * 3);
  EXPECT_EQ(cases_of(rows), sweep({1024, 65536}, kAllTypes, {"sum", "min", "max"}));
  // The table: one row per JSON object, each of size (2 words), count, type, op, treeduce's
  // time, algbw, path, retransmissions (0 on the host path), then time, algbw, x per baseline,
  // then wrong (0).
  const std::string out = read_file(c.out);
  const auto table = table_rows(out);
  EXPECT_EQ(table.size(), rows.size()) << out;
  for (const auto& cols : table) {
    ASSERT_EQ(cols.size(), 16u) << out;
    EXPECT_EQ(cols[7], "host") << out;
    EXPECT_EQ(cols[8], "0") << out;
    EXPECT_EQ(cols.back(), "0") << out;
  }
  EXPECT_NE(out.find("# gloo: verified: 0 wrong elements"), std::string::npos) << out;
  EXPECT_NE(out.find("# mpi: verified: 0 wrong elements"), std::string::npos) << out;
#endif
}

}  // namespace
