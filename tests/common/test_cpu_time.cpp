// treeduce/common/cpu_time.h: a process's CPU time, the machine's split by kind (on made-up
// /proc/stat ticks, and on this machine's).
#include "treeduce/common/cpu_time.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

using treeduce::MachineCpu;

MachineCpu ticks(unsigned long long user, unsigned long long nice, unsigned long long system,
                 unsigned long long idle, unsigned long long iowait, unsigned long long irq,
                 unsigned long long softirq, unsigned long long steal) {
  MachineCpu m;
  m.ticks = {user, nice, system, idle, iowait, irq, softirq, steal};
  m.valid = true;
  return m;
}

TEST(CpuTime, OwnProcessGrowsWithWork) {
  const double a = treeduce::process_cpu_seconds(getpid());
  ASSERT_GE(a, 0);
  // Work until the clock moves: no bound on how long that takes.
  volatile unsigned long long x = 0;
  double b = a;
  while (b == a) {
    for (int i = 0; i < 100000; ++i) x = x + static_cast<unsigned long long>(i);
    b = treeduce::process_cpu_seconds(getpid());
  }
  EXPECT_GT(b, a);
}

TEST(CpuTime, NoSuchProcessIsMinusOne) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);  // reaped: the pid names no process now
  EXPECT_EQ(treeduce::process_cpu_seconds(child), -1);
}

TEST(CpuTime, SplitByKind) {
  const MachineCpu a = ticks(100, 0, 100, 100, 0, 0, 0, 0);
  // 200 ticks: user 80 + nice 12, system 52, idle 4 + iowait 2, irq 10 + softirq 40, steal 0.
  const MachineCpu b = ticks(180, 12, 152, 104, 2, 10, 40, 0);
  EXPECT_EQ(treeduce::cpu_split_text(a, b),
            "user 46%, system 26%, irq+softirq 25%, idle 3%, steal 0%");
  EXPECT_DOUBLE_EQ(treeduce::busy_share(a, b), 1.0 - 6.0 / 200.0);
}

TEST(CpuTime, NothingToTellGivesEmptyAndZero) {
  const MachineCpu a = ticks(1, 2, 3, 4, 5, 6, 7, 8);
  EXPECT_EQ(treeduce::cpu_split_text(a, a), "");  // no tick passed
  EXPECT_EQ(treeduce::busy_share(a, a), 0);
  const MachineCpu unread;  // /proc/stat not read
  EXPECT_EQ(treeduce::cpu_split_text(unread, a), "");
  EXPECT_EQ(treeduce::cpu_split_text(a, unread), "");
  EXPECT_EQ(treeduce::busy_share(unread, a), 0);
}

TEST(CpuTime, ThisMachine) {
  const MachineCpu a = MachineCpu::now();
  ASSERT_TRUE(a.valid);
  // Spin until the machine's clock ticks once (USER_HZ): no bound on how long.
  MachineCpu b = MachineCpu::now();
  while (b.ticks == a.ticks) b = MachineCpu::now();
  const double busy = treeduce::busy_share(a, b);
  EXPECT_GE(busy, 0);
  EXPECT_LE(busy, 1);
  EXPECT_NE(treeduce::cpu_split_text(a, b).find("user "), std::string::npos);
}

}  // namespace
