// What the `treeduce lab` integration tests share: running the real treeduce binary under a
// state root of the test's own (TREEDUCE_LAB_ROOT, so a test never meets a user's lab), waiting
// for events without clocks, and reading what the lab wrote. Header-only; every test executable
// defines TREEDUCE_CLI_BIN and TREEDUCE_PERF_BIN (tests/lab/meson.build), the defaults of cli_
// and tools_dir_.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "lab_test_util.h"

namespace treeduce::labtest {

/// A fixture whose labs live under a state root of its own, all taken down after the test
/// (also a failed one). Needs root: skips otherwise.
class LabTest : public ::testing::Test {
 protected:
  /// `tag` names the state root (/tmp/treeduce-TAG-XXXXXX).
  explicit LabTest(std::string tag) : tag_(std::move(tag)) {}

  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root (network namespaces)";
    std::string tmpl = "/tmp/treeduce-" + tag_ + "-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    chmod(root_.c_str(), 0755);  // ranks that drop root read what the test writes here
  }

  void TearDown() override {
    if (root_.empty()) return;
    before_down();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(root_, ec)) {
      if (e.is_directory() && fs::exists(e.path() / "state.json")) {
        lab({"down", "--name", e.path().filename().string()});
      }
    }
    fs::remove_all(root_, ec);
  }

  /// What a fixture stops before the labs go down (ranks it holds, say).
  virtual void before_down() {}

  /// `env TREEDUCE_LAB_ROOT=... PATH=<tools_dir_>:$PATH ENV <cli_> lab`.
  std::string command(const std::string& env = "") const {
    return "env TREEDUCE_LAB_ROOT=" + shq(root_) +
           " PATH=" + shq(tools_dir_ + ":" + std::getenv("PATH")) + " " + env + " " + shq(cli_) +
           " lab";
  }

  /// `treeduce lab ARGS...` with `env` before it, in `cwd` when given; stdout and stderr apart.
  Result lab(const std::vector<std::string>& args, const std::string& env = "",
             const std::string& cwd = "") {
    std::string cmd;
    if (!cwd.empty()) cmd.append("cd ").append(shq(cwd)).append(" && ");
    cmd += command(env);
    for (const auto& a : args) cmd.append(" ").append(shq(a));
    static std::atomic<int> calls{0};
    const std::string id = std::to_string(calls++);
    const std::string out = root_ + "/.out" + id, err = root_ + "/.err" + id;
    cmd += " >" + shq(out) + " 2>" + shq(err) + " </dev/null";
    const int rc = std::system(cmd.c_str());
    Result r;
    r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
  }

  /// `treeduce lab ARGS...` in the background with `env` before it, stdout and stderr to `out`;
  /// its pid, for the caller to reap.
  pid_t start(const std::vector<std::string>& args, const std::string& out,
              const std::string& env = "") {
    std::string cmd = "exec " + command(env);
    for (const auto& a : args) cmd.append(" ").append(shq(a));
    cmd += " >" + shq(out) + " 2>&1 </dev/null";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }

  /// A lab name unique to this test process.
  std::string name(const std::string& tag) const { return "t" + std::to_string(getpid()) + tag; }

  nlohmann::json state(const std::string& lab_name) const {
    return nlohmann::json::parse(read_file(root_ + "/" + lab_name + "/state.json"));
  }

  std::string root_;
  std::string cli_ = TREEDUCE_CLI_BIN;  ///< the treeduce binary the test runs
  /// Put first on the PATH of what `lab` runs (treeduce-perf's directory).
  std::string tools_dir_ = fs::path(TREEDUCE_PERF_BIN).parent_path().string();

 private:
  std::string tag_;
};

}  // namespace treeduce::labtest
