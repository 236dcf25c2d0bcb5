#include "neighbor_table.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace treeduce::switchd {

NeighborTable::NeighborTable(const std::vector<NeighborEntry>& entries) {
  const std::size_t cap = std::bit_ceil(std::max<std::size_t>(16, entries.size() * 2));
  buckets_.assign(cap, NeighborEntry{});
  mask_ = static_cast<std::uint32_t>(cap - 1);
  shift_ = 32 - static_cast<std::uint32_t>(std::countr_zero(cap));
  for (const NeighborEntry& e : entries) {
    if (e.ip == 0) continue;
    std::uint32_t i = hash(e.ip);
    while (buckets_[i].ip != 0 && buckets_[i].ip != e.ip) i = (i + 1) & mask_;
    if (buckets_[i].ip == 0) ++size_;
    buckets_[i] = e;
  }
}

bool NeighborBook::learn(const NeighborEntry& e) {
  if (e.ip == 0) return false;
  auto [it, added] = entries_.try_emplace(e.ip, e);
  if (added) return true;
  if (it->second.port == e.port && std::memcmp(it->second.mac, e.mac, 6) == 0) return false;
  it->second = e;
  return true;
}

std::unique_ptr<NeighborTable> NeighborBook::build() const {
  std::vector<NeighborEntry> v;
  v.reserve(entries_.size());
  for (const auto& [ip, e] : entries_) v.push_back(e);
  return std::make_unique<NeighborTable>(v);
}

}  // namespace treeduce::switchd
