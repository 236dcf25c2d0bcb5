#include "treeduce/control/resources.h"

#include <algorithm>
#include <array>

namespace treeduce::ctl {

namespace {

// Quantum-2-like: SHARP job logs show 23 OSTs per job and user_data_per_ost 1024 (DESIGN.md
// section 9); we give a switch 64 trees and 512 OSTs so that ~20 jobs at the SHARP default fit,
// and 64 ports of fan-in. Floats and ints, all three ops, a reproducible mode (SHARP has one).
// Tofino-like: SwitchML-sized register memory, 64 int32 per packet (256 B), 32 workers, integer
// arithmetic only (hosts quantise). Server: a DPDK aggregator on a CPU box (OmniReduce style),
// bounded by 1 GiB of slot memory rather than by slot count.
const std::array<ResourceProfile, 3> kBuiltin = {{
    {"quantum2", 64, 512, 1024, 0, 64, 0x3F, 0x07, true},
    {"tofino", 16, 1024, 256, 0, 32, 1u << 5, 0x07, false},
    {"server", 4096, 1u << 20, 8192, 1ull << 30, 64, 0x3F, 0x07, true},
}};

}  // namespace

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
