// treeduce-switch configuration (docs/switch-config.md): the YAML file and the command line read
// values with the same converters, and one checker validates what either produced.
#include "config.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string_view>
#include <unordered_map>

namespace treeduce::switchd {

namespace {

using Mac = std::array<std::uint8_t, 6>;

constexpr std::array kAllRoles = {dp::Role::leaf, dp::Role::inner, dp::Role::root};

std::string quote(const std::string& s) { return "\"" + s + "\""; }

ConfigResult failure(std::string error, bool help = false) {
  ConfigResult r;
  r.error = std::move(error);
  r.help = help;
  return r;
}

ConfigResult success(SwitchConfig c) {
  ConfigResult r;
  r.config = std::move(c);
  return r;
}

std::string format_endpoint(const dp::Endpoint& e) {
  return format_ipv4(e.ip) + ":" + std::to_string(e.port);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (std::size_t end; (end = s.find(sep, start)) != std::string::npos; start = end + 1)
    out.push_back(s.substr(start, end - start));
  out.push_back(s.substr(start));
  return out;
}

// Converters: one text form per value type, shared by the file and the command line. Each stores
// the value of `s` in `out`, or returns why it cannot as one sentence starting with `what`.

std::string convert(const std::string& s, std::string& out, const std::string&) {
  out = s;
  return {};
}

// Decimal, or hexadecimal after "0x" (tree keys read better so).
template <std::unsigned_integral T>
std::string convert(const std::string& s, T& out, const std::string& what) {
  const bool hex = s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X');
  const char* end = s.data() + s.size();
  std::uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data() + (hex ? 2 : 0), end, v, hex ? 16 : 10);
  if (ec == std::errc::invalid_argument || p != end)
    return what + ": " + quote(s) + " is not a number.";
  if (ec == std::errc::result_out_of_range || v > std::numeric_limits<T>::max())
    return what + ": " + s + " is more than " + std::to_string(std::numeric_limits<T>::max()) + ".";
  out = static_cast<T>(v);
  return {};
}

// A fraction from 0 to 1 (rx_loss).
std::string convert(const std::string& s, double& out, const std::string& what) {
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc{} || p != s.data() + s.size() || !(v >= 0 && v <= 1))
    return what + ": " + quote(s) + " is not a fraction from 0 to 1.";
  out = v;
  return {};
}

std::string convert(const std::string& s, bool& out, const std::string& what) {
  if (s != "true" && s != "false") return what + ": " + quote(s) + " is not true or false.";
  out = s == "true";
  return {};
}

std::string convert_ipv4(const std::string& s, std::uint32_t& out, const std::string& what) {
  const auto ip = parse_ipv4(s);
  if (!ip) return what + ": " + quote(s) + " is not an IPv4 address (A.B.C.D).";
  out = *ip;
  return {};
}

// "A.B.C.D[:PORT]"; the port defaults to the treeduce port.
std::string convert(const std::string& s, dp::Endpoint& out, const std::string& what) {
  const std::size_t colon = s.find(':');
  const auto ip = parse_ipv4(s.substr(0, colon));
  std::uint16_t port = dp::kDefaultUdpPort;
  if (!ip || (colon != std::string::npos && !convert(s.substr(colon + 1), port, what).empty()))
    return what + ": " + quote(s) + " is not an IPv4 address and UDP port (A.B.C.D:PORT).";
  out.ip = *ip;
  out.port = port;
  return {};
}

// A port's "A.B.C.D[/PREFIX]"; the prefix keeps its default when not given.
std::string convert_cidr(const std::string& s, PortConfig& out, const std::string& what) {
  const std::size_t slash = s.find('/');
  const auto ip = parse_ipv4(s.substr(0, slash));
  std::uint8_t prefix = out.prefix;
  if (!ip || (slash != std::string::npos && !convert(s.substr(slash + 1), prefix, what).empty()))
    return what + ": " + quote(s) + " is not an IPv4 address with a prefix length (A.B.C.D/P).";
  out.ip = *ip;
  out.prefix = prefix;
  return {};
}

std::string convert(const std::string& s, Mac& out, const std::string& what) {
  const auto mac = parse_mac(s);
  if (!mac) return what + ": " + quote(s) + " is not a MAC address (aa:bb:cc:dd:ee:ff).";
  out = *mac;
  return {};
}

std::string convert(const std::string& s, std::optional<Mac>& out, const std::string& what) {
  Mac mac;
  std::string e = convert(s, mac, what);
  if (e.empty()) out = mac;
  return e;
}

// An enum by the name(E) of one of `all`.
template <class E, std::size_t N>
std::string convert_named(const std::string& s, E& out, const std::string& what,
                          const std::array<E, N>& all) {
  std::string known;
  for (E e : all) {
    if (name(e) == s) {
      out = e;
      return {};
    }
    known += (known.empty() ? "" : ", ") + std::string(name(e));
  }
  return what + ": " + quote(s) + " is not one of " + known + ".";
}
std::string convert(const std::string& s, DType& out, const std::string& what) {
  return convert_named(s, out, what, kAllDTypes);
}
std::string convert(const std::string& s, ReduceOp& out, const std::string& what) {
  return convert_named(s, out, what, kAllReduceOps);
}
std::string convert(const std::string& s, dp::Role& out, const std::string& what) {
  return convert_named(s, out, what, kAllRoles);
}

// The settings that are one value: their YAML key (the flag is "--" and the key with dashes),
// the flag's help and the field, for the file reader and the command-line reader alike.
template <class C, class F>
void each_setting(C& c, F&& f) {
  f("name", "the switch's name in the manager's topology", c.name);
  f("data", "the switch's treeduce address, A.B.C.D[:PORT]", c.data);
  f("idle_sleep_us", "0: busy polling; else the longest sleep of an idle lcore", c.idle_sleep_us);
  f("idle_yield_us", "with idle_sleep_us: how long an idle lcore yields before it sleeps",
    c.idle_yield_us);
  f("burst", "RX/TX burst size, 1..64", c.burst);
  f("tx_drain_us", "flush TX buffers at least this often", c.tx_drain_us);
  f("nack_rate", "NACKs per second and lcore at most; 0: no limit", c.nack_rate);
  f("mbufs", "mbufs in the packet pool", c.mbufs);
  f("rx_desc", "RX descriptors per queue", c.rx_desc);
  f("tx_desc", "TX descriptors per queue", c.tx_desc);
  f("metrics", "Prometheus endpoint ADDR:PORT; \"\" or off disables it", c.metrics_listen);
  f("manager", "Aggregation Manager HOST:PORT; \"\": static trees only", c.manager);
  f("agent_listen", "where to serve the manager, ADDR:PORT (port 0 picks one)", c.agent_listen);
  f("agent_advertise", "agent address for the manager; \"\": agent_listen's", c.agent_advertise);
  f("heartbeat_ms", "heartbeat period to the manager", c.heartbeat_ms);
  f("deterministic_allowed", "accept deterministic trees (true, false)", c.deterministic_allowed);
  f("log_level", "trace, debug, info, warn or error", c.log_level);
  f("run_ms", "stop after this long; 0: run until SIGINT or SIGTERM", c.run_ms);
  f("exit_idle_ms", "stop when idle this long after the first packet; 0: never", c.exit_idle_ms);
  f("final_stats", "at shutdown, write the final counters to this file (Prometheus text)",
    c.final_stats);
  f("seed", "seed of the ports' rx_loss fault injection", c.seed);
  f("faults", "accept SetPortFault from the agent's clients (true: labs and tests only)", c.faults);
  f("tls_ca", "CA certificate (PEM) the manager's and callers' certificates chain to", c.tls_ca);
  f("tls_cert", "the switch's certificate (PEM; its CN is the switch's name)", c.tls_cert);
  f("tls_key", "the switch's private key (PEM)", c.tls_key);
  f("tls_server_name", "with TLS, the manager certificate's name when `manager` is not it",
    c.tls_server_name);
  f("tls_manager_name", "with TLS, the manager's certificate name (CN)", c.tls_manager_name);
  f("tls_admin_name", "with TLS, the admin certificate name (CN) that may also call the agent",
    c.tls_admin_name);
  f("insecure", "no TLS and no authentication of the agent's callers (labs and tests only)",
    c.insecure);
}

// Where a file set each field or list item: its line, keyed by the field's address in the config
// being checked, so that the checker names the line of the value it refuses. Fields a file did not
// set fall back to their item's line, and that to the file's first line (key nullptr). An item
// and its first field share an address: the item's line, recorded first, stands for both. Empty
// for a config that is not straight from a file.
using Lines = std::unordered_map<const void*, int>;

std::string must(const std::string& what, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  return what + " must be from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " +
         std::to_string(v) + ".";
}

bool unicast(const Mac& m) { return (m[0] & 1) == 0 && m != Mac{}; }

// "HOST:PORT" with a port from `min_port`. HOST may be a name, which gRPC resolves; with
// `ipv4_only` (the metrics endpoint's HTTP server binds no names) it is what the server takes.
bool host_port(const std::string& s, std::uint16_t min_port, bool ipv4_only) {
  if (ipv4_only) {
    const auto m = parse_metrics_listen(s);
    return m && m->port >= min_port;
  }
  const std::size_t colon = s.rfind(':');
  std::uint16_t port = 0;
  return colon != std::string::npos && colon > 0 &&
         convert(s.substr(colon + 1), port, "").empty() && port >= min_port;
}

// `security`: whether the TLS settings must be complete (off for a file the command line may
// complete, parse_args()).
std::string check(const SwitchConfig& c, const Lines& lines, bool security = true) {
  // `msg` after the line of the first of `at` (most specific first) that the file set.
  const auto err = [&](std::initializer_list<const void*> at, const std::string& msg) {
    const auto* p =
        std::find_if(at.begin(), at.end(), [&](const void* f) { return lines.count(f); });
    const auto it = lines.find(p == at.end() ? nullptr : *p);
    return it == lines.end() ? msg : "line " + std::to_string(it->second) + ": " + msg;
  };

  if (c.name.empty()) return err({&c.name}, "name must not be empty.");
  if (c.data.ip == 0)
    return err({&c.data}, "the switch has no data address (data: A.B.C.D:PORT, or --data).");
  if (c.data.port == 0) return err({&c.data}, must("data's UDP port", 0, 1, 65535));

  if (c.ports.empty()) return err({&c.ports}, "the switch has no ports (ports:, or --port).");
  std::set<std::string> port_names;
  for (const PortConfig& p : c.ports) {
    if (p.name.empty()) return err({&p}, "a port name must not be empty.");
    if (!port_names.insert(p.name).second)
      return err({&p}, "port '" + p.name + "' is listed twice.");
    const std::string w = "port '" + p.name + "': ";
    if (p.prefix > 32) return err({&p.prefix, &p}, w + must("the prefix length", p.prefix, 0, 32));
    if (p.mac && !unicast(*p.mac))
      return err({&p.mac, &p}, w + "mac " + format_mac(p.mac->data()) + " is not unicast.");
    if (p.mtu != 0 && (p.mtu < 68 || p.mtu > 65535))
      return err({&p.mtu, &p}, w + "mtu must be 0 (keep) or from 68 to 65535, got " +
                                   std::to_string(p.mtu) + ".");
    if (p.delay_us > kMaxFaultDelayUs)
      return err({&p.delay_us, &p}, w + must("delay_us", p.delay_us, 0, kMaxFaultDelayUs));
    if (p.rate_mbps > kMaxFaultRateMbps)
      return err({&p.rate_mbps, &p}, w + must("rate_mbps", p.rate_mbps, 0, kMaxFaultRateMbps));
  }

  std::set<std::uint32_t> neighbor_ips;
  for (const StaticNeighbor& n : c.neighbors) {
    const std::string w = "neighbor " + format_ipv4(n.ip);
    if (n.ip == 0) return err({&n}, "a neighbor's ip must not be 0.0.0.0.");
    if (!neighbor_ips.insert(n.ip).second) return err({&n}, w + " is listed twice.");
    if (!unicast(n.mac))
      return err({&n.mac, &n}, w + ": mac " + format_mac(n.mac.data()) + " is not unicast.");
    if (!port_names.count(n.port))
      return err({&n.port, &n},
                 w + " is on port '" + n.port + "', which the switch does not have.");
  }

  std::set<unsigned> lcores;
  for (const unsigned& l : c.lcores)
    if (!lcores.insert(l).second)
      return err({&l}, "lcore " + std::to_string(l) + " is listed twice.");

  struct Range {
    const std::uint32_t* v;
    const char* what;
    std::uint32_t lo, hi;
  };
  const Range ranges[] = {{&c.idle_sleep_us, "idle_sleep_us", 0, 1'000'000},
                          {&c.idle_yield_us, "idle_yield_us", 0, 1'000'000},
                          {&c.burst, "burst", 1, 64},
                          {&c.tx_drain_us, "tx_drain_us", 1, 1'000'000},
                          {&c.nack_rate, "nack_rate", 0, 100'000'000},
                          {&c.mbufs, "mbufs", 1024, 1u << 24},
                          {&c.rx_desc, "rx_desc", 32, 16384},
                          {&c.tx_desc, "tx_desc", 32, 16384},
                          {&c.heartbeat_ms, "heartbeat_ms", 10, 60'000}};
  for (const Range& r : ranges)
    if (*r.v < r.lo || *r.v > r.hi) return err({r.v}, must(r.what, *r.v, r.lo, r.hi));

  struct HostPort {
    const std::string* v;
    const char* what;
    bool may_be_empty;
    std::uint16_t min_port;
    bool ipv4_only;
  };
  const HostPort addresses[] = {{&c.metrics_listen, "metrics", true, 0, true},
                                {&c.manager, "manager", true, 1, false},
                                {&c.agent_listen, "agent_listen", false, 0, false},
                                {&c.agent_advertise, "agent_advertise", true, 1, false}};
  for (const HostPort& a : addresses)
    if (!(a.may_be_empty && a.v->empty()) && !host_port(*a.v, a.min_port, a.ipv4_only))
      return err({a.v}, std::string(a.what) + " must be " + (a.may_be_empty ? "\"\" or " : "") +
                            (a.ipv4_only ? "A.B.C.D:PORT or localhost:PORT" : "HOST:PORT") +
                            " with a port from " + std::to_string(a.min_port) + " to 65535, got " +
                            quote(*a.v) + ".");
  // A wildcard listen address is what the agent would advertise otherwise: the manager would
  // dial 0.0.0.0, i.e. its own machine. Checked on the whole configuration only (`security`):
  // the command line may give agent_advertise to a file that lacks it.
  const std::string listen_host = c.agent_listen.substr(0, c.agent_listen.rfind(':'));
  if (security && !c.manager.empty() && c.agent_advertise.empty() &&
      (listen_host == "0.0.0.0" || listen_host == "[::]" || listen_host == "::"))
    return err({&c.agent_listen, &c.manager},
               "agent_listen " + c.agent_listen +
                   " is every address of this machine, which the manager cannot dial: give "
                   "agent_advertise, an address and port it can reach.");
  if (c.log_level != "trace" && c.log_level != "debug" && c.log_level != "info" &&
      c.log_level != "warn" && c.log_level != "error")
    return err({&c.log_level}, "log_level must be trace, debug, info, warn or error, got " +
                                   quote(c.log_level) + ".");

  // A switch that talks to a manager, or serves its agent beyond this machine, needs
  // certificates or an explicit insecure; a static switch's agent on loopback does not. TLS
  // settings given are checked whatever the switch does: one or two of the three files would
  // otherwise be ignored silently, and the agent serve without TLS.
  const bool loopback_agent = c.agent_listen.rfind("127.", 0) == 0 ||
                              c.agent_listen.rfind("localhost:", 0) == 0 ||
                              c.agent_listen.rfind("[::1]:", 0) == 0;
  const bool tls_given =
      !c.tls_ca.empty() || !c.tls_cert.empty() || !c.tls_key.empty() || c.insecure;
  if (security && (!c.manager.empty() || !loopback_agent || tls_given)) {
    tls::TlsOptions t{c.tls_ca, c.tls_cert, c.tls_key, c.insecure};
    if (const std::string bad = tls::check(t, "tls_ca, tls_cert and tls_key", "insecure: true");
        !bad.empty())
      return err({&c.tls_ca, &c.tls_cert, &c.tls_key, &c.insecure, &c.manager}, bad);
  }
  if (security && !c.tls_server_name.empty() && (c.tls_ca.empty() || c.manager.empty()))
    return err({&c.tls_server_name},
               "tls_server_name is the name of the manager's certificate: it needs a manager "
               "and tls_ca, tls_cert and tls_key.");

  std::set<std::uint16_t> tree_ids;
  for (const StaticTree& st : c.trees) {
    const dp::TreeConfig& t = st.tree;
    const std::string w = "tree " + std::to_string(t.tree_id) + ": ";
    if (!tree_ids.insert(t.tree_id).second)
      return err({&st}, "tree " + std::to_string(t.tree_id) + " is defined twice.");
    // The protocol's rules (proto::validate_tree), tied to the line of the field they refuse.
    if (const auto issue = proto::validate_tree(t)) {
      const void* field = &st;
      switch (issue->field) {
        case proto::TreeField::children:
          field = &t.children;
          break;
        case proto::TreeField::child_address:
          field = &t.children[issue->child];
          break;
        case proto::TreeField::child_hosts:
          field = &t.children[issue->child].hosts;
          break;
        case proto::TreeField::slots:
          field = &t.slots;
          break;
        case proto::TreeField::payload_bytes:
          field = &t.payload_bytes;
          break;
        case proto::TreeField::dtype_mask:
          field = &t.dtype_mask;
          break;
        case proto::TreeField::op_mask:
          field = &t.op_mask;
          break;
        case proto::TreeField::role:
          field = &t.role;
          break;
        case proto::TreeField::parent:
          field = &t.parent;
          break;
        case proto::TreeField::index_at_parent:
          field = &t.index_at_parent;
          break;
      }
      return err({field, &st}, w + issue->sentence);
    }
    if (t.deterministic && !c.deterministic_allowed)
      return err({&t.deterministic, &st},
                 w + "deterministic is true, but deterministic_allowed is false.");
  }
  return {};
}

// Both readers end here. "off" is the spoken form of "no metrics endpoint".
std::string finish(SwitchConfig& c, const Lines& lines, bool security = true) {
  if (c.metrics_listen == "off") c.metrics_listen.clear();
  return check(c, lines, security);
}

// Thrown inside the YAML reader only and turned into the result's error at its end, as in
// control/src/topology_yaml.cpp: early returns would triple the length of the walk.
struct LoadError {
  std::string msg;
};

int line(const YAML::Node& n) { return std::max(n.Mark().line, 0) + 1; }

[[noreturn]] void fail(const YAML::Node& n, const std::string& msg) {
  throw LoadError{"line " + std::to_string(line(n)) + ": " + msg};
}

// A scalar's text; an empty value ("key:") reads as "".
std::string scalar(const YAML::Node& n, const std::string& what) {
  if (n.IsNull()) return {};
  if (!n.IsScalar()) fail(n, what + " must be a single value.");
  return n.Scalar();
}

// `key` of the map `m` (describing `who`), which must be there.
YAML::Node need(const YAML::Node& m, const char* key, const std::string& who) {
  if (!m.IsMap()) fail(m, who + " must be a map.");
  YAML::Node n = m[key];
  if (!n) fail(m, who + " has no '" + key + "'.");
  return n;
}

// Refuses keys of `m` not in `known`, and keys given twice (yaml-cpp keeps either silently).
void only_keys(const YAML::Node& m, const std::string& who,
               const std::vector<std::string_view>& known) {
  std::set<std::string> seen;
  for (const auto& kv : m) {
    const std::string k = scalar(kv.first, who + "'s key");
    if (std::find(known.begin(), known.end(), k) == known.end())
      fail(kv.first, who + " has an unknown key '" + k + "'.");
    if (!seen.insert(k).second) fail(kv.first, who + " has '" + k + "' twice.");
  }
}

class Loader {
 public:
  SwitchConfig c;
  Lines lines;

  void load(const YAML::Node& root) {
    if (!root.IsMap()) fail(root, "a switch config is a map of settings.");
    lines.emplace(nullptr, line(root));
    std::vector<std::string_view> known = {"ports", "neighbors", "lcores", "trees"};
    each_setting(c, [&](const char* key, const char*, auto& field) {
      known.push_back(key);
      if (const YAML::Node n = root[key]) get(n, key, field);
    });
    only_keys(root, "the config", known);
    each(root, "ports", "ports", c.ports, [&](const YAML::Node& m, PortConfig& p) { port(m, p); });
    each(root, "neighbors", "neighbors", c.neighbors,
         [&](const YAML::Node& m, StaticNeighbor& n) { neighbor(m, n); });
    each(root, "lcores", "lcores", c.lcores,
         [&](const YAML::Node& n, unsigned& l) { get(n, "lcores", l); });
    each(root, "trees", "trees", c.trees, [&](const YAML::Node& m, StaticTree& t) { tree(m, t); });
  }

 private:
  // Fails with `error` at `n`, or remembers that `n` set `field`.
  void put(const YAML::Node& n, const void* field, const std::string& error) {
    if (!error.empty()) fail(n, error);
    lines.emplace(field, line(n));
  }
  template <class T>
  void get(const YAML::Node& n, const std::string& what, T& out) {
    put(n, &out, convert(scalar(n, what), out, what));
  }
  template <class T>
  void opt(const YAML::Node& m, const char* key, const std::string& who, T& out) {
    if (const YAML::Node n = m[key]) get(n, who + ": " + key, out);
  }

  // The list under `key` of `m`, or an undefined node when absent. `field` gets the key's line: a
  // block list's own line is its first item's.
  YAML::Node list(const YAML::Node& m, const char* key, const std::string& what,
                  const void* field) {
    for (const auto& kv : m) {
      if (kv.first.Scalar() != key) continue;
      if (!kv.second.IsSequence()) fail(kv.first, what + " must be a list.");
      lines.emplace(field, line(kv.first));
      return kv.second;
    }
    return YAML::Node(YAML::NodeType::Undefined);
  }

  // Reads the list under `key` of `m` (absent: `out` stays) into `out`, one `item` call per
  // element. Reserves first: `lines` holds the elements' addresses.
  template <class T, class F>
  void each(const YAML::Node& m, const char* key, const std::string& what, std::vector<T>& out,
            F item) {
    const YAML::Node n = list(m, key, what, &out);
    if (!n) return;
    out.reserve(n.size());
    for (const auto& x : n) {
      lines.emplace(&out.emplace_back(), line(x));
      item(x, out.back());
    }
  }

  // A list of names into a mask whose bit e allows E(e).
  template <class E>
  void mask(const YAML::Node& m, const char* key, const std::string& who, std::uint32_t& out) {
    const std::string what = who + ": " + key;
    const YAML::Node n = list(m, key, what, &out);
    if (!n) return;
    out = 0;
    for (const auto& x : n) {
      E e{};
      if (std::string error = convert(scalar(x, what), e, what); !error.empty()) fail(x, error);
      out |= 1u << static_cast<unsigned>(e);
    }
  }

  void port(const YAML::Node& m, PortConfig& p) {
    get(need(m, "name", "a port"), "a port's name", p.name);
    const std::string who = "port '" + p.name + "'";
    only_keys(m, who, {"name", "ip", "mac", "mtu", "rx_loss", "delay_us", "rate_mbps"});
    if (const YAML::Node n = m["ip"]) {
      put(n, &p.prefix, convert_cidr(scalar(n, who + ": ip"), p, who + ": ip"));
      lines.emplace(&p.ip, line(n));
    }
    opt(m, "mac", who, p.mac);
    opt(m, "mtu", who, p.mtu);
    opt(m, "rx_loss", who, p.rx_loss);
    opt(m, "delay_us", who, p.delay_us);
    opt(m, "rate_mbps", who, p.rate_mbps);
  }

  void neighbor(const YAML::Node& m, StaticNeighbor& nb) {
    const YAML::Node ip = need(m, "ip", "a neighbor");
    put(ip, &nb.ip, convert_ipv4(scalar(ip, "a neighbor's ip"), nb.ip, "a neighbor's ip"));
    const std::string who = "neighbor " + format_ipv4(nb.ip);
    only_keys(m, who, {"ip", "mac", "port"});
    get(need(m, "mac", who), who + ": mac", nb.mac);
    get(need(m, "port", who), who + ": port", nb.port);
  }

  void tree(const YAML::Node& m, StaticTree& st) {
    dp::TreeConfig& t = st.tree;
    get(need(m, "tree", "a tree"), "a tree's id", t.tree_id);
    const std::string who = "tree " + std::to_string(t.tree_id);
    only_keys(m, who,
              {"tree", "job", "key", "role", "parent", "index_at_parent", "children", "slots",
               "payload_bytes", "dtypes", "ops", "deterministic"});
    get(need(m, "key", who), who + ": key", t.key);
    get(need(m, "role", who), who + ": role", t.role);
    opt(m, "job", who, st.job);
    opt(m, "parent", who, t.parent);
    opt(m, "index_at_parent", who, t.index_at_parent);
    need(m, "children", who);
    each(m, "children", who + ": children", t.children,
         [&](const YAML::Node& x, dp::ChildConfig& ch) {
           get(need(x, "addr", who + ": a child"), who + ": a child's addr", ch.addr);
           const std::string cw = who + ": child " + format_endpoint(ch.addr);
           only_keys(x, cw, {"addr", "hosts"});
           opt(x, "hosts", cw, ch.hosts);
         });
    opt(m, "slots", who, t.slots);
    opt(m, "payload_bytes", who, t.payload_bytes);
    mask<DType>(m, "dtypes", who, t.dtype_mask);
    mask<ReduceOp>(m, "ops", who, t.op_mask);
    opt(m, "deterministic", who, t.deterministic);
  }
};

// "--port NAME[,ip=A.B.C.D/P][,mac=M][,mtu=N][,rx_loss=F][,delay_us=N][,rate_mbps=N]".
std::string parse_port_flag(const std::string& s, PortConfig& p) {
  const std::vector<std::string> parts = split(s, ',');
  p.name = parts[0];
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const std::size_t eq = parts[i].find('=');
    const std::string key = parts[i].substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : parts[i].substr(eq + 1);
    const std::string what = "--port " + p.name + ": " + key;
    std::string e;
    if (key == "ip")
      e = convert_cidr(value, p, what);
    else if (key == "mac")
      e = convert(value, p.mac, what);
    else if (key == "mtu")
      e = convert(value, p.mtu, what);
    else if (key == "rx_loss")
      e = convert(value, p.rx_loss, what);
    else if (key == "delay_us")
      e = convert(value, p.delay_us, what);
    else if (key == "rate_mbps")
      e = convert(value, p.rate_mbps, what);
    else
      e = "--port: " + quote(parts[i]) + " in " + quote(s) +
          " is not ip=, mac=, mtu=, rx_loss=, delay_us= or rate_mbps=.";
    if (!e.empty()) return e;
  }
  return {};
}

// "--neighbor IP,MAC,PORT".
std::string parse_neighbor_flag(const std::string& s, StaticNeighbor& n) {
  const std::vector<std::string> parts = split(s, ',');
  if (parts.size() != 3) return "--neighbor: " + quote(s) + " is not IP,MAC,PORT.";
  n.port = parts[2];
  std::string e = convert_ipv4(parts[0], n.ip, "--neighbor");
  return e.empty() ? convert(parts[1], n.mac, "--neighbor") : e;
}

std::string flag(const char* key) {
  std::string f = std::string("--") + key;
  std::replace(f.begin(), f.end(), '_', '-');
  return f;
}

}  // namespace

namespace {

ConfigResult parse_yaml(const std::string& text, const std::string& origin, bool security) {
  Loader l;
  std::string error;
  try {
    l.load(YAML::Load(text));
    error = finish(l.c, l.lines, security);
  } catch (const LoadError& e) {
    error = e.msg;
  } catch (const YAML::Exception& e) {
    error = "line " + std::to_string(std::max(e.mark.line, 0) + 1) + ": " + e.msg + ".";
  }
  if (!error.empty()) return failure(origin + ": " + error);
  return success(std::move(l.c));
}

ConfigResult load_file(const std::string& path, bool security) {
  std::ifstream in(path);
  if (!in) return failure(path + ": cannot open the file (" + std::strerror(errno) + ").");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_yaml(ss.str(), path, security);
}

}  // namespace

ConfigResult parse_config_yaml(const std::string& text, const std::string& origin) {
  return parse_yaml(text, origin, true);
}

ConfigResult load_config_file(const std::string& path) { return load_file(path, true); }

ConfigResult parse_args(int argc, const char* const* argv) {
  CLI::App app{
      "treeduce-switch: in-network aggregation on DPDK ports. These arguments follow the EAL's "
      "\"--\"; the file format and every setting: docs/switch-config.md."};
  app.allow_extras();  // to report an unknown argument in one sentence, below
  CLI::Option* config = app.add_option("--config", "YAML config file; the flags below override it");
  // Repeatable: each occurrence takes one value.
  const auto repeatable = [&](const char* name, const char* help) {
    return app.add_option(name, CLI::callback_t{}, help)
        ->allow_extra_args(false)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  };
  CLI::Option* ports = repeatable(
      "--port",
      "NAME[,ip=A.B.C.D/P][,mac=M][,mtu=N][,rx_loss=F][,delay_us=N][,rate_mbps=N]; replaces the "
      "file's ports");
  CLI::Option* neighbors = repeatable("--neighbor", "IP,MAC,PORT: a static ARP entry; adds one");
  CLI::Option* lcores = app.add_option("--lcores", "datapath lcores, e.g. 0,1");
  std::vector<CLI::Option*> settings;
  const SwitchConfig defaults;
  each_setting(defaults, [&](const char* key, const char* help, auto&) {
    settings.push_back(app.add_option(flag(key), CLI::callback_t{}, help));
  });
  // --insecure alone means --insecure true, as for the manager.
  app.get_option("--insecure")->expected(0, 1)->default_str("true");
  for (CLI::Option* o : settings) o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  config->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  lcores->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return failure(app.help(), true);
  } catch (const CLI::ArgumentMismatch& e) {
    // CLI11 says "--name: 1 required  missing": the flag is before the colon.
    const std::string what = e.what();
    return failure(what.substr(0, what.find(':')) + " needs a value.");
  } catch (const CLI::ParseError& e) {
    const std::string what = e.what();
    return failure(what.substr(0, what.find('\n')) + ".");
  }
  if (!app.remaining().empty())
    return failure("unknown argument " + quote(app.remaining().front()) + ".");

  SwitchConfig c;
  if (config->count()) {
    // The flags may complete the file's TLS settings (--insecure, --tls-*): checked after them.
    ConfigResult file = load_file(config->results().back(), false);
    if (!file.config) return file;
    c = std::move(*file.config);
  }
  std::string error;
  std::size_t i = 0;
  each_setting(c, [&](const char* key, const char*, auto& field) {
    const CLI::Option* o = settings[i++];
    if (error.empty() && o->count()) {
      // A bare --insecure.
      const bool bare = std::string_view(key) == "insecure" &&
                        (o->results().empty() || o->results().back().empty());
      error = convert(bare ? std::string("true") : o->results().back(), field, flag(key));
    }
  });
  if (ports->count()) c.ports.clear();
  for (const std::string& s : ports->results())
    if (error.empty()) error = parse_port_flag(s, c.ports.emplace_back());
  for (const std::string& s : neighbors->results())
    if (error.empty()) error = parse_neighbor_flag(s, c.neighbors.emplace_back());
  if (lcores->count() && error.empty()) {
    c.lcores.clear();
    const std::string& s = lcores->results().back();
    if (!s.empty())
      for (const std::string& l : split(s, ','))
        if (error.empty()) error = convert(l, c.lcores.emplace_back(), "--lcores");
  }
  if (error.empty()) error = finish(c, {});
  if (!error.empty()) return failure(error);
  return success(std::move(c));
}

std::string validate(const SwitchConfig& c) { return check(c, {}); }

std::optional<std::array<std::uint8_t, 6>> parse_mac(const std::string& s) {
  if (s.size() != 17) return std::nullopt;
  Mac mac;
  for (std::size_t i = 0; i < 6; ++i) {
    const char* b = s.data() + 3 * i;
    if (i < 5 && b[2] != ':') return std::nullopt;
    auto [next, ec] = std::from_chars(b, b + 2, mac[i], 16);
    if (ec != std::errc() || next != b + 2) return std::nullopt;
  }
  return mac;
}

std::string format_ipv4(std::uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 0xFF) + "." +
         std::to_string(ip >> 8 & 0xFF) + "." + std::to_string(ip & 0xFF);
}

std::string format_mac(const std::uint8_t* mac) {
  char s[18];
  std::snprintf(s, sizeof s, "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
                mac[4], mac[5]);
  return s;
}

}  // namespace treeduce::switchd
