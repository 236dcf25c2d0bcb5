// scripts/bench.sh --report-only: the report's verdicts for each target (docs/performance.md,
// "Allreduce against Gloo and Open MPI"), computed from results made up here, and what makes a
// report FAILED (exit status 1). No fabric runs: only the report generator (python3, gnuplot).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::size_t kMiB = 1 << 20;

class BenchReport : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/treeduce-bench-report-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    write("machine.txt", "CPU = Test CPU, 2 CPUs\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ + "/" + name) << text;
  }

  // One row of treeduce-perf's JSON (docs/host.md): treeduce's time and the baselines', every
  // speed-up = baseline time / treeduce time, `wrong` elements for treeduce.
  static json row(std::size_t size, double td_us, double gloo_us, double mpi_us, int wrong = 0) {
    const double mib = static_cast<double>(size) / kMiB;
    auto impl = [&](double t) {
      return json{{"time_us", t},
                  {"min_us", t * 0.9},
                  {"cpu_us", t / 2},
                  {"algbw_GBps", size / t / 1e3},
                  {"busbw_GBps", size / t / 1e3},
                  {"cpu_ms_per_MiB", t / 2 / 1e3 / mib},
                  {"wrong", 0}};
    };
    json r = {{"size", size}, {"count", size / 4}, {"type", "f32"}, {"op", "sum"},
              {"ranks", 4},   {"iters", 20},       {"warmup", 3}};
    r["treeduce"] = impl(td_us);
    r["treeduce"]["path"] = "network";
    r["treeduce"]["wrong"] = wrong;
    r["treeduce"]["fallbacks"] = 0;
    r["treeduce"]["retransmits"] = 0;
    r["gloo"] = impl(gloo_us);
    r["gloo"]["speedup"] = gloo_us / td_us;
    r["mpi"] = impl(mpi_us);
    r["mpi"]["speedup"] = mpi_us / td_us;
    return r;
  }

  // A --back-to-back row: `b2b_us` per allreduce at once, `seq_us` one after the other.
  static json b2b_row(double b2b_us, double seq_us) {
    json r = row(256 * 1024, b2b_us, seq_us, seq_us);
    r["back_to_back"] = 32;
    r["sequential"] = r["gloo"];
    r.erase("gloo");
    r.erase("mpi");
    return r;
  }

  void lines(const std::string& name, const std::vector<json>& rows) {
    std::string text;
    for (const json& r : rows) text += r.dump() + "\n";
    write(name, text);
  }

  // Runs the report; its exit status, report.md in report_.
  int run() {
    const std::string cmd = std::string("bash '") + TREEDUCE_SOURCE_ROOT +
                            "/scripts/bench.sh' --report-only '" + dir_ + "' >'" + dir_ +
                            "/stderr.txt' 2>&1";
    const int st = std::system(cmd.c_str());
    std::ifstream in(dir_ + "/report.md");
    std::stringstream ss;
    ss << in.rdbuf();
    report_ = ss.str();
    std::ifstream err(dir_ + "/stderr.txt");
    std::stringstream es;
    es << err.rdbuf();
    stderr_ = es.str();
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  // The report's line for the target that starts with `what` after its verdict.
  std::string target(const std::string& what) const {
    std::istringstream in(report_);
    for (std::string line; std::getline(in, line);) {
      const auto p = line.find("**: " + what);
      if (line.rfind("- **", 0) == 0 && p != std::string::npos) return line;
    }
    return "(no target line for '" + what + "')";
  }

  std::string dir_, report_, stderr_;
};

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST_F(BenchReport, EveryTargetVerdictFromItsFigures) {
  // Kernel-bypass hosts: 2.5x Gloo and 1.6x MPI at 1 and 16 MiB, but 1.4x MPI at 4 MiB.
  lines("allreduce-dpdk.jsonl", {row(4096, 30, 1000, 40), row(kMiB, 100, 250, 160),
                                 row(4 * kMiB, 400, 1000, 560), row(16 * kMiB, 1600, 4000, 2560)});
  // Hosts without DPDK: udp below Gloo at 4 MiB, af_xdp above it there: the faster counts.
  lines("allreduce-udp.jsonl", {row(4096, 60, 1000, 50), row(kMiB, 100, 110, 100),
                                row(4 * kMiB, 500, 400, 400), row(16 * kMiB, 1000, 1200, 900)});
  lines("allreduce-af_xdp.jsonl",
        {row(kMiB, 200, 110, 100), row(4 * kMiB, 300, 400, 400), row(16 * kMiB, 2000, 1200, 900)});
  lines("b2b-dpdk.jsonl", {b2b_row(100, 160)});
  lines("b2b-udp.jsonl", {b2b_row(100, 140)});
  // treeduce-fabric's line on the switches' CPU: treeduce's dpdk rows lasted 23 x 2130 us.
  write("allreduce-dpdk.txt",
        "      switch CPU while the ranks ran: leaf0 0.02 s (4% of one CPU)\n"
        "      machine CPU while the ranks ran: user 46%, system 26%, irq+softirq 25%, idle 3%, "
        "steal 0%\n");
  write("allreduce-udp.txt",
        "      switch CPU while the ranks ran: leaf0 0.50 s (9% of one CPU)\n");
  // Defaults within 1.2x of the tuned settings at both MTUs, but 3 retransmissions at 8300.
  json retx = row(kMiB, 100, 100, 100);
  retx["treeduce"]["retransmits"] = 3;
  lines("tuning-1500-defaults.jsonl", {row(kMiB, 110, 100, 100)});
  lines("tuning-1500-tuned.jsonl", {row(kMiB, 100, 100, 100)});
  lines("tuning-8300-defaults.jsonl", {retx});
  lines("tuning-8300-tuned.jsonl", {row(kMiB, 95, 100, 100)});
  write("switchd.json", json{{"ok", true},
                             {"reps", 3},
                             {"rows", json::array()},
                             {"target",
                              {{{"dut", "switch"},
                                {"payload", 1024},
                                {"fanin", 8},
                                {"switch_ns", 210.0},
                                {"macswap_ns", 160.0},
                                {"core_ns", 40.0},
                                {"ratio", 1.05},
                                {"min_cpu_share", 0.99},
                                {"valid", true}}}}}
                            .dump());
  ASSERT_EQ(run(), 0) << stderr_ << report_;

  const std::string bypass = target("kernel-bypass hosts, f32 sum: algbw >= 2.0x");
  EXPECT_TRUE(has(bypass, "**MISSED**")) << bypass;
  EXPECT_TRUE(has(bypass, "4 MiB: 2.50x Gloo's, 1.40x MPI's (short by 0.10, 7%)")) << bypass;
  EXPECT_TRUE(has(bypass, "16 MiB: 2.50x Gloo's, 1.60x MPI's")) << bypass;

  const std::string nodpdk = target("hosts without DPDK");
  EXPECT_TRUE(has(nodpdk, "**MET**")) << nodpdk;
  EXPECT_TRUE(has(nodpdk, "4 MiB: udp 0.80x, af_xdp 1.33x, the faster af_xdp 1.33x")) << nodpdk;

  const std::string small_dpdk = target(
      "kernel-bypass hosts (libtreeduce's DPDK transport on "
      "memif), f32 sum, sizes <= 4 KiB: time <= 1.0x MPI's");
  EXPECT_TRUE(has(small_dpdk, "**MET**")) << small_dpdk;
  const std::string small_udp = target(
      "kernel UDP hosts (sockets on veth, af_packet at the "
      "switch), f32 sum, sizes <= 4 KiB: time <= 1.0x MPI's");
  EXPECT_TRUE(has(small_udp, "**MISSED**")) << small_udp;
  EXPECT_TRUE(has(small_udp, "4 KiB: 60.0 vs 50.0 us = 1.20x (0.20 over, 20%)")) << small_udp;

  const std::string b2b_dpdk = target(
      "kernel-bypass hosts (libtreeduce's DPDK transport on "
      "memif), back to back");
  EXPECT_TRUE(has(b2b_dpdk, "**MET**")) << b2b_dpdk;
  EXPECT_TRUE(has(b2b_dpdk, "32 x 256 KiB f32 sum")) << b2b_dpdk;
  const std::string b2b_udp = target(
      "kernel UDP hosts (sockets on veth, af_packet at the "
      "switch), back to back");
  EXPECT_TRUE(has(b2b_udp, "**MISSED**")) << b2b_udp;
  EXPECT_TRUE(has(b2b_udp, "1.40x (short by 0.10, 7%)")) << b2b_udp;
  // The ranks' CPU bound: 4 ranks x 50 us of CPU each per allreduce on the 2 CPUs of
  // machine.txt is 100 us, against 140 us one after the other.
  EXPECT_TRUE(has(b2b_udp,
                  "the 4 ranks' CPU alone (50.0 us each per allreduce back to back, polling "
                  "included) needs 100.0 us of the 2 CPUs per allreduce, so at that CPU cost at "
                  "most 1.40x here"))
      << b2b_udp;

  const std::string tuning = target("fast without tuning");
  EXPECT_TRUE(has(tuning, "**MISSED**")) << tuning;
  EXPECT_TRUE(has(tuning,
                  "MTU 1500: defaults 110.0 us with 0 retransmissions, tuned 100.0 us "
                  "(0): 1.10x;"))
      << tuning;
  EXPECT_TRUE(has(tuning, "MTU 8300: defaults 100.0 us with 3 retransmissions")) << tuning;

  const std::string sw = target("the switch at 1 KiB, fan-in 8");
  EXPECT_TRUE(has(sw, "**MET**")) << sw;
  EXPECT_TRUE(has(sw, "210 ns against 160 + 40.0 ns = 1.05x")) << sw;
  // Per row: a rank's CPU per MiB and the retransmissions; a plot per host kind.
  EXPECT_TRUE(fs::exists(dir_ + "/allreduce_af_xdp_f32_sum_speedup.png")) << report_;
  EXPECT_TRUE(has(report_, "| 16 MiB | 1600 (1440) | 10.5 | 0.0500 | 0 | network |")) << report_;
  // The switch's CPU against the time treeduce's rows lasted, never more than all of it.
  EXPECT_TRUE(has(report_,
                  "the switch used 0.02 s of CPU while the ranks ran, and treeduce's allreduces "
                  "lasted about 0.05 s of that run (the rest: the baselines, start-up): at most "
                  "41% of one CPU while treeduce ran (leaf0 0.02 s (4% of one CPU))"))
      << report_;
  EXPECT_TRUE(has(report_,
                  "the machine's CPUs while the ranks ran (every backend; interrupt work is no "
                  "process's): user 46%, system 26%, irq+softirq 25%, idle 3%, steal 0%"))
      << report_;
  EXPECT_TRUE(has(report_,
                  "the switch used 0.50 s of CPU while the ranks ran, and treeduce's allreduces "
                  "lasted about 0.04 s of that run (the rest: the baselines, start-up): more CPU "
                  "time than treeduce's allreduces lasted, so its share while they ran cannot be "
                  "told from the rest"))
      << report_;
}

TEST_F(BenchReport, MissingFiguresAreNotMeasuredAndUndisturbedRunsAreNeeded) {
  // No 4 MiB row, no af_xdp run, no switch run; the switch bench kept no run of macswap.
  lines("allreduce-dpdk.jsonl", {row(kMiB, 100, 250, 160), row(16 * kMiB, 1600, 4000, 2560)});
  lines("allreduce-udp.jsonl", {row(kMiB, 100, 110, 100)});
  ASSERT_EQ(run(), 0) << stderr_ << report_;
  EXPECT_TRUE(has(target("kernel-bypass hosts, f32 sum"), "**NOT MEASURED**"));
  EXPECT_TRUE(has(target("kernel-bypass hosts, f32 sum"), "4 MiB: not in this run"));
  EXPECT_TRUE(has(target("hosts without DPDK"), "(af_xdp hosts not run (--hosts))"));
  EXPECT_TRUE(has(target("kernel UDP hosts (sockets on veth, af_packet at the switch), back to "
                         "back"),
                  "**NOT MEASURED**"));
  EXPECT_TRUE(has(target("fast without tuning"), "the tuning runs were not made"));
  EXPECT_TRUE(has(target("the switch at 1 KiB"), "**NOT MEASURED**"));
  EXPECT_TRUE(has(target("the switch at 1 KiB"), "the switch benchmark was not run"));

  write("switchd.json", json{{"ok", false},
                             {"rows",
                              {{{"dut", "macswap"},
                                {"payload", 1024},
                                {"fanin", 0},
                                {"runs_mpps", json::array()},
                                {"runs_discarded", 3}}}},
                             {"target",
                              {{{"dut", "switch"},
                                {"payload", 1024},
                                {"fanin", 8},
                                {"ratio", nullptr},
                                {"valid", false}}}}}
                            .dump());
  EXPECT_EQ(run(), 1) << report_;
  EXPECT_TRUE(has(target("the switch at 1 KiB"), "**NO VERDICT**"));
  EXPECT_TRUE(has(report_, "no undisturbed run of macswap at 1024 B")) << report_;
}

// A host kind not run, or run without results, still has a line for each of its targets.
TEST_F(BenchReport, EveryTargetHasALineWhenAHostKindIsMissing) {
  lines("allreduce-udp.jsonl", {row(4096, 30, 1000, 40), row(kMiB, 100, 110, 100)});
  ASSERT_EQ(run(), 0) << stderr_ << report_;
  EXPECT_TRUE(has(target("kernel-bypass hosts: algbw >= 2.0x Gloo"),
                  "**NOT MEASURED**: kernel-bypass hosts: algbw >= 2.0x Gloo ring's and >= 1.5x "
                  "MPI's at 1, 4 and 16 MiB: dpdk hosts not run (--hosts; dpdk hosts run on one "
                  "leaf only)"))
      << report_;
  EXPECT_TRUE(has(target("hosts without DPDK"), "**MET**")) << report_;
  for (const char* goal : {"1.0x MPI's", "0.5x Gloo ring's"}) {
    for (const char* kind : {"kernel-bypass hosts (libtreeduce's DPDK transport on memif)",
                             "AF_XDP hosts (libtreeduce's AF_XDP transport on veth, af_packet at "
                             "the switch)"}) {
      EXPECT_TRUE(
          has(target(std::string(kind) + ", sizes <= 4 KiB: time <= " + goal), "**NOT MEASURED**"))
          << kind << " " << goal << "\n"
          << report_;
    }
  }
  EXPECT_TRUE(has(target("kernel-bypass hosts (libtreeduce's DPDK transport on memif), back to "
                         "back"),
                  "dpdk hosts not run (--hosts; dpdk hosts run on one leaf only)"))
      << report_;
  EXPECT_TRUE(has(target("kernel UDP hosts (sockets on veth, af_packet at the switch), back to "
                         "back"),
                  "not run (--no-back-to-back)"))
      << report_;

  // A dpdk run that wrote nothing, and no host kind without DPDK.
  fs::remove(dir_ + "/allreduce-udp.jsonl");
  write("allreduce-dpdk.jsonl", "");
  EXPECT_EQ(run(), 1) << report_;
  EXPECT_TRUE(has(report_, "allreduce-dpdk.jsonl has no results")) << report_;
  EXPECT_TRUE(has(target("kernel-bypass hosts: algbw"),
                  "**NOT MEASURED**: kernel-bypass hosts: algbw >= 2.0x Gloo ring's and >= 1.5x "
                  "MPI's at 1, 4 and 16 MiB: dpdk hosts gave no results (see the failures)"))
      << report_;
  EXPECT_TRUE(has(target("hosts without DPDK"),
                  "**NOT MEASURED**: hosts without DPDK (AF_XDP or kernel UDP, the faster): "
                  "algbw >= 1.0x Gloo ring's at 1-16 MiB: udp hosts not run (--hosts); af_xdp "
                  "hosts not run (--hosts)"))
      << report_;
  EXPECT_TRUE(has(target("kernel-bypass hosts (libtreeduce's DPDK transport on memif), sizes <= "
                         "4 KiB"),
                  "**NOT MEASURED**"))
      << report_;
  EXPECT_TRUE(has(target("kernel-bypass hosts (libtreeduce's DPDK transport on memif), sizes <= "
                         "4 KiB"),
                  "dpdk hosts gave no results"))
      << report_;
}

TEST_F(BenchReport, WrongElementsOrAMissingHalfFailTheReport) {
  lines("allreduce-dpdk.jsonl", {row(kMiB, 100, 250, 160, /*wrong=*/3)});
  json half = b2b_row(100, 160);
  half.erase("sequential");
  lines("b2b-dpdk.jsonl", {half});
  EXPECT_EQ(run(), 1) << report_;
  EXPECT_TRUE(has(report_, "**FAILED**")) << report_;
  EXPECT_TRUE(has(report_, "treeduce: 3 wrong elements at 1048576 B f32 sum (dpdk hosts)"))
      << report_;
  EXPECT_TRUE(has(report_, "back to back (dpdk hosts): no sequential result at 262144 B"))
      << report_;
}

// A report directory from before the host kinds (one allreduce.jsonl) is still reported.
TEST_F(BenchReport, AnOlderReportDirectory) {
  lines("allreduce.jsonl", {row(4096, 30, 1000, 40), row(kMiB, 100, 250, 160)});
  ASSERT_EQ(run(), 0) << stderr_ << report_;
  EXPECT_TRUE(has(report_, "## Allreduce, hosts as run")) << report_;
  EXPECT_TRUE(has(target("hosts as run, f32 sum, sizes <= 4 KiB: time <= 0.5x Gloo"), "**MET**"))
      << report_;
  EXPECT_TRUE(fs::exists(dir_ + "/allreduce_f32_sum.png"));
  // Its targets per host kind say why they have no figures.
  EXPECT_TRUE(has(target("kernel-bypass hosts: algbw"),
                  "dpdk hosts: this report's results predate the host kinds"))
      << report_;
}

}  // namespace
