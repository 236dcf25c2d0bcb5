// The launcher's environment as a communicator's Options: the only place the host library reads
// variables (environment.cpp). The parser takes a lookup function, so that tests give it a map of
// variables instead of changing the process's environment.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "treeduce/common/status.h"
#include "treeduce/host/communicator.h"

namespace treeduce::host {

/// The value of a variable, or nullptr when it is not set (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

/// Fills `*out` from the variables `env` gives (communicator.h, options_from_environment()).
/// Fields no variable names keep their value; on an error `*out` is unchanged and the Status
/// (invalid_argument) names the variable.
treeduce::Status parse_environment(const EnvLookup& env, Options* out);

/// When parse_environment() fails: what the rank could still say of itself (the variables it
/// names, each empty or unset when it is itself malformed), so that it can tell the manager.
struct UnstartableRank {
  std::string manager;                ///< TREEDUCE_MANAGER ("" = none)
  std::string job;                    ///< TREEDUCE_JOB / TORCHELASTIC_RUN_ID ("" = none)
  std::optional<std::uint32_t> rank;  ///< TREEDUCE_RANK / RANK / OMPI_COMM_WORLD_RANK
};
UnstartableRank what_is_known(const EnvLookup& env);

/// Tells the manager that `who` cannot start, for `why` (JobService.Abort): the manager fails
/// the job for every rank. Returns the sentence to add to the rank's own error: whether the
/// others were told, and if not why. Defined with the communicator (it needs the manager client).
std::string report_unstartable(const UnstartableRank& who, const std::string& why);

/// Only the transport's variables (TREEDUCE_TRANSPORT, TREEDUCE_UDP_*, ...) into `*out`: for
/// tdr_comm_create(), whose C options have no transport fields.
treeduce::Status parse_transport_environment(const EnvLookup& env, TransportOptions* out);

/// "aa:bb:cc:dd:ee:ff", six pairs of hexadecimal digits (either case) separated by colons, into
/// `out`; false and `out` untouched when it is not that. TREEDUCE_LOCAL_MAC, TREEDUCE_LEAF_MAC
/// and the verbs transport's options (here, as that transport is built only with rdma-core).
bool parse_mac(std::string_view s, std::uint8_t out[6]);

/// "A.B.C.D:PORT" with PORT a decimal number from 1 to 65535: a static tree's leaf switch data
/// address, from TREEDUCE_STATIC_LEAF or TreeAssignment::leaf_address alike (each caller says
/// why not in its own words).
bool is_leaf_address(std::string_view a);

/// A decimal number from `min` to `max` and nothing else (no sign, spaces or suffix) in the
/// variable `name`; else invalid_argument: "NAME is 'v', not a whole number from MIN to MAX.".
treeduce::Status parse_number(std::string_view name, std::string_view value, std::uint64_t min,
                              std::uint64_t max, std::uint64_t* out);

}  // namespace treeduce::host
