#include "treeduce/common/cpu_time.h"

#include <ctime>
#include <fstream>

namespace treeduce {

double process_cpu_seconds(pid_t pid) {
  clockid_t clock;
  timespec ts{};
  if (clock_getcpuclockid(pid, &clock) != 0 || clock_gettime(clock, &ts) != 0) return -1;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

MachineCpu MachineCpu::now() {
  MachineCpu m;
  std::ifstream in("/proc/stat");
  std::string cpu;
  if (!(in >> cpu) || cpu != "cpu") return m;
  for (auto& t : m.ticks) {
    if (!(in >> t)) return m;
  }
  m.valid = true;
  return m;
}

namespace {

// The ticks of each kind from a to b, and their total; false when there are none.
bool deltas(const MachineCpu& a, const MachineCpu& b,
            std::array<unsigned long long, MachineCpu::kinds>* d, unsigned long long* total) {
  if (!a.valid || !b.valid) return false;
  *total = 0;
  for (std::size_t i = 0; i < d->size(); ++i) {
    (*d)[i] = b.ticks[i] >= a.ticks[i] ? b.ticks[i] - a.ticks[i] : 0;
    *total += (*d)[i];
  }
  return *total != 0;
}

}  // namespace

double busy_share(const MachineCpu& a, const MachineCpu& b) {
  std::array<unsigned long long, MachineCpu::kinds> d;
  unsigned long long total;
  if (!deltas(a, b, &d, &total)) return 0;
  return 1.0 - static_cast<double>(d[MachineCpu::idle] + d[MachineCpu::iowait]) /
                   static_cast<double>(total);
}

std::string cpu_split_text(const MachineCpu& a, const MachineCpu& b) {
  std::array<unsigned long long, MachineCpu::kinds> d;
  unsigned long long total;
  if (!deltas(a, b, &d, &total)) return "";
  const auto pct = [&](unsigned long long x) {
    return std::to_string(static_cast<int>(100.0 * static_cast<double>(x) / total + 0.5)) + "%";
  };
  using K = MachineCpu;
  return "user " + pct(d[K::user] + d[K::nice]) + ", system " + pct(d[K::system]) +
         ", irq+softirq " + pct(d[K::irq] + d[K::softirq]) + ", idle " +
         pct(d[K::idle] + d[K::iowait]) + ", steal " + pct(d[K::steal]);
}

}  // namespace treeduce
