// The interposer's own variables (docs/mpi.md, "Variables"), parsed without MPI so that the unit
// test gives them as a map.
#ifndef TREEDUCE_MPI_CONFIG_H
#define TREEDUCE_MPI_CONFIG_H

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace treeduce::mpi {

/** TREEDUCE_MPI: which path collectives take. */
enum class Mode : std::uint8_t {
  off,    ///< every call goes to PMPI unchanged
  on,     ///< offloadable calls within the thresholds go to the network (default)
  force,  ///< every offloadable call goes to the network, thresholds ignored
};

struct Config {
  Mode mode = Mode::on;
  std::uint32_t min_ranks = 2;  ///< TREEDUCE_MPI_MIN_RANKS: smallest communicator offloaded
  std::uint64_t min_bytes = 0;  ///< TREEDUCE_MPI_MIN_BYTES: smallest message offloaded
  std::uint64_t max_bytes = UINT64_MAX;  ///< TREEDUCE_MPI_MAX_BYTES: largest message offloaded
  bool stats = false;                    ///< TREEDUCE_MPI_STATS=1: counters at MPI_Finalize
  bool operator==(const Config&) const = default;
};

/** A variable's value, or nullopt when it is not set. */
using Lookup = std::function<std::optional<std::string>(const char* name)>;

/**
 * The configuration from `lookup`. A bad value leaves `*error` with one sentence naming the
 * variable and returns a configuration with mode off (nothing is offloaded on a rank that was
 * misconfigured; MPI_Init makes every rank agree on that).
 */
Config parse_config(const Lookup& lookup, std::string* error);

/** "off", "on" or "force". */
const char* to_string(Mode m);

}  // namespace treeduce::mpi

#endif
