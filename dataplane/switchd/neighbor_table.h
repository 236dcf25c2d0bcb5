/// @file
/// The switch's next hops: IPv4 address -> (port, MAC). Read on every transmitted frame by the
/// lcores, written only by the control thread, which builds a new immutable table and publishes it
/// (RCU: the old one is freed after rte_rcu_qsbr_synchronize). Entries come from ARP (requests
/// and replies addressed to the switch) and from the static neighbours of the configuration.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace treeduce::switchd {

struct NeighborEntry {
  std::uint32_t ip = 0;  ///< host order; 0 marks an empty bucket
  std::uint16_t port = 0;
  std::uint8_t mac[6] = {};
};

/// Open addressing with linear probing, at most half full: a lookup is one hash and, almost
/// always, one cache line. Immutable once built.
class NeighborTable {
 public:
  explicit NeighborTable(const std::vector<NeighborEntry>& entries);
  const NeighborEntry* find(std::uint32_t ip) const noexcept {
    if (ip == 0) return nullptr;  // 0 marks empty buckets
    for (std::uint32_t i = hash(ip);; i = (i + 1) & mask_) {
      const NeighborEntry& e = buckets_[i];
      if (e.ip == ip) return &e;
      if (e.ip == 0) return nullptr;
    }
  }
  std::size_t size() const noexcept { return size_; }

 private:
  std::uint32_t hash(std::uint32_t ip) const noexcept {
    return (ip * 0x9E3779B1u) >> shift_ & mask_;
  }
  std::vector<NeighborEntry> buckets_;
  std::uint32_t mask_ = 0;
  std::uint32_t shift_ = 0;
  std::size_t size_ = 0;
};

/// The control thread's master copy. learn() returns true when the table changed (a new
/// address, or a known one that moved to another MAC or port) and must be republished.
class NeighborBook {
 public:
  bool learn(const NeighborEntry& e);
  bool contains(std::uint32_t ip) const { return entries_.count(ip) != 0; }
  const NeighborEntry* find(std::uint32_t ip) const {
    const auto it = entries_.find(ip);
    return it != entries_.end() ? &it->second : nullptr;
  }
  std::size_t size() const { return entries_.size(); }
  std::unique_ptr<NeighborTable> build() const;

 private:
  std::unordered_map<std::uint32_t, NeighborEntry> entries_;
};

}  // namespace treeduce::switchd
