// treeduce-fabric: the main job (scripts/main.sh). Brings up a whole emulated fabric on this
// machine (a treeduce-manager, three treeduce-switch processes in a 2-level tree, four host ranks
// in their own network namespaces), runs treeduce-perf on the four ranks (libtreeduce: the ranks
// join the job through the manager, which installs the tree on the switches), streams rank 0's
// table as it runs, and tears everything down on success, failure and Ctrl-C: no namespace,
// process, bridge or socket is left behind.
//   treeduce-fabric [--loss F] [--keep-logs] [-- treeduce-perf arguments]
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "fabric.h"

namespace {

using namespace treeduce::testing;

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int usage(const char* why) {
  std::fprintf(stderr,
               "treeduce-fabric: %s\nusage: treeduce-fabric [--loss F] [--keep-logs] "
               "[-- treeduce-perf arguments]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  double loss = 0;
  std::vector<std::string> perf_args = {
      "-b", "4096",    "-e", "4194304", "-f", "8", "-d", "f32,bf16,f16,e4m3,e5m2,i32",
      "-o", "sum,max", "-n", "5",       "-w", "1"};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--loss") == 0 && i + 1 < argc) {
      char* end = nullptr;
      loss = std::strtod(argv[++i], &end);
      if (*end != '\0' || !(loss >= 0 && loss < 1))
        return usage("--loss takes a fraction below 1.");
    } else if (std::strcmp(argv[i], "--keep-logs") == 0) {
      setenv("TREEDUCE_KEEP_LAB", "1", 1);
    } else if (std::strcmp(argv[i], "--") == 0) {
      perf_args.assign(argv + i + 1, argv + argc);
      break;
    } else {
      return usage((std::string("unknown argument ") + argv[i] + ".").c_str());
    }
  }
  if (geteuid() != 0) {
    return usage("network namespaces and veth pairs need root (run it with sudo).");
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  int rc = 0;
  {
    Lab lab("m");  // everything it made goes when it is destroyed, whatever happened
    FabricOptions fo{TREEDUCE_SWITCH_BIN, TREEDUCE_MANAGER_BIN};
    fo.host_port_loss = loss;
    fo.leaf_uplink_loss = loss;
    fo.spine_loss = loss;
    fo.management_network = true;
    Fabric fab(lab, fo);
    auto t = std::chrono::steady_clock::now();
    std::printf(
        "[1/3] fabric: manager, leaf0 + leaf1 + spine (treeduce-switch on memif and "
        "af_packet), 4 host namespaces%s ...\n",
        loss > 0 ? (", " + std::to_string(loss * 100) + " % loss on every link").c_str() : "");
    if (const std::string e = fab.up(); !e.empty()) {
      std::fprintf(stderr, "treeduce-fabric: %s\n", e.c_str());
      return 1;
    }
    std::printf("      up in %.1f s; manager %s; logs in %s\n", seconds_since(t),
                fab.manager_address().c_str(), lab.dir().c_str());
    std::printf("[2/3] allreduce: 4 ranks of treeduce-perf (libtreeduce), every result checked\n");
    t = std::chrono::steady_clock::now();
    std::vector<Proc*> ranks;
    for (int h = 0; h < Fabric::kHosts; ++h) {
      std::vector<std::string> argv_h = fab.rank_env(h, "main");
      argv_h.push_back(TREEDUCE_PERF_BIN);
      argv_h.insert(argv_h.end(), perf_args.begin(), perf_args.end());
      ranks.push_back(&lab.spawn("rank" + std::to_string(h), fab.host_netns(h), argv_h));
    }
    // Stream rank 0's output as it grows: the table is the progress.
    std::size_t shown = 0;
    bool all_done = false;
    while (!all_done && !g_interrupted) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const std::string log = Lab::read_log(*ranks[0]);
      const std::size_t end = log.rfind('\n');
      if (end != std::string::npos && end + 1 > shown) {
        std::fwrite(log.data() + shown, 1, end + 1 - shown, stdout);
        shown = end + 1;
      }
      all_done = true;
      for (Proc* p : ranks) all_done &= lab.wait(*p, std::chrono::milliseconds(0));
      if (seconds_since(t) > 900) {
        std::fprintf(stderr, "treeduce-fabric: the ranks did not finish in 15 minutes.\n");
        break;
      }
    }
    const std::string log = Lab::read_log(*ranks[0]);
    if (log.size() > shown) std::fwrite(log.data() + shown, 1, log.size() - shown, stdout);
    if (g_interrupted) {
      std::printf("\ninterrupted: tearing down\n");
      rc = 130;
    }
    for (std::size_t h = 0; h < ranks.size(); ++h) {
      Proc* p = ranks[h];
      if (!p->done) lab.stop(*p);
      if (p->status != 0 && rc == 0) {
        rc = 1;
        std::fprintf(stderr, "treeduce-fabric: rank %zu exited with %d:\n%s\n", h, p->status,
                     Lab::read_log(*p).c_str());
      }
    }
    std::printf("[3/3] teardown (%.1f s of allreduce)\n", seconds_since(t));
    const std::vector<int> status = fab.stop();
    for (std::size_t i = 0; i < status.size(); ++i) {
      if (status[i] != 0 && rc == 0) {
        rc = 1;
        std::fprintf(stderr, "treeduce-fabric: %s exited with %d\n",
                     fab.switches()[i]->name.c_str(), status[i]);
      }
    }
  }
  std::printf("main job: %s; fabric removed\n", rc == 0     ? "every allreduce verified"
                                                : rc == 130 ? "interrupted"
                                                            : "FAILED (see above)");
  return rc;
}
