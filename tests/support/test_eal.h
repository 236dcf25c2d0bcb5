// The EAL for unit tests that need DPDK without hardware: no hugepages, no PCI, no telemetry,
// one lcore (the first CPU this process may run on) and the virtual devices the test names.
// Each test binary has its own main() that calls init_test_eal() before RUN_ALL_TESTS().
#pragma once

#include <rte_eal.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace treeduce::test_support {

/// The first CPU this process may run on (0 when the affinity cannot be read).
inline int first_allowed_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) return c;
    }
  }
  return 0;
}

/// Starts the EAL with `vdevs` ("net_ring0", ...) and a file prefix unique to this process;
/// false (and a line on stderr) when it cannot.
inline bool init_test_eal(const char* argv0, const std::string& prefix,
                          const std::vector<std::string>& vdevs) {
  std::vector<std::string> eal = {argv0,
                                  "-l",
                                  std::to_string(first_allowed_cpu()),
                                  "--no-huge",
                                  "-m",
                                  "128",
                                  "--no-pci",
                                  "--no-telemetry",
                                  "--file-prefix=" + prefix + std::to_string(getpid()),
                                  "--log-level=lib.eal:warning"};
  for (const std::string& v : vdevs) eal.push_back("--vdev=" + v);
  std::vector<char*> argv;
  for (std::string& s : eal) argv.push_back(s.data());
  if (rte_eal_init(static_cast<int>(argv.size()), argv.data()) < 0) {
    std::fprintf(stderr, "EAL initialisation failed\n");
    return false;
  }
  return true;
}

}  // namespace treeduce::test_support
