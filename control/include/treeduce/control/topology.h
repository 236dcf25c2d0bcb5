/// @file
/// The fabric the manager allocates trees on: switches in levels, links, hosts.
///
/// Level 0 switches are leaves (hosts attach to them); every link joins adjacent levels. That is
/// what fat-trees, leaf-spine and rail-optimised fabrics look like, and it makes "shallowest tree"
/// well defined: a tree rooted at level h has depth h. Loaded from YAML (docs/manager.md) or built
/// by the generators below.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "treeduce/common/status.h"
#include "treeduce/control/resources.h"

namespace treeduce::ctl {

/// An IPv4 address and UDP/TCP port, host byte order.
struct Address {
  std::uint32_t ip = 0;
  std::uint16_t port = 0;
  bool operator==(const Address&) const = default;
};
/// "10.0.0.1:4791" (port omitted when 0).
std::string to_string(const Address& a);
/// Parses "a.b.c.d" or "a.b.c.d:port"; nullopt-like failure as a Status sentence.
Result<Address> parse_address(std::string_view s);

/// One switch.
struct Switch {
  std::string name;
  std::uint32_t level = 0;           ///< 0 = leaf
  std::string mgmt;                  ///< where its agent listens for the manager, "host:port"
  Address data;                      ///< its treeduce UDP endpoint (hosts send CONTRIBs here)
  std::uint32_t ports = 0;           ///< port count; 0 = unbounded
  std::uint32_t profile = 0;         ///< index into Topology::profiles
  std::vector<std::uint32_t> up;     ///< switches one level up
  std::vector<std::uint32_t> down;   ///< switches one level down
  std::vector<std::uint32_t> hosts;  ///< hosts attached (leaves only)
  int line = 0;                      ///< 1-based line in the YAML file, 0 when generated
};

/// One host (a NIC: a rail-optimised server has one host entry per rail).
struct Host {
  std::string name;
  Address data;            ///< data-plane address; the port is chosen by the rank at join time
  std::uint32_t leaf = 0;  ///< index of the leaf switch it attaches to
  std::uint32_t port = 0;  ///< port on that leaf; 0 = unspecified
};

/// The fabric. Build with load_topology*() or a generator; then read only.
class Topology {
 public:
  std::vector<ResourceProfile> profiles;
  std::vector<Switch> switches;
  std::vector<Host> hosts;

  /// Indexes names, leaf numbering and reachability. Called by the loaders and generators;
  /// call again after editing the vectors by hand. Fails on structural errors.
  Status finalize();

  std::uint32_t levels() const noexcept { return levels_; }  ///< highest level + 1
  /// Switch index by name, or -1.
  std::int64_t find_switch(std::string_view name) const;
  /// Host index by name, or -1.
  std::int64_t find_host(std::string_view name) const;
  /// Host index by data IP, or -1.
  std::int64_t find_host_by_ip(std::uint32_t ip) const;
  const ResourceProfile& profile_of(std::uint32_t sw) const {
    return profiles[switches[sw].profile];
  }
  /// Leaves are numbered 0..num_leaves()-1 for bitsets.
  std::uint32_t num_leaves() const noexcept { return static_cast<std::uint32_t>(leaves_.size()); }
  std::uint32_t leaf_switch(std::uint32_t leaf_no) const { return leaves_[leaf_no]; }
  /// Leaf number of a level-0 switch.
  std::uint32_t leaf_number(std::uint32_t sw) const { return leaf_no_[sw]; }
  /// Words of a leaf bitset.
  std::size_t leaf_words() const noexcept { return words_; }
  /// Bitset of leaves reachable downward from switch `sw` (itself for a leaf).
  const std::uint64_t* below(std::uint32_t sw) const { return &below_[sw * words_]; }
  /// Switches of one level.
  const std::vector<std::uint32_t>& at_level(std::uint32_t level) const { return by_level_[level]; }

 private:
  std::uint32_t levels_ = 0;
  std::vector<std::uint32_t> leaves_, leaf_no_;
  std::vector<std::vector<std::uint32_t>> by_level_;
  std::size_t words_ = 0;
  std::vector<std::uint64_t> below_;
  std::unordered_map<std::string, std::uint32_t> switch_by_name_, host_by_name_;
  std::unordered_map<std::uint32_t, std::uint32_t> host_by_ip_;
};

/// Bytes of `s` that are valid UTF-8 (no overlong forms, surrogates or code points above
/// U+10FFFF), counted from the start: s.size() when all are. Names and reasons go into JSON
/// documents (nlohmann refuses to write invalid UTF-8), logs and proto3 strings.
std::size_t utf8_valid_prefix(std::string_view s) noexcept;

/// Parses the YAML format of docs/manager.md (UTF-8 text). Errors name the line: "line 12: ...".
Result<Topology> load_topology_yaml(std::string_view text);
/// Reads and parses a file; errors name the file and line.
Result<Topology> load_topology_file(const std::string& path);
/// A topology file's text; not_found "Cannot open the topology file 'P'." when unreadable.
Result<std::string> read_topology_text(const std::string& path);

/// k-ary fat-tree with 2 levels (leaf-spine): k leaves with k/2 hosts and k/2 up-links each, k/2
/// spines. k²/2 hosts. k even, 2..128.
Result<Topology> make_fat_tree2(std::uint32_t k, std::string_view profile = "quantum2");
/// k-ary fat-tree with 3 levels (Al-Fares et al.): k pods of k/2 edge and k/2 aggregation
/// switches, (k/2)² cores; k³/4 hosts (k=16: 1024, k=40: 16000, k=64: 65536). k even, 2..128.
Result<Topology> make_fat_tree3(std::uint32_t k, std::string_view profile = "quantum2");
/// Rail-optimised fabric: `groups` scalable units of `servers` servers with `rails` NICs each;
/// rail r of every server in a group goes to that group's rail-r leaf; every leaf goes to each of
/// `spines` spines. Host "g<G>-s<S>-r<R>".
Result<Topology> make_rail_optimised(std::uint32_t groups, std::uint32_t servers,
                                     std::uint32_t rails, std::uint32_t spines,
                                     std::string_view profile = "quantum2");

}  // namespace treeduce::ctl
