/// @file
/// Resource model of one aggregation switch, with named profiles that mimic real limits.
///
/// A tree with a window of W slots and P-byte payloads costs one tree entry, W slots and
/// 2·W·P bytes (live and shadow version of each slot, docs/protocol.md); in deterministic mode a
/// switch also keeps each child's payload, so c children cost 2·W·P·(c+1) bytes. ASIC profiles
/// are bounded by tree entries and slots (their SRAM is carved into fixed-size slots), the server
/// profile by memory.
///
/// What a switch can reduce is two masks over the codes of treeduce/aggregation/dtype.h: a pair
/// (d, op) is offloadable when d is in dtype_mask, op is in op_mask and op_defined(d, op). The
/// masks are a product, so the intersection of two profiles' pairs is the pairs of the
/// intersected masks: the allocator narrows a tree's masks switch by switch.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::ctl {

/// Limits of one switch model.
struct ResourceProfile {
  std::string name;
  std::uint32_t max_trees = 0;          ///< concurrent trees (SHARP: aggregation trees / groups)
  std::uint32_t max_slots = 0;          ///< slots over all trees (SHARP: OSTs)
  std::uint32_t max_payload_bytes = 0;  ///< bytes one slot holds (SHARP: user_data_per_ost)
  std::uint64_t memory_bytes = 0;       ///< slot memory budget; 0 = bounded by slots alone
  std::uint32_t max_children = 0;       ///< fan-in of one tree on this switch (<= 64)
  std::uint32_t dtype_mask = 0;         ///< bit d: can reduce treeduce::DType d
  std::uint32_t op_mask = 0;            ///< bit o: can apply treeduce::ReduceOp o
  bool deterministic = false;           ///< can run the bit-reproducible mode
  bool operator==(const ResourceProfile&) const = default;
};

/// True when masks `dtype_mask` and `op_mask` let a switch reduce (d, op): both bits set and
/// op_defined(d, op).
constexpr bool offloads(std::uint32_t dtype_mask, std::uint32_t op_mask, DType d,
                        ReduceOp op) noexcept {
  return (dtype_mask >> static_cast<unsigned>(d) & 1u) != 0 &&
         (op_mask >> static_cast<unsigned>(op) & 1u) != 0 && op_defined(d, op);
}
inline bool offloads(const ResourceProfile& p, DType d, ReduceOp op) noexcept {
  return offloads(p.dtype_mask, p.op_mask, d, op);
}
/// The number of (type, operation) pairs the masks offload (0: nothing a job could use).
std::uint32_t count_pairs(std::uint32_t dtype_mask, std::uint32_t op_mask) noexcept;
/// The first defined pair the job's masks ask for (0 = every pair) that `p` does not offload,
/// in code order (types, then operations), or nullopt when `p` offloads all of them.
struct Pair {
  DType dtype;
  ReduceOp op;
};
std::optional<Pair> first_missing(const ResourceProfile& p, std::uint32_t want_dtypes,
                                  std::uint32_t want_ops) noexcept;
/// "f64 sum" (the type's and the operation's names).
std::string pair_name(DType d, ReduceOp op);

/// The built-in profiles: "quantum2", "tofino", "server".
std::span<const ResourceProfile> builtin_profiles() noexcept;
/// A built-in profile by name, or nullopt.
std::optional<ResourceProfile> find_builtin_profile(std::string_view name);

/// What a switch has handed out. Value type: the allocator keeps one per switch.
struct Usage {
  std::uint32_t trees = 0;
  std::uint64_t slots = 0;
  std::uint64_t bytes = 0;
  Usage& operator+=(const Usage& o) noexcept {
    trees += o.trees;
    slots += o.slots;
    bytes += o.bytes;
    return *this;
  }
  Usage& operator-=(const Usage& o) noexcept {
    trees -= o.trees;
    slots -= o.slots;
    bytes -= o.bytes;
    return *this;
  }
  bool operator==(const Usage&) const = default;
};

/// Cost of one tree on one switch.
Usage tree_cost(std::uint32_t slots, std::uint32_t payload_bytes, bool deterministic,
                std::uint32_t children) noexcept;

/// True when `used + add` stays within `p`.
bool fits(const ResourceProfile& p, const Usage& used, const Usage& add) noexcept;

/// Fraction of the scarcest resource in use, 0..1: the allocator balances on it.
double utilisation(const ResourceProfile& p, const Usage& used) noexcept;

}  // namespace treeduce::ctl
