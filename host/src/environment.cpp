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
#include <unistd.h>

#include <charconv>
#include <climits>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>

#include "environment.h"
#include "errors.h"
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
    } else {
      return invalid_argument("TREEDUCE_TRANSPORT is '" + v.value +
                              "'; it must be udp, dpdk or verbs.");
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
  if (const Var v = var({"TREEDUCE_DPDK_PORT"}); v.name) t->dpdk_port = v.value;
  if (const Var v = var({"TREEDUCE_DPDK_EAL"}); v.name) t->dpdk_eal = v.value;
  if (const Var v = var({"TREEDUCE_LOCAL_MAC"}); v.name) t->local_mac = v.value;
  if (const Var v = var({"TREEDUCE_LEAF_MAC"}); v.name) t->leaf_mac = v.value;
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
  if (const Var v = first_of({"TREEDUCE_HOST"}); v.name) {
    o.host = v.value;
  } else if (o.host.empty()) {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0')
      return invalid_argument(
          "TREEDUCE_HOST is not set and this machine's host name cannot be read.");
    o.host = name;
  }
  if (const Var v = first_of({"TREEDUCE_BIND"}); v.name) o.bind_address = v.value;
  if (const Var v = first_of({"TREEDUCE_PORT"}); v.name) {
    std::uint64_t port = 0;
    if (auto s = number(v, 0, 65535, &port); !s.ok()) return s;
    o.port = std::uint16_t(port);
  }
  // The window and the packet payload asked of the manager (it may grant less); the payload must
  // fit the path's MTU (docs/host.md).
  if (const Var v = first_of({"TREEDUCE_SLOTS"}); v.name) {
    std::uint64_t slots = 0;
    if (auto s = number(v, 0, 4096, &slots); !s.ok()) return s;
    if (proto::check_slots(slots))
      return invalid_argument("TREEDUCE_SLOTS is " + v.value +
                              "; it must be a power of two from 1 to 4096.");
    o.slots = std::uint32_t(slots);
  }
  if (const Var v = first_of({"TREEDUCE_PAYLOAD_BYTES"}); v.name) {
    std::uint64_t bytes = 0;
    if (auto s = number(v, 0, 8192, &bytes); !s.ok()) return s;
    if (proto::check_payload_bytes(bytes))
      return invalid_argument("TREEDUCE_PAYLOAD_BYTES is " + v.value +
                              "; it must be a power of two from 256 to 8192.");
    o.payload_bytes = std::uint32_t(bytes);
  }
  if (const Var v = first_of({"TREEDUCE_RTO_US"}); v.name) {
    std::uint64_t us = 0;
    if (auto s = number(v, 0, 128000, &us); !s.ok()) return s;
    o.rto_us = std::uint32_t(us);
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
  if (const Var v = first_of({"TREEDUCE_FALLBACK_ADDRESS"}); v.name) o.fallback_address = v.value;

  if (auto s = parse_transport(first_of, &o.transport); !s.ok()) return s;

  *out = std::move(o);
  return treeduce::Status::Ok();
}

}  // namespace treeduce::host
