// options_from_environment (communicator.h): a communicator's options from the launcher, and the
// parser behind it (environment.h). The only place the host library reads the environment.
//
// Each field takes the first variable that is set and not empty, so that treeduce's own
// variables override what a launcher exports: rank from TREEDUCE_RANK, RANK (torchrun),
// OMPI_COMM_WORLD_RANK (Open MPI); world size from TREEDUCE_WORLD_SIZE, WORLD_SIZE,
// OMPI_COMM_WORLD_SIZE; the job from TREEDUCE_JOB, then TORCHELASTIC_RUN_ID (the same on every
// rank of a torchrun job and fresh for each run, except torchrun's placeholder "none"). Fields no
// variable names keep the value *out had, so a caller can set its own defaults first. A process
// with no rank, world size or job is an error rather than a job of one: N processes that each
// believed they were alone would all run and silently compute the wrong thing.
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "environment.h"
#include "errors.h"
#include "treeduce/common/tls_options.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::host {
namespace {

struct Var {
  const char* name = nullptr;  // nullptr: none of the candidates is set
  std::string value;
};

// A variable's number from `min` to `max`.
treeduce::Status number(const Var& v, std::uint64_t min, std::uint64_t max, std::uint64_t* out) {
  return parse_number(v.name, v.value, min, max, out);
}

// A power of two from `min` to `max` (a window, a payload size): anything else, a word or a
// number out of range too, gets the one sentence that says what is wanted.
treeduce::Status power_of_two(const Var& v, std::uint64_t min, std::uint64_t max,
                              std::uint64_t* out) {
  std::uint64_t x = 0;
  if (!number(v, min, max, &x).ok() || (x & (x - 1)) != 0)
    return invalid_argument(std::string(v.name) + " is " + v.value +
                            "; it must be a power of two from " + std::to_string(min) + " to " +
                            std::to_string(max) + ".");
  *out = x;
  return treeduce::Status::Ok();
}

// A dotted-quad IPv4 address (TREEDUCE_BIND, TREEDUCE_FALLBACK_ADDRESS): a host name or a typo
// there would otherwise surface only as a transport that cannot bind, i.e. a fallback.
treeduce::Status ipv4(const Var& v) {
  in_addr a{};
  if (inet_pton(AF_INET, v.value.c_str(), &a) != 1)
    return invalid_argument(std::string(v.name) + " is '" + v.value +
                            "', not an IPv4 address (10.1.0.4).");
  return treeduce::Status::Ok();
}

// An Ethernet address (TREEDUCE_LEAF_MAC, TREEDUCE_LOCAL_MAC): refused here whatever the
// transport, rather than when dpdk or verbs opens.
treeduce::Status mac(const Var& v) {
  std::uint8_t m[6];
  if (!parse_mac(v.value, m))
    return invalid_argument(std::string(v.name) + " is '" + v.value +
                            "', not a MAC address (02:00:00:00:00:01).");
  return treeduce::Status::Ok();
}

// The transport's variables (docs/host.md, "Environment"; TransportOptions).
treeduce::Status parse_transport(const std::function<Var(std::initializer_list<const char*>)>& var,
                                 TransportOptions* t) {
  if (const Var v = var({"TREEDUCE_TRANSPORT"}); v.name) {
    if (v.value == "udp") {
      t->kind = TransportKind::udp;
    } else if (v.value == "dpdk") {
      t->kind = TransportKind::dpdk;
    } else if (v.value == "verbs") {
      t->kind = TransportKind::verbs;
    } else if (v.value == "af_xdp") {
      t->kind = TransportKind::af_xdp;
    } else {
      return invalid_argument("TREEDUCE_TRANSPORT is '" + v.value +
                              "'; it must be udp, dpdk, verbs or af_xdp.");
    }
  }
  std::uint64_t x = 0;
  if (const Var v = var({"TREEDUCE_UDP_SEND_PORTS"}); v.name) {
    if (auto s = number(v, 1, 64, &x); !s.ok()) return s;
    t->udp_send_ports = std::uint32_t(x);
  }
  if (const Var v = var({"TREEDUCE_UDP_GSO"}); v.name) {
    if (auto s = number(v, 0, 1, &x); !s.ok()) return s;
    t->udp_gso = x != 0;
  }
  if (const Var v = var({"TREEDUCE_UDP_GRO"}); v.name) {
    if (auto s = number(v, 0, 1, &x); !s.ok()) return s;
    t->udp_gro = x != 0;
  }
  if (const Var v = var({"TREEDUCE_VERBS_PORT"}); v.name) {
    if (auto s = number(v, 1, 255, &x); !s.ok()) return s;
    t->verbs_port = std::uint8_t(x);
  }
  if (const Var v = var({"TREEDUCE_VERBS_DEVICE"}); v.name) t->verbs_device = v.value;
  if (const Var v = var({"TREEDUCE_XDP_INTERFACE"}); v.name) t->xdp_interface = v.value;
  if (const Var v = var({"TREEDUCE_XDP_QUEUE"}); v.name) {
    if (auto s = number(v, 0, 255, &x); !s.ok()) return s;
    t->xdp_queue = std::uint32_t(x);
  }
  if (const Var v = var({"TREEDUCE_XDP_MODE"}); v.name) {
    static constexpr std::pair<std::string_view, XdpMode> kModes[] = {
        {"auto", XdpMode::auto_select},
        {"native", XdpMode::native},
        {"skb", XdpMode::skb},
        {"zerocopy", XdpMode::zerocopy}};
    const auto* m = std::find_if(std::begin(kModes), std::end(kModes),
                                 [&v](const auto& e) { return e.first == v.value; });
    if (m == std::end(kModes)) {
      return invalid_argument("TREEDUCE_XDP_MODE is '" + v.value +
                              "'; it must be auto, native, skb or zerocopy.");
    }
    t->xdp_mode = m->second;
  }
  if (const Var v = var({"TREEDUCE_DPDK_PORT"}); v.name) t->dpdk_port = v.value;
  if (const Var v = var({"TREEDUCE_DPDK_EAL"}); v.name) t->dpdk_eal = v.value;
  if (const Var v = var({"TREEDUCE_DPDK_TX_COPY"}); v.name) {
    if (auto s = number(v, 0, 1, &x); !s.ok()) return s;
    t->dpdk_tx_copy = x != 0;
  }
  if (const Var v = var({"TREEDUCE_LOCAL_MAC"}); v.name) {
    if (auto s = mac(v); !s.ok()) return s;
    t->local_mac = v.value;
  }
  if (const Var v = var({"TREEDUCE_LEAF_MAC"}); v.name) {
    if (auto s = mac(v); !s.ok()) return s;
    t->leaf_mac = v.value;
  }
  if (const Var v = var({"TREEDUCE_BUSY_POLL_US"}); v.name) {
    if (auto s = number(v, 0, 10000, &x); !s.ok()) return s;
    t->busy_poll_us = std::uint32_t(x);
  }
  return treeduce::Status::Ok();
}

// A comma list of element types or operations ("f32,bf16", "all") as a mask, or why not.
template <typename T, typename Parse>
treeduce::Status name_mask(const Var& v, std::string_view list, Parse parse, std::uint32_t all,
                           const char* what, std::uint32_t* out) {
  if (list == "all") {
    *out = all;
    return treeduce::Status::Ok();
  }
  std::uint32_t m = 0;
  std::size_t at = 0;
  while (at <= list.size()) {
    const std::size_t end = std::min(list.find(',', at), list.size());
    const std::string_view one = list.substr(at, end - at);
    const std::optional<T> x = parse(one);
    if (!x) {
      return invalid_argument(std::string(v.name) + " is '" + v.value + "': '" + std::string(one) +
                              "' is not " + what + " (a comma list of names, or all).");
    }
    m |= 1u << static_cast<unsigned>(*x);
    at = end + 1;
  }
  *out = m;
  return treeduce::Status::Ok();
}

// The static tree's variables (docs/host.md, "Environment"; TreeAssignment) into `*t`. A leaf
// makes a static tree; the tree id, key and child index must then be given (a default would
// make every rank child 0 of tree 0, which no switch was configured for); any of them without
// a leaf is an error, and so is a leaf with a manager (a job takes its tree from one of them).
treeduce::Status parse_static_tree(
    const std::function<Var(std::initializer_list<const char*>)>& var, bool manager,
    TreeAssignment* t) {
  const Var leaf = var({"TREEDUCE_STATIC_LEAF"});
  static constexpr const char* kOthers[] = {
      "TREEDUCE_STATIC_TREE_ID", "TREEDUCE_STATIC_KEY",           "TREEDUCE_STATIC_CHILD_INDEX",
      "TREEDUCE_STATIC_SLOTS",   "TREEDUCE_STATIC_PAYLOAD_BYTES", "TREEDUCE_STATIC_DTYPES",
      "TREEDUCE_STATIC_OPS",     "TREEDUCE_STATIC_DETERMINISTIC", "TREEDUCE_STATIC_SWITCHES"};
  if (!leaf.name) {
    for (const char* n : kOthers)
      if (var({n}).name)
        return invalid_argument(std::string(n) +
                                " is set but TREEDUCE_STATIC_LEAF is not: a static tree starts "
                                "with its leaf switch's data address.");
    return treeduce::Status::Ok();
  }
  if (manager)
    return invalid_argument(
        "TREEDUCE_MANAGER and TREEDUCE_STATIC_LEAF are both set; a job takes its tree from one of "
        "them.");
  TreeAssignment s = *t;
  if (!is_leaf_address(leaf.value))
    return invalid_argument(std::string(leaf.name) + " is '" + leaf.value +
                            "', not the leaf switch's data address as IPv4:PORT "
                            "(10.0.1.1:4791).");
  s.leaf_address = leaf.value;
  std::uint64_t x = 0;
  for (const char* n :
       {"TREEDUCE_STATIC_TREE_ID", "TREEDUCE_STATIC_KEY", "TREEDUCE_STATIC_CHILD_INDEX"})
    if (!var({n}).name)
      return invalid_argument(std::string(n) +
                              " is not set; a static tree (TREEDUCE_STATIC_LEAF) needs its tree "
                              "id, key and this rank's child index as the switch has them.");
  if (auto st = number(var({"TREEDUCE_STATIC_TREE_ID"}), 0, 65535, &x); !st.ok()) return st;
  s.tree_id = std::uint16_t(x);
  {
    const Var k = var({"TREEDUCE_STATIC_KEY"});
    const bool hex =
        k.value.size() > 2 && k.value[0] == '0' && (k.value[1] == 'x' || k.value[1] == 'X');
    const std::string_view digits = std::string_view(k.value).substr(hex ? 2 : 0);
    const char* end = digits.data() + digits.size();
    auto [p, ec] = std::from_chars(digits.data(), end, x, hex ? 16 : 10);
    if (ec != std::errc() || p != end || digits.empty())
      return invalid_argument("TREEDUCE_STATIC_KEY is '" + k.value +
                              "', not a 64-bit key (decimal, or hexadecimal after 0x).");
    s.key = x;
  }
  if (auto st = number(var({"TREEDUCE_STATIC_CHILD_INDEX"}), 0, proto::kMaxChildren - 1, &x);
      !st.ok())
    return st;
  s.child_index = std::uint16_t(x);
  if (const Var v = var({"TREEDUCE_STATIC_SLOTS"}); v.name) {
    if (auto st = power_of_two(v, 1, 4096, &x); !st.ok()) return st;
    s.slots = std::uint32_t(x);
  }
  if (const Var v = var({"TREEDUCE_STATIC_PAYLOAD_BYTES"}); v.name) {
    if (auto st = power_of_two(v, 256, 8192, &x); !st.ok()) return st;
    s.payload_bytes = std::uint32_t(x);
  }
  if (const Var v = var({"TREEDUCE_STATIC_DTYPES"}); v.name) {
    if (auto st = name_mask<DType>(v, v.value, parse_dtype, kAllDTypesMask, "an element type",
                                   &s.dtype_mask);
        !st.ok())
      return st;
  }
  if (const Var v = var({"TREEDUCE_STATIC_OPS"}); v.name) {
    if (auto st =
            name_mask<ReduceOp>(v, v.value, parse_op, kAllOpsMask, "an operation", &s.op_mask);
        !st.ok())
      return st;
  }
  if (const Var v = var({"TREEDUCE_STATIC_DETERMINISTIC"}); v.name) {
    if (auto st = number(v, 0, 1, &x); !st.ok()) return st;
    s.deterministic = x != 0;
  }
  // The tree's switches, root first, for sentences that name the model that cannot reduce a
  // pair: NAME:PROFILE[:DTYPES[:OPS]] separated by ';', the lists as above (default: the
  // tree's own).
  if (const Var v = var({"TREEDUCE_STATIC_SWITCHES"}); v.name) {
    s.switches.clear();
    std::string_view rest = v.value;
    while (true) {
      const std::size_t semi = std::min(rest.find(';'), rest.size());
      const std::string_view one = rest.substr(0, semi);
      std::vector<std::string_view> f;
      for (std::size_t at = 0; at <= one.size();) {
        const std::size_t c = std::min(one.find(':', at), one.size());
        f.push_back(one.substr(at, c - at));
        at = c + 1;
      }
      if (f.size() < 2 || f.size() > 4 || f[0].empty() || f[1].empty())
        return invalid_argument("TREEDUCE_STATIC_SWITCHES is '" + v.value + "': '" +
                                std::string(one) +
                                "' is not NAME:PROFILE[:DTYPES[:OPS]] (switches separated by "
                                "';', root first).");
      TreeSwitch sw{std::string(f[0]), std::string(f[1]), s.dtype_mask, s.op_mask};
      if (f.size() > 2)
        if (auto st = name_mask<DType>(v, f[2], parse_dtype, kAllDTypesMask, "an element type",
                                       &sw.dtype_mask);
            !st.ok())
          return st;
      if (f.size() > 3)
        if (auto st =
                name_mask<ReduceOp>(v, f[3], parse_op, kAllOpsMask, "an operation", &sw.op_mask);
            !st.ok())
          return st;
      s.switches.push_back(std::move(sw));
      if (semi == rest.size()) break;
      rest = rest.substr(semi + 1);
    }
  }
  *t = std::move(s);
  return treeduce::Status::Ok();
}

}  // namespace

treeduce::Status parse_number(std::string_view name, std::string_view value, std::uint64_t min,
                              std::uint64_t max, std::uint64_t* out) {
  std::uint64_t x = 0;
  const char* end = value.data() + value.size();
  auto [p, ec] = std::from_chars(value.data(), end, x);
  if (ec != std::errc() || p != end || x < min || x > max) {
    return invalid_argument(std::string(name) + " is '" + std::string(value) +
                            "', not a whole number from " + std::to_string(min) + " to " +
                            std::to_string(max) + ".");
  }
  *out = x;
  return treeduce::Status::Ok();
}

bool parse_mac(std::string_view s, std::uint8_t out[6]) {
  if (s.size() != 17) return false;
  std::uint8_t m[6];
  for (std::size_t i = 0; i < 6; ++i) {
    if (i != 0 && s[3 * i - 1] != ':') return false;
    const char* b = s.data() + 3 * i;
    // from_chars would take a sign or a single digit; two hexadecimal digits exactly.
    if (std::isxdigit(static_cast<unsigned char>(b[0])) == 0 ||
        std::isxdigit(static_cast<unsigned char>(b[1])) == 0)
      return false;
    std::from_chars(b, b + 2, m[i], 16);
  }
  std::memcpy(out, m, 6);
  return true;
}

bool is_leaf_address(std::string_view a) {
  const auto colon = a.rfind(':');
  in_addr ip{};
  std::uint64_t port = 0;
  return colon != std::string_view::npos &&
         inet_pton(AF_INET, std::string(a.substr(0, colon)).c_str(), &ip) == 1 &&
         parse_number("", a.substr(colon + 1), 1, 65535, &port).ok();
}

treeduce::Status parse_transport_environment(const EnvLookup& env, TransportOptions* out) {
  TransportOptions t = *out;
  auto s = parse_transport(
      [&env](std::initializer_list<const char*> names) -> Var {
        for (const char* n : names) {
          const char* v = env(n);
          if (v != nullptr && *v != '\0') return {n, v};
        }
        return {};
      },
      &t);
  if (s.ok()) *out = std::move(t);
  return s;
}

UnstartableRank what_is_known(const EnvLookup& env) {
  const auto first_of = [&env](std::initializer_list<const char*> names) -> Var {
    for (const char* n : names) {
      const char* v = env(n);
      if (v != nullptr && *v != '\0') return {n, v};
    }
    return {};
  };
  UnstartableRank u;
  if (const Var v = first_of({"TREEDUCE_MANAGER"}); v.name) u.manager = v.value;
  if (const Var v = first_of({"TREEDUCE_JOB", "TORCHELASTIC_RUN_ID"});
      v.name && !(std::string_view(v.name) == "TORCHELASTIC_RUN_ID" && v.value == "none"))
    u.job = v.value;
  std::uint64_t r = 0;
  if (const Var v = first_of({"TREEDUCE_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
      v.name && number(v, 0, UINT32_MAX, &r).ok())
    u.rank = std::uint32_t(r);
  return u;
}

treeduce::Status parse_environment(const EnvLookup& env, Options* out) {
  // The first of `names` that is set and not empty.
  const auto first_of = [&env](std::initializer_list<const char*> names) -> Var {
    for (const char* n : names) {
      const char* v = env(n);
      if (v != nullptr && *v != '\0') return {n, v};
    }
    return {};
  };
  Options o = *out;  // written back only when every variable is valid

  const Var rank = first_of({"TREEDUCE_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
  const Var world = first_of({"TREEDUCE_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  if (rank.name == nullptr || world.name == nullptr) {
    return invalid_argument(
        "No rank or world size: set TREEDUCE_RANK and TREEDUCE_WORLD_SIZE, or start the "
        "processes with torchrun (RANK, WORLD_SIZE) or Open MPI's mpirun.");
  }
  std::uint64_t r = 0, w = 0;
  if (auto s = number(rank, 0, UINT32_MAX, &r); !s.ok()) return s;
  if (auto s = number(world, 0, UINT32_MAX, &w); !s.ok()) return s;
  if (w == 0)
    return invalid_argument(std::string(world.name) + " is 0; a job has at least one rank.");
  if (r >= w) {
    return invalid_argument(std::string(rank.name) + " is " + std::to_string(r) +
                            ", but ranks of a world of " + std::to_string(w) + " (" + world.name +
                            ") go from 0 to " + std::to_string(w - 1) + ".");
  }
  o.rank = std::uint32_t(r);
  o.world_size = std::uint32_t(w);

  Var job = first_of({"TREEDUCE_JOB", "TORCHELASTIC_RUN_ID"});
  // torchrun exports the literal "none" when no --rdzv-id is given: shared by unrelated jobs.
  if (job.name != nullptr && std::string_view(job.name) == "TORCHELASTIC_RUN_ID" &&
      job.value == "none")
    job = {};
  if (job.name != nullptr) {
    o.job = job.value;
  } else if (o.job.empty()) {
    return invalid_argument(
        "No job name: set TREEDUCE_JOB to a name every rank of the job shares (torchrun's "
        "TORCHELASTIC_RUN_ID is used when it is set).");
  }

  if (const Var v = first_of({"TREEDUCE_MANAGER"}); v.name) o.manager = v.value;
  {
    // TREEDUCE_TLS_* and TREEDUCE_INSECURE as tdr_comm_create() and the CLI read them.
    tls::TlsOptions t{o.tls_ca, o.tls_cert, o.tls_key, o.insecure, o.tls_server_name};
    std::string bad;
    tls::read_environment(env, &t, &bad);
    if (!bad.empty()) return invalid_argument(bad);
    o.tls_ca = std::move(t.ca);
    o.tls_cert = std::move(t.cert);
    o.tls_key = std::move(t.key);
    o.tls_server_name = std::move(t.server_name);
    o.insecure = t.insecure;
  }
  if (const Var v = first_of({"TREEDUCE_HOST"}); v.name) {
    o.host = v.value;
  } else if (o.host.empty()) {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
      return invalid_argument(
          "TREEDUCE_HOST is not set and this machine's host name cannot be read.");
    o.host = name;
  }
  if (const Var v = first_of({"TREEDUCE_BIND"}); v.name) {
    if (auto s = ipv4(v); !s.ok()) return s;
    o.bind_address = v.value;
  }
  if (const Var v = first_of({"TREEDUCE_PORT"}); v.name) {
    std::uint64_t port = 0;
    if (auto s = number(v, 0, 65535, &port); !s.ok()) return s;
    o.port = std::uint16_t(port);
  }
  // The window and the packet payload asked of the manager (it may lower the payload to what its
  // switches hold); the payload must fit the path's MTU (docs/host.md).
  if (const Var v = first_of({"TREEDUCE_SLOTS"}); v.name) {
    std::uint64_t slots = 0;
    if (auto s = power_of_two(v, 1, 4096, &slots); !s.ok()) return s;
    o.slots = std::uint32_t(slots);
  }
  if (const Var v = first_of({"TREEDUCE_PAYLOAD_BYTES"}); v.name) {
    std::uint64_t bytes = 0;
    if (auto s = power_of_two(v, 256, 8192, &bytes); !s.ok()) return s;
    o.payload_bytes = std::uint32_t(bytes);
  }
  // A deterministic tree (bit-reproducible sums, docs/numerics.md) asked of the manager.
  if (const Var v = first_of({"TREEDUCE_DETERMINISTIC"}); v.name) {
    std::uint64_t d = 0;
    if (auto s = number(v, 0, 1, &d); !s.ok()) return s;
    o.deterministic = d != 0;
  }
  if (const Var v = first_of({"TREEDUCE_RTO_US"}); v.name) {
    std::uint64_t us = 0;
    if (auto s = number(v, 0, 128000, &us); !s.ok()) return s;
    o.rto_us = std::uint32_t(us);
  }
  if (const Var v = first_of({"TREEDUCE_MAX_RETRIES"}); v.name) {
    std::uint64_t n = 0;
    if (auto s = number(v, 1, 1000, &n); !s.ok()) return s;
    o.max_retries = std::uint32_t(n);
  }
  if (const Var v = first_of({"TREEDUCE_PATH"}); v.name) {
    if (v.value == "auto") {
      o.path = Path::auto_select;
    } else if (v.value == "network") {
      o.path = Path::network;
    } else if (v.value == "host") {
      o.path = Path::host;
    } else {
      return invalid_argument("TREEDUCE_PATH is '" + v.value +
                              "'; it must be auto, network or host.");
    }
  }
  if (const Var v = first_of({"TREEDUCE_FALLBACK_STORE"}); v.name) o.fallback_store = v.value;
  if (const Var v = first_of({"TREEDUCE_FALLBACK_ADDRESS"}); v.name) {
    if (auto s = ipv4(v); !s.ok()) return s;
    o.fallback_address = v.value;
  }

  if (auto s = parse_transport(first_of, &o.transport); !s.ok()) return s;
  if (auto s = parse_static_tree(first_of, !o.manager.empty(), &o.static_tree); !s.ok()) return s;

  *out = std::move(o);
  return treeduce::Status::Ok();
}

}  // namespace treeduce::host
