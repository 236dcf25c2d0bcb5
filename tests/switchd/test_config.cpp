// treeduce-switch configuration: the documented example, one exact line-numbered sentence per
// error, command-line overrides on top of a file, and the address helpers.
#include "config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include "../support/test_support.h"

using namespace treeduce;
using namespace treeduce::switchd;

namespace {

std::string doc_example() { return treeduce::test_support::doc_yaml("switch-config.md"); }

// `text` with its one occurrence of `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  EXPECT_EQ(text.find(from, at + 1), std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

std::string error_of(const std::string& yaml) {
  ConfigResult r = parse_config_yaml(yaml, "t.yaml");
  EXPECT_FALSE(r.config.has_value()) << yaml;
  EXPECT_FALSE(r.help);
  return r.error;
}

SwitchConfig load(const std::string& yaml) {
  ConfigResult r = parse_config_yaml(yaml, "t.yaml");
  EXPECT_TRUE(r.config.has_value()) << r.error;
  return r.config.value_or(SwitchConfig{});
}

using Mac = std::array<std::uint8_t, 6>;

// Line numbers below count from here.
const std::string kSwitch =
    "name: s\n"                          // 1
    "data: 10.0.0.1:47110\n"             // 2
    "ports:\n"                           // 3
    "  - {name: p0, ip: 10.2.0.1/30}\n"  // 4
    ;
const std::string kTree =
    "trees:\n"                          // 5
    "  - tree: 7\n"                     // 6
    "    key: 0x10\n"                   // 7
    "    role: leaf\n"                  // 8
    "    parent: 10.0.0.3:47110\n"      // 9
    "    children:\n"                   // 10
    "      - {addr: 10.1.0.1:50000}\n"  // 11
    ;

}  // namespace

// The example docs/deploy.md installs for a leaf on a NIC bound to vfio-pci (PCI-named ports).
TEST(SwitchConfig, DeployExampleLoads) {
  std::ifstream in(std::string(TREEDUCE_SOURCE_ROOT) + "/deploy/examples/switch-leaf0.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  ASSERT_FALSE(ss.str().empty()) << "deploy/examples/switch-leaf0.yaml is missing";
  const SwitchConfig c = load(ss.str());
  EXPECT_EQ(c.name, "leaf0");
  ASSERT_EQ(c.ports.size(), 2u);
  EXPECT_EQ(c.ports[0].name, "0000:03:00.0");
  EXPECT_EQ(c.ports[1].mtu, 9000u);
  EXPECT_EQ(c.manager, "10.0.0.100:9300");
}

TEST(SwitchConfig, DocExampleLoads) {
  const std::string yaml = doc_example();
  ASSERT_FALSE(yaml.empty()) << "docs/switch-config.md lost its yaml example";
  const SwitchConfig c = load(yaml);
  EXPECT_EQ(c.name, "leaf0");
  EXPECT_EQ(c.data.ip, 0x0A000001u);
  EXPECT_EQ(c.data.port, 47110);
  ASSERT_EQ(c.ports.size(), 2u);
  EXPECT_EQ(c.ports[0].name, "net_memif0");
  EXPECT_EQ(c.ports[0].ip, 0x0A020001u);
  EXPECT_EQ(c.ports[0].prefix, 30);
  EXPECT_FALSE(c.ports[0].mac.has_value());
  EXPECT_EQ(c.ports[0].mtu, 0u);
  EXPECT_EQ(c.ports[1].name, "net_af_packet0");
  EXPECT_EQ(c.ports[1].ip, 0x0A0100FEu);
  EXPECT_EQ(c.ports[1].prefix, 24);
  EXPECT_EQ(c.ports[1].mac, (Mac{2, 0, 0, 0, 0, 1}));
  EXPECT_EQ(c.ports[1].mtu, 8400u);
  ASSERT_EQ(c.neighbors.size(), 1u);
  EXPECT_EQ(c.neighbors[0].ip, 0x0A020002u);
  EXPECT_EQ(c.neighbors[0].mac, (Mac{2, 0, 0, 0, 1, 0}));
  EXPECT_EQ(c.neighbors[0].port, "net_memif0");
  EXPECT_EQ(c.lcores, (std::vector<unsigned>{0, 1}));
  EXPECT_EQ(c.idle_sleep_us, 100u);
  EXPECT_EQ(c.idle_yield_us, 1000u);
  EXPECT_EQ(c.burst, 32u);
  EXPECT_EQ(c.tx_drain_us, 100u);
  EXPECT_EQ(c.nack_rate, 10000u);
  EXPECT_EQ(c.mbufs, 8192u);
  EXPECT_EQ(c.rx_desc, 1024u);
  EXPECT_EQ(c.tx_desc, 1024u);
  EXPECT_EQ(c.metrics_listen, "127.0.0.1:9470");
  EXPECT_EQ(c.manager, "127.0.0.1:9300");
  EXPECT_EQ(c.agent_listen, "127.0.0.1:0");
  EXPECT_EQ(c.agent_advertise, "");
  EXPECT_EQ(c.heartbeat_ms, 1000u);
  EXPECT_EQ(c.log_level, "info");
  ASSERT_EQ(c.trees.size(), 1u);
  const dp::TreeConfig& t = c.trees[0].tree;
  EXPECT_EQ(c.trees[0].job, "demo");
  EXPECT_EQ(t.tree_id, 7);
  EXPECT_EQ(t.key, 0x1234abcdu);
  EXPECT_EQ(t.role, dp::Role::leaf);
  EXPECT_EQ(t.parent.ip, 0x0A000003u);
  EXPECT_EQ(t.parent.port, 47110);
  EXPECT_EQ(t.index_at_parent, 0);
  ASSERT_EQ(t.children.size(), 2u);
  EXPECT_EQ(t.children[1].addr.ip, 0x0A010101u);
  EXPECT_EQ(t.children[1].addr.port, 50000);
  EXPECT_EQ(t.children[1].hosts, 1);
  EXPECT_EQ(t.slots, 16u);
  EXPECT_EQ(t.payload_bytes, 1024u);
  EXPECT_EQ(t.dtype_mask, 0x3Fu | bit(DType::f64) | bit(DType::f64_i32));
  EXPECT_EQ(t.op_mask, 0x0Fu | bit(ReduceOp::minloc));
  EXPECT_FALSE(t.deterministic);
  EXPECT_EQ(validate(c), "");
}

// Every type and operation name the protocol has is a dtypes:/ops: entry, bit d and bit o.
TEST(SwitchConfig, EveryTypeAndOperationName) {
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      const SwitchConfig c = load(
          "data: 10.0.0.1\n"
          "ports: [{name: p0}]\n"
          "trees:\n"
          "  - {tree: 1, key: 1, role: root, children: [{addr: 10.1.0.1:1}], dtypes: [" +
          std::string(name(d)) + "], ops: [" + std::string(name(op)) + "]}\n");
      ASSERT_EQ(c.trees.size(), 1u) << name(d) << " " << name(op);
      EXPECT_EQ(c.trees[0].tree.dtype_mask, bit(d));
      EXPECT_EQ(c.trees[0].tree.op_mask, bit(op));
    }
  }
  std::string all_d, all_o;
  for (DType d : kAllDTypes) all_d += (all_d.empty() ? "" : ", ") + std::string(name(d));
  for (ReduceOp op : kAllReduceOps) all_o += (all_o.empty() ? "" : ", ") + std::string(name(op));
  const SwitchConfig c = load(
      "data: 10.0.0.1\n"
      "ports: [{name: p0}]\n"
      "trees:\n"
      "  - {tree: 1, key: 1, role: root, children: [{addr: 10.1.0.1:1}], dtypes: [" +
      all_d + "], ops: [" + all_o + "]}\n");
  ASSERT_EQ(c.trees.size(), 1u);
  EXPECT_EQ(c.trees[0].tree.dtype_mask, kAllDTypesMask);
  EXPECT_EQ(c.trees[0].tree.op_mask, kAllOpsMask);
}

// The sentences docs/switch-config.md shows under "Errors".
TEST(SwitchConfig, DocErrorExamples) {
  const std::string yaml = doc_example();
  EXPECT_EQ(error_of(replaced(yaml, "slots: 16", "slots: 12")),
            "t.yaml: line 31: tree 7: slots must be a power of two from 1 to 4096, got 12.");
  EXPECT_EQ(error_of(replaced(yaml, "port: net_memif0}", "port: net_memif1}")),
            "t.yaml: line 7: neighbor 10.2.0.2 is on port 'net_memif1', which the switch does not "
            "have.");
}

TEST(SwitchConfig, DefaultsAndSpellings) {
  const SwitchConfig c = load(
      "data: 10.0.0.1\n"
      "ports: [{name: p0, ip: 10.2.0.1}, {name: p1}]\n"
      "metrics: off\n"
      "manager:\n"
      "trees:\n"
      "  - {tree: 0x2, key: 18446744073709551615, role: root, dtypes: [i32, f32], ops: [max],\n"
      "     deterministic: true, children: [{addr: 10.1.0.1:1, hosts: 65534}, {addr: "
      "10.1.0.2:1}]}\n");
  EXPECT_EQ(c.name, "switch");
  EXPECT_EQ(c.data.port, dp::kDefaultUdpPort);
  EXPECT_EQ(c.ports[0].prefix, 24);
  EXPECT_EQ(c.ports[1].ip, 0u);
  EXPECT_EQ(c.metrics_listen, "");
  EXPECT_EQ(c.manager, "");
  EXPECT_EQ(c.burst, 32u);
  EXPECT_EQ(c.idle_sleep_us, 0u);
  EXPECT_EQ(c.idle_yield_us, 1000u);
  EXPECT_TRUE(c.lcores.empty());
  EXPECT_FALSE(c.faults);
  EXPECT_EQ(c.ports[0].delay_us, 0u);
  EXPECT_EQ(c.ports[0].rate_mbps, 0u);
  const dp::TreeConfig& t = c.trees.at(0).tree;
  EXPECT_EQ(t.tree_id, 2);
  EXPECT_EQ(t.key, ~std::uint64_t{0});
  EXPECT_EQ(t.role, dp::Role::root);
  EXPECT_EQ(t.dtype_mask, 1u << 5 | 1u);
  EXPECT_EQ(t.op_mask, 1u << 2);
  EXPECT_TRUE(t.deterministic);
  EXPECT_EQ(t.slots, 8u);
  EXPECT_EQ(t.payload_bytes, 1024u);
  EXPECT_EQ(t.children.at(0).hosts, 65534);
  EXPECT_EQ(t.children.at(1).hosts, 1);
}

TEST(SwitchConfig, PortFaults) {
  const SwitchConfig c = load(
      "data: 10.0.0.1\n"
      "faults: true\n"
      "ports: [{name: p0, rx_loss: 0.5, delay_us: 1000000, rate_mbps: 100}, {name: p1}]\n");
  EXPECT_TRUE(c.faults);
  EXPECT_EQ(c.ports[0].rx_loss, 0.5);
  EXPECT_EQ(c.ports[0].delay_us, 1000000u);
  EXPECT_EQ(c.ports[0].rate_mbps, 100u);
  EXPECT_EQ(c.ports[1].delay_us, 0u);
  EXPECT_EQ(error_of("data: 10.0.0.1\nports: [{name: p0, delay_us: 1000001}]\n"),
            "t.yaml: line 2: port 'p0': delay_us must be from 0 to 1000000, got 1000001.");
  EXPECT_EQ(error_of("data: 10.0.0.1\nports:\n  - {name: p0,\n     rate_mbps: 1000001}\n"),
            "t.yaml: line 4: port 'p0': rate_mbps must be from 0 to 1000000, got 1000001.");
  EXPECT_EQ(error_of("data: 10.0.0.1\nfaults: yes\nports: [{name: p0}]\n"),
            "t.yaml: line 2: faults: \"yes\" is not true or false.");
}

TEST(SwitchConfig, SwitchErrorsNameTheLine) {
  const std::string& s = kSwitch;
  const std::pair<std::string, std::string> cases[] = {
      {"name: [a\n", "line 2: end of sequence flow not found."},
      {"- a\n", "line 1: a switch config is a map of settings."},
      {s + "burts: 3\n", "line 5: the config has an unknown key 'burts'."},
      {s + "name: t\n", "line 5: the config has 'name' twice."},
      {s + "burst: abc\n", "line 5: burst: \"abc\" is not a number."},
      {s + "burst: [1]\n", "line 5: burst must be a single value."},
      {s + "mbufs: -1\n", "line 5: mbufs: \"-1\" is not a number."},
      {s + "tx_drain_us: 4294967296\n", "line 5: tx_drain_us: 4294967296 is more than 4294967295."},
      {s + "burst: 65\n", "line 5: burst must be from 1 to 64, got 65."},
      {s + "burst: 0\n", "line 5: burst must be from 1 to 64, got 0."},
      {s + "idle_sleep_us: 1000001\n",
       "line 5: idle_sleep_us must be from 0 to 1000000, got 1000001."},
      {s + "idle_yield_us: 1000001\n",
       "line 5: idle_yield_us must be from 0 to 1000000, got 1000001."},
      {s + "heartbeat_ms: 5\n", "line 5: heartbeat_ms must be from 10 to 60000, got 5."},
      {s + "nack_rate: 100000001\n",
       "line 5: nack_rate must be from 0 to 100000000, got 100000001."},
      {s + "rx_desc: 16\n", "line 5: rx_desc must be from 32 to 16384, got 16."},
      {s + "log_level: loud\n",
       "line 5: log_level must be trace, debug, info, warn or error, got \"loud\"."},
      {s + "manager: localhost\n",
       "line 5: manager must be \"\" or HOST:PORT with a port from 1 to 65535, got \"localhost\"."},
      {s + "metrics: 127.0.0.1\n",
       "line 5: metrics must be \"\" or A.B.C.D:PORT or localhost:PORT with a port from 0 to "
       "65535, got \"127.0.0.1\"."},
      // The HTTP server binds no names: this was accepted, then stopped the started switch.
      {s + "metrics: metrics.example:9470\n",
       "line 5: metrics must be \"\" or A.B.C.D:PORT or localhost:PORT with a port from 0 to "
       "65535, got \"metrics.example:9470\"."},
      // The server reads its port in decimal only: a hex one, accepted here, stopped the switch.
      {s + "metrics: 127.0.0.1:0x24fe\n",
       "line 5: metrics must be \"\" or A.B.C.D:PORT or localhost:PORT with a port from 0 to "
       "65535, got \"127.0.0.1:0x24fe\"."},
      {s + "agent_listen: \"\"\n",
       "line 5: agent_listen must be HOST:PORT with a port from 0 to 65535, got \"\"."},
      {s + "deterministic_allowed: maybe\n",
       "line 5: deterministic_allowed: \"maybe\" is not true or false."},
      {replaced(s, "name: s", "name: \"\""), "line 1: name must not be empty."},
      {replaced(s, "10.0.0.1:47110", "256.0.0.1:47110"),
       "line 2: data: \"256.0.0.1:47110\" is not an IPv4 address and UDP port (A.B.C.D:PORT)."},
      {replaced(s, "10.0.0.1:47110", "10.0.0.1:65536"),
       "line 2: data: \"10.0.0.1:65536\" is not an IPv4 address and UDP port (A.B.C.D:PORT)."},
      {replaced(s, "10.0.0.1:47110", "10.0.0.1:0"),
       "line 2: data's UDP port must be from 1 to 65535, got 0."},
      {replaced(s, "data: 10.0.0.1:47110\n", ""),
       "line 1: the switch has no data address (data: A.B.C.D:PORT, or --data)."},
      {"data: 10.0.0.1\n\nports: []\n", "line 3: the switch has no ports (ports:, or --port)."},
      {"data: 10.0.0.1\nports: p0\n", "line 2: ports must be a list."},
      {s + "  - p1\n", "line 5: a port must be a map."},
      {s + "  - {ip: 10.2.0.5/30}\n", "line 5: a port has no 'name'."},
      {s + "  - {name: p0}\n", "line 5: port 'p0' is listed twice."},
      {s + "  - {name: p1, speed: 10}\n", "line 5: port 'p1' has an unknown key 'speed'."},
      {s + "  - {name: p1, ip: 10.2.0.5/x}\n",
       "line 5: port 'p1': ip: \"10.2.0.5/x\" is not an IPv4 address with a prefix length "
       "(A.B.C.D/P)."},
      {s + "  - {name: p1, ip: 10.2.0.5/33}\n",
       "line 5: port 'p1': the prefix length must be from 0 to 32, got 33."},
      {s + "  - {name: p1, mac: \"02:00:00:00:00\"}\n",
       "line 5: port 'p1': mac: \"02:00:00:00:00\" is not a MAC address (aa:bb:cc:dd:ee:ff)."},
      {s + "  - {name: p1, mac: \"01:00:5E:00:00:01\"}\n",
       "line 5: port 'p1': mac 01:00:5e:00:00:01 is not unicast."},
      {s + "  - {name: p1, mtu: 67}\n",
       "line 5: port 'p1': mtu must be 0 (keep) or from 68 to 65535, got 67."},
      {s + "neighbors:\n  - {ip: 10.2.0.2, mac: \"02:00:00:00:01:00\", port: p9}\n",
       "line 6: neighbor 10.2.0.2 is on port 'p9', which the switch does not have."},
      {s + "neighbors:\n  - {ip: 10.2.0.2, port: p0}\n", "line 6: neighbor 10.2.0.2 has no 'mac'."},
      {s + "neighbors:\n  - {ip: 10.2.0.2, mac: \"ff:ff:ff:ff:ff:ff\", port: p0}\n",
       "line 6: neighbor 10.2.0.2: mac ff:ff:ff:ff:ff:ff is not unicast."},
      {s + "neighbors:\n  - {ip: 1.2.3, mac: \"02:00:00:00:01:00\", port: p0}\n",
       "line 6: a neighbor's ip: \"1.2.3\" is not an IPv4 address (A.B.C.D)."},
      {s + "neighbors:\n"
           "  - {ip: 10.2.0.2, mac: \"02:00:00:00:01:00\", port: p0}\n"
           "  - {ip: 10.2.0.2, mac: \"02:00:00:00:01:01\", port: p0}\n",
       "line 7: neighbor 10.2.0.2 is listed twice."},
      {s + "lcores:\n  - 0\n  - 1\n  - 0\n", "line 8: lcore 0 is listed twice."},
      {s + "lcores: 1\n", "line 5: lcores must be a list."},
  };
  for (const auto& [yaml, msg] : cases) EXPECT_EQ(error_of(yaml), "t.yaml: " + msg) << yaml;
  EXPECT_EQ(load(s + "metrics: localhost:0\n").metrics_listen, "localhost:0");
  // The agent advertised itself as 0.0.0.0:PORT, which the manager dials on its own machine.
  const std::string managed = s + "manager: 10.0.0.100:9300\ninsecure: true\n";
  EXPECT_EQ(error_of(managed + "agent_listen: 0.0.0.0:9471\n"),
            "t.yaml: line 7: agent_listen 0.0.0.0:9471 is every address of this machine, which the "
            "manager cannot dial: give agent_advertise, an address and port it can reach.");
  EXPECT_EQ(load(managed + "agent_listen: 0.0.0.0:9471\nagent_advertise: 10.0.0.1:9471\n")
                .agent_advertise,
            "10.0.0.1:9471");
  EXPECT_EQ(load(s + "agent_listen: 0.0.0.0:9471\ninsecure: true\n").manager, "");
}

TEST(SwitchConfig, TreeErrorsNameTheLine) {
  const std::string t = kSwitch + kTree;
  ASSERT_EQ(load(t).trees.size(), 1u);
  std::string many = "      - {addr: 10.1.0.1:50000}\n";
  for (int i = 2; i <= 65; ++i) many += "      - {addr: 10.1.0.1:" + std::to_string(i) + "}\n";
  const std::pair<std::string, std::string> cases[] = {
      {t + "    slots: 12\n",
       "line 12: tree 7: slots must be a power of two from 1 to 4096, got 12."},
      {t + "    slots: 8192\n",
       "line 12: tree 7: slots must be a power of two from 1 to 4096, got 8192."},
      {t + "    payload_bytes: 100\n",
       "line 12: tree 7: payload_bytes must be a power of two from 256 to 8192, got 100."},
      {t + "    payload_bytes: 16384\n",
       "line 12: tree 7: payload_bytes must be a power of two from 256 to 8192, got 16384."},
      {t + "    slot: 8\n", "line 12: tree 7 has an unknown key 'slot'."},
      {t + "    dtypes: [f32, f128]\n",
       "line 12: tree 7: dtypes: \"f128\" is not one of f32, f16, bf16, e4m3, e5m2, i32, i8, u8, "
       "i16, u16, u32, i64, u64, f64, f32_i32, f64_i32, i32_i32."},
      {t + "    ops: [sum, avg]\n",
       "line 12: tree 7: ops: \"avg\" is not one of sum, min, max, prod, band, bor, bxor, land, "
       "lor, lxor, minloc, maxloc."},
      {t + "    dtypes: []\n", "line 12: tree 7: dtypes must name at least one type."},
      {t + "    ops: []\n", "line 12: tree 7: ops must name at least one operation."},
      {t + "    ops: sum\n", "line 12: tree 7: ops must be a list."},
      {t + "    index_at_parent: 64\n",
       "line 12: tree 7: index_at_parent must be from 0 to 63, got 64."},
      {t + "    deterministic: yes\n",
       "line 12: tree 7: deterministic: \"yes\" is not true or false."},
      {t + "    deterministic: true\ndeterministic_allowed: false\n",
       "line 12: tree 7: deterministic is true, but deterministic_allowed is false."},
      {t + "      - {addr: 10.1.0.1:50000}\n",
       "line 12: tree 7: child 10.1.0.1:50000 is listed twice."},
      {t + "      - {addr: 10.1.0.2:50000, hosts: 0}\n",
       "line 12: tree 7: child 10.1.0.2:50000: hosts must be from 1 to 65535, got 0."},
      {t + "      - {addr: 10.1.0.2:50000, hosts: 65535}\n",
       "line 10: tree 7: the children have 65536 hosts in all, more than 65535."},
      {t + "      - {addr: 0.0.0.0:1}\n",
       "line 12: tree 7: child 0.0.0.0:1 needs an address other than 0.0.0.0 and a port from 1 to "
       "65535."},
      {t + "      - {host: 10.1.0.2:1}\n", "line 12: tree 7: a child has no 'addr'."},
      {t + "      - {addr: 10.1.0.2:1, rank: 3}\n",
       "line 12: tree 7: child 10.1.0.2:1 has an unknown key 'rank'."},
      {t + "  - {tree: 7, key: 1, role: root, children: [{addr: 10.1.0.9:1}]}\n",
       "line 12: tree 7 is defined twice."},
      {replaced(t, "role: leaf", "role: trunk"),
       "line 8: tree 7: role: \"trunk\" is not one of leaf, inner, root."},
      {replaced(t, "role: leaf", "role: root"),
       "line 9: tree 7: a root has no parent, but parent is set."},
      {replaced(t, "    parent: 10.0.0.3:47110\n", ""),
       "line 6: tree 7: role leaf needs a parent (parent: A.B.C.D:PORT)."},
      {replaced(replaced(t, "    parent: 10.0.0.3:47110\n", ""), "leaf", "inner"),
       "line 6: tree 7: role inner needs a parent (parent: A.B.C.D:PORT)."},
      {replaced(t, "    key: 0x10\n", ""), "line 6: tree 7 has no 'key'."},
      {replaced(t, "key: 0x10", "key: 0x"), "line 7: tree 7: key: \"0x\" is not a number."},
      {replaced(t, "tree: 7", "tree: 70000"), "line 6: a tree's id: 70000 is more than 65535."},
      {replaced(t, "      - {addr: 10.1.0.1:50000}\n", ""),
       "line 10: tree 7: children must be a list."},
      {replaced(t, "    children:\n      - {addr: 10.1.0.1:50000}\n", "    children: []\n"),
       "line 10: tree 7: the number of children must be from 1 to 64, got 0."},
      {replaced(t, "      - {addr: 10.1.0.1:50000}\n", many),
       "line 10: tree 7: the number of children must be from 1 to 64, got 65."},
      {replaced(t, "    children:\n      - {addr: 10.1.0.1:50000}\n", ""),
       "line 6: tree 7 has no 'children'."},
      {kSwitch + "trees:\n  - {key: 1}\n", "line 6: a tree has no 'tree'."},
  };
  for (const auto& [yaml, msg] : cases) EXPECT_EQ(error_of(yaml), "t.yaml: " + msg) << yaml;
}

TEST(SwitchConfig, ValidateWithoutAFile) {
  SwitchConfig c;
  EXPECT_EQ(validate(c), "the switch has no data address (data: A.B.C.D:PORT, or --data).");
  c.data.ip = 0x0A000001;
  EXPECT_EQ(validate(c), "the switch has no ports (ports:, or --port).");
  PortConfig p0;
  p0.name = "p0";
  c.ports.push_back(p0);
  EXPECT_EQ(validate(c), "");
  c.ports.push_back(p0);
  EXPECT_EQ(validate(c), "port 'p0' is listed twice.");
  c.ports.pop_back();
  c.lcores = {3, 3};
  EXPECT_EQ(validate(c), "lcore 3 is listed twice.");
  c.lcores = {3};
  c.metrics_listen = "off";  // only the readers translate "off"
  EXPECT_EQ(validate(c),
            "metrics must be \"\" or A.B.C.D:PORT or localhost:PORT with a port from 0 to 65535, "
            "got \"off\".");
  c.metrics_listen = "";
  StaticTree t;
  t.tree.children = {{.addr = {{}, 0x0A010001, 1}, .hosts = 1}};
  t.tree.dtype_mask = 1u << 17 | 1u;  // f32 and no such type
  c.trees.push_back(t);
  EXPECT_EQ(validate(c), "tree 0: dtypes names a type with code 17; the codes are 0 to 16.");
  c.trees[0].tree.dtype_mask = 0x3F;
  c.trees[0].tree.op_mask = 1u << 12 | 1u;  // no such operation
  EXPECT_EQ(validate(c), "tree 0: ops names an operation with code 12; the codes are 0 to 11.");
  c.trees[0].tree.op_mask = kAllOpsMask;
  EXPECT_EQ(validate(c), "");
}

namespace {

class ConfigArgs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "treeduce-config-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    doc_ = write("leaf0.yaml", doc_example());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  static ConfigResult args(std::vector<const char*> a) {
    a.insert(a.begin(), "treeduce-switch");
    return parse_args(static_cast<int>(a.size()), a.data());
  }
  // The error of a command line that must be refused.
  static std::string refused(std::vector<const char*> a) {
    ConfigResult r = args(std::move(a));
    EXPECT_FALSE(r.config.has_value());
    EXPECT_FALSE(r.help);
    EXPECT_EQ(r.error.find('\n'), std::string::npos) << r.error;
    return r.error;
  }

  std::string dir_, doc_;
};

}  // namespace

TEST_F(ConfigArgs, FlagsOverrideTheFile) {
  ConfigResult r = args({"--name",
                         "a",
                         "--burst",
                         "16",
                         "--config",
                         doc_.c_str(),
                         "--name",
                         "b",
                         "--idle-sleep-us",
                         "0",
                         "--metrics",
                         "off",
                         "--lcores",
                         "2,3",
                         "--neighbor",
                         "10.2.0.9,02:00:00:00:00:09,net_af_packet0",
                         "--data",
                         "10.0.0.9:4000",
                         "--run-ms",
                         "1500",
                         "--exit-idle-ms",
                         "200",
                         "--manager",
                         "",
                         "--log-level",
                         "debug",
                         "--mbufs",
                         "4096",
                         "--deterministic-allowed",
                         "false",
                         "--tx-drain-us",
                         "50",
                         "--idle-yield-us",
                         "0"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  const SwitchConfig& c = *r.config;
  EXPECT_EQ(c.name, "b");  // the last one counts
  EXPECT_EQ(c.burst, 16u);
  EXPECT_EQ(c.idle_sleep_us, 0u);
  EXPECT_EQ(c.idle_yield_us, 0u);
  EXPECT_EQ(c.metrics_listen, "");
  EXPECT_EQ(c.lcores, (std::vector<unsigned>{2, 3}));
  ASSERT_EQ(c.neighbors.size(), 2u);  // appended to the file's
  EXPECT_EQ(c.neighbors[1].ip, 0x0A020009u);
  EXPECT_EQ(c.neighbors[1].mac, (Mac{2, 0, 0, 0, 0, 9}));
  EXPECT_EQ(c.neighbors[1].port, "net_af_packet0");
  EXPECT_EQ(c.data.ip, 0x0A000009u);
  EXPECT_EQ(c.data.port, 4000);
  EXPECT_EQ(c.run_ms, 1500u);
  EXPECT_EQ(c.exit_idle_ms, 200u);
  EXPECT_EQ(c.manager, "");
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.mbufs, 4096u);
  EXPECT_FALSE(c.deterministic_allowed);
  EXPECT_EQ(c.tx_drain_us, 50u);
  // What no flag touched stays the file's.
  EXPECT_EQ(c.ports.size(), 2u);
  EXPECT_EQ(c.trees.size(), 1u);
  EXPECT_EQ(c.heartbeat_ms, 1000u);
  EXPECT_EQ(c.agent_listen, "127.0.0.1:0");
}

TEST_F(ConfigArgs, PortsReplaceTheFile) {
  ConfigResult r =
      args({"--config", doc_.c_str(), "--port",
            "net_memif0,ip=10.9.0.1/16,mac=02:AA:bb:cc:dd:ee,mtu=1500,delay_us=20,rate_mbps=50",
            "--port", "net_null0", "--lcores", "", "--faults", "true"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  const SwitchConfig& c = *r.config;
  ASSERT_EQ(c.ports.size(), 2u);
  EXPECT_EQ(c.ports[0].name, "net_memif0");
  EXPECT_EQ(c.ports[0].ip, 0x0A090001u);
  EXPECT_EQ(c.ports[0].prefix, 16);
  EXPECT_EQ(c.ports[0].mac, (Mac{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee}));
  EXPECT_EQ(c.ports[0].mtu, 1500u);
  EXPECT_EQ(c.ports[0].delay_us, 20u);
  EXPECT_EQ(c.ports[0].rate_mbps, 50u);
  EXPECT_TRUE(c.faults);
  EXPECT_EQ(c.ports[1].name, "net_null0");
  EXPECT_EQ(c.ports[1].ip, 0u);
  EXPECT_FALSE(c.ports[1].mac.has_value());
  EXPECT_TRUE(c.lcores.empty());
  // The file's neighbour was on net_memif0, which the new list still has; without it, it is not.
  EXPECT_EQ(refused({"--config", doc_.c_str(), "--port", "net_null0"}),
            "neighbor 10.2.0.2 is on port 'net_memif0', which the switch does not have.");
}

TEST_F(ConfigArgs, WithoutAFile) {
  ConfigResult r = args({"--data", "10.0.0.5", "--port", "net_tap0,ip=10.1.0.1/24"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  EXPECT_EQ(r.config->data.ip, 0x0A000005u);
  EXPECT_EQ(r.config->data.port, dp::kDefaultUdpPort);
  EXPECT_EQ(r.config->ports.at(0).name, "net_tap0");
  EXPECT_EQ(r.config->ports.at(0).prefix, 24);
  EXPECT_EQ(r.config->metrics_listen, "127.0.0.1:9470");
  EXPECT_EQ(refused({}), "the switch has no data address (data: A.B.C.D:PORT, or --data).");
  EXPECT_EQ(refused({"--data", "10.0.0.5"}), "the switch has no ports (ports:, or --port).");
}

TEST_F(ConfigArgs, BadArgumentsAreOneSentence) {
  const char* doc = doc_.c_str();
  const std::string bad = write("bad.yaml", replaced(doc_example(), "burst: 32", "burst: 99"));
  EXPECT_EQ(refused({"--config", doc, "--idle-sleep-us", "abc"}),
            "--idle-sleep-us: \"abc\" is not a number.");
  EXPECT_EQ(refused({"--config", doc, "--burst", "0"}), "burst must be from 1 to 64, got 0.");
  EXPECT_EQ(refused({"--config", doc, "--heartbeat-ms", "-5"}),
            "--heartbeat-ms: \"-5\" is not a number.");
  EXPECT_EQ(refused({"--config", doc, "--name"}), "--name needs a value.");
  EXPECT_EQ(refused({"--config", doc, "--bogus", "1"}), "unknown argument \"--bogus\".");
  EXPECT_EQ(refused({"--config", doc, "stray"}), "unknown argument \"stray\".");
  EXPECT_EQ(refused({"--config", doc, "--data", "10.0.0.1:x"}),
            "--data: \"10.0.0.1:x\" is not an IPv4 address and UDP port (A.B.C.D:PORT).");
  EXPECT_EQ(refused({"--config", doc, "--deterministic-allowed", "no"}),
            "--deterministic-allowed: \"no\" is not true or false.");
  EXPECT_EQ(refused({"--config", doc, "--lcores", "1,x"}), "--lcores: \"x\" is not a number.");
  EXPECT_EQ(
      refused({"--config", doc, "--port", "p0,speed=10"}),
      "--port: \"speed=10\" in \"p0,speed=10\" is not ip=, mac=, mtu=, rx_loss=, delay_us= or "
      "rate_mbps=.");
  EXPECT_EQ(refused({"--config", doc, "--port", "p0,ip=1.2.3"}),
            "--port p0: ip: \"1.2.3\" is not an IPv4 address with a prefix length (A.B.C.D/P).");
  EXPECT_EQ(refused({"--config", doc, "--port", "p0,mac=02:00:00:00:00:0g"}),
            "--port p0: mac: \"02:00:00:00:00:0g\" is not a MAC address (aa:bb:cc:dd:ee:ff).");
  EXPECT_EQ(refused({"--config", doc, "--port", "p0,mtu=big"}),
            "--port p0: mtu: \"big\" is not a number.");
  EXPECT_EQ(refused({"--config", doc, "--port", ",ip=10.0.0.1/8"}),
            "a port name must not be empty.");
  EXPECT_EQ(refused({"--config", doc, "--neighbor", "10.2.0.9,02:00:00:00:00:09"}),
            "--neighbor: \"10.2.0.9,02:00:00:00:00:09\" is not IP,MAC,PORT.");
  EXPECT_EQ(refused({"--config", doc, "--neighbor", "10.2.0.9,02:00:00:00:00,net_memif0"}),
            "--neighbor: \"02:00:00:00:00\" is not a MAC address (aa:bb:cc:dd:ee:ff).");
  EXPECT_EQ(refused({"--config", bad.c_str()}),
            bad + ": line 10: burst must be from 1 to 64, got 99.");
  EXPECT_EQ(refused({"--config", (dir_ + "/none.yaml").c_str()}),
            dir_ + "/none.yaml: cannot open the file (No such file or directory).");
}

TEST_F(ConfigArgs, Help) {
  ConfigResult r = args({"--config", doc_.c_str(), "--help"});
  EXPECT_TRUE(r.help);
  EXPECT_FALSE(r.config.has_value());
  for (const char* flag :
       {"--config", "--port", "--neighbor", "--lcores", "--idle-sleep-us", "--metrics",
        "--agent-advertise", "--exit-idle-ms", "docs/switch-config.md"})
    EXPECT_NE(r.error.find(flag), std::string::npos) << flag << " not in:\n" << r.error;
}

TEST(Addresses, ParseIpv4) {
  EXPECT_EQ(parse_ipv4("10.1.2.3"), 0x0A010203u);
  EXPECT_EQ(parse_ipv4("0.0.0.0"), 0u);
  EXPECT_EQ(parse_ipv4("255.255.255.255"), 0xFFFFFFFFu);
  for (const char* bad : {"", "1.2.3", "1.2.3.4.5", "256.0.0.1", "1.2.3.256", "01.2.3.4",
                          "1.2.3.00", "1..2.3", "1.2.3.", ".1.2.3", "1.2.3.4 ", " 1.2.3.4",
                          "1.2.3.-4", "1.2.3.+4", "1.2.3.a", "1.2.3.4:80", "1000.2.3.4"})
    EXPECT_FALSE(parse_ipv4(bad).has_value()) << bad;
  EXPECT_EQ(format_ipv4(0x0A0100FE), "10.1.0.254");
  EXPECT_EQ(format_ipv4(0), "0.0.0.0");
  EXPECT_EQ(format_ipv4(0xFFFFFFFF), "255.255.255.255");
}

// The one parser of the metrics address: the check above and MetricsServer::start().
TEST(Addresses, ParseMetricsListen) {
  const auto m = parse_metrics_listen("10.0.0.1:9470");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->host, "10.0.0.1");
  EXPECT_EQ(m->port, 9470);
  EXPECT_EQ(parse_metrics_listen("localhost:0")->port, 0);
  EXPECT_EQ(parse_metrics_listen("localhost:65535")->port, 65535);
  for (const char* bad : {"", "9470", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", ":80",
                          "127.0.0.1:0x50", "127.0.0.1:+80", "127.0.0.1:-1", "010.0.0.1:80",
                          "example.com:80", "[::1]:80", "::1:80", " 127.0.0.1:80"})
    EXPECT_FALSE(parse_metrics_listen(bad).has_value()) << bad;
}

TEST(Addresses, ParseMac) {
  EXPECT_EQ(parse_mac("02:aB:Cd:eF:00:ff"), (Mac{0x02, 0xab, 0xcd, 0xef, 0x00, 0xff}));
  for (const char* bad : {"", "02:00:00:00:00", "02:00:00:00:00:00:00", "2:00:00:00:00:00:0",
                          "02-00-00-00-00-00", "02:00:00:00:00:0g", "020000000000",
                          "02:00:00:00:00:000", "+2:00:00:00:00:00", " 2:00:00:00:00:00"})
    EXPECT_FALSE(parse_mac(bad).has_value()) << bad;
  const Mac m{0x02, 0xab, 0x0c, 0xd0, 0x00, 0xff};
  EXPECT_EQ(format_mac(m.data()), "02:ab:0c:d0:00:ff");
  EXPECT_EQ(parse_mac(format_mac(m.data())), m);
}

// A switch with a manager needs certificates or an explicit insecure (docs/deploy.md, "TLS"):
// one sentence otherwise. `--insecure` alone is `--insecure true`; both at once is refused.
TEST_F(ConfigArgs, ManagerNeedsCertificatesOrInsecure) {
  const std::string plain = write("plain.yaml", kSwitch + "manager: 127.0.0.1:9300\n");
  EXPECT_EQ(refused({"--config", plain.c_str()}),
            "no TLS certificates: give tls_ca, tls_cert and tls_key (docs/deploy.md, \"TLS\"), "
            "or insecure: true to run without authentication in a lab or test.");
  EXPECT_EQ(refused({"--config", plain.c_str(), "--tls-ca", "/ca.pem"}),
            "give all of tls_ca, tls_cert and tls_key (a CA, a certificate and its key).");
  EXPECT_EQ(refused({"--config", plain.c_str(), "--insecure", "--tls-ca", "/a", "--tls-cert", "/b",
                     "--tls-key", "/c"}),
            "both certificates and insecure: true are given; choose one.");
  ConfigResult r = args({"--config", plain.c_str(), "--insecure"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  EXPECT_TRUE(r.config->insecure);
  r = args({"--config", plain.c_str(), "--tls-ca", "/a", "--tls-cert", "/b", "--tls-key", "/c"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  EXPECT_EQ(r.config->tls_cert, "/b");
  EXPECT_EQ(r.config->tls_server_name, "");
  r = args({"--config", plain.c_str(), "--tls-ca", "/a", "--tls-cert", "/b", "--tls-key", "/c",
            "--tls-server-name", "manager.example"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  EXPECT_EQ(r.config->tls_server_name, "manager.example");
  EXPECT_EQ(refused({"--config", plain.c_str(), "--insecure", "--tls-server-name", "m.example"}),
            "tls_server_name is the name of the manager's certificate: it needs a manager and "
            "tls_ca, tls_cert and tls_key.");
  // The command line may give what makes a file's wildcard agent_listen dialable.
  const std::string wild =
      write("wild.yaml",
            kSwitch + "manager: 127.0.0.1:9300\ninsecure: true\nagent_listen: 0.0.0.0:9471\n");
  EXPECT_NE(refused({"--config", wild.c_str()}).find("is every address of this machine"),
            std::string::npos);
  r = args({"--config", wild.c_str(), "--agent-advertise", "10.0.0.1:9471"});
  ASSERT_TRUE(r.config.has_value()) << r.error;
  EXPECT_EQ(r.config->agent_advertise, "10.0.0.1:9471");
  // A static switch whose agent serves beyond loopback needs them too.
  const std::string open = write("open.yaml", kSwitch + "agent_listen: 0.0.0.0:9471\n");
  EXPECT_NE(refused({"--config", open.c_str()}).find("no TLS certificates"), std::string::npos);
  const std::string local = write("local.yaml", kSwitch);
  EXPECT_TRUE(args({"--config", local.c_str()}).config.has_value());
  // A static switch on loopback needs neither, but what it is given must be whole: one file
  // alone was ignored, and the agent served without TLS.
  EXPECT_EQ(refused({"--config", local.c_str(), "--tls-ca", "/ca.pem"}),
            "give all of tls_ca, tls_cert and tls_key (a CA, a certificate and its key).");
  EXPECT_EQ(error_of(kSwitch + "tls_key: /k.pem\n"),
            "t.yaml: line 5: give all of tls_ca, tls_cert and tls_key (a CA, a certificate and "
            "its key).");
  EXPECT_EQ(refused({"--config", local.c_str(), "--insecure", "--tls-ca", "/a", "--tls-cert", "/b",
                     "--tls-key", "/c"}),
            "both certificates and insecure: true are given; choose one.");
  EXPECT_TRUE(args({"--config", local.c_str(), "--insecure"}).config.has_value());
}
