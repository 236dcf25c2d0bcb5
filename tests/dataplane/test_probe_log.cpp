// The rate-limited log of bad_key/bad_source probes (probe_log.h), on a virtual clock.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "treeduce/dataplane/probe_log.h"

namespace treeduce::dp {
namespace {

constexpr std::uint64_t kS = 1'000'000'000;

ProbeLog::Config cfg(std::size_t max_lines = 20, std::size_t max_sources = 4096) {
  ProbeLog::Config c;
  c.interval_ns = 10 * kS;
  c.max_lines = max_lines;
  c.max_sources = max_sources;
  return c;
}

Probe probe(std::uint32_t ip, proto::Reason r = proto::Reason::bad_key, std::uint16_t tree = 7) {
  return Probe{ip, tree, r};
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// One line per source per interval, saying how many were held back in between.
TEST(ProbeLog, OneLinePerSourcePerIntervalWithTheCount) {
  ProbeLog log(cfg());
  log.note(probe(0x0A000009));
  auto lines = log.flush(0);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(has(lines[0], "probe from 10.0.0.9: 1 refused as bad_key")) << lines[0];
  EXPECT_TRUE(has(lines[0], "tree 7")) << lines[0];
  EXPECT_TRUE(has(lines[0], "at most one line per address every 10 s")) << lines[0];
  // A flood within the interval: no line, however often flushed.
  for (int i = 0; i < 1000; ++i) log.note(probe(0x0A000009));
  for (int i = 0; i < 10; ++i) log.note(probe(0x0A000009, proto::Reason::bad_source, 8));
  for (std::uint64_t t = 1; t < 10 * kS; t += kS / 2) EXPECT_TRUE(log.flush(t).empty()) << t;
  lines = log.flush(10 * kS);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(has(lines[0], "1000 refused as bad_key (wrong job key), 10 refused as bad_source"))
      << lines[0];
  EXPECT_TRUE(has(lines[0], "last for tree 8 (in the last 10 s)")) << lines[0];
  // Quiet for an interval: forgotten, and its next probe is news again.
  EXPECT_TRUE(log.flush(21 * kS).empty());
  EXPECT_EQ(log.sources(), 0u);
  log.note(probe(0x0A000009));
  lines = log.flush(21 * kS + 1);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(has(lines[0], "at most one line per address")) << lines[0];
}

// Sources are limited one by one: a second source gets its own first line at once.
TEST(ProbeLog, SourcesAreIndependent) {
  ProbeLog log(cfg());
  log.note(probe(0x0A000001));
  EXPECT_EQ(log.flush(0).size(), 1u);
  log.note(probe(0x0A000001));
  log.note(probe(0x0A000002, proto::Reason::bad_source));
  const auto lines = log.flush(kS);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(has(lines[0], "probe from 10.0.0.2: 1 refused as bad_source")) << lines[0];
}

// A stranger cycling through made-up source addresses: at most max_lines lines per interval and
// one summary; what the budget held back comes in the next interval; beyond max_sources only a
// sum.
TEST(ProbeLog, TheBudgetBoundsLinesFromManySources) {
  ProbeLog log(cfg(5, 100));
  for (std::uint32_t ip = 1; ip <= 150; ++ip) log.note(probe(0x0B000000 + ip));
  auto lines = log.flush(0);
  ASSERT_EQ(lines.size(), 6u);
  EXPECT_TRUE(has(lines[5],
                  "probes held back: 95 from 95 more addresses (at most 5 lines every "
                  "10 s), 50 from addresses beyond the 100 remembered"))
      << lines[5];
  for (int i = 0; i < 50; ++i) log.note(probe(0x0B000001 + static_cast<std::uint32_t>(i)));
  EXPECT_TRUE(log.flush(kS).empty()) << "the interval's budget is spent";
  lines = log.flush(10 * kS);
  ASSERT_EQ(lines.size(), 6u);  // five more sources, and the summary of the rest
  EXPECT_TRUE(has(lines[5], "probes held back:")) << lines[5];
}

}  // namespace
}  // namespace treeduce::dp
