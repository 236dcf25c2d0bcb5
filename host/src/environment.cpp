// options_from_environment (communicator.h): a communicator's options from the launcher.
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
#include <string>
#include <string_view>

#include "treeduce/host/communicator.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {
namespace {

struct Var {
  const char* name = nullptr;  // nullptr: none of the candidates is set
  std::string value;
};

// The first of `names` that is set and not empty.
Var first_of(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = std::getenv(n);
    if (v != nullptr && *v != '\0') return {n, v};
  }
  return {};
}

// A decimal number from 0 to `max`, nothing else (no sign, no spaces, no suffix).
bool parse_number(const Var& v, std::uint64_t max, std::uint64_t* out, std::string* error) {
  std::uint64_t x = 0;
  const char* end = v.value.data() + v.value.size();
  auto [p, ec] = std::from_chars(v.value.data(), end, x);
  if (ec != std::errc() || p != end || x > max) {
    *error = std::string(v.name) + " is '" + v.value + "', not a whole number from 0 to " +
             std::to_string(max) + ".";
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

Result options_from_environment(Options* out, std::string* error) {
  std::string scratch;
  if (error == nullptr) error = &scratch;
  if (out == nullptr) {
    *error = "options_from_environment needs an Options to fill.";
    return Result::invalid_argument;
  }
  Options o = *out;  // written back only when every variable is valid

  const Var rank = first_of({"TREEDUCE_RANK", "RANK", "OMPI_COMM_WORLD_RANK"});
  const Var world = first_of({"TREEDUCE_WORLD_SIZE", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE"});
  if (rank.name == nullptr || world.name == nullptr) {
    *error =
        "No rank or world size: set TREEDUCE_RANK and TREEDUCE_WORLD_SIZE, or start the "
        "processes with torchrun (RANK, WORLD_SIZE) or Open MPI's mpirun.";
    return Result::invalid_argument;
  }
  std::uint64_t r = 0, w = 0;
  if (!parse_number(rank, UINT32_MAX, &r, error) || !parse_number(world, UINT32_MAX, &w, error))
    return Result::invalid_argument;
  if (w == 0) {
    *error = std::string(world.name) + " is 0; a job has at least one rank.";
    return Result::invalid_argument;
  }
  if (r >= w) {
    *error = std::string(rank.name) + " is " + std::to_string(r) + ", but ranks of a world of " +
             std::to_string(w) + " (" + world.name + ") go from 0 to " + std::to_string(w - 1) +
             ".";
    return Result::invalid_argument;
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
    *error =
        "No job name: set TREEDUCE_JOB to a name every rank of the job shares (torchrun's "
        "TORCHELASTIC_RUN_ID is used when it is set).";
    return Result::invalid_argument;
  }

  if (const Var v = first_of({"TREEDUCE_MANAGER"}); v.name) o.manager = v.value;
  if (const Var v = first_of({"TREEDUCE_HOST"}); v.name) {
    o.host = v.value;
  } else if (o.host.empty()) {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') {
      *error = "TREEDUCE_HOST is not set and this machine's host name cannot be read.";
      return Result::invalid_argument;
    }
    o.host = name;
  }
  if (const Var v = first_of({"TREEDUCE_BIND"}); v.name) o.bind_address = v.value;
  if (const Var v = first_of({"TREEDUCE_PORT"}); v.name) {
    std::uint64_t port = 0;
    if (!parse_number(v, 65535, &port, error)) return Result::invalid_argument;
    o.port = std::uint16_t(port);
  }
  // The window and the packet payload asked of the manager (it may grant less); the payload must
  // fit the path's MTU (docs/host.md).
  if (const Var v = first_of({"TREEDUCE_SLOTS"}); v.name) {
    std::uint64_t slots = 0;
    if (!parse_number(v, 4096, &slots, error)) return Result::invalid_argument;
    if (slots == 0 || (slots & (slots - 1)) != 0) {
      *error = "TREEDUCE_SLOTS is " + v.value + "; it must be a power of two from 1 to 4096.";
      return Result::invalid_argument;
    }
    o.slots = std::uint32_t(slots);
  }
  if (const Var v = first_of({"TREEDUCE_PAYLOAD_BYTES"}); v.name) {
    std::uint64_t bytes = 0;
    if (!parse_number(v, 8192, &bytes, error)) return Result::invalid_argument;
    if (!proto::valid_payload_bytes(bytes)) {
      *error =
          "TREEDUCE_PAYLOAD_BYTES is " + v.value + "; it must be a power of two from 256 to 8192.";
      return Result::invalid_argument;
    }
    o.payload_bytes = std::uint32_t(bytes);
  }
  if (const Var v = first_of({"TREEDUCE_RTO_US"}); v.name) {
    std::uint64_t us = 0;
    if (!parse_number(v, 128000, &us, error)) return Result::invalid_argument;
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
      *error = "TREEDUCE_PATH is '" + v.value + "'; it must be auto, network or host.";
      return Result::invalid_argument;
    }
  }
  if (const Var v = first_of({"TREEDUCE_FALLBACK_STORE"}); v.name) o.fallback_store = v.value;
  if (const Var v = first_of({"TREEDUCE_FALLBACK_ADDRESS"}); v.name) o.fallback_address = v.value;

  *out = std::move(o);
  error->clear();
  return Result::ok;
}

}  // namespace treeduce::host
