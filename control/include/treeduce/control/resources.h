/// @file
/// Resource model of one aggregation switch, with named profiles that mimic real limits.
///
/// A tree with a window of W slots and P-byte payloads costs one tree entry, W slots and
/// 2·W·P bytes (live and shadow version of each slot, docs/protocol.md); in deterministic mode a
/// switch also keeps each child's payload, so c children cost 2·W·P·(c+1) bytes. ASIC profiles
/// are bounded by tree entries and slots (their SRAM is carved into fixed-size slots), the server
/// profile by memory.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace treeduce::ctl {

/// Limits of one switch model.
struct ResourceProfile {
  std::string name;
  std::uint32_t max_trees = 0;          ///< concurrent trees (SHARP: aggregation trees / groups)
  std::uint32_t max_slots = 0;          ///< slots over all trees (SHARP: OSTs)
  std::uint32_t max_payload_bytes = 0;  ///< bytes one slot holds (SHARP: user_data_per_ost)
  std::uint64_t memory_bytes = 0;       ///< slot memory budget; 0 = bounded by slots alone
  std::uint32_t max_children = 0;       ///< fan-in of one tree on this switch (<= 64)
  std::uint8_t dtype_mask = 0;          ///< bit d: can reduce treeduce::DType d
  std::uint8_t op_mask = 0;             ///< bit o: can apply treeduce::ReduceOp o
  bool deterministic = false;           ///< can run the bit-reproducible mode
};

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
