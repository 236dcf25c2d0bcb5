// treeduce-switch's start-up errors: every mistake is one sentence and a non-zero exit, never an
// EAL usage dump or a crash. Runs the real binary; ports that need nothing (net_null).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include <array>
#include <cstdio>
#include <string>

namespace {

struct Outcome {
  int status = -1;
  std::string out;  ///< stdout and stderr
};

Outcome run(const std::string& args) {
  static int n = 0;
  // A distinct --file-prefix per run: DPDK keeps runtime files per prefix.
  const std::string eal =
      " --no-huge -m 256 --no-pci -l 0 --log-level=lib.eal:error "
      "--file-prefix=tdcli" +
      std::to_string(getpid()) + "-" + std::to_string(n++) + " ";
  std::string cmd = std::string(TREEDUCE_SWITCH_BIN) + " " + args;
  const std::size_t at = cmd.find(" @EAL ");
  if (at != std::string::npos) cmd.replace(at, 6, eal);
  Outcome r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p) != nullptr) r.out += buf.data();
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

/// The last line of the output, which must be the daemon's sentence.
std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
}

TEST(SwitchCli, OurArgumentsAreCheckedBeforeTheEal) {
  const Outcome r = run("@EAL --vdev=net_null0 -- --data 10.0.0.1 --port net_null0 --burst 500");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out.find("EAL:"), std::string::npos) << r.out;
  EXPECT_EQ(last_line(r.out), "treeduce-switch: burst must be from 1 to 64, got 500.");
}

TEST(SwitchCli, BadEalArgumentIsOneSentenceWithoutTheUsageDump) {
  const Outcome r = run("--no-such-eal-option -- --data 10.0.0.1 --port net_null0");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(last_line(r.out),
            "treeduce-switch: DPDK EAL initialisation failed (Invalid argument); check the EAL "
            "arguments before '--'.");
  EXPECT_EQ(r.out.find("Usage"), std::string::npos) << r.out;
}

TEST(SwitchCli, MissingPortNamesTheProbedOnes) {
  const Outcome r = run("@EAL --vdev=net_null0 -- --data 10.0.0.1 --port net_memif7 --metrics off");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(last_line(r.out),
            "treeduce-switch: There is no DPDK port 'net_memif7' (the EAL probed net_null0).");
}

TEST(SwitchCli, LcoreTheEalWasNotGiven) {
  const Outcome r =
      run("@EAL --vdev=net_null0 -- --data 10.0.0.1 --port net_null0 --lcores 1 --metrics off");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(last_line(r.out),
            "treeduce-switch: lcore 1 is not one of the EAL's lcores (give it with -l).");
}

TEST(SwitchCli, RunsAndStopsWithFinalCounters) {
  const Outcome r =
      run("@EAL --vdev=net_null0 -- --data 10.0.0.1 --port net_null0,ip=10.0.0.1/24 "
          "--metrics off --run-ms 300");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("switch ready: data 10.0.0.1:47110, 1 port(s)"), std::string::npos);
  // net_null delivers empty frames: all counted, none a crash.
  EXPECT_NE(r.out.find("drop too_short: "), std::string::npos) << r.out;
}

TEST(SwitchCli, HelpNeedsNoEal) {
  const Outcome r = run("--help");
  EXPECT_EQ(r.status, 0);
  EXPECT_NE(r.out.find("Usage: treeduce-switch [EAL arguments] -- [treeduce arguments]"),
            std::string::npos);
  EXPECT_EQ(r.out.find("EAL:"), std::string::npos);
}

}  // namespace
