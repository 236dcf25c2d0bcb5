// CPU time as the benchmarks read it: a process's own (every thread, user and system), and the
// machine's by kind from /proc/stat. The kernel's interrupt work for packets (veth, af_packet,
// XDP) is charged to no process: only the machine's split shows it.
#pragma once

#include <sys/types.h>

#include <array>
#include <string>

namespace treeduce {

/// CPU time of a running process, every thread, user and system, in seconds (nanosecond
/// resolution); -1 when it cannot be read (no such process, no permission).
double process_cpu_seconds(pid_t pid);

/// The machine's CPU time by kind since boot, in clock ticks: the first line of /proc/stat.
struct MachineCpu {
  enum Kind { user, nice, system, idle, iowait, irq, softirq, steal, kinds };
  std::array<unsigned long long, kinds> ticks{};
  bool valid = false;  ///< false when /proc/stat could not be read

  static MachineCpu now();
};

/// The share (0 to 1) of the machine's CPU time from `a` to `b` that was busy: neither idle nor
/// iowait. 0 when either is invalid or no tick passed.
double busy_share(const MachineCpu& a, const MachineCpu& b);

/// "user 46%, system 26%, irq+softirq 25%, idle 3%, steal 0%" from `a` to `b` (user includes
/// nice, idle includes iowait); empty when either is invalid or no tick passed.
std::string cpu_split_text(const MachineCpu& a, const MachineCpu& b);

}  // namespace treeduce
