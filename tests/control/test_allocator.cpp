// Tree allocator: properties on generated fabrics (no overlap, capacity respected, all leaves
// covered, minimal depth), an exact oracle for refusals on 3-level fat-trees, balance, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "treeduce/control/allocator.h"

using namespace treeduce;
using namespace treeduce::ctl;

namespace {

bool covers(const Topology& t, std::uint32_t sw, const std::set<std::uint32_t>& leaves) {
  for (std::uint32_t l : leaves) {
    std::uint32_t n = t.leaf_number(l);
    if (!(t.below(sw)[n / 64] >> (n % 64) & 1)) return false;
  }
  return true;
}

std::set<std::uint32_t> leaves_of(const Topology& t, const std::vector<std::uint32_t>& hosts) {
  std::set<std::uint32_t> s;
  for (auto h : hosts) s.insert(t.hosts[h].leaf);
  return s;
}

// Lowest level at which one switch reaches every leaf of the job.
std::uint32_t min_depth(const Topology& t, const std::vector<std::uint32_t>& hosts) {
  auto leaves = leaves_of(t, hosts);
  if (leaves.size() == 1) return 0;
  for (std::uint32_t h = 1; h < t.levels(); ++h)
    for (std::uint32_t sw : t.at_level(h))
      if (covers(t, sw, leaves)) return h;
  return ~0u;
}

// Structure of one tree against its request.
void check_tree(const Topology& t, const Allocation& a, const std::vector<std::uint32_t>& hosts) {
  ASSERT_FALSE(a.nodes.empty());
  EXPECT_EQ(a.nodes[0].parent, -1);
  EXPECT_EQ(a.nodes[0].role, NodeRole::root);
  EXPECT_EQ(a.depth, t.switches[a.nodes[0].sw].level);
  std::set<std::uint32_t> sws, tree_leaves;
  std::vector<int> rank_seen(hosts.size(), 0);
  for (std::uint32_t i = 0; i < a.nodes.size(); ++i) {
    const TreeNode& n = a.nodes[i];
    EXPECT_TRUE(sws.insert(n.sw).second) << "switch twice in one tree";
    EXPECT_FALSE(n.children.empty());
    EXPECT_LE(n.children.size(), std::min<std::size_t>(t.profile_of(n.sw).max_children, 64));
    const Switch& s = t.switches[n.sw];
    if (s.level == 0) tree_leaves.insert(n.sw);
    if (i > 0) {
      EXPECT_EQ(n.role, s.level == 0 ? NodeRole::leaf : NodeRole::inner);
    }
    for (std::uint32_t c = 0; c < n.children.size(); ++c) {
      const TreeChild& ch = n.children[c];
      if (ch.is_rank) {
        ASSERT_LT(ch.id, hosts.size());
        EXPECT_EQ(s.level, 0u);
        EXPECT_EQ(t.hosts[hosts[ch.id]].leaf, n.sw) << "rank under the wrong leaf";
        ++rank_seen[ch.id];
        EXPECT_EQ(a.ranks[ch.id].node, i);
        EXPECT_EQ(a.ranks[ch.id].child_index, c);
      } else {
        ASSERT_LT(ch.id, a.nodes.size());
        const TreeNode& cn = a.nodes[ch.id];
        EXPECT_EQ(cn.parent, std::int32_t(i));
        EXPECT_EQ(cn.index_at_parent, c);
        EXPECT_NE(std::find(s.down.begin(), s.down.end(), cn.sw), s.down.end())
            << "child is not linked to its parent";
      }
    }
  }
  for (auto n : rank_seen) EXPECT_EQ(n, 1) << "a rank is not covered exactly once";
  EXPECT_EQ(tree_leaves, leaves_of(t, hosts)) << "tree leaves differ from the ranks' leaves";
}

// Usage the allocator reports equals the sum of its trees, within every profile; ids distinct.
void check_fabric(const Allocator& al) {
  const Topology& t = al.topology();
  std::vector<Usage> sum(t.switches.size());
  std::set<std::uint16_t> ids;
  for (const auto& [job, a] : al.allocations()) {
    EXPECT_TRUE(ids.insert(a.tree_id).second) << "tree id reused";
    for (const auto& n : a.nodes)
      sum[n.sw] +=
          tree_cost(a.slots, a.payload_bytes, a.deterministic, std::uint32_t(n.children.size()));
  }
  for (std::uint32_t s = 0; s < t.switches.size(); ++s) {
    EXPECT_EQ(al.usage(s), sum[s]) << t.switches[s].name;
    EXPECT_TRUE(fits(t.profile_of(s), Usage{}, sum[s])) << t.switches[s].name << " over-committed";
  }
}

// On a 3-level fat-tree the tree under a root is forced (one aggregation switch per pod links to
// a given core), so whether any tree fits is decidable exactly.
bool fat_tree3_has_room(const Topology& t, const Allocator& al, const JobRequest& r) {
  auto room = [&](std::uint32_t sw) {
    return fits(t.profile_of(sw), al.usage(sw), tree_cost(r.slots, 1024, false, 1));
  };
  auto leaves = leaves_of(t, r.rank_host);
  for (auto l : leaves)
    if (!room(l)) return false;
  if (leaves.size() == 1) return true;
  auto agg_of = [&](std::uint32_t leaf, std::uint32_t core) -> std::int64_t {
    for (auto a : t.switches[leaf].up)
      if (std::find(t.switches[a].up.begin(), t.switches[a].up.end(), core) !=
          t.switches[a].up.end())
        return a;
    return -1;
  };
  for (std::uint32_t a : t.at_level(1))
    if (covers(t, a, leaves) && room(a)) return true;
  for (std::uint32_t c : t.at_level(2)) {
    if (!room(c)) continue;
    bool ok = true;
    for (auto l : leaves) ok = ok && room(std::uint32_t(agg_of(l, c)));
    if (ok) return true;
  }
  return false;
}

JobRequest random_job(std::mt19937& rng, const Topology& t, int id, std::uint32_t max_world) {
  JobRequest r;
  r.job = "job" + std::to_string(id);
  std::uint32_t world = std::uniform_int_distribution<std::uint32_t>(1, max_world)(rng);
  // Half the jobs are local (a few leaves), half spread: both shapes occur in practice.
  bool local = rng() % 2;
  std::uint32_t base = std::uint32_t(rng() % t.hosts.size());
  for (std::uint32_t i = 0; i < world; ++i) {
    std::uint32_t h = local ? (base + std::uint32_t(rng() % 12)) % std::uint32_t(t.hosts.size())
                            : std::uint32_t(rng() % t.hosts.size());
    r.rank_host.push_back(h);
  }
  r.slots = 1u << (rng() % 5);
  return r;
}

}  // namespace

TEST(Allocator, PropertiesOnFatTree3WithExactOracle) {
  auto topo = make_fat_tree3(8);
  ASSERT_TRUE(topo.ok());
  topo->profiles[0].max_trees = 6;  // scarce, so refusals happen often
  topo->profiles[0].max_slots = 48;
  Allocator al(*topo);
  std::mt19937 rng(1234);
  std::vector<std::string> live;
  int granted = 0, refused = 0;
  for (int i = 0; i < 600; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto k = rng() % live.size();
      ASSERT_TRUE(al.release(live[k]).ok());
      live.erase(live.begin() + long(k));
      continue;
    }
    JobRequest r = random_job(rng, *topo, i, 40);
    const bool room = fat_tree3_has_room(*topo, al, r);
    auto a = al.allocate(r);
    if (a.ok()) {
      ++granted;
      EXPECT_TRUE(room);
      check_tree(*topo, *a, r.rank_host);
      live.push_back(r.job);
    } else {
      ++refused;
      EXPECT_FALSE(room) << "refused although a tree fits: " << a.status().to_string();
      EXPECT_EQ(a.status().code(), Code::resource_exhausted) << a.status().to_string();
      EXPECT_NE(a.status().message().find("switch "), std::string::npos);
    }
    check_fabric(al);
  }
  EXPECT_GT(granted, 100);
  EXPECT_GT(refused, 20);
  for (auto& j : live) ASSERT_TRUE(al.release(j).ok());
  for (std::uint32_t s = 0; s < topo->switches.size(); ++s) EXPECT_EQ(al.usage(s), Usage{});
}

TEST(Allocator, MinimalDepthOnEmptyFabrics) {
  std::vector<Topology> topos;
  topos.push_back(*make_fat_tree2(8));
  topos.push_back(*make_fat_tree3(8));
  topos.push_back(*make_rail_optimised(2, 4, 4, 2));
  std::mt19937 rng(7);
  for (const Topology& t : topos) {
    for (int i = 0; i < 200; ++i) {
      Allocator al(t);
      JobRequest r = random_job(rng, t, i, 32);
      auto a = al.allocate(r);
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      EXPECT_EQ(a->depth, min_depth(t, r.rank_host));
      check_tree(t, *a, r.rank_host);
    }
  }
}

TEST(Allocator, SingleLeafJobIsRootedAtTheLeaf) {
  auto t = *make_fat_tree3(4);
  Allocator al(t);
  JobRequest r{"j", {0, 1, 0}};
  auto a = al.allocate(r);
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->nodes.size(), 1u);
  EXPECT_EQ(a->depth, 0u);
  EXPECT_EQ(a->nodes[0].children.size(), 3u);
  EXPECT_EQ(a->ranks[2].child_index, 2);
}

TEST(Allocator, BalancesAcrossSpines) {
  auto t = *make_fat_tree2(8);  // 8 leaves, 4 spines
  Allocator al(t);
  for (int j = 0; j < 8; ++j) {
    JobRequest r{"j" + std::to_string(j),
                 {std::uint32_t(j % 8) * 4, std::uint32_t((j + 1) % 8) * 4}};
    ASSERT_TRUE(al.allocate(r).ok());
  }
  for (auto s : t.at_level(1)) EXPECT_EQ(al.usage(s).trees, 2u) << t.switches[s].name;
}

TEST(Allocator, ConcurrentJobsFillTheFabricExactly) {
  // Each leaf has 64 trees: 64 two-leaf jobs over leaves 0 and 1 fit, the 65th is refused and the
  // sentence names the leaf and its usage.
  auto t = *make_fat_tree2(8);
  Allocator al(t);
  for (int j = 0; j < 64; ++j)
    ASSERT_TRUE(al.allocate({"j" + std::to_string(j), {0, 4}, 1}).ok()) << j;
  auto a = al.allocate({"late", {1, 5}, 1});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::resource_exhausted);
  EXPECT_NE(a.status().message().find("leaf0"), std::string::npos) << a.status().message();
  EXPECT_NE(a.status().message().find("64/64 trees"), std::string::npos) << a.status().message();
  for (auto s : t.at_level(1)) EXPECT_EQ(al.usage(s).trees, 16u);
  EXPECT_TRUE(al.allocate({"other", {8, 12}}).ok());  // leaves 2 and 3 are free
}

TEST(Allocator, RefusesBadRequests) {
  auto t = *make_fat_tree2(4);
  Allocator al(t);
  auto code = [&](JobRequest r) { return al.allocate(r).status().code(); };
  EXPECT_EQ(code({"", {0}}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {}}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {99}}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {0}, 3}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {0}, 8192}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {0}, 8, 100}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {0}, 8, 1024, 1u << kNumDTypes}), Code::invalid_argument);
  EXPECT_EQ(code({"j", {0}, 8, 1024, 0, 1u << kNumReduceOps}), Code::invalid_argument);
  JobRequest huge{"j", std::vector<std::uint32_t>((1u << 20) + 1, 0)};
  EXPECT_EQ(code(huge), Code::invalid_argument);
  // 65 ranks on one leaf exceed a fan-in of 64.
  EXPECT_EQ(code({"j", std::vector<std::uint32_t>(65, 0)}), Code::resource_exhausted);
  ASSERT_TRUE(al.allocate({"j", {0, 2}}).ok());
  EXPECT_EQ(code({"j", {0, 2}}), Code::already_exists);
  EXPECT_EQ(al.release("nope").code(), Code::not_found);
}

TEST(Allocator, ProfilesShapeTheTree) {
  auto t = *make_fat_tree2(4, "tofino");
  Allocator al(t);
  JobRequest f32{"f", {0, 2}, 8, 1024, 1u << 0};  // tofino adds integers only
  auto a = al.allocate(f32);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::failed_precondition);
  EXPECT_EQ(a.status().message(),
            "No tree for job 'f': switch leaf0 (tofino) does not reduce f32 sum, which the job "
            "needs.");
  JobRequest det{"d", {0, 2}, 8, 1024, 0, 0, true};
  EXPECT_EQ(al.allocate(det).status().code(), Code::failed_precondition);
  auto ok = al.allocate({"i", {0, 2}});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->payload_bytes, 256u);  // a Tofino slot holds 64 int32
  EXPECT_EQ(ok->dtype_mask, bit(DType::i32) | bit(DType::u32));
  EXPECT_EQ(ok->op_mask, bit(ReduceOp::sum) | bit(ReduceOp::min) | bit(ReduceOp::max));
}

// What each built-in model offloads, pair by pair (docs/manager.md, "Resource profiles").
TEST(Profiles, BuiltinProfilesOffloadTheirPairs) {
  const ResourceProfile q2 = *find_builtin_profile("quantum2");
  const ResourceProfile tofino = *find_builtin_profile("tofino");
  const ResourceProfile server = *find_builtin_profile("server");
  int defined = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      const bool def = op_defined(d, op);
      defined += def;
      SCOPED_TRACE(pair_name(d, op));
      // Server: everything the kernels define.
      EXPECT_EQ(offloads(server, d, op), def);
      // Quantum-2: SHARP's set, everything but FP8.
      EXPECT_EQ(offloads(q2, d, op), def && d != DType::e4m3 && d != DType::e5m2);
      // Tofino: 32-bit integer sum, min and max.
      const bool int32 = d == DType::i32 || d == DType::u32;
      const bool arith = op == ReduceOp::sum || op == ReduceOp::min || op == ReduceOp::max;
      EXPECT_EQ(offloads(tofino, d, op), int32 && arith);
    }
  }
  EXPECT_EQ(count_pairs(server.dtype_mask, server.op_mask), std::uint32_t(defined));
  EXPECT_EQ(count_pairs(tofino.dtype_mask, tofino.op_mask), 6u);
  // Every pair type with minloc and maxloc, every integer with the ten others, every float
  // with four: 3*2 + 8*10 + 4*4 (f16, bf16, f32, f64).
  EXPECT_EQ(count_pairs(q2.dtype_mask, q2.op_mask), 6u + 80u + 16u);
  // An undefined pair is never offloaded, whatever the masks say.
  EXPECT_FALSE(offloads(kAllDTypesMask, kAllOpsMask, DType::f32, ReduceOp::band));
  EXPECT_FALSE(offloads(kAllDTypesMask, kAllOpsMask, DType::i32, ReduceOp::minloc));
}

// A job that names the pairs it needs is granted a tree exactly when every switch offloads them;
// a refusal names the switch, its model and the first missing pair.
TEST(Allocator, AcceptsOrRefusesEveryPairByProfile) {
  for (const char* model : {"quantum2", "tofino", "server"}) {
    auto t = *make_fat_tree2(4, model);
    Allocator al(t);
    const ResourceProfile p = *find_builtin_profile(model);
    int n = 0;
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!op_defined(d, op)) continue;
        SCOPED_TRACE(std::string(model) + " " + pair_name(d, op));
        const std::string job = "j" + std::to_string(n++);
        auto a = al.allocate({job, {0, 2}, 8, 256, bit(d), bit(op)});
        if (offloads(p, d, op)) {
          ASSERT_TRUE(a.ok()) << a.status().to_string();
          EXPECT_TRUE(offloads(a->dtype_mask, a->op_mask, d, op));
          ASSERT_TRUE(al.release(job).ok());
        } else {
          ASSERT_FALSE(a.ok());
          EXPECT_EQ(a.status().code(), Code::failed_precondition);
          EXPECT_EQ(a.status().message(), "No tree for job '" + job + "': switch leaf0 (" + model +
                                              ") does not reduce " + pair_name(d, op) +
                                              ", which the job needs.");
        }
      }
    }
  }
}

// Quantum-2 leaves under Tofino spines: a job under one leaf gets Quantum-2's pairs, a job across
// leaves gets the spines' (the intersection), and one that needs f64 sum across leaves is refused
// by the spine.
TEST(Allocator, MixedFabricIntersectsAndNamesTheLimitingModel) {
  auto t = *make_fat_tree2(4, "quantum2");
  t.profiles.push_back(*find_builtin_profile("tofino"));
  for (auto& s : t.switches)
    if (s.level == 1) s.profile = std::uint32_t(t.profiles.size() - 1);
  Allocator al(t);
  auto local = al.allocate({"local", {0, 1}});
  ASSERT_TRUE(local.ok()) << local.status().to_string();
  EXPECT_TRUE(offloads(local->dtype_mask, local->op_mask, DType::f64, ReduceOp::sum));
  EXPECT_FALSE(offloads(local->dtype_mask, local->op_mask, DType::e4m3, ReduceOp::sum));
  auto wide = al.allocate({"wide", {0, 2}});
  ASSERT_TRUE(wide.ok()) << wide.status().to_string();
  EXPECT_EQ(count_pairs(wide->dtype_mask, wide->op_mask), 6u);
  EXPECT_TRUE(offloads(wide->dtype_mask, wide->op_mask, DType::u32, ReduceOp::max));
  EXPECT_FALSE(offloads(wide->dtype_mask, wide->op_mask, DType::f64, ReduceOp::sum));
  auto f64 = al.allocate({"f64", {0, 2}, 16, 1024, bit(DType::f64), bit(ReduceOp::sum)});
  ASSERT_FALSE(f64.ok());
  EXPECT_EQ(f64.status().code(), Code::failed_precondition);
  EXPECT_NE(f64.status().message().find("(tofino) does not reduce f64 sum, which the job needs"),
            std::string::npos)
      << f64.status().message();
  EXPECT_NE(f64.status().message().find("switch spine"), std::string::npos)
      << f64.status().message();
}

// Masks whose every pair is meaningless are a wrong request, refused by name.
TEST(Allocator, RefusesMasksWithNoDefinedPair) {
  auto t = *make_fat_tree2(4, "server");
  Allocator al(t);
  auto a = al.allocate({"j", {0}, 8, 1024, bit(DType::f32) | bit(DType::f64), bit(ReduceOp::band)});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), Code::invalid_argument);
  EXPECT_NE(a.status().message().find("band (bitwise and) is defined on integer types only"),
            std::string::npos)
      << a.status().message();
  auto b = al.allocate({"k", {0}, 8, 1024, bit(DType::i32), bit(ReduceOp::minloc)});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), Code::invalid_argument);
  EXPECT_NE(b.status().message().find("minloc"), std::string::npos);
  // One defined pair among meaningless ones is enough (f32 band is simply not needed).
  EXPECT_TRUE(
      al.allocate({"m", {0}, 8, 1024, bit(DType::f32) | bit(DType::i32), bit(ReduceOp::band)})
          .ok());
}

TEST(Allocator, DeterministicModeCostsMemoryPerChild) {
  auto t = *make_fat_tree2(4, "server");
  // Leaves get 2 hosts; spines 4 leaves. 16 slots of 8 KiB, two versions: 256 KiB per copy.
  t.profiles[0].memory_bytes = 1u << 20;  // 1 MiB: 4 copies
  Allocator al(t);
  JobRequest plain{"p", {0, 1, 2, 3}, 16, 8192};
  auto a = al.allocate(plain);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  ASSERT_TRUE(al.release("p").ok());
  JobRequest det{"d", {0, 1, 2, 3}, 16, 8192, 0, 0, true};  // leaf: 2 children + 1 = 3 copies
  ASSERT_TRUE(al.allocate(det).ok());
  JobRequest det2{"d2", {0, 1}, 16, 8192, 0, 0, true};  // leaf0 has 1 copy left, needs 3
  auto r = al.allocate(det2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::resource_exhausted);
  EXPECT_NE(r.status().message().find("memory"), std::string::npos) << r.status().message();
}

TEST(Allocator, PartitionedFabricIsAPrecondition) {
  auto t = load_topology_yaml(
      "switches: [{name: a, level: 0}, {name: b, level: 0}, {name: s, level: 1}]\n"
      "hosts: [{name: x, address: 10.0.0.1, switch: a}, {name: y, address: 10.0.0.2, switch: b}]\n"
      "links: [{a: a, b: s}]\n");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  Allocator al(*t);
  auto r = al.allocate({"j", {0, 1}});
  EXPECT_EQ(r.status().code(), Code::failed_precondition);
  EXPECT_NE(r.status().message().find("partitioned"), std::string::npos);
}

TEST(Allocator, AdoptRestoresExactly) {
  auto t = *make_fat_tree3(4);
  Allocator al(t);
  auto a = al.allocate({"j", {0, 5, 9, 15}, 32});
  ASSERT_TRUE(a.ok());
  std::vector<Usage> before;
  for (std::uint32_t s = 0; s < t.switches.size(); ++s) before.push_back(al.usage(s));
  Allocator fresh(t);
  ASSERT_TRUE(fresh.adopt(*a).ok());
  for (std::uint32_t s = 0; s < t.switches.size(); ++s) EXPECT_EQ(fresh.usage(s), before[s]);
  EXPECT_EQ(fresh.adopt(*a).code(), Code::already_exists);
  Allocation other = *a;
  other.job = "k";
  EXPECT_EQ(fresh.adopt(other).code(), Code::already_exists);  // same tree id
  other.tree_id = 999;
  other.slots = 4096;  // more than a switch has
  EXPECT_EQ(fresh.adopt(other).code(), Code::resource_exhausted);
  // A new job never gets an adopted tree's id.
  auto b = fresh.allocate({"new", {0, 15}});
  ASSERT_TRUE(b.ok());
  EXPECT_NE(b->tree_id, a->tree_id);
}

TEST(Allocator, DownSwitchesAreAvoided) {
  auto t = *make_fat_tree2(4);  // spines 4 and 5
  Allocator al(t);
  auto a = al.allocate({"j", {0, 2}});
  ASSERT_TRUE(a.ok());
  auto hit = al.set_switch_up(a->nodes[0].sw, false);
  EXPECT_EQ(hit, std::vector<std::string>{"j"});
  for (int i = 0; i < 5; ++i) {
    auto b = al.allocate({"k" + std::to_string(i), {0, 2}});
    ASSERT_TRUE(b.ok());
    EXPECT_NE(b->nodes[0].sw, a->nodes[0].sw);
  }
  al.set_switch_up(std::uint32_t(t.find_switch("leaf0")), false);
  auto c = al.allocate({"c", {0, 2}});
  EXPECT_EQ(c.status().code(), Code::failed_precondition);
  EXPECT_NE(c.status().message().find("down"), std::string::npos);
}

TEST(Allocator, ParallelEvaluationChoosesTheSameTrees) {
  auto t = *make_fat_tree3(16);
  Allocator seq(t, {.round = 16, .parallel_threshold = 0}),
      par(t, {.round = 16, .parallel_threshold = 2});
  std::mt19937 rng(99);
  for (int i = 0; i < 60; ++i) {
    JobRequest r = random_job(rng, t, i, 200);
    auto a = seq.allocate(r);
    auto b = par.allocate(r);
    ASSERT_EQ(a.ok(), b.ok());
    if (!a.ok()) continue;
    ASSERT_EQ(a->nodes.size(), b->nodes.size());
    for (std::size_t n = 0; n < a->nodes.size(); ++n) EXPECT_EQ(a->nodes[n].sw, b->nodes[n].sw);
  }
}
