// treeduce: the manager's command line. Reads the Query service and prints tables or JSON,
// `doctor` explains whether a job would be reduced in the network, and `lab` brings emulated
// fabrics up and down on this machine (docs/lab.md).
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "grpc_tls.h"
#include "manager.grpc.pb.h"
#include "treeduce/aggregation/dtype.h"
#include "treeduce/control/topology.h"
#include "treeduce/lab/lab_cli.h"
#include "treeduce/protocol/tree.h"

namespace pb = treeduce::control::v1;
using nlohmann::json;

namespace {

using Row = std::vector<std::string>;

// Left-aligned columns two spaces apart; the header is upper case, like kubectl and docker.
void print_table(const Row& header, const std::vector<Row>& rows) {
  std::vector<std::size_t> w(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const Row& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const Row& r) {
    std::string s;
    for (std::size_t c = 0; c < r.size(); ++c) {
      s += r[c];
      if (c + 1 < r.size()) s += std::string(w[c] - r[c].size() + 2, ' ');
    }
    std::cout << s << "\n";
  };
  line(header);
  for (const Row& r : rows) line(r);
}

std::string state_name(pb::JobState s) {
  switch (s) {
    case pb::JOB_STATE_GATHERING:
      return "gathering";
    case pb::JOB_STATE_RUNNING:
      return "running";
    case pb::JOB_STATE_REFUSED:
      return "refused";
    case pb::JOB_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

std::string dtypes(std::uint32_t mask) {
  std::string s;
  for (auto d : treeduce::kAllDTypes)
    if (mask >> unsigned(d) & 1) s += (s.empty() ? "" : ",") + std::string(treeduce::name(d));
  return s.empty() ? "-" : s;
}

std::string join(const google::protobuf::RepeatedPtrField<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "-" : s;
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return std::to_string(b >> 30) + "Gi";
  if (b >= (1ull << 20)) return std::to_string(b >> 20) + "Mi";
  if (b >= (1ull << 10)) return std::to_string(b >> 10) + "Ki";
  return std::to_string(b);
}

int fail(const grpc::Status& s, const std::string& manager) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    std::cerr << "treeduce: cannot reach the manager at " << manager << ": " << s.error_message()
              << "\n";
  else
    std::cerr << "treeduce: " << s.error_message() << "\n";
  return 1;
}

// ---------------------------------------------------------------------------------------------
// `treeduce doctor`: would a job be reduced in the network, and if not, why. It reads the Query
// service only, so it never creates a job. The Query service lists switches and jobs but not
// hosts, so it cannot tell which leaf a host sits under: a switch that cannot serve the job is
// a blocker only when no leaf at all could serve it, and a warning otherwise (a tree that needs
// that switch is refused; one that avoids it is not).

struct DoctorArgs {
  std::string job;
  std::uint32_t world = 0;
  std::string dtype = "f32";
  std::string op = "sum";
  std::string host;
  std::uint32_t slots = 0;  ///< 0: libtreeduce's default for the payload
  std::uint32_t payload_bytes = 1024;
  bool deterministic = false;
  std::string leaf;  ///< the leaf's data address to ping ("" = the manager's leaves)
  bool ping = true;
};

// The manager's rule for job names (control/src/registry.cpp).
bool good_job_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  return std::all_of(s.begin(), s.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' ||
           ch == ':';
  });
}

std::string ops(std::uint32_t mask) {
  std::string s;
  for (auto o : treeduce::kAllReduceOps)
    if (mask >> unsigned(o) & 1) s += (s.empty() ? "" : ",") + std::string(treeduce::name(o));
  return s.empty() ? "-" : s;
}

class Report {
 public:
  void ok(const std::string& s) { line("ok", s); }
  void note(const std::string& s) { line("note", s); }
  void warning(const std::string& s) { line("warning", s); }
  void blocked(const std::string& s) {
    line("blocked", s);
    ++blockers_;
  }
  int blockers() const { return blockers_; }

 private:
  static void line(const std::string& tag, const std::string& s) {
    std::cout << tag << std::string(9 - tag.size(), ' ') << s << "\n";
  }
  int blockers_ = 0;
};

// "i32,u32 with sum,min,max": what masks offload, as the types and operations of their defined
// pairs (a pair type lists only minloc/maxloc, so the product is read with op_defined()).
std::string pairs(std::uint32_t dmask, std::uint32_t omask) {
  std::uint32_t d_used = 0, o_used = 0, n = 0;
  for (auto d : treeduce::kAllDTypes)
    for (auto o : treeduce::kAllReduceOps)
      if ((dmask >> unsigned(d) & 1) && (omask >> unsigned(o) & 1) && treeduce::op_defined(d, o)) {
        d_used |= treeduce::bit(d);
        o_used |= treeduce::bit(o);
        ++n;
      }
  if (n == 0) return "no pair";
  return dtypes(d_used) + " with " + ops(o_used) + " (" + std::to_string(n) + " pairs)";
}

bool offloads(std::uint32_t dmask, std::uint32_t omask, treeduce::DType d, treeduce::ReduceOp op) {
  return (dmask >> unsigned(d) & 1) && (omask >> unsigned(op) & 1) && treeduce::op_defined(d, op);
}

// Why `s` cannot be part of the job's tree, or "" when it can.
std::string unusable(const pb::SwitchInfo& s, const DoctorArgs& a, treeduce::DType d,
                     treeduce::ReduceOp op, std::uint32_t payload) {
  const auto& r = s.resources();
  const std::string sw = "Switch " + s.name() + " (" + r.profile() + ")";
  if (!s.registered()) return sw + " has not registered with the manager, so it takes no trees.";
  if (!s.up()) return sw + " is down: its agent stopped heartbeating or missed an install.";
  if (s.drained())
    return sw + " is drained by an administrator" +
           (s.drain_reason().empty() ? std::string() : " (" + s.drain_reason() + ")") +
           " and takes no new trees.";
  if (!offloads(r.dtype_mask(), r.op_mask(), d, op))
    return sw + " does not reduce " + std::string(treeduce::name(d)) + " " +
           std::string(treeduce::name(op)) + "; it reduces " + pairs(r.dtype_mask(), r.op_mask()) +
           ".";
  if (a.deterministic && !r.deterministic())
    return sw + " has no deterministic mode, and the job asks for it.";
  if (s.trees_used() >= r.max_trees())
    return sw + " is out of trees: " + std::to_string(s.trees_used()) + "/" +
           std::to_string(r.max_trees()) + " in use.";
  if (s.slots_used() + a.slots > r.max_slots())
    return sw + " has " +
           std::to_string(r.max_slots() - std::min<std::uint64_t>(s.slots_used(), r.max_slots())) +
           " free slots of " + std::to_string(r.max_slots()) + "; the job's window needs " +
           std::to_string(a.slots) + ".";
  // Live and shadow copy of every slot (docs/manager.md); deterministic mode needs more.
  const std::uint64_t bytes = 2ull * a.slots * payload;
  if (r.memory_bytes() && s.bytes_used() + bytes > r.memory_bytes())
    return sw + " has " +
           human_bytes(r.memory_bytes() - std::min(s.bytes_used(), r.memory_bytes())) +
           "B of aggregation memory free; the job needs " + human_bytes(bytes) + "B.";
  return "";
}

std::string period(std::string s) {
  if (!s.empty() && s.back() != '.') s += '.';
  return s;
}

// Everything the manager's two lists tell about the job's chances.
void check_fabric(Report& rep, const DoctorArgs& a, treeduce::DType d, treeduce::ReduceOp op,
                  const pb::SwitchList& sl, const pb::JobList& jl) {
  const std::string job = a.job.empty() ? "the job" : "Job '" + a.job + "'";
  if (!a.job.empty() && !good_job_name(a.job))
    rep.blocked("The manager refuses the name '" + a.job +
                "': a job name is 1 to 128 letters, digits or . _ - : characters.");
  for (const auto& j : jl.jobs()) {
    if (a.job.empty() || j.job() != a.job) continue;
    const std::string ranks = std::to_string(j.joined()) + "/" + std::to_string(j.world_size());
    if (j.switches_size() > 0) {
      // The job's tree: what it offloads is the intersection of its switches' models.
      const bool in = offloads(j.dtype_mask(), j.op_mask(), d, op);
      rep.note(job + "'s tree (" + join(j.switches()) + ") offloads " +
               pairs(j.dtype_mask(), j.op_mask()) + "; " + std::string(treeduce::name(d)) + " " +
               std::string(treeduce::name(op)) +
               (in ? " is one of them." : " is not: its ranks reduce it on the host path."));
    }
    if (j.world_size() != a.world)
      rep.blocked(job + " already exists on the manager with " + std::to_string(j.world_size()) +
                  " ranks, not " + std::to_string(a.world) + "; its ranks would be refused.");
    else if (j.state() == pb::JOB_STATE_GATHERING)
      rep.note(job + " is gathering (" + ranks + " ranks joined); these ranks would join it.");
    else
      rep.blocked(job + " already exists on the manager (" + state_name(j.state()) + ", " + ranks +
                  " ranks" + (j.reason().empty() ? "" : ": " + j.reason()) +
                  "); new ranks of that name are refused until all its ranks leave.");
  }

  rep.note((a.host.empty() ? std::string("Each rank's host") : "Host '" + a.host + "'") +
           " must be in the manager's topology, by name or data address; the Query service "
           "lists no hosts, so only a join can tell (an unknown host is refused).");

  // The allocator lowers the payload to the smallest in the tree.
  std::uint32_t payload = a.payload_bytes;
  for (const auto& s : sl.switches())
    if (s.registered() && s.up()) payload = std::min(payload, s.resources().max_payload_bytes());
  // What each switch model in the fabric offloads, once per profile.
  std::vector<std::string> seen;
  for (const auto& s : sl.switches()) {
    const auto& r = s.resources();
    const std::string key =
        r.profile() + "/" + std::to_string(r.dtype_mask()) + "/" + std::to_string(r.op_mask());
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    std::string names;
    for (const auto& t : sl.switches())
      if (t.resources().profile() == r.profile() && t.resources().dtype_mask() == r.dtype_mask() &&
          t.resources().op_mask() == r.op_mask())
        names += (names.empty() ? "" : ",") + t.name();
    rep.note("Profile " + r.profile() + " (" + names + ") offloads " +
             pairs(r.dtype_mask(), r.op_mask()) + ".");
  }

  int leaves = 0, usable_leaves = 0, usable = 0;
  std::vector<std::string> problems;
  for (const auto& s : sl.switches()) {
    const std::string why = unusable(s, a, d, op, payload);
    leaves += s.level() == 0;
    if (why.empty()) {
      ++usable;
      usable_leaves += s.level() == 0;
    } else {
      problems.push_back(why);
    }
  }
  const std::string what = std::to_string(a.slots) + " slots of " + std::to_string(payload) +
                           " bytes for " + std::string(treeduce::name(d)) + " " +
                           std::string(treeduce::name(op));
  if (usable_leaves == 0) {
    for (const auto& p : problems) rep.blocked(p);
    rep.blocked(leaves == 0
                    ? "The topology has no leaf switches."
                    : "No leaf switch can serve " + (a.job.empty() ? job : "job '" + a.job + "'") +
                          " (" + what + "), whichever hosts its ranks are on.");
    return;
  }
  for (const auto& p : problems) rep.warning(p + " A tree that needs this switch is refused.");
  rep.ok(std::to_string(usable) + " of " + std::to_string(sl.switches_size()) + " switches (" +
         std::to_string(usable_leaves) + " of " + std::to_string(leaves) +
         " leaves) are up and have room for " + what + ".");
}

// ---- Can this host reach its leaf? A treeduce switch answers ICMP echo for its data address
// (dataplane/include/treeduce/dataplane/neighbor.h), so an echo reply means that the route, the
// neighbour (ARP) and the switch's port on this host's link all work: what the network path
// needs before its first packet. The protocol has no probe message of its own (docs/protocol.md).

enum class Echo { answered, silent, no_route };

struct Target {
  std::string label;  // "10.0.1.1 (leaf0)"
  in_addr ip{};
  Echo echo = Echo::silent;
  std::string error;  // why a send failed
};

std::uint16_t icmp_checksum(const std::uint8_t* p, std::size_t n) {
  std::uint32_t sum = 0;
  for (std::size_t i = 0; i + 1 < n; i += 2) sum += std::uint32_t(p[i]) << 8 | p[i + 1];
  if (n & 1) sum += std::uint32_t(p[n - 1]) << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<std::uint16_t>(~sum);
}

// Three rounds of one echo request to every target not yet answered, each round waiting up to a
// second for replies. An unprivileged ICMP socket first (net.ipv4.ping_group_range), a raw one
// (root) else; "" when it ran, else why no ICMP could be sent.
std::string ping_all(std::vector<Target>& targets) {
  bool raw = false;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, IPPROTO_ICMP);
  if (fd < 0) {
    const int dgram_errno = errno;
    fd = socket(AF_INET, SOCK_RAW | SOCK_CLOEXEC, IPPROTO_ICMP);
    if (fd < 0)
      return std::string("this process may open no ICMP socket (") + std::strerror(dgram_errno) +
             "): allow ping sockets (sysctl net.ipv4.ping_group_range) or run it as root";
    raw = true;
  }
  const std::uint16_t id = static_cast<std::uint16_t>(getpid());
  for (int round = 0; round < 3; ++round) {
    std::size_t waiting = 0;
    for (std::size_t t = 0; t < targets.size(); ++t) {
      Target& x = targets[t];
      if (x.echo != Echo::silent) continue;
      std::uint8_t req[24] = {8,
                              0,
                              0,
                              0,
                              std::uint8_t(id >> 8),
                              std::uint8_t(id),
                              std::uint8_t(round),
                              std::uint8_t(t)};
      std::memcpy(req + 8, "treeduce doctor!", 16);
      const std::uint16_t c = icmp_checksum(req, sizeof req);
      req[2] = std::uint8_t(c >> 8);
      req[3] = std::uint8_t(c);
      sockaddr_in to{};
      to.sin_family = AF_INET;
      to.sin_addr = x.ip;
      if (sendto(fd, req, sizeof req, 0, reinterpret_cast<sockaddr*>(&to), sizeof to) < 0) {
        if (errno == ENETUNREACH || errno == EHOSTUNREACH || errno == EINVAL) {
          x.echo = Echo::no_route;
          x.error = std::strerror(errno);
          continue;
        }
        x.error = std::strerror(errno);
      }
      ++waiting;
    }
    if (waiting == 0) break;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (waiting > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            until - std::chrono::steady_clock::now())
                            .count();
      pollfd p{fd, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, int(left)) <= 0) break;
      std::uint8_t buf[1500];
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      const ssize_t n = recvfrom(fd, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (n <= 0) continue;  // an ICMP error queued on the socket: no echo from it
      std::size_t off = 0;
      if (raw) {
        off = std::size_t(buf[0] & 0x0F) * 4;
        if (std::size_t(n) < off + 8) continue;
        if ((std::uint16_t(buf[off + 4]) << 8 | buf[off + 5]) != id) continue;  // not ours
      }
      if (std::size_t(n) < off + 8 || buf[off] != 0) continue;  // not an echo reply
      for (Target& x : targets)
        if (x.echo == Echo::silent && x.ip.s_addr == from.sin_addr.s_addr) {
          x.echo = Echo::answered;
          --waiting;
        }
    }
  }
  close(fd);
  return {};
}

// The leaf's data address, given or from the manager's list of level-0 switches, pinged from
// this host. A leaf that cannot be reached is a warning (the library would fall back, saying
// "the network stopped answering"), not a blocker: the manager would still give a tree.
void check_reach(Report& rep, const DoctorArgs& a, const pb::SwitchList* sl) {
  std::vector<Target> targets;
  const auto add = [&](const std::string& address, const std::string& name) {
    Target t;
    const std::string ip = address.substr(0, address.rfind(':'));
    if (inet_pton(AF_INET, ip.c_str(), &t.ip) != 1) {
      rep.warning("The leaf address '" + address +
                  "' is not IPv4[:PORT], so this host's route to it was not checked.");
      return;
    }
    t.label = ip + (name.empty() ? "" : " (" + name + ")");
    targets.push_back(t);
  };
  if (!a.leaf.empty()) {
    add(a.leaf, "");
  } else if (sl != nullptr) {
    for (const auto& s : sl->switches())
      if (s.level() == 0 && !s.data_address().empty()) add(s.data_address(), s.name());
  }
  if (targets.empty()) return;
  if (std::string why = ping_all(targets); !why.empty()) {
    rep.note("Whether this host reaches its leaf switch was not checked: " + why + ".");
    return;
  }
  std::vector<const Target*> answered, silent;
  for (const Target& t : targets) (t.echo == Echo::answered ? answered : silent).push_back(&t);
  for (const Target* t : answered)
    rep.ok("The leaf switch at " + t->label + " answers ICMP echo from this host.");
  // With the manager's leaves, this host need reach only its own (the Query service does not say
  // which): the others are notes once one answered.
  const bool own_unknown = a.leaf.empty() && targets.size() > 1;
  for (const Target* t : silent) {
    const std::string ip = t->label.substr(0, t->label.find(' '));
    std::string line;
    if (t->echo == Echo::no_route) {
      line = "This host has no route to the leaf switch's data address " + t->label + " (" +
             t->error + "): add one (ip route add " + ip +
             " dev IFACE, or via a gateway) on the interface that faces the leaf";
    } else {
      line = "The leaf switch's data address " + t->label +
             " did not answer 3 ICMP echo requests from this host: check the route to it (ip "
             "route get " +
             ip + "), that " + ip +
             " is the leaf's data address (data: in its configuration), and that the switch runs "
             "with a port on this host's link (ip neigh show " +
             ip + " says whether it answered ARP)";
    }
    if (own_unknown && !answered.empty())
      rep.note(line + "; fine if this host is not under that leaf.");
    else
      rep.warning(line + "; without it the in-network path fails and the ranks fall back.");
  }
}

// The channel credentials of every call to the manager: from --tls-* or TREEDUCE_TLS_*, or none
// with --insecure (main() sets them before any call).
std::shared_ptr<grpc::ChannelCredentials> g_creds;
treeduce::tls::TlsOptions g_tls;

std::shared_ptr<grpc::Channel> manager_channel(const std::string& manager) {
  return treeduce::tls::channel(manager, g_creds, g_tls);
}

// `treeduce set-topology FILE`: sends the file's text; prints what changed by kind.
int set_topology(const std::string& file, const std::string& manager) {
  const auto text = treeduce::ctl::read_topology_text(file);
  if (!text.ok()) {
    std::cerr << "treeduce: " << text.status().message() << "\n";
    return 2;
  }
  pb::SetTopologyRequest req;
  req.set_yaml(*text);
  auto admin = pb::Admin::NewStub(manager_channel(manager));
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  pb::SetTopologyReply rep;
  if (auto s = admin->SetTopology(&c, req, &rep); !s.ok()) {
    // The loader's sentence names a line: say of which file.
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT)
      std::cerr << "treeduce: " << file << ": " << s.error_message() << "\n";
    else
      return fail(s, manager);
    return 1;
  }
  const std::pair<const char*, const google::protobuf::RepeatedPtrField<std::string>*> kinds[] = {
      {"switches added", &rep.switches_added()},     {"switches removed", &rep.switches_removed()},
      {"switches changed", &rep.switches_changed()}, {"hosts added", &rep.hosts_added()},
      {"hosts removed", &rep.hosts_removed()},       {"hosts changed", &rep.hosts_changed()},
      {"links added", &rep.links_added()},           {"links removed", &rep.links_removed()}};
  bool any = false;
  for (const auto& [what, names] : kinds) {
    if (names->empty()) continue;
    if (!any) std::cout << "topology changed:\n";
    any = true;
    std::cout << "  " << what << " (" << names->size() << "):";
    for (const std::string& n : *names) std::cout << " " << n;
    std::cout << "\n";
  }
  if (!any)
    std::cout << "topology unchanged: " << file << " describes the topology the manager has\n";
  return 0;
}

int doctor(const DoctorArgs& args, const std::string& manager) {
  // The leaf to ping and whether to: from the environment, as the library reads them
  // (TREEDUCE_STATIC_LEAF, docs/host.md); TREEDUCE_DOCTOR_PING=0 skips the ping (tests whose
  // topology's addresses are not on this machine).
  // --leaf and --no-ping win over them.
  DoctorArgs a = args;
  if (const char* env = std::getenv("TREEDUCE_STATIC_LEAF");
      a.leaf.empty() && env != nullptr && *env != '\0')
    a.leaf = env;
  if (const char* env = std::getenv("TREEDUCE_DOCTOR_PING"); env != nullptr && a.ping)
    a.ping = std::string_view(env) != "0";
  const auto d = treeduce::parse_dtype(a.dtype);
  const auto op = treeduce::parse_op(a.op);
  if (!d) {
    std::cerr << "treeduce doctor: '" << a.dtype << "' is not an element type ("
              << dtypes(treeduce::kAllDTypesMask) << ").\n";
    return 2;
  }
  if (!op) {
    std::cerr << "treeduce doctor: '" << a.op << "' is not an operation ("
              << ops(treeduce::kAllOpsMask) << ").\n";
    return 2;
  }
  if (!treeduce::op_defined(*d, *op)) {
    std::cerr << "treeduce doctor: " << treeduce::name(*d) << " " << treeduce::name(*op)
              << " is not a reduction: " << treeduce::op_refusal(*d, *op) << ".\n";
    return 2;
  }
  auto pow2 = [](std::uint32_t v) { return v && !(v & (v - 1)); };
  if (a.slots == 0) a.slots = treeduce::proto::default_window(a.payload_bytes);
  if (!pow2(a.slots) || a.slots > 4096 || !pow2(a.payload_bytes) || a.payload_bytes < 256 ||
      a.payload_bytes > 8192) {
    std::cerr << "treeduce doctor: the window must be a power of two up to 4096 slots and the "
                 "payload a power of two from 256 to 8192 bytes.\n";
    return 2;
  }
  Report rep;
  bool reached = false;
  auto stub = pb::Query::NewStub(manager_channel(manager));
  pb::SwitchList sl;
  pb::JobList jl;
  grpc::ClientContext c1, c2;
  c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (auto st = stub->ListSwitches(&c1, pb::ListRequest(), &sl); !st.ok()) {
    rep.blocked("The manager at " + manager + " cannot be reached (" + st.error_message() +
                "), so every rank falls back to host-side reduction.");
  } else if (st = stub->ListJobs(&c2, pb::ListRequest(), &jl);
             !st.ok() && st.error_code() != grpc::StatusCode::PERMISSION_DENIED) {
    rep.blocked("The manager at " + manager +
                " did not list its jobs: " + period(st.error_message()));
  } else {
    // A job's certificate may not list every job (the admin's may): the name is not checked.
    if (!st.ok())
      rep.note(
          "This certificate may not list the manager's jobs (the admin identity may), so "
          "whether the job's name is free is not checked.");
    rep.ok("The manager at " + manager + " answers: " + std::to_string(sl.switches_size()) +
           " switches, " + std::to_string(jl.jobs_size()) + " jobs.");
    check_fabric(rep, a, *d, *op, sl, jl);
    if (a.ping) check_reach(rep, a, &sl);
    reached = true;
  }
  if (!reached && a.ping) check_reach(rep, a, nullptr);

  const std::string subject = (a.job.empty() ? std::string("The job") : "Job '" + a.job + "'") +
                              " (" + std::to_string(a.world) + " ranks, " +
                              std::string(treeduce::name(*d)) + " " +
                              std::string(treeduce::name(*op)) + ")";
  if (rep.blockers() == 0) {
    std::cout << subject << " would be reduced in the network.\n";
    return 0;
  }
  std::cout << subject
            << " would not be reduced in the network; its ranks would fall back to host-side "
               "reduction for the reasons marked 'blocked' above.\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"treeduce: jobs, trees, switches and resources of a treeduce Aggregation Manager"};
  std::string manager = "127.0.0.1:9300";
  if (const char* env = std::getenv("TREEDUCE_MANAGER")) manager = env;
  bool as_json = false;
  app.add_option("-m,--manager", manager, "manager address (or $TREEDUCE_MANAGER)")
      ->capture_default_str();
  app.add_flag("--json", as_json, "print JSON instead of a table");
  std::string tls_env_error;
  treeduce::tls::TlsOptions tls = treeduce::tls::from_environment(&tls_env_error);
  app.add_option("--tls-ca", tls.ca, "CA certificate, PEM (or $TREEDUCE_TLS_CA)");
  app.add_option("--tls-cert", tls.cert, "this client's certificate, PEM (or $TREEDUCE_TLS_CERT)");
  app.add_option("--tls-key", tls.key, "its private key, PEM (or $TREEDUCE_TLS_KEY)");
  app.add_option("--tls-server-name", tls.server_name,
                 "the name the manager's certificate carries when the address given is not it "
                 "(or $TREEDUCE_TLS_SERVER_NAME)");
  app.add_flag("--insecure", tls.insecure,
               "talk to a manager without TLS (or $TREEDUCE_INSECURE=1; labs and tests)");
  // Checked only when a command talks to the manager (`treeduce lab` makes its own).
  const auto connect = [&]() -> bool {
    if (!tls_env_error.empty()) {
      std::cerr << "treeduce: " << tls_env_error << "\n";
      return false;
    }
    const std::string bad = treeduce::tls::check(
        tls,
        "--tls-ca, --tls-cert and --tls-key (or TREEDUCE_TLS_CA, TREEDUCE_TLS_CERT and "
        "TREEDUCE_TLS_KEY)",
        "--insecure (or TREEDUCE_INSECURE=1)");
    std::string error;
    if (bad.empty()) g_creds = treeduce::tls::channel_credentials(tls, &error);
    g_tls = tls;
    if (!bad.empty() || !g_creds) {
      std::cerr << "treeduce: " << (bad.empty() ? error : bad) << "\n";
      return false;
    }
    return true;
  };
  app.require_subcommand(1);
  auto* jobs_cmd = app.add_subcommand("jobs", "jobs and their state");
  auto* trees_cmd = app.add_subcommand("trees", "installed aggregation trees");
  auto* sw_cmd = app.add_subcommand("switches", "switches, their state and agents");
  auto* res_cmd = app.add_subcommand("resources", "per-switch resources: used / limit");
  auto* fail_cmd = app.add_subcommand(
      "fail-switch", "declare a switch failed: its jobs fall back (the admin identity only)");
  std::string fail_name, fail_reason;
  fail_cmd->add_option("switch", fail_name, "the switch's name in the topology")->required();
  fail_cmd->add_option("--reason", fail_reason, "why, for the logs and the jobs' state");
  auto* drain_cmd = app.add_subcommand(
      "drain-switch",
      "drain a switch before maintenance: it takes no new trees, its jobs run on until they "
      "leave (the admin identity only)");
  std::string drain_name, drain_reason;
  drain_cmd->add_option("switch", drain_name, "the switch's name in the topology")->required();
  drain_cmd->add_option("--reason", drain_reason,
                        "why, for the logs, `treeduce switches` and the jobs it refuses");
  auto* undrain_cmd = app.add_subcommand(
      "undrain-switch", "make a drained switch take new trees again (the admin identity only)");
  undrain_cmd->add_option("switch", drain_name, "the switch's name in the topology")->required();
  auto* topo_cmd = app.add_subcommand(
      "set-topology",
      "replace the manager's topology at run time with a YAML file; refused, with nothing "
      "changed, when it would cut a live job's tree (the admin identity only)");
  std::string topo_file;
  topo_cmd->add_option("file", topo_file, "the new topology (docs/manager.md)")->required();
  auto* doc_cmd = app.add_subcommand(
      "doctor", "says whether a job would be reduced in the network, and why not (exit 0: yes)");
  // `treeduce lab ...` (docs/lab.md): the lab's own code, lab/src/lab_cli.cpp.
  auto lab_cmds = treeduce::lab::add_lab_commands(app);
  DoctorArgs da;
  if (const char* env = std::getenv("TREEDUCE_JOB")) da.job = env;
  if (const char* env = std::getenv("TREEDUCE_HOST")) da.host = env;
  std::string world_env;
  if (const char* env = std::getenv("TREEDUCE_WORLD_SIZE")) world_env = env;
  doc_cmd->add_option("--job", da.job, "job name (or $TREEDUCE_JOB)");
  auto* world_opt = doc_cmd->add_option("--world", da.world, "ranks (or $TREEDUCE_WORLD_SIZE)")
                        ->check(CLI::Range(1, 65535));
  doc_cmd->add_option("--dtype", da.dtype, "element type")->capture_default_str();
  doc_cmd
      ->add_option("--op", da.op,
                   "operation: sum, prod, min, max, band, bor, bxor, land, lor, "
                   "lxor, minloc, maxloc")
      ->capture_default_str();
  doc_cmd->add_option("--host", da.host, "a rank's host (or $TREEDUCE_HOST)");
  doc_cmd
      ->add_option("--slots", da.slots,
                   "window asked of the manager (0: libtreeduce's default for the payload, 64 "
                   "slots at 1024 bytes)")
      ->capture_default_str();
  doc_cmd->add_option("--payload", da.payload_bytes, "payload bytes per packet")
      ->capture_default_str();
  doc_cmd->add_flag("--deterministic", da.deterministic, "ask for deterministic mode");
  doc_cmd->add_option("--leaf", da.leaf,
                      "the leaf switch's data address to ping, A.B.C.D:PORT (or "
                      "$TREEDUCE_STATIC_LEAF; default: every leaf the manager lists)");
  bool no_ping = false;
  doc_cmd->add_flag("--no-ping", no_ping,
                    "do not ping the leaves' data addresses (or $TREEDUCE_DOCTOR_PING=0)");
  // Usage errors exit 2, so that scripts can tell them from doctor's "not offloaded" (1).
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (lab_cmds->parsed()) return lab_cmds->run();
  if (doc_cmd->parsed()) {
    if (world_opt->count() == 0) {
      if (world_env.empty()) {
        std::cerr << "treeduce doctor: give the job's number of ranks with --world or "
                     "TREEDUCE_WORLD_SIZE.\n";
        return 2;
      }
      unsigned long w = 0;
      const char* end = world_env.data() + world_env.size();
      auto [p, ec] = std::from_chars(world_env.data(), end, w);
      if (ec != std::errc() || p != end || w == 0 || w > 65535) {
        std::cerr << "treeduce doctor: TREEDUCE_WORLD_SIZE is '" << world_env
                  << "', not a number of ranks from 1 to 65535.\n";
        return 2;
      }
      da.world = std::uint32_t(w);
    }
    if (no_ping) da.ping = false;
    if (!connect()) return 2;
    return doctor(da, manager);
  }

  if (!connect()) return 2;
  if (fail_cmd->parsed()) {
    auto admin = pb::Admin::NewStub(manager_channel(manager));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::FailSwitchRequest req;
    req.set_name(fail_name);
    req.set_reason(fail_reason);
    pb::AdminReply rep;
    if (auto s = admin->FailSwitch(&c, req, &rep); !s.ok()) return fail(s, manager);
    std::cout << "switch " << fail_name << " declared failed\n";
    return 0;
  }
  if (topo_cmd->parsed()) return set_topology(topo_file, manager);
  if (drain_cmd->parsed() || undrain_cmd->parsed()) {
    auto admin = pb::Admin::NewStub(manager_channel(manager));
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::DrainSwitchRequest req;
    req.set_name(drain_name);
    req.set_drain(drain_cmd->parsed());
    req.set_reason(drain_reason);
    pb::AdminReply rep;
    if (auto s = admin->DrainSwitch(&c, req, &rep); !s.ok()) return fail(s, manager);
    std::cout << "switch " << drain_name
              << (drain_cmd->parsed() ? " drained: it takes no new trees; its jobs run on until "
                                        "they leave (treeduce resources shows its trees)\n"
                                      : " undrained: it takes new trees again\n");
    return 0;
  }
  auto stub = pb::Query::NewStub(manager_channel(manager));
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return c;
  };

  if (jobs_cmd->parsed() || trees_cmd->parsed()) {
    pb::JobList jl;
    auto c = ctx();
    if (auto s = stub->ListJobs(c.get(), pb::ListRequest(), &jl); !s.ok()) return fail(s, manager);
    json out = json::array();
    std::vector<Row> rows;
    for (const auto& j : jl.jobs()) {
      const bool has_tree = j.switches_size() > 0;
      if (trees_cmd->parsed() && !has_tree) continue;
      if (jobs_cmd->parsed()) {
        out.push_back({{"job", j.job()},
                       {"state", state_name(j.state())},
                       {"joined", j.joined()},
                       {"world_size", j.world_size()},
                       {"tree_id", has_tree ? json(j.tree_id()) : json(nullptr)},
                       {"reason", j.reason()}});
        rows.push_back({j.job(), state_name(j.state()),
                        std::to_string(j.joined()) + "/" + std::to_string(j.world_size()),
                        has_tree ? std::to_string(j.tree_id()) : "-",
                        j.reason().empty() ? "-" : j.reason()});
      } else {
        std::vector<std::string> sws(j.switches().begin(), j.switches().end());
        out.push_back({{"tree_id", j.tree_id()},
                       {"job", j.job()},
                       {"depth", j.depth()},
                       {"slots", j.slots()},
                       {"payload_bytes", j.payload_bytes()},
                       {"offloads", pairs(j.dtype_mask(), j.op_mask())},
                       {"switches", sws}});
        rows.push_back({std::to_string(j.tree_id()), j.job(), std::to_string(j.depth()),
                        std::to_string(j.slots()), std::to_string(j.payload_bytes()),
                        join(j.switches())});
      }
    }
    if (as_json)
      std::cout << out.dump(2) << "\n";
    else if (jobs_cmd->parsed())
      print_table({"JOB", "STATE", "RANKS", "TREE", "REASON"}, rows);
    else
      print_table({"TREE", "JOB", "DEPTH", "SLOTS", "PAYLOAD", "SWITCHES (ROOT FIRST)"}, rows);
    return 0;
  }

  pb::SwitchList sl;
  auto c = ctx();
  if (auto s = stub->ListSwitches(c.get(), pb::ListRequest(), &sl); !s.ok())
    return fail(s, manager);
  json out = json::array();
  std::vector<Row> rows;
  for (const auto& s : sl.switches()) {
    const auto& r = s.resources();
    std::string state = !s.registered() ? "unregistered" : s.up() ? "up" : "down";
    // A drained switch that is up says only "drained"; down or unregistered, both.
    if (s.drained()) state = state == "up" ? "drained" : state + ",drained";
    if (sw_cmd->parsed()) {
      out.push_back({{"switch", s.name()},
                     {"level", s.level()},
                     {"state", state},
                     {"drained", s.drained()},
                     {"drain_reason", s.drain_reason()},
                     {"agent", s.agent_address()},
                     {"profile", r.profile()}});
      rows.push_back({s.name(), std::to_string(s.level()), state,
                      s.agent_address().empty() ? "-" : s.agent_address(), r.profile(),
                      s.drain_reason().empty() ? "-" : s.drain_reason()});
    } else {
      out.push_back({{"switch", s.name()},
                     {"profile", r.profile()},
                     {"trees_used", s.trees_used()},
                     {"max_trees", r.max_trees()},
                     {"slots_used", s.slots_used()},
                     {"max_slots", r.max_slots()},
                     {"bytes_used", s.bytes_used()},
                     {"memory_bytes", r.memory_bytes()},
                     {"max_payload_bytes", r.max_payload_bytes()},
                     {"max_children", r.max_children()},
                     {"dtypes", dtypes(r.dtype_mask())},
                     {"ops", ops(r.op_mask())},
                     {"pairs", pairs(r.dtype_mask(), r.op_mask())},
                     {"deterministic", r.deterministic()}});
      rows.push_back({s.name(), r.profile(),
                      std::to_string(s.trees_used()) + "/" + std::to_string(r.max_trees()),
                      std::to_string(s.slots_used()) + "/" + std::to_string(r.max_slots()),
                      r.memory_bytes()
                          ? human_bytes(s.bytes_used()) + "/" + human_bytes(r.memory_bytes())
                          : "-",
                      std::to_string(r.max_payload_bytes()), std::to_string(r.max_children()),
                      dtypes(r.dtype_mask()), ops(r.op_mask())});
    }
  }
  if (as_json)
    std::cout << out.dump(2) << "\n";
  else if (sw_cmd->parsed())
    print_table({"SWITCH", "LEVEL", "STATE", "AGENT", "PROFILE", "DRAIN REASON"}, rows);
  else
    print_table(
        {"SWITCH", "PROFILE", "TREES", "SLOTS", "MEMORY", "PAYLOAD", "FAN-IN", "TYPES", "OPS"},
        rows);
  (void)res_cmd;
  return 0;
}
