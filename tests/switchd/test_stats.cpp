// The switch's counter exports: counter names, the Prometheus text (exact lines, escaping, every
// series present, and a line-by-line check of the whole format), the shutdown summary, and the
// /metrics endpoint fetched over a plain TCP socket.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "stats.h"

namespace treeduce::switchd {
namespace {

using dp::DropReason;
using dp::Event;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::size_t count_line(const std::string& text, const std::string& line) {
  std::size_t n = 0;
  for (const std::string& l : lines_of(text)) n += l == line;
  return n;
}

Snapshot sample_snapshot() {
  Snapshot s;
  s.switch_name = "leaf1";
  s.uptime_s = 12.5;
  s.core.drops[static_cast<std::size_t>(DropReason::bad_key)] = 10;
  s.core.events[static_cast<std::size_t>(Event::rx_frames)] = 1200;
  s.switchd[static_cast<std::size_t>(SwitchdCounter::steered)] = 5;
  s.ports.push_back({"net_memif0", 0, 1200, 1'300'000, 1100, 1'240'000, 3, 0, 0, {}, ""});
  s.ports.push_back({"net_tap1", 1, 0, 0, 0, 0, 0, 0, 0, {0.25, true, 500, 100}, "/tmp/tap1.pcap"});
  TreeStats t;
  t.tree_id = 7;
  t.job = "demo";
  t.counters.events[static_cast<std::size_t>(Event::contrib_accepted)] = 400;
  t.counters.drops[static_cast<std::size_t>(DropReason::bad_key)] = 2;
  s.trees.push_back(t);
  s.lcores.push_back({2, 1000, 20, 3, 40});
  return s;
}

/// Checks text against the exposition format 0.0.4 as this exporter uses it: every family has
/// one HELP then one TYPE line before its samples, samples of a family are contiguous, each
/// sample is `name{label="value",...} value` with escaped values, and counters are integers.
/// Returns the problems found (empty when the text is valid).
std::vector<std::string> validate(const std::string& text) {
  static const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) [^\n]*)");
  static const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge))");
  static const std::string kLabel = R"([a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")";
  static const std::regex kSample("([a-zA-Z_:][a-zA-Z0-9_:]*)\\{(" + kLabel + "(?:," + kLabel +
                                  ")*)\\} ([^ ]+)");
  static const std::regex kInteger("[0-9]+");
  std::vector<std::string> problems;
  std::set<std::string> seen;  // families already started
  std::map<std::string, std::string> types;
  std::string current;  // family whose samples may follow
  bool help_pending = false;
  if (text.empty() || text.back() != '\n') problems.push_back("text does not end in a newline");
  for (const std::string& l : lines_of(text)) {
    std::smatch m;
    if (std::regex_match(l, m, kHelp)) {
      if (!seen.insert(m[1]).second) problems.push_back("family seen twice: " + l);
      current = m[1];
      help_pending = true;
    } else if (std::regex_match(l, m, kType)) {
      if (!help_pending || m[1] != current) problems.push_back("TYPE without its HELP: " + l);
      types[m[1]] = m[2];
      help_pending = false;
    } else if (std::regex_match(l, m, kSample)) {
      if (m[1] != current || help_pending) problems.push_back("sample outside its family: " + l);
      if (types[m[1]] == "counter" && !std::regex_match(m[3].str(), kInteger)) {
        problems.push_back("counter not an integer: " + l);
      }
    } else {
      problems.push_back("not a valid line: " + l);
    }
  }
  return problems;
}

TEST(SwitchdCounterNames, ComeFromTheXMacro) {
  EXPECT_EQ(name(SwitchdCounter::rx_multiseg), "rx_multiseg");
  EXPECT_EQ(name(SwitchdCounter::ctl_ring_full), "ctl_ring_full");
  EXPECT_EQ(description(SwitchdCounter::tx_unresolved),
            "frames dropped because the next hop's MAC is not known yet");
  EXPECT_EQ(name(static_cast<SwitchdCounter>(kNumSwitchdCounters)), "?");
  EXPECT_EQ(description(static_cast<SwitchdCounter>(255)), "?");
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < kNumSwitchdCounters; ++i) {
    const auto c = static_cast<SwitchdCounter>(i);
    EXPECT_FALSE(description(c).empty());
    EXPECT_TRUE(names.insert(name(c)).second) << name(c);
  }
}

TEST(Validator, RejectsMalformedText) {
  // The validator must be able to fail, or the format test below proves nothing.
  EXPECT_TRUE(validate("# HELP a_total x\n# TYPE a_total counter\na_total{l=\"v\"} 1\n").empty());
  EXPECT_FALSE(
      validate("# HELP a_total x\n# TYPE a_total counter\na_total{l=\"v\"\"} 1\n").empty());
  EXPECT_FALSE(
      validate("# HELP a_total x\n# TYPE a_total counter\na_total{l=\"v\"} 1.5\n").empty());
  EXPECT_FALSE(validate("# TYPE a_total counter\na_total{l=\"v\"} 1\n").empty());
  EXPECT_FALSE(validate("# HELP a x\n# TYPE a gauge\n# HELP a x\n# TYPE a gauge\n").empty());
  EXPECT_FALSE(validate("# HELP a x\n# TYPE a gauge\nb{l=\"v\"} 1\n").empty());
}

TEST(RenderPrometheus, WholeOutputIsValid) {
  Snapshot s = sample_snapshot();
  s.switch_name = "odd \"name\"\\with\nnewline";
  s.ports[0].name = "port\"0";
  s.trees[0].job = "job\\\"\n";
  for (const std::string& p : validate(render_prometheus(s))) ADD_FAILURE() << p;
  for (const std::string& p : validate(render_prometheus(Snapshot{}))) ADD_FAILURE() << p;
}

TEST(RenderPrometheus, EachFamilyHasOneHelpAndOneType) {
  const std::string text = render_prometheus(sample_snapshot());
  const std::pair<const char*, const char*> families[] = {
      {"treeduce_switch_uptime_seconds", "gauge"},
      {"treeduce_switch_trees", "gauge"},
      {"treeduce_switch_drops_total", "counter"},
      {"treeduce_switch_events_total", "counter"},
      {"treeduce_switch_daemon_total", "counter"},
      {"treeduce_port_rx_packets_total", "counter"},
      {"treeduce_port_rx_bytes_total", "counter"},
      {"treeduce_port_tx_packets_total", "counter"},
      {"treeduce_port_tx_bytes_total", "counter"},
      {"treeduce_port_rx_missed_total", "counter"},
      {"treeduce_port_rx_errors_total", "counter"},
      {"treeduce_port_tx_errors_total", "counter"},
      {"treeduce_port_fault_rx_loss", "gauge"},
      {"treeduce_port_fault_down", "gauge"},
      {"treeduce_port_fault_delay_us", "gauge"},
      {"treeduce_port_fault_rate_mbps", "gauge"},
      {"treeduce_port_capturing", "gauge"},
      {"treeduce_tree_drops_total", "counter"},
      {"treeduce_port_link_up", "gauge"},
      {"treeduce_port_link_changes_total", "counter"},
      {"treeduce_port_link_restarts_total", "counter"},
      {"treeduce_tree_events_total", "counter"},
      {"treeduce_lcore_polls_total", "counter"},
      {"treeduce_lcore_busy_polls_total", "counter"},
      {"treeduce_lcore_sleeps_total", "counter"},
      {"treeduce_lcore_yields_total", "counter"},
  };
  std::size_t help_lines = 0;
  for (const std::string& l : lines_of(text)) help_lines += l.starts_with("# HELP ");
  EXPECT_EQ(help_lines, std::size(families));
  for (const auto& [family, type] : families) {
    EXPECT_EQ(count_line(text, std::string("# TYPE ") + family + ' ' + type), 1u) << family;
    std::size_t helps = 0;
    for (const std::string& l : lines_of(text)) {
      helps += l.starts_with(std::string("# HELP ") + family + ' ');
    }
    EXPECT_EQ(helps, 1u) << family;
  }
  // HELP lines carry the descriptions of the labels' values.
  EXPECT_NE(text.find(std::string(dp::description(DropReason::bad_key))), std::string::npos);
  EXPECT_NE(text.find(std::string(dp::description(Event::slot_reused))), std::string::npos);
  EXPECT_NE(text.find(std::string(description(SwitchdCounter::ctl_ring_full))), std::string::npos);
}

TEST(RenderPrometheus, ExactLines) {
  const std::string text = render_prometheus(sample_snapshot());
  for (
      const char* line : {
          R"(treeduce_switch_uptime_seconds{switch="leaf1"} 12.5)",
          R"(treeduce_switch_trees{switch="leaf1"} 1)",
          R"(treeduce_switch_drops_total{switch="leaf1",reason="bad_key"} 10)",
          R"(treeduce_switch_drops_total{switch="leaf1",reason="too_short"} 0)",
          R"(treeduce_switch_events_total{switch="leaf1",event="rx_frames"} 1200)",
          R"(treeduce_switch_daemon_total{switch="leaf1",counter="steered"} 5)",
          R"(treeduce_switch_daemon_total{switch="leaf1",counter="ctl_ring_full"} 0)",
          R"(treeduce_port_rx_packets_total{switch="leaf1",port="net_memif0"} 1200)",
          R"(treeduce_port_rx_bytes_total{switch="leaf1",port="net_memif0"} 1300000)",
          R"(treeduce_port_tx_packets_total{switch="leaf1",port="net_memif0"} 1100)",
          R"(treeduce_port_tx_bytes_total{switch="leaf1",port="net_memif0"} 1240000)",
          R"(treeduce_port_rx_missed_total{switch="leaf1",port="net_memif0"} 3)",
          R"(treeduce_port_rx_errors_total{switch="leaf1",port="net_tap1"} 0)",
          R"(treeduce_port_fault_rx_loss{switch="leaf1",port="net_memif0"} 0)",
          R"(treeduce_port_fault_rx_loss{switch="leaf1",port="net_tap1"} 0.25)",
          R"(treeduce_port_fault_down{switch="leaf1",port="net_memif0"} 0)",
          R"(treeduce_port_fault_down{switch="leaf1",port="net_tap1"} 1)",
          R"(treeduce_port_fault_delay_us{switch="leaf1",port="net_tap1"} 500)",
          R"(treeduce_port_fault_rate_mbps{switch="leaf1",port="net_tap1"} 100)",
          R"(treeduce_port_capturing{switch="leaf1",port="net_tap1"} 1)",
          R"(treeduce_port_capturing{switch="leaf1",port="net_memif0"} 0)",
          R"(treeduce_tree_drops_total{switch="leaf1",tree="7",job="demo",reason="bad_key"} 2)",
          R"(treeduce_tree_events_total{switch="leaf1",tree="7",job="demo",event="contrib_accepted"} 400)",
          R"(treeduce_tree_events_total{switch="leaf1",tree="7",job="demo",event="rx_frames"} 0)",
          R"(treeduce_lcore_polls_total{switch="leaf1",lcore="2"} 1000)",
          R"(treeduce_lcore_busy_polls_total{switch="leaf1",lcore="2"} 20)",
          R"(treeduce_lcore_sleeps_total{switch="leaf1",lcore="2"} 3)",
          R"(treeduce_lcore_yields_total{switch="leaf1",lcore="2"} 40)",
      }) {
    EXPECT_EQ(count_line(text, line), 1u) << line;
  }
}

TEST(RenderPrometheus, EverySeriesOfTheSwitchEvenAtZero) {
  Snapshot s;
  s.switch_name = "s";
  const std::string text = render_prometheus(s);
  for (std::size_t i = 1; i < dp::kNumDropReasons; ++i) {
    const std::string line = "treeduce_switch_drops_total{switch=\"s\",reason=\"" +
                             std::string(dp::name(static_cast<DropReason>(i))) + "\"} 0";
    EXPECT_EQ(count_line(text, line), 1u) << line;
  }
  for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
    const std::string line = "treeduce_switch_events_total{switch=\"s\",event=\"" +
                             std::string(dp::name(static_cast<Event>(i))) + "\"} 0";
    EXPECT_EQ(count_line(text, line), 1u) << line;
  }
  for (std::size_t i = 0; i < kNumSwitchdCounters; ++i) {
    const std::string line = "treeduce_switch_daemon_total{switch=\"s\",counter=\"" +
                             std::string(name(static_cast<SwitchdCounter>(i))) + "\"} 0";
    EXPECT_EQ(count_line(text, line), 1u) << line;
  }
  // "none" is not a drop reason: no series for it.
  EXPECT_EQ(text.find("reason=\"none\""), std::string::npos);
  // No installed tree, port or lcore: none of their samples.
  for (const char* prefix : {"treeduce_tree_", "treeduce_port_", "treeduce_lcore_"}) {
    for (const std::string& l : lines_of(text)) {
      EXPECT_TRUE(l.starts_with("#") || !l.starts_with(prefix)) << l;
    }
  }
}

TEST(RenderPrometheus, PerTreeSeriesForEachInstalledTree) {
  Snapshot s = sample_snapshot();
  TreeStats other;
  other.tree_id = 9;
  other.job = "other";
  s.trees.push_back(other);
  const std::string text = render_prometheus(s);
  EXPECT_EQ(count_line(text, R"(treeduce_switch_trees{switch="leaf1"} 2)"), 1u);
  for (const std::string tree : {"tree=\"7\",job=\"demo\"", "tree=\"9\",job=\"other\""}) {
    std::size_t drops = 0, events = 0;
    for (const std::string& l : lines_of(text)) {
      drops += l.starts_with("treeduce_tree_drops_total{switch=\"leaf1\"," + tree + ",reason=");
      events += l.starts_with("treeduce_tree_events_total{switch=\"leaf1\"," + tree + ",event=");
    }
    EXPECT_EQ(drops, dp::kNumDropReasons - 1) << tree;
    EXPECT_EQ(events, dp::kNumEvents) << tree;
  }
}

TEST(RenderPrometheus, EscapesLabelValues) {
  Snapshot s;
  s.switch_name = "a\"b\\c\nd";
  s.ports.push_back({"p\"0", 0, 1, 0, 0, 0, 0, 0, 0, {}, ""});
  const std::string text = render_prometheus(s);
  EXPECT_EQ(count_line(text, R"(treeduce_switch_trees{switch="a\"b\\c\nd"} 0)"), 1u) << text;
  EXPECT_EQ(
      count_line(text, R"(treeduce_port_rx_packets_total{switch="a\"b\\c\nd",port="p\"0"} 1)"), 1u);
}

TEST(RenderPrometheus, LargeCountersAreExactIntegers) {
  Snapshot s;
  s.switch_name = "s";
  s.core.events[0] = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(count_line(render_prometheus(s),
                       R"(treeduce_switch_events_total{switch="s",event="rx_frames"} )"
                       "18446744073709551615"),
            1u);
}

TEST(RenderSummary, NonZeroCountersOnly) {
  EXPECT_EQ(render_summary(sample_snapshot()),
            "port net_memif0: rx 1200 packets 1.3 MB, tx 1100 packets 1.2 MB, rx_missed 3\n"
            "port net_tap1: faults: down rx_loss=0.25 delay_us=500 rate_mbps=100, capture "
            "/tmp/tap1.pcap\n"
            "event rx_frames: 1200\n"
            "drop bad_key: 10\n"
            "daemon steered: 5\n"
            "tree 7 (demo): contrib_accepted 400, drop bad_key 2\n"
            "lcore 2: polls 1000, busy_polls 20, sleeps 3, yields 40\n");
  EXPECT_EQ(render_summary(Snapshot{}), "");
  Snapshot s;
  s.ports.push_back({"p", 0, 0, 0, 3, 999, 0, 0, 7, {}, ""});
  s.trees.push_back({.tree_id = 1, .job = "", .counters = {}});
  EXPECT_EQ(render_summary(s), "port p: tx 3 packets 999 B, tx_errors 7\n");
}

// ---- MetricsServer ----

struct HttpReply {
  int status = 0;
  std::string headers, body;
};

/// GET over a plain socket with Connection: close, so the body ends at EOF.
HttpReply http_get(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  HttpReply r;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ADD_FAILURE() << "connect to port " << port << " failed";
    close(fd);
    return r;
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const auto end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || end == std::string::npos) {
    ADD_FAILURE() << "not an HTTP reply: " << raw;
    return r;
  }
  r.status = std::stoi(raw.substr(9, 3));  // "HTTP/1.1 200 OK"
  r.headers = raw.substr(0, end + 2);      // each header line ends in CRLF
  r.body = raw.substr(end + 4);
  return r;
}

TEST(MetricsServer, ServesTheRenderedSnapshot) {
  std::string error;
  int calls = 0;
  auto server = MetricsServer::start(
      "127.0.0.1:0",
      [&calls] {
        ++calls;
        return sample_snapshot();
      },
      &error);
  ASSERT_NE(server, nullptr) << error;
  ASSERT_GT(server->port(), 0);
  const HttpReply r = http_get(server->port(), "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            std::string::npos)
      << r.headers;
  EXPECT_EQ(r.body, render_prometheus(sample_snapshot()));
  EXPECT_EQ(calls, 1);
  // A fresh snapshot per scrape.
  EXPECT_EQ(http_get(server->port(), "/metrics?x=1").body, r.body);
  EXPECT_EQ(calls, 2);
}

TEST(MetricsServer, AnythingElseIs404) {
  std::string error;
  auto server = MetricsServer::start(
      "localhost:0", [] { return Snapshot{}; }, &error);
  ASSERT_NE(server, nullptr) << error;
  for (const char* path : {"/", "/metrics/", "/metricsx", "/favicon.ico"}) {
    EXPECT_EQ(http_get(server->port(), path).status, 404) << path;
  }
}

TEST(MetricsServer, BadAddressIsASentence) {
  for (const char* listen :
       {"", "9470", "127.0.0.1", "127.0.0.1:", "127.0.0.1:x", "127.0.0.1:65536", "127.0.0.1:-1",
        "127.0.0.1:+80", "example.com:80", "[::1]:80", "::1:80", "1.2.3:80", " 127.0.0.1:80"}) {
    std::string error;
    EXPECT_EQ(MetricsServer::start(
                  listen, [] { return Snapshot{}; }, &error),
              nullptr)
        << listen;
    EXPECT_EQ(error, std::string("metrics: bad listen address \"") + listen +
                         "\" (expected an IPv4 address or localhost, a colon and a port).");
  }
}

TEST(MetricsServer, PortTakenIsASentence) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string listen = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  std::string error;
  EXPECT_EQ(MetricsServer::start(
                listen, [] { return Snapshot{}; }, &error),
            nullptr);
  EXPECT_EQ(error, "metrics: cannot listen on " + listen + ": Address already in use.");
  close(fd);
}

TEST(MetricsServer, DestructorReturnsPromptly) {
  using Clock = std::chrono::steady_clock;
  std::string error;
  auto server = MetricsServer::start(
      "127.0.0.1:0", [] { return Snapshot{}; }, &error);
  ASSERT_NE(server, nullptr) << error;
  auto t0 = Clock::now();
  server.reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(500));

  // A client whose keep-alive connection stays silent holds the worker only for the keep-alive
  // timeout.
  server = MetricsServer::start(
      "127.0.0.1:0", [] { return Snapshot{}; }, &error);
  ASSERT_NE(server, nullptr) << error;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(server->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  // One scrape answered on the connection: the server accepted it, and its worker now waits
  // on it for the next request.
  const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
  ASSERT_EQ(send(fd, req.data(), req.size(), 0), static_cast<ssize_t>(req.size()));
  std::string reply;
  char buf[4096];
  while (reply.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << reply;
    reply.append(buf, static_cast<std::size_t>(n));
  }
  ASSERT_EQ(reply.rfind("HTTP/1.1 200", 0), 0u) << reply;
  t0 = Clock::now();
  server.reset();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));
  close(fd);
}

}  // namespace
}  // namespace treeduce::switchd
