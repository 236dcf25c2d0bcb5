#include "stats.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <initializer_list>
#include <iterator>
#include <system_error>
#include <thread>
#include <utility>

// cpp-httplib serves /metrics: a well-kept HTTP server that Debian packages
// (libcpp-httplib-dev), so the daemon needs no HTTP code of its own. Included here only, so that
// its large header stays out of every file that includes stats.h.
#include <httplib.h>

#include "address.h"  // parse_metrics_listen

namespace treeduce::switchd {

namespace {
struct CounterInfo {
  std::string_view name;
  std::string_view desc;
};
constexpr CounterInfo kCounters[] = {
#define TREEDUCE_SWITCHD_INFO(n, desc) {#n, desc},
    TREEDUCE_FOREACH_SWITCHD_COUNTER(TREEDUCE_SWITCHD_INFO)
#undef TREEDUCE_SWITCHD_INFO
};
}  // namespace

std::string_view name(SwitchdCounter c) noexcept {
  const auto i = static_cast<std::size_t>(c);
  return i < kNumSwitchdCounters ? kCounters[i].name : "?";
}
std::string_view description(SwitchdCounter c) noexcept {
  const auto i = static_cast<std::size_t>(c);
  return i < kNumSwitchdCounters ? kCounters[i].desc : "?";
}

namespace {

// DropReason 0 (none) means "not dropped": it is never counted, so it is not exported either.
constexpr std::size_t kFirstDrop = 1;

dp::DropReason drop_at(std::size_t i) { return static_cast<dp::DropReason>(i); }
dp::Event event_at(std::size_t i) { return static_cast<dp::Event>(i); }

void append_number(std::string& out, std::uint64_t v) {
  char buf[24];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// Shortest text that reads back as the same double; Prometheus parses it with Go's ParseFloat.
void append_number(std::string& out, double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

// The exposition format escapes backslash and newline in HELP text, and also the double quote in
// label values (which are quoted).
void append_escaped(std::string& out, std::string_view s, bool label_value) {
  for (const char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

struct Label {
  std::string_view name;
  std::string_view value;
};

/// Writes one metric family after another: HELP and TYPE, then its samples, each labelled with
/// the switch first.
class Exposition {
 public:
  explicit Exposition(std::string_view switch_name) : switch_(switch_name) {}

  void family(std::string_view name, std::string_view type, std::string_view help) {
    family_ = name;
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    append_escaped(out_, help, false);
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }

  template <typename Value>
  void sample(std::initializer_list<Label> labels, Value v) {
    out_ += family_;
    out_ += "{switch=\"";
    append_escaped(out_, switch_, true);
    out_ += '"';
    for (const Label& l : labels) {
      out_ += ',';
      out_ += l.name;
      out_ += "=\"";
      append_escaped(out_, l.value, true);
      out_ += '"';
    }
    out_ += "} ";
    append_number(out_, v);
    out_ += '\n';
  }

  std::string take() { return std::move(out_); }

 private:
  std::string_view switch_;
  std::string_view family_;
  std::string out_;
};

/// "(name: description; ...)" of every entry, for the HELP line of a family labelled by entry.
template <typename Enum>
std::string legend(std::size_t first, std::size_t count) {
  std::string s = "(";
  for (std::size_t i = first; i < count; ++i) {
    const auto e = static_cast<Enum>(i);
    if (i != first) s += "; ";
    s += name(e);
    s += ": ";
    s += description(e);
  }
  s += ')';
  return s;
}

struct PortField {
  std::string_view metric;
  std::string_view summary;  ///< its name in render_summary (rx/tx packets and bytes have none)
  std::uint64_t PortStats::*value;
  std::string_view help;
};
constexpr PortField kPortFields[] = {
    {"treeduce_port_rx_packets_total", "", &PortStats::rx_packets, "Frames received on the port."},
    {"treeduce_port_rx_bytes_total", "", &PortStats::rx_bytes, "Bytes received on the port."},
    {"treeduce_port_tx_packets_total", "", &PortStats::tx_packets, "Frames sent on the port."},
    {"treeduce_port_tx_bytes_total", "", &PortStats::tx_bytes, "Bytes sent on the port."},
    {"treeduce_port_rx_missed_total", "rx_missed", &PortStats::rx_missed,
     "Frames the port dropped because its receive queues were full."},
    {"treeduce_port_rx_errors_total", "rx_errors", &PortStats::rx_errors,
     "Erroneous frames received on the port."},
    {"treeduce_port_tx_errors_total", "tx_errors", &PortStats::tx_errors,
     "Frames the port failed to send."},
    {"treeduce_port_link_changes_total", "link_changes", &PortStats::link_changes,
     "Times the port's link went up or down after the switch first looked at it."},
    {"treeduce_port_link_restarts_total", "link_restarts", &PortStats::link_restarts,
     "Restarts of the port (a memif client whose link stayed down)."},
};

struct LcoreField {
  std::string_view metric;
  std::string_view summary;
  std::uint64_t LcoreStats::*value;
  std::string_view help;
};
constexpr LcoreField kLcoreFields[] = {
    {"treeduce_lcore_polls_total", "polls", &LcoreStats::polls, "Receive polls of the lcore."},
    {"treeduce_lcore_busy_polls_total", "busy_polls", &LcoreStats::busy_polls,
     "Receive polls of the lcore that returned frames."},
    {"treeduce_lcore_sleeps_total", "sleeps", &LcoreStats::sleeps,
     "Times the lcore slept because it was idle."},
    {"treeduce_lcore_yields_total", "yields", &LcoreStats::yields,
     "Times the lcore yielded its CPU because it was idle, before sleeping."},
};

}  // namespace

std::string render_prometheus(const Snapshot& s) {
  Exposition x(s.switch_name);

  x.family("treeduce_switch_uptime_seconds", "gauge", "Seconds since the switch started.");
  x.sample({}, s.uptime_s);
  x.family("treeduce_switch_trees", "gauge", "Reduction trees installed on the switch.");
  x.sample({}, static_cast<std::uint64_t>(s.trees.size()));

  // Every reason, event and counter even at zero, so that each series exists from the start.
  x.family("treeduce_switch_drops_total", "counter",
           "Frames the switch core dropped, by reason " +
               legend<dp::DropReason>(kFirstDrop, dp::kNumDropReasons) + '.');
  for (std::size_t i = kFirstDrop; i < dp::kNumDropReasons; ++i) {
    x.sample({{"reason", dp::name(drop_at(i))}}, s.core.drops[i]);
  }
  x.family("treeduce_switch_events_total", "counter",
           "Events of the switch core " + legend<dp::Event>(0, dp::kNumEvents) + '.');
  for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
    x.sample({{"event", dp::name(event_at(i))}}, s.core.events[i]);
  }
  x.family("treeduce_switch_daemon_total", "counter",
           "Drops and events of the daemon around the switch core " +
               legend<SwitchdCounter>(0, kNumSwitchdCounters) + '.');
  for (std::size_t i = 0; i < kNumSwitchdCounters; ++i) {
    x.sample({{"counter", name(static_cast<SwitchdCounter>(i))}}, s.switchd[i]);
  }

  for (const PortField& f : kPortFields) {
    x.family(f.metric, "counter", f.help);
    for (const PortStats& p : s.ports) x.sample({{"port", p.name}}, p.*f.value);
  }
  // Injected faults (docs/switch-config.md, `treeduce lab fault`): all zero on a healthy port.
  x.family("treeduce_port_fault_rx_loss", "gauge",
           "Fraction of the frames received on the port dropped on purpose.");
  for (const PortStats& p : s.ports) x.sample({{"port", p.name}}, p.fault.rx_loss);
  x.family("treeduce_port_fault_down", "gauge",
           "1 when the port is set down: every frame in or out dropped.");
  for (const PortStats& p : s.ports)
    x.sample({{"port", p.name}}, std::uint64_t{p.fault.down ? 1u : 0u});
  x.family("treeduce_port_fault_delay_us", "gauge",
           "Microseconds each received frame is held before the switch processes it.");
  for (const PortStats& p : s.ports) x.sample({{"port", p.name}}, std::uint64_t{p.fault.delay_us});
  x.family("treeduce_port_fault_rate_mbps", "gauge",
           "Rate received frames are released at, in Mb/s; 0: line rate.");
  for (const PortStats& p : s.ports) x.sample({{"port", p.name}}, std::uint64_t{p.fault.rate_mbps});
  x.family("treeduce_port_link_up", "gauge",
           "1 while the port's link is up (looked at every 100 ms; docs/switch.md, Links).");
  for (const PortStats& p : s.ports)
    x.sample({{"port", p.name}}, std::uint64_t{p.link_up ? 1u : 0u});
  x.family("treeduce_port_capturing", "gauge",
           "1 while the port's frames are captured to a file (SetPortCapture).");
  for (const PortStats& p : s.ports)
    x.sample({{"port", p.name}}, std::uint64_t{p.capture.empty() ? 0u : 1u});

  x.family("treeduce_tree_drops_total", "counter",
           "Frames the switch core dropped for one tree, by reason (as "
           "treeduce_switch_drops_total).");
  for (const TreeStats& t : s.trees) {
    const std::string tree = std::to_string(t.tree_id);
    for (std::size_t i = kFirstDrop; i < dp::kNumDropReasons; ++i) {
      x.sample({{"tree", tree}, {"job", t.job}, {"reason", dp::name(drop_at(i))}},
               t.counters.drops[i]);
    }
  }
  x.family("treeduce_tree_events_total", "counter",
           "Events of the switch core for one tree (as treeduce_switch_events_total).");
  for (const TreeStats& t : s.trees) {
    const std::string tree = std::to_string(t.tree_id);
    for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
      x.sample({{"tree", tree}, {"job", t.job}, {"event", dp::name(event_at(i))}},
               t.counters.events[i]);
    }
  }

  for (const LcoreField& f : kLcoreFields) {
    x.family(f.metric, "counter", f.help);
    for (const LcoreStats& l : s.lcores) x.sample({{"lcore", std::to_string(l.lcore)}}, l.*f.value);
  }
  return x.take();
}

namespace {

/// "1.3 MB": decimal units, one decimal, for a log line read by people.
std::string human_bytes(std::uint64_t b) {
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  if (b < 1000) return std::to_string(b) + " B";
  double v = static_cast<double>(b);
  std::size_t u = 0;
  // 999.95 rather than 1000: "%.1f" would show 999,960 B as "1000.0 kB".
  while (v >= 999.95 && u + 1 < std::size(kUnits)) {
    v /= 1000;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

/// One line of render_summary: "head: item, item"; written only when it got an item.
class SummaryLine {
 public:
  explicit SummaryLine(std::string head) : head_(std::move(head)) {}
  void add(std::string_view item) {
    body_ += body_.empty() ? ": " : ", ";
    body_ += item;
  }
  void add(std::string_view what, std::uint64_t v) {
    if (v == 0) return;
    std::string item(what);
    item += ' ';
    append_number(item, v);
    add(item);
  }
  void write_to(std::string& out) const {
    if (body_.empty()) return;
    out += head_;
    out += body_;
    out += '\n';
  }

 private:
  std::string head_, body_;
};

void summarize_core(const dp::Counters& c, SummaryLine& line) {
  for (std::size_t i = 0; i < dp::kNumEvents; ++i) line.add(dp::name(event_at(i)), c.events[i]);
  for (std::size_t i = kFirstDrop; i < dp::kNumDropReasons; ++i) {
    line.add("drop " + std::string(dp::name(drop_at(i))), c.drops[i]);
  }
}

// Switch-wide counters get a line each ("drop bad_key: 10"), so that a grep finds them.
template <typename Enum, std::size_t N>
void summarize_each(std::string_view kind, const std::array<std::uint64_t, N>& values,
                    std::size_t first, std::string& out) {
  for (std::size_t i = first; i < N; ++i) {
    if (values[i] == 0) continue;
    out += kind;
    out += ' ';
    out += name(static_cast<Enum>(i));
    out += ": ";
    append_number(out, values[i]);
    out += '\n';
  }
}

}  // namespace

std::string render_summary(const Snapshot& s) {
  std::string out;
  for (const PortStats& p : s.ports) {
    SummaryLine line("port " + p.name);
    if (p.rx_packets != 0 || p.rx_bytes != 0) {
      line.add("rx " + std::to_string(p.rx_packets) + " packets " + human_bytes(p.rx_bytes));
    }
    if (p.tx_packets != 0 || p.tx_bytes != 0) {
      line.add("tx " + std::to_string(p.tx_packets) + " packets " + human_bytes(p.tx_bytes));
    }
    for (const PortField& f : kPortFields) {
      if (!f.summary.empty()) line.add(f.summary, p.*f.value);
    }
    if (p.fault != PortFault{}) {
      char f[160];
      std::snprintf(f, sizeof f, "faults:%s rx_loss=%g delay_us=%u rate_mbps=%u",
                    p.fault.down ? " down" : "", p.fault.rx_loss, p.fault.delay_us,
                    p.fault.rate_mbps);
      line.add(f);
    }
    if (!p.capture.empty()) line.add("capture " + p.capture);
    line.write_to(out);
  }
  summarize_each<dp::Event>("event", s.core.events, 0, out);
  summarize_each<dp::DropReason>("drop", s.core.drops, kFirstDrop, out);
  summarize_each<SwitchdCounter>("daemon", s.switchd, 0, out);
  for (const TreeStats& t : s.trees) {
    SummaryLine line("tree " + std::to_string(t.tree_id) +
                     (t.job.empty() ? "" : " (" + t.job + ')'));
    summarize_core(t.counters, line);
    line.write_to(out);
  }
  for (const LcoreStats& l : s.lcores) {
    SummaryLine line("lcore " + std::to_string(l.lcore));
    for (const LcoreField& f : kLcoreFields) line.add(f.summary, l.*f.value);
    line.write_to(out);
  }
  return out;
}

namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace

struct MetricsServer::Impl {
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> stopped{false};  ///< listen_after_bind returned
  int port = 0;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<MetricsServer> MetricsServer::start(const std::string& listen, SnapshotFn fn,
                                                    std::string* error) {
  const auto ep = parse_metrics_listen(listen);
  if (!ep) {
    *error = "metrics: bad listen address \"" + listen +
             "\" (expected an IPv4 address or localhost, a colon and a port).";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  httplib::Server& svr = impl->server;
  svr.set_address_family(AF_INET);  // "localhost" is 127.0.0.1 then, never ::1
  // Scrapes are rare and cheap: one worker keeps the daemon's thread count low on small machines.
  svr.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // A worker waits this long on an idle keep-alive connection before it notices stop(): this
  // bounds the destructor (and the wait of a second scraper).
  svr.set_keep_alive_timeout(1);
  svr.Get("/metrics", [fn = std::move(fn)](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_prometheus(fn()), kContentType);
  });

  // httplib reports a failure as false or -1 only; errno is still the one of the failed bind()
  // or listen(), as close() and freeaddrinfo() after it leave errno alone.
  errno = 0;
  impl->port = ep->port == 0 ? svr.bind_to_any_port(ep->host)
                             : (svr.bind_to_port(ep->host, ep->port) ? ep->port : -1);
  if (impl->port < 0) {
    const int err = errno;
    *error = "metrics: cannot listen on " + listen + ": " +
             (err != 0 ? std::system_category().message(err) : std::string("bind failed")) + '.';
    return nullptr;
  }
  impl->thread = std::thread([&i = *impl] {
    i.server.listen_after_bind();
    i.stopped = true;
  });
  // stop() does nothing before the thread has marked the server running: wait for that, so the
  // destructor's stop() cannot be lost.
  while (!svr.is_running() && !impl->stopped) std::this_thread::yield();
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  impl_->thread.join();
}

int MetricsServer::port() const noexcept { return impl_->port; }

}  // namespace treeduce::switchd
