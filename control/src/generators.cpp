// Fabric generators. Addresses are synthetic but unique: switch data 10.255.x.y:4791, switch
// management 10.254.x.y:9390, hosts 10.h.h.h.
#include <string>

#include "treeduce/control/topology.h"

namespace treeduce::ctl {

namespace {

constexpr std::uint16_t kDataPort = 4791;

struct Builder {
  Topology t;
  std::uint32_t add_switch(std::string name, std::uint32_t level, std::uint32_t ports) {
    auto i = std::uint32_t(t.switches.size());
    Switch s;
    s.name = std::move(name);
    s.level = level;
    s.ports = ports;
    s.data = {0x0AFF0000u | (i + 1), kDataPort};
    s.mgmt = to_string(Address{0x0AFE0000u | (i + 1), 0}) + ":9390";
    t.switches.push_back(std::move(s));
    return i;
  }
  void add_host(std::string name, std::uint32_t leaf) {
    auto i = std::uint32_t(t.hosts.size());
    Host h;
    h.name = std::move(name);
    h.data = {0x0A000000u | (i + 1), 0};
    h.leaf = leaf;
    t.switches[leaf].hosts.push_back(i);
    t.hosts.push_back(std::move(h));
  }
  void link(std::uint32_t lo, std::uint32_t hi) {
    t.switches[lo].up.push_back(hi);
    t.switches[hi].down.push_back(lo);
  }
};

Result<Builder> start(std::string_view profile) {
  auto p = find_builtin_profile(profile);
  if (!p) return invalid_argument("unknown resource profile '" + std::string(profile) + "'.");
  Builder b;
  b.t.profiles.push_back(*p);
  return b;
}

Status check_k(std::uint32_t k) {
  if (k < 2 || k > 128 || k % 2)
    return invalid_argument("a k-ary fat-tree needs an even k from 2 to 128, not " +
                            std::to_string(k) + ".");
  return Status::Ok();
}

Result<Topology> done(Builder& b) {
  if (Status s = b.t.finalize(); !s.ok()) return s;
  return std::move(b.t);
}

}  // namespace

Result<Topology> make_fat_tree2(std::uint32_t k, std::string_view profile) {
  if (Status s = check_k(k); !s.ok()) return s;
  auto b = start(profile);
  if (!b.ok()) return b.status();
  const std::uint32_t h = k / 2;
  std::vector<std::uint32_t> leaves, spines;
  for (std::uint32_t l = 0; l < k; ++l)
    leaves.push_back(b->add_switch("leaf" + std::to_string(l), 0, k));
  for (std::uint32_t s = 0; s < h; ++s)
    spines.push_back(b->add_switch("spine" + std::to_string(s), 1, k));
  for (std::uint32_t l = 0; l < k; ++l) {
    for (std::uint32_t i = 0; i < h; ++i)
      b->add_host("h" + std::to_string(l) + "-" + std::to_string(i), leaves[l]);
    for (std::uint32_t s : spines) b->link(leaves[l], s);
  }
  return done(*b);
}

Result<Topology> make_fat_tree3(std::uint32_t k, std::string_view profile) {
  if (Status s = check_k(k); !s.ok()) return s;
  auto b = start(profile);
  if (!b.ok()) return b.status();
  const std::uint32_t h = k / 2;
  // Edges first so leaf numbers follow pods; then aggregation; then cores.
  std::vector<std::uint32_t> edge(k * h), agg(k * h), core(h * h);
  for (std::uint32_t p = 0; p < k; ++p)
    for (std::uint32_t e = 0; e < h; ++e)
      edge[p * h + e] = b->add_switch("p" + std::to_string(p) + "-edge" + std::to_string(e), 0, k);
  for (std::uint32_t p = 0; p < k; ++p)
    for (std::uint32_t a = 0; a < h; ++a)
      agg[p * h + a] = b->add_switch("p" + std::to_string(p) + "-agg" + std::to_string(a), 1, k);
  for (std::uint32_t c = 0; c < h * h; ++c)
    core[c] = b->add_switch("core" + std::to_string(c), 2, k);
  for (std::uint32_t p = 0; p < k; ++p) {
    for (std::uint32_t e = 0; e < h; ++e) {
      for (std::uint32_t i = 0; i < h; ++i)
        b->add_host("p" + std::to_string(p) + "-e" + std::to_string(e) + "-h" + std::to_string(i),
                    edge[p * h + e]);
      for (std::uint32_t a = 0; a < h; ++a) b->link(edge[p * h + e], agg[p * h + a]);
    }
    // Aggregation switch a of every pod reaches cores a·k/2 .. a·k/2 + k/2 - 1.
    for (std::uint32_t a = 0; a < h; ++a)
      for (std::uint32_t c = 0; c < h; ++c) b->link(agg[p * h + a], core[a * h + c]);
  }
  return done(*b);
}

Result<Topology> make_rail_optimised(std::uint32_t groups, std::uint32_t servers,
                                     std::uint32_t rails, std::uint32_t spines,
                                     std::string_view profile) {
  if (groups < 1 || servers < 1 || rails < 1 || spines < 1 || servers > 64 ||
      groups * rails > 4096 || spines > 4096)
    return invalid_argument(
        "a rail-optimised fabric needs at least one group, server, rail and spine, at most 64 "
        "servers per group and 4096 leaves.");
  auto b = start(profile);
  if (!b.ok()) return b.status();
  std::vector<std::uint32_t> leaves;
  for (std::uint32_t g = 0; g < groups; ++g)
    for (std::uint32_t r = 0; r < rails; ++r)
      leaves.push_back(b->add_switch("g" + std::to_string(g) + "-rail" + std::to_string(r), 0,
                                     servers + spines));
  std::vector<std::uint32_t> sp;
  for (std::uint32_t s = 0; s < spines; ++s)
    sp.push_back(b->add_switch("spine" + std::to_string(s), 1, groups * rails));
  for (std::uint32_t g = 0; g < groups; ++g)
    for (std::uint32_t s = 0; s < servers; ++s)
      for (std::uint32_t r = 0; r < rails; ++r)
        b->add_host("g" + std::to_string(g) + "-s" + std::to_string(s) + "-r" + std::to_string(r),
                    leaves[g * rails + r]);
  for (std::uint32_t l : leaves)
    for (std::uint32_t s : sp) b->link(l, s);
  return done(*b);
}

}  // namespace treeduce::ctl
