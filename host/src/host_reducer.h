// Host-side reduction: what a Communicator runs when the network path is refused, unreachable,
// not offloadable or switched off. Implemented with Gloo (gloo_reducer.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/common/status.h"

namespace treeduce::host {

class HostReducer {
 public:
  virtual ~HostReducer() = default;
  /// Blocking allreduce among all ranks, with the switch's numerics (docs/numerics.md) for
  /// every defined (dtype, op) pair: narrow floats are widened to binary32, reduced, and
  /// narrowed once; integers wrap in their own width; f64 reduces in binary64; MIN/MAX are IEEE
  /// minimum/maximum (NaN propagates, -0 < +0); logical results are 0 or 1; MINLOC/MAXLOC keep
  /// the lowest index on ties. An undefined pair is invalid_argument. Ok, or why not.
  virtual treeduce::Status allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                     ReduceOp op) = 0;
};

struct HostReducerOptions {
  std::string job;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::string store_dir;     ///< rendezvous directory shared by all ranks (Gloo FileStore)
  std::string bind_address;  ///< IPv4 this rank's Gloo TCP transport listens on
  std::uint32_t timeout_ms = 60000;
};

/// Connects all ranks (blocks until every rank has called it, or timeout): the reducer, or why
/// not (invalid_argument: the options; unavailable: the rendezvous failed).
treeduce::Result<std::unique_ptr<HostReducer>> make_gloo_reducer(const HostReducerOptions& opt);

}  // namespace treeduce::host
