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

/// Gloo's reduction function c = a OP b for f32 and i32, whose accumulator lanes are the elements
/// themselves, with the aggregation kernel `acc` (acc = acc OP payload, in place); c may be a or
/// b: SUM, MIN and MAX are commutative bit for bit (docs/numerics.md), so c == b is acc(c, a).
gloo::AllreduceOptions::Func gloo_reduce_32(agg::AccumulateFn acc);

}  // namespace treeduce::host
