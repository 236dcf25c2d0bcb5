// What libtreeduce's host-side reduction and treeduce-perf's Gloo baseline share: a Gloo context
// over Gloo's TCP transport (host/src/gloo_connect.cpp says how the rendezvous leaves no stale
// keys behind) and the reduction function of the 32-bit types.
#pragma once

#include <gloo/allreduce.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::host {

struct GlooRendezvous {
  std::string store_dir;     ///< FileStore directory every rank can read and write
  std::string prefix;        ///< the keys' prefix: one per job and use, so contexts never mix
  std::string bind_address;  ///< IPv4 this rank's TCP transport listens on
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::chrono::milliseconds timeout{60000};
};

/// Connects this rank to all others (full mesh) and waits at a barrier; the store directory is
/// made if missing. nullptr on failure with Gloo's reason (no sentence of ours) in `*reason`.
std::shared_ptr<gloo::Context> connect_gloo(const GlooRendezvous& r, std::string* reason);

/// Gloo's reduction function c = a OP b over elements of `elem_size` bytes that are their own
/// accumulator (acc_size(d) == dtype_size(d): every type but the narrow floats), with the
/// aggregation kernel `acc` (acc = acc OP payload, in place); c may be a or b: every defined
/// operation is commutative bit for bit (docs/numerics.md; a NaN's payload aside, which emit
/// makes canonical), so c == b is acc(c, a).
gloo::AllreduceOptions::Func gloo_reduce(agg::AccumulateFn acc, std::size_t elem_size);
/// gloo_reduce(acc, 4): f32, i32, u32 (treeduce-perf's Gloo baseline).
gloo::AllreduceOptions::Func gloo_reduce_32(agg::AccumulateFn acc);

}  // namespace treeduce::host
