// Topology: YAML loading with line-numbered errors, generators, addresses.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "../support/test_support.h"
#include "treeduce/control/topology.h"

using namespace treeduce;
using namespace treeduce::ctl;

namespace {

std::string doc_example() { return treeduce::test_support::doc_yaml("manager.md"); }

// Expects a refusal whose sentence starts with "line N:" and mentions `what`.
void expect_error(const std::string& yaml, int line, const std::string& what) {
  auto t = load_topology_yaml(yaml);
  ASSERT_FALSE(t.ok()) << yaml;
  EXPECT_EQ(t.status().code(), Code::invalid_argument);
  EXPECT_EQ(t.status().message().rfind("line " + std::to_string(line) + ":", 0), 0u)
      << t.status().message();
  EXPECT_NE(t.status().message().find(what), std::string::npos) << t.status().message();
}

const char* kHead =
    "switches:\n"                              // 1
    "  - {name: leaf0, level: 0, ports: 4}\n"  // 2
    "  - {name: spine0, level: 1}\n";          // 3

}  // namespace

// The example docs/deploy.md installs: two leaves under one spine.
TEST(Topology, DeployExampleLoads) {
  auto t = load_topology_file(std::string(TREEDUCE_SOURCE_ROOT) + "/deploy/examples/topology.yaml");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->switches.size(), 3u);
  EXPECT_EQ(t->hosts.size(), 4u);
  EXPECT_EQ(t->levels(), 2u);
}

TEST(Topology, DocExampleLoads) {
  const std::string yaml = doc_example();
  ASSERT_FALSE(yaml.empty()) << "docs/manager.md lost its yaml example";
  auto t = load_topology_yaml(yaml);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(t->switches.size(), 4u);
  EXPECT_EQ(t->hosts.size(), 4u);
  EXPECT_EQ(t->levels(), 2u);
  EXPECT_EQ(t->num_leaves(), 2u);
  auto leaf0 = t->find_switch("leaf0");
  ASSERT_GE(leaf0, 0);
  EXPECT_EQ(t->profile_of(std::uint32_t(leaf0)).name, "small-q2");
  EXPECT_EQ(t->profile_of(std::uint32_t(leaf0)).max_trees, 8u);
  EXPECT_EQ(t->profile_of(std::uint32_t(leaf0)).max_payload_bytes, 1024u);  // from quantum2
  EXPECT_EQ(t->switches[std::uint32_t(leaf0)].up.size(), 2u);
  EXPECT_EQ(to_string(t->switches[std::uint32_t(leaf0)].data), "10.0.0.1:4791");
  EXPECT_EQ(t->find_host_by_ip(parse_address("10.1.0.3")->ip), t->find_host("h2"));
  // Both spines reach both leaves.
  auto spine = std::uint32_t(t->find_switch("spine1"));
  EXPECT_EQ(t->below(spine)[0], 0b11u);
}

TEST(Topology, ErrorsNameTheLine) {
  const std::string h = kHead;
  expect_error(h + "  - {name: leaf0, level: 1}\n", 4, "defined twice (first on line 2)");
  expect_error(h + "  - {name: x, level: -1}\n", 4, "non-negative whole number");
  expect_error(h + "  - {name: x, level: 0, profile: nope}\n", 4, "unknown profile 'nope'");
  expect_error(h + "  - {name: x}\n", 4, "has no 'level'");
  expect_error(h + "  - {name: x, level: 0, colour: red}\n", 4, "unknown key 'colour'");
  expect_error(h + "hosts:\n  - {name: h, address: 10.0.0.300, switch: leaf0}\n", 5,
               "not an IPv4 address");
  expect_error(h + "hosts:\n  - {name: h, address: 10.0.0.1, switch: spine0}\n", 5, "not a leaf");
  expect_error(h + "hosts:\n  - {name: h, address: 10.0.0.1, switch: leaf9}\n", 5,
               "unknown switch 'leaf9'");
  expect_error(h + "hosts:\n  - {name: h, address: 10.0.0.1, switch: leaf0, port: 5}\n", 5,
               "ports 1..4");
  expect_error(h + "hosts:\n"
                   "  - {name: h, address: 10.0.0.1, switch: leaf0, port: 1}\n"
                   "  - {name: g, address: 10.0.0.2, switch: leaf0, port: 1}\n",
               6, "already used on line 5");
  expect_error(h + "hosts:\n"
                   "  - {name: h, address: 10.0.0.1, switch: leaf0}\n"
                   "  - {name: g, address: 10.0.0.1, switch: leaf0}\n",
               6, "reuses the address");
  expect_error(h + "links:\n  - {a: leaf0, b: leaf0}\n", 5, "adjacent levels");
  expect_error(h + "links:\n  - {a: leaf0, b: spine0}\n  - {a: spine0, b: leaf0}\n", 6,
               "listed twice");
  expect_error(h + "links: 3\n", 4, "must be a list");
  expect_error("switches:\n  - {name: [a, b], level: 0}\n", 2, "single value");
  expect_error("switches:\n  - {name: a, level: 0\n", 3, "");  // parser error, end of input
  expect_error("profiles:\n  - {name: p, base: q}\nswitches: []\n", 2, "unknown profile 'q'");
  expect_error("profiles:\n  - {name: p, max_payload_bytes: 300}\nswitches: []\n", 2,
               "power of two");
  // Names go into the store's JSON documents: the text must be UTF-8 (found by fuzz-registry, a
  // comment of Latin-1 through set_topology), and valid UTF-8 passes.
  expect_error(h + "# caf\xe9\n", 4, "byte " + std::to_string(h.size() + 5) + " is not UTF-8");
  expect_error(h + "  - {name: \"\xed\xa0\x80\", level: 0}\n", 4, "is not UTF-8");  // surrogate
  EXPECT_TRUE(load_topology_yaml(h + "# café ✓ \xf0\x9f\x94\x8c\n").ok());
}

// A profile may say which types and operations its model reduces, by name; a pair is offloaded
// when both are listed and the pair is defined.
TEST(Topology, ProfilesNameTheirTypesAndOperations) {
  auto t = load_topology_yaml(
      "profiles:\n"
      "  - {name: ints, base: quantum2, dtypes: [i32, uint64, MPI_2INT], ops: [sum, bxor, "
      "minloc]}\n"
      "  - {name: every, base: tofino, dtypes: all, ops: all}\n"
      "switches:\n  - {name: a, level: 0, profile: ints}\n  - {name: b, level: 0, profile: "
      "every}\n");
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  const ResourceProfile& ints = t->profile_of(std::uint32_t(t->find_switch("a")));
  EXPECT_EQ(ints.dtype_mask, bit(DType::i32) | bit(DType::u64) | bit(DType::i32_i32));
  EXPECT_EQ(ints.op_mask, bit(ReduceOp::sum) | bit(ReduceOp::bxor) | bit(ReduceOp::minloc));
  EXPECT_TRUE(offloads(ints, DType::u64, ReduceOp::bxor));
  EXPECT_TRUE(offloads(ints, DType::i32_i32, ReduceOp::minloc));
  EXPECT_FALSE(offloads(ints, DType::i32_i32, ReduceOp::sum));
  EXPECT_EQ(ints.max_payload_bytes, 1024u);  // the rest from quantum2
  const ResourceProfile& every = t->profile_of(std::uint32_t(t->find_switch("b")));
  EXPECT_EQ(every.dtype_mask, kAllDTypesMask);
  EXPECT_EQ(every.op_mask, kAllOpsMask);
  EXPECT_EQ(every.max_payload_bytes, 256u);  // from tofino
  expect_error("profiles:\n  - {name: p, dtypes: [f32, quad]}\nswitches: []\n", 2,
               "'quad' is not an element type");
  expect_error("profiles:\n  - {name: p, ops: [sum, avg]}\nswitches: []\n", 2,
               "'avg' is not an operation");
  expect_error("profiles:\n  - {name: p, dtypes: f32}\nswitches: []\n", 2,
               "list of names or 'all'");
  expect_error("profiles:\n  - {name: p, dtypes: [f32, f64], ops: [band, lor]}\nswitches: []\n", 2,
               "make no defined pair");
}

TEST(Topology, StructuralErrors) {
  EXPECT_EQ(load_topology_yaml("switches: []\n").status().code(), Code::invalid_argument);
  EXPECT_EQ(load_topology_file("/nonexistent/x.yaml").status().code(), Code::not_found);
  // Found by tests/fuzz/fuzz_topology.cpp: a fabric without leaves read past an empty vector.
  auto r = load_topology_yaml("switches:\n  - {name: s, level: 2}\n");
  EXPECT_EQ(r.status().message(), "The topology has no leaf (level-0) switch.");
  r = load_topology_yaml("switches:\n  - {name: l, level: 0}\n  - {name: s, level: 2}\n");
  EXPECT_EQ(r.status().message(), "The topology has switches at level 2 but none at level 1.");
}

TEST(Topology, Addresses) {
  EXPECT_EQ(to_string(*parse_address("192.168.1.2:80")), "192.168.1.2:80");
  EXPECT_EQ(parse_address("1.2.3.4")->ip, 0x01020304u);
  for (const char* bad :
       {"", "1.2.3", "1.2.3.4.5", "1.2.3.4:", "1.2.3.4:70000", "a.b.c.d", "1.2.3.256", "1..2.3"})
    EXPECT_FALSE(parse_address(bad).ok()) << bad;
}

TEST(Generators, FatTreeSizes) {
  for (std::uint32_t k : {4u, 16u}) {
    auto t = make_fat_tree3(k);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->hosts.size(), k * k * k / 4);
    EXPECT_EQ(t->switches.size(), 5 * k * k / 4);
    EXPECT_EQ(t->levels(), 3u);
    // Every core reaches every edge switch; an aggregation switch only its pod's.
    for (std::uint32_t c : t->at_level(2))
      EXPECT_EQ(std::uint32_t(std::popcount(t->below(c)[0]) +
                              (t->leaf_words() > 1 ? std::popcount(t->below(c)[1]) : 0)),
                t->num_leaves());
    for (std::uint32_t a : t->at_level(1)) EXPECT_EQ(t->switches[a].down.size(), k / 2);
  }
  auto t2 = make_fat_tree2(8);
  ASSERT_TRUE(t2.ok());
  EXPECT_EQ(t2->hosts.size(), 32u);
  EXPECT_EQ(t2->at_level(1).size(), 4u);
  EXPECT_EQ(make_fat_tree3(5).status().code(), Code::invalid_argument);
  EXPECT_EQ(make_fat_tree2(4, "nope").status().code(), Code::invalid_argument);
}

TEST(Generators, RailOptimised) {
  auto t = make_rail_optimised(2, 4, 8, 4);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->hosts.size(), 2u * 4 * 8);
  EXPECT_EQ(t->num_leaves(), 16u);
  // Rail 3 of server 1 in group 1 hangs off group 1's rail-3 leaf.
  auto h = t->find_host("g1-s1-r3");
  ASSERT_GE(h, 0);
  EXPECT_EQ(t->switches[t->hosts[std::size_t(h)].leaf].name, "g1-rail3");
  EXPECT_FALSE(make_rail_optimised(0, 1, 1, 1).ok());
}
