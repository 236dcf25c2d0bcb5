#include "treeduce/control/resources.h"

#include <algorithm>
#include <array>
#include <string>

namespace treeduce::ctl {

namespace {

// Quantum-2-like: SHARP job logs show 23 OSTs per job and user_data_per_ost 1024 (DESIGN.md
// section 9); we give a switch 64 trees and 512 OSTs so that ~20 jobs at the SHARP default fit,
// and 64 ports of fan-in. SHARP's data types (8- to 64-bit integers, fp16, bf16, fp32, fp64 and
// the MINLOC/MAXLOC pairs) with every MPI operation, but no FP8; a reproducible mode (SHARP has
// one). Tofino-like: SwitchML-sized register memory, 64 int32 per packet (256 B), 32 workers,
// and what an integer match-action pipeline does: 32-bit integer sum, min and max (hosts
// quantise). Server: a DPDK aggregator on a CPU box (OmniReduce style), bounded by 1 GiB of slot
// memory rather than by slot count; the aggregation kernels reduce every pair.
constexpr std::uint32_t kQuantum2DTypes = kAllDTypesMask & ~(bit(DType::e4m3) | bit(DType::e5m2));
constexpr std::uint32_t kTofinoDTypes = bit(DType::i32) | bit(DType::u32);
constexpr std::uint32_t kTofinoOps = bit(ReduceOp::sum) | bit(ReduceOp::min) | bit(ReduceOp::max);

const std::array<ResourceProfile, 3> kBuiltin = {{
    {"quantum2", 64, 512, 1024, 0, 64, kQuantum2DTypes, kAllOpsMask, true},
    {"tofino", 16, 1024, 256, 0, 32, kTofinoDTypes, kTofinoOps, false},
    {"server", 4096, 1u << 20, 8192, 1ull << 30, 64, kAllDTypesMask, kAllOpsMask, true},
}};

}  // namespace

std::uint32_t count_pairs(std::uint32_t dtype_mask, std::uint32_t op_mask) noexcept {
  std::uint32_t n = 0;
  for (DType d : kAllDTypes)
    for (ReduceOp op : kAllReduceOps) n += offloads(dtype_mask, op_mask, d, op) ? 1 : 0;
  return n;
}

std::optional<Pair> first_missing(const ResourceProfile& p, std::uint32_t want_dtypes,
                                  std::uint32_t want_ops) noexcept {
  if (want_dtypes == 0) want_dtypes = kAllDTypesMask;
  if (want_ops == 0) want_ops = kAllOpsMask;
  for (DType d : kAllDTypes)
    for (ReduceOp op : kAllReduceOps)
      if (offloads(want_dtypes, want_ops, d, op) && !offloads(p, d, op)) return Pair{d, op};
  return std::nullopt;
}

std::string pair_name(DType d, ReduceOp op) {
  return std::string(name(d)) + " " + std::string(name(op));
}

std::span<const ResourceProfile> builtin_profiles() noexcept { return kBuiltin; }

std::optional<ResourceProfile> find_builtin_profile(std::string_view name) {
  for (const auto& p : kBuiltin)
    if (p.name == name) return p;
  return std::nullopt;
}

Usage tree_cost(std::uint32_t slots, std::uint32_t payload_bytes, bool deterministic,
                std::uint32_t children) noexcept {
  Usage u;
  u.trees = 1;
  u.slots = slots;
  u.bytes = 2ull * slots * payload_bytes * (deterministic ? children + 1ull : 1ull);
  return u;
}

bool fits(const ResourceProfile& p, const Usage& used, const Usage& add) noexcept {
  if (used.trees + add.trees > p.max_trees) return false;
  if (used.slots + add.slots > p.max_slots) return false;
  if (p.memory_bytes != 0 && used.bytes + add.bytes > p.memory_bytes) return false;
  return true;
}

double utilisation(const ResourceProfile& p, const Usage& used) noexcept {
  double u = 0;
  if (p.max_trees) u = std::max(u, double(used.trees) / p.max_trees);
  if (p.max_slots) u = std::max(u, double(used.slots) / double(p.max_slots));
  if (p.memory_bytes) u = std::max(u, double(used.bytes) / double(p.memory_bytes));
  return u;
}

}  // namespace treeduce::ctl
