// The launcher's environment as Options (host/src/environment.h): treeduce's variables,
// torchrun's and Open MPI's, in that order, and a sentence naming the variable for every bad
// value. The parser is given a map of variables; the process's environment is never changed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "debug_env.h"
#include "environment.h"
#include "treeduce/common/tls_options.h"
#include "treeduce/host/communicator.h"

using treeduce::Code;
using treeduce::host::Options;
using treeduce::host::parse_environment;
using treeduce::host::parse_number;
using treeduce::host::parse_transport_environment;
using treeduce::host::Path;
using treeduce::host::Result;
using treeduce::host::TransportKind;
using treeduce::host::TransportOptions;
using treeduce::host::what_is_known;
using treeduce::host::XdpMode;

namespace {

struct Environment : ::testing::Test {
  std::map<std::string, std::string> vars;
  void set(const char* k, const char* v) { vars[k] = v; }
  treeduce::host::EnvLookup lookup() const {
    return [this](const char* n) -> const char* {
      const auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
  treeduce::Status parse(Options* o) const { return parse_environment(lookup(), o); }
  // Parses and expects a failure whose sentence contains `needle`.
  void expect_error(const std::string& needle) const {
    Options o;
    const treeduce::Status s = parse(&o);
    EXPECT_EQ(s.code(), Code::invalid_argument) << s.to_string();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
    ASSERT_FALSE(s.message().empty());
    EXPECT_EQ(s.message().back(), '.') << s.message();
  }
};

}  // namespace

// The one reader of TREEDUCE_TLS_* (libtreeduce's parser above, tls::from_environment() for
// tdr_comm_create() and the CLI): unset or empty keeps a field; a malformed TREEDUCE_INSECURE
// keeps `insecure`, says why, and the other variables are read all the same.
TEST_F(Environment, TlsVariablesOverlayWhatIsThere) {
  treeduce::tls::TlsOptions t{"/etc/ca.pem", "/etc/host.pem", "/etc/host.key", true, "m.example"};
  std::string error;
  set("TREEDUCE_TLS_CA", "");
  treeduce::tls::read_environment(lookup(), &t, &error);
  EXPECT_EQ(t.ca, "/etc/ca.pem");
  EXPECT_EQ(t.cert, "/etc/host.pem");
  EXPECT_EQ(t.server_name, "m.example");
  EXPECT_TRUE(t.insecure);
  EXPECT_EQ(error, "");
  set("TREEDUCE_TLS_CA", "/run/ca.pem");
  set("TREEDUCE_TLS_KEY", "/run/host.key");
  set("TREEDUCE_INSECURE", "yes");
  treeduce::tls::read_environment(lookup(), &t, &error);
  EXPECT_EQ(t.ca, "/run/ca.pem");
  EXPECT_EQ(t.key, "/run/host.key");
  EXPECT_TRUE(t.insecure);
  EXPECT_EQ(error, "TREEDUCE_INSECURE is 'yes'; it must be 0 or 1.");
  set("TREEDUCE_INSECURE", "0");
  error.clear();
  treeduce::tls::read_environment(lookup(), &t, &error);
  EXPECT_FALSE(t.insecure);
  EXPECT_EQ(error, "");
}

TEST_F(Environment, TreeduceVariablesFillEveryField) {
  set("TREEDUCE_MANAGER", "10.0.0.9:9300");
  set("TREEDUCE_JOB", "train-7");
  set("TREEDUCE_RANK", "3");
  set("TREEDUCE_WORLD_SIZE", "8");
  set("TREEDUCE_HOST", "h3");
  set("TREEDUCE_BIND", "10.1.0.4");
  set("TREEDUCE_PORT", "50123");
  set("TREEDUCE_PATH", "network");
  set("TREEDUCE_FALLBACK_STORE", "/shared/rdv");
  set("TREEDUCE_FALLBACK_ADDRESS", "10.2.0.4");
  set("TREEDUCE_SLOTS", "64");
  set("TREEDUCE_PAYLOAD_BYTES", "8192");
  set("TREEDUCE_RTO_US", "10000");
  set("TREEDUCE_MAX_RETRIES", "30");
  set("TREEDUCE_DETERMINISTIC", "1");
  set("TREEDUCE_TLS_SERVER_NAME", "manager.example");
  Options o;
  const treeduce::Status s = parse(&o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(o.manager, "10.0.0.9:9300");
  EXPECT_EQ(o.job, "train-7");
  EXPECT_EQ(o.rank, 3u);
  EXPECT_EQ(o.world_size, 8u);
  EXPECT_EQ(o.host, "h3");
  EXPECT_EQ(o.bind_address, "10.1.0.4");
  EXPECT_EQ(o.port, 50123);
  EXPECT_EQ(o.path, Path::network);
  EXPECT_EQ(o.fallback_store, "/shared/rdv");
  EXPECT_EQ(o.fallback_address, "10.2.0.4");
  EXPECT_EQ(o.slots, 64u);
  EXPECT_EQ(o.payload_bytes, 8192u);
  EXPECT_EQ(o.rto_us, 10000u);
  EXPECT_EQ(o.max_retries, 30u);
  EXPECT_TRUE(o.deterministic);
  EXPECT_EQ(o.tls_server_name, "manager.example");
}

TEST_F(Environment, TorchrunGivesRankWorldAndJobAndTreeduceOverrides) {
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "1");
  set("TORCHELASTIC_RUN_ID", "abc123");
  Options o;
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.rank, 1u);
  EXPECT_EQ(o.world_size, 4u);
  EXPECT_EQ(o.job, "abc123");
  set("TREEDUCE_RANK", "2");
  set("TREEDUCE_JOB", "mine");
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.rank, 2u);
  EXPECT_EQ(o.world_size, 4u);
  EXPECT_EQ(o.job, "mine");
}

TEST_F(Environment, OpenMpiGivesRankAndWorld) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "6");
  set("TREEDUCE_JOB", "mpi");
  Options o;
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.rank, 5u);
  EXPECT_EQ(o.world_size, 6u);
  set("WORLD_SIZE", "7");  // torchrun's comes before Open MPI's
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.world_size, 7u);
}

TEST_F(Environment, DefaultsHostNameAndKeepsTheCallersOtherFields) {
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "1");
  set("TREEDUCE_JOB", "j");
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  Options o;
  o.slots = 64;
  o.manager = "preset:1";
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.host, name);
  EXPECT_EQ(o.slots, 64u);
  EXPECT_EQ(o.manager, "preset:1");
  EXPECT_EQ(o.path, Path::auto_select);
  EXPECT_EQ(o.port, 0);
}

TEST_F(Environment, MissingRankWorldOrJobIsAnError) {
  expect_error("No rank or world size");
  set("RANK", "0");
  expect_error("No rank or world size");
  set("WORLD_SIZE", "2");
  expect_error("TREEDUCE_JOB");
  set("TORCHELASTIC_RUN_ID", "none");  // torchrun's placeholder names no job
  expect_error("TREEDUCE_JOB");
  set("TREEDUCE_JOB", "");  // empty counts as unset
  expect_error("TREEDUCE_JOB");
}

TEST_F(Environment, BadValuesNameTheirVariable) {
  set("TREEDUCE_JOB", "j");
  set("TREEDUCE_WORLD_SIZE", "4");
  set("TREEDUCE_RANK", "-1");
  expect_error("TREEDUCE_RANK is '-1', not a whole number from 0 to 4294967295.");
  set("TREEDUCE_RANK", "1x");
  expect_error("TREEDUCE_RANK is '1x'");
  set("TREEDUCE_RANK", "4294967296");
  expect_error("TREEDUCE_RANK is '4294967296'");
  set("TREEDUCE_RANK", "4");
  expect_error(
      "TREEDUCE_RANK is 4, but ranks of a world of 4 (TREEDUCE_WORLD_SIZE) go from 0 to 3.");
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "0");
  expect_error("TREEDUCE_WORLD_SIZE is 0");
  set("TREEDUCE_WORLD_SIZE", "4");
  set("TREEDUCE_PORT", "65536");
  expect_error("TREEDUCE_PORT is '65536', not a whole number from 0 to 65535.");
  set("TREEDUCE_PORT", "50000");
  set("TREEDUCE_PATH", "fast");
  expect_error("TREEDUCE_PATH is 'fast'; it must be auto, network or host.");
  set("TREEDUCE_PATH", "host");
  set("TREEDUCE_SLOTS", "48");
  expect_error("TREEDUCE_SLOTS is 48; it must be a power of two from 1 to 4096.");
  set("TREEDUCE_SLOTS", "8192");
  expect_error("TREEDUCE_SLOTS is 8192; it must be a power of two from 1 to 4096.");
  set("TREEDUCE_SLOTS", "3");
  expect_error("TREEDUCE_SLOTS is 3; it must be a power of two from 1 to 4096.");
  set("TREEDUCE_SLOTS", "0");
  expect_error("TREEDUCE_SLOTS is 0; it must be a power of two from 1 to 4096.");
  set("TREEDUCE_SLOTS", "32");
  set("TREEDUCE_PAYLOAD_BYTES", "128");
  expect_error("TREEDUCE_PAYLOAD_BYTES is 128; it must be a power of two from 256 to 8192.");
  set("TREEDUCE_PAYLOAD_BYTES", "9000");
  expect_error("TREEDUCE_PAYLOAD_BYTES is 9000; it must be a power of two from 256 to 8192.");
  set("TREEDUCE_PAYLOAD_BYTES", "4096");
  set("TREEDUCE_RTO_US", "5ms");
  expect_error("TREEDUCE_RTO_US is '5ms', not a whole number from 0 to 128000.");
  set("TREEDUCE_RTO_US", "5000");
  set("TREEDUCE_MAX_RETRIES", "0");
  expect_error("TREEDUCE_MAX_RETRIES is '0', not a whole number from 1 to 1000.");
  set("TREEDUCE_MAX_RETRIES", "1001");
  expect_error("TREEDUCE_MAX_RETRIES is '1001', not a whole number from 1 to 1000.");
  set("TREEDUCE_MAX_RETRIES", "20");
  set("TREEDUCE_DETERMINISTIC", "yes");
  expect_error("TREEDUCE_DETERMINISTIC is 'yes', not a whole number from 0 to 1.");
  set("TREEDUCE_DETERMINISTIC", "0");
  // The sentence docs/host.md quotes, the same as tdr_comm_create()'s.
  set("TREEDUCE_INSECURE", "yes");
  expect_error("TREEDUCE_INSECURE is 'yes'; it must be 0 or 1.");
  set("TREEDUCE_INSECURE", "0");
  // Addresses are IPv4, not names: a bad one is refused here, not found later as a fallback.
  set("TREEDUCE_BIND", "h3");
  expect_error("TREEDUCE_BIND is 'h3', not an IPv4 address (10.1.0.4).");
  set("TREEDUCE_BIND", "10.1.0.256");
  expect_error("TREEDUCE_BIND is '10.1.0.256', not an IPv4 address");
  set("TREEDUCE_BIND", "10.1.0.4");
  set("TREEDUCE_FALLBACK_ADDRESS", "mgmt0");
  expect_error("TREEDUCE_FALLBACK_ADDRESS is 'mgmt0', not an IPv4 address (10.1.0.4).");
  set("TREEDUCE_FALLBACK_ADDRESS", "10.2.0.4");
  Options o;
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.path, Path::host);
  EXPECT_EQ(o.bind_address, "10.1.0.4");
  EXPECT_EQ(o.fallback_address, "10.2.0.4");
  EXPECT_FALSE(o.insecure);
  EXPECT_EQ(o.port, 50000);
  EXPECT_EQ(o.slots, 32u);
  EXPECT_EQ(o.payload_bytes, 4096u);
  EXPECT_EQ(o.rto_us, 5000u);
  EXPECT_EQ(o.max_retries, 20u);
}

TEST_F(Environment, AFailureLeavesTheOptionsUntouched) {
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "2");
  set("TREEDUCE_JOB", "j");
  set("TREEDUCE_PATH", "nope");
  Options o;
  o.job = "before";
  EXPECT_EQ(parse(&o).code(), Code::invalid_argument);
  EXPECT_EQ(o.job, "before");
  EXPECT_EQ(o.world_size, 1u);
  set("TREEDUCE_PATH", "host");
  set("TREEDUCE_UDP_GSO", "on");
  EXPECT_EQ(parse(&o).code(), Code::invalid_argument);
  EXPECT_EQ(o.job, "before");
  EXPECT_EQ(o.transport.udp_gso, false);
}

// The transport's variables: every field, the defaults, and a sentence for every bad value (a
// typo must not quietly run another configuration than the one asked for).
TEST_F(Environment, TransportVariablesFillTransportOptions) {
  set("TREEDUCE_JOB", "j");
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "1");
  Options o;
  ASSERT_TRUE(parse(&o).ok());
  EXPECT_EQ(o.transport.kind, TransportKind::udp);
  EXPECT_EQ(o.transport.udp_send_ports, 1u);
  EXPECT_FALSE(o.transport.udp_gso);
  EXPECT_TRUE(o.transport.udp_gro);
  EXPECT_EQ(o.transport.verbs_port, 1);
  EXPECT_EQ(o.transport.busy_poll_us, treeduce::host::kDefaultBusyPollUs);
  set("TREEDUCE_TRANSPORT", "dpdk");
  set("TREEDUCE_UDP_SEND_PORTS", "4");
  set("TREEDUCE_UDP_GSO", "1");
  set("TREEDUCE_UDP_GRO", "0");
  set("TREEDUCE_DPDK_PORT", "net_memif0");
  set("TREEDUCE_DPDK_EAL", "--no-huge -m 128");
  set("TREEDUCE_DPDK_TX_COPY", "1");
  set("TREEDUCE_VERBS_DEVICE", "mlx5_0");
  set("TREEDUCE_VERBS_PORT", "2");
  set("TREEDUCE_LOCAL_MAC", "02:00:00:00:00:01");
  set("TREEDUCE_LEAF_MAC", "02:00:00:00:00:02");
  set("TREEDUCE_BUSY_POLL_US", "250");
  ASSERT_TRUE(parse(&o).ok()) << parse(&o).to_string();
  EXPECT_EQ(o.transport.kind, TransportKind::dpdk);
  EXPECT_EQ(o.transport.udp_send_ports, 4u);
  EXPECT_TRUE(o.transport.udp_gso);
  EXPECT_FALSE(o.transport.udp_gro);
  EXPECT_EQ(o.transport.dpdk_port, "net_memif0");
  EXPECT_EQ(o.transport.dpdk_eal, "--no-huge -m 128");
  EXPECT_TRUE(o.transport.dpdk_tx_copy);
  EXPECT_EQ(o.transport.verbs_device, "mlx5_0");
  EXPECT_EQ(o.transport.verbs_port, 2);
  EXPECT_EQ(o.transport.local_mac, "02:00:00:00:00:01");
  EXPECT_EQ(o.transport.leaf_mac, "02:00:00:00:00:02");
  EXPECT_EQ(o.transport.busy_poll_us, 250u);
  set("TREEDUCE_TRANSPORT", "verbs");
  ASSERT_TRUE(parse(&o).ok());
  EXPECT_EQ(o.transport.kind, TransportKind::verbs);
  EXPECT_EQ(o.transport.xdp_interface, "");
  EXPECT_EQ(o.transport.xdp_queue, 0u);
  EXPECT_EQ(o.transport.xdp_mode, XdpMode::auto_select);
  set("TREEDUCE_TRANSPORT", "af_xdp");
  set("TREEDUCE_XDP_INTERFACE", "eth1");
  set("TREEDUCE_XDP_QUEUE", "3");
  for (const auto& [value, mode] :
       {std::pair{"native", XdpMode::native}, std::pair{"skb", XdpMode::skb},
        std::pair{"zerocopy", XdpMode::zerocopy}, std::pair{"auto", XdpMode::auto_select}}) {
    set("TREEDUCE_XDP_MODE", value);
    ASSERT_TRUE(parse(&o).ok());
    EXPECT_EQ(o.transport.kind, TransportKind::af_xdp);
    EXPECT_EQ(o.transport.xdp_interface, "eth1");
    EXPECT_EQ(o.transport.xdp_queue, 3u);
    EXPECT_EQ(o.transport.xdp_mode, mode);
  }
  set("TREEDUCE_XDP_MODE", "turbo");
  expect_error("TREEDUCE_XDP_MODE is 'turbo'; it must be auto, native, skb or zerocopy.");
  set("TREEDUCE_XDP_MODE", "auto");

  set("TREEDUCE_TRANSPORT", "carrier-pigeon");
  expect_error("TREEDUCE_TRANSPORT is 'carrier-pigeon'; it must be udp, dpdk, verbs or af_xdp.");
  set("TREEDUCE_TRANSPORT", "udp");
  for (const auto& [name, value] :
       {std::pair{"TREEDUCE_UDP_GSO", "yes"}, std::pair{"TREEDUCE_UDP_GRO", "2"},
        std::pair{"TREEDUCE_UDP_SEND_PORTS", "0"}, std::pair{"TREEDUCE_UDP_SEND_PORTS", "65"},
        std::pair{"TREEDUCE_UDP_SEND_PORTS", "4 "}, std::pair{"TREEDUCE_VERBS_PORT", "0"},
        std::pair{"TREEDUCE_VERBS_PORT", "256"}, std::pair{"TREEDUCE_XDP_QUEUE", "256"},
        std::pair{"TREEDUCE_BUSY_POLL_US", "10001"}, std::pair{"TREEDUCE_BUSY_POLL_US", "-1"},
        std::pair{"TREEDUCE_DPDK_TX_COPY", "yes"}}) {
    const std::string before = vars[name];
    set(name, value);
    expect_error(std::string(name) + " is '" + value + "', not a whole number from ");
    set(name, before.c_str());
  }
  // MACs are refused whatever the transport, not only when dpdk or verbs opens.
  for (const char* name : {"TREEDUCE_LEAF_MAC", "TREEDUCE_LOCAL_MAC"}) {
    const std::string before = vars[name];
    for (const char* value : {"02:00:00:00:00", "02-00-00-00-00-02", "02:00:00:00:00:0g"}) {
      set(name, value);
      expect_error(std::string(name) + " is '" + value +
                   "', not a MAC address (02:00:00:00:00:01).");
    }
    set(name, "0A:bc:00:00:00:02");
    Options m;
    ASSERT_TRUE(parse(&m).ok());
    set(name, before.c_str());
  }

  // tdr_comm_create()'s part: only the transport's variables, the rest untouched.
  TransportOptions t;
  set("TREEDUCE_UDP_SEND_PORTS", "8");
  ASSERT_TRUE(parse_transport_environment(lookup(), &t).ok());
  EXPECT_EQ(t.udp_send_ports, 8u);
  EXPECT_FALSE(t.udp_gro);  // TREEDUCE_UDP_GRO=0 from above
  set("TREEDUCE_UDP_SEND_PORTS", "2");
  set("TREEDUCE_UDP_GRO", "x");
  EXPECT_EQ(parse_transport_environment(lookup(), &t).code(), Code::invalid_argument);
  EXPECT_EQ(t.udp_send_ports, 8u) << "a failure leaves the options untouched";
}

// The one number parser every variable goes through.
TEST_F(Environment, NumbersAreWholeAndInRange) {
  std::uint64_t x = 7;
  EXPECT_TRUE(parse_number("V", "0", 0, 1, &x).ok());
  EXPECT_EQ(x, 0u);
  EXPECT_TRUE(parse_number("V", "18446744073709551615", 0, UINT64_MAX, &x).ok());
  EXPECT_EQ(x, UINT64_MAX);
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "0x10", "1e3", "18446744073709551616"}) {
    const treeduce::Status s = parse_number("V", bad, 0, UINT64_MAX, &x);
    EXPECT_EQ(s.code(), Code::invalid_argument) << "'" << bad << "'";
  }
  EXPECT_EQ(parse_number("TREEDUCE_X", "5", 6, 9, &x).message(),
            "TREEDUCE_X is '5', not a whole number from 6 to 9.");
  EXPECT_EQ(x, UINT64_MAX);
}

// The one MAC parser: TREEDUCE_LOCAL_MAC and TREEDUCE_LEAF_MAC, and the verbs transport's
// options.
TEST(Mac, SixHexPairsSeparatedByColons) {
  std::uint8_t m[6] = {};
  ASSERT_TRUE(treeduce::host::parse_mac("0a:1B:2c:3D:4e:5F", m));
  const std::uint8_t want[6] = {0x0a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f};
  EXPECT_EQ(std::memcmp(m, want, 6), 0);
  for (const char* bad :
       {"", "0a:1b:2c:3d:4e", "0a:1b:2c:3d:4e:5f:", "0a-1b-2c-3d-4e-5f", "0g:1b:2c:3d:4e:5f",
        "0a:1b:2c:3d:4e:5", " 0a:1b:2c:3d:4e:5f", "+a:1b:2c:3d:4e:5f", "0a:1b:2c:3d:4e:5 "}) {
    std::uint8_t before[6] = {1, 2, 3, 4, 5, 6};
    EXPECT_FALSE(treeduce::host::parse_mac(bad, before)) << bad;
    EXPECT_EQ(before[0], 1) << "untouched on failure: " << bad;
  }
}

// The one check of a static tree's leaf address, for TREEDUCE_STATIC_LEAF and for a
// TreeAssignment given in code (Communicator::create()).
TEST(LeafAddress, IsIpv4AndAPortFrom1To65535) {
  using treeduce::host::is_leaf_address;
  for (const char* good : {"10.0.1.1:4791", "10.0.1.1:1", "10.0.1.1:65535", "10.0.1.1:004791"})
    EXPECT_TRUE(is_leaf_address(good)) << good;
  for (const char* bad :
       {"", "10.0.1.1", "10.0.1.1:", "10.0.1.1:0", "10.0.1.1:65536", "leaf0:4791",
        "10.0.1.256:4791", "10.0.1.1:+4791", "10.0.1.1: 4791", ":4791", "[::1]:4791"})
    EXPECT_FALSE(is_leaf_address(bad)) << bad;
}

// What a rank whose environment is malformed can still say of itself, to tell the manager
// (docs/host.md, "Environment"): the manager, the job and the rank, each only when it is itself
// well formed.
TEST_F(Environment, WhatABadRankStillKnows) {
  set("TREEDUCE_MANAGER", "am:7000");
  set("TREEDUCE_JOB", "j1");
  set("TREEDUCE_RANK", "3");
  set("TREEDUCE_WORLD_SIZE", "4");
  set("TREEDUCE_SLOTS", "3");
  Options o;
  EXPECT_EQ(parse(&o).message(), "TREEDUCE_SLOTS is 3; it must be a power of two from 1 to 4096.");
  auto u = what_is_known(lookup());
  EXPECT_EQ(u.manager, "am:7000");
  EXPECT_EQ(u.job, "j1");
  ASSERT_TRUE(u.rank.has_value());
  EXPECT_EQ(*u.rank, 3u);
  set("TREEDUCE_RANK", "three");
  vars.erase("TREEDUCE_JOB");
  set("TORCHELASTIC_RUN_ID", "none");  // torchrun's placeholder is no job name
  u = what_is_known(lookup());
  EXPECT_FALSE(u.rank.has_value());
  EXPECT_EQ(u.job, "");
  vars.clear();
  set("RANK", "2");
  set("TORCHELASTIC_RUN_ID", "run7");
  u = what_is_known(lookup());
  EXPECT_EQ(u.manager, "");
  EXPECT_EQ(u.job, "run7");
  EXPECT_EQ(u.rank.value_or(99), 2u);
}

// A static tree from the environment (TreeAssignment's every field a launcher can know): the
// leaf, tree id, key (decimal or 0x), child index, slots, payload, the types and operations it
// reduces, deterministic mode and its switches' models.
TEST_F(Environment, StaticTreeVariablesFillTheStaticTree) {
  set("TREEDUCE_JOB", "st");
  set("TREEDUCE_RANK", "1");
  set("TREEDUCE_WORLD_SIZE", "2");
  set("TREEDUCE_STATIC_LEAF", "10.0.1.1:4791");
  set("TREEDUCE_STATIC_TREE_ID", "65535");
  set("TREEDUCE_STATIC_KEY", "0x1234abcd");
  set("TREEDUCE_STATIC_CHILD_INDEX", "63");
  set("TREEDUCE_STATIC_SLOTS", "64");
  set("TREEDUCE_STATIC_PAYLOAD_BYTES", "4096");
  set("TREEDUCE_STATIC_DTYPES", "i32,u32");
  set("TREEDUCE_STATIC_OPS", "sum,min,max");
  set("TREEDUCE_STATIC_DETERMINISTIC", "1");
  set("TREEDUCE_STATIC_SWITCHES", "leaf0:tofino;spine0:quantum2:all:all");
  Options o;
  const treeduce::Status s = parse(&o);
  ASSERT_TRUE(s.ok()) << s.to_string();
  const auto& t = o.static_tree;
  EXPECT_EQ(t.leaf_address, "10.0.1.1:4791");
  EXPECT_EQ(t.tree_id, 65535);
  EXPECT_EQ(t.key, 0x1234abcdu);
  EXPECT_EQ(t.child_index, 63);
  EXPECT_EQ(t.slots, 64u);
  EXPECT_EQ(t.payload_bytes, 4096u);
  const std::uint32_t ints = 1u << int(treeduce::DType::i32) | 1u << int(treeduce::DType::u32);
  const std::uint32_t ops = 1u << int(treeduce::ReduceOp::sum) |
                            1u << int(treeduce::ReduceOp::min) | 1u << int(treeduce::ReduceOp::max);
  EXPECT_EQ(t.dtype_mask, ints);
  EXPECT_EQ(t.op_mask, ops);
  EXPECT_TRUE(t.deterministic);
  ASSERT_EQ(t.switches.size(), 2u);
  EXPECT_EQ(t.switches[0].name, "leaf0");
  EXPECT_EQ(t.switches[0].profile, "tofino");
  EXPECT_EQ(t.switches[0].dtype_mask, ints) << "a switch without lists has the tree's";
  EXPECT_EQ(t.switches[0].op_mask, ops);
  EXPECT_EQ(t.switches[1].name, "spine0");
  EXPECT_EQ(t.switches[1].dtype_mask, treeduce::kAllDTypesMask);
  EXPECT_EQ(t.switches[1].op_mask, treeduce::kAllOpsMask);
  // Decimal keys, and the defaults of what is not given.
  set("TREEDUCE_STATIC_KEY", "18446744073709551615");
  for (const char* v :
       {"TREEDUCE_STATIC_SLOTS", "TREEDUCE_STATIC_PAYLOAD_BYTES", "TREEDUCE_STATIC_DTYPES",
        "TREEDUCE_STATIC_OPS", "TREEDUCE_STATIC_DETERMINISTIC", "TREEDUCE_STATIC_SWITCHES"})
    vars.erase(v);
  Options d;
  ASSERT_TRUE(parse(&d).ok());
  EXPECT_EQ(d.static_tree.key, UINT64_MAX);
  EXPECT_EQ(d.static_tree.slots, 16u);
  EXPECT_EQ(d.static_tree.payload_bytes, 1024u);
  EXPECT_EQ(d.static_tree.dtype_mask, treeduce::kAllDTypesMask);
  EXPECT_FALSE(d.static_tree.deterministic);
  EXPECT_TRUE(d.static_tree.switches.empty());
}

TEST_F(Environment, BadStaticTreeValuesSaySo) {
  const auto base = [this] {
    vars.clear();
    set("TREEDUCE_JOB", "st");
    set("TREEDUCE_RANK", "0");
    set("TREEDUCE_WORLD_SIZE", "2");
    set("TREEDUCE_STATIC_LEAF", "10.0.1.1:4791");
    set("TREEDUCE_STATIC_TREE_ID", "7");
    set("TREEDUCE_STATIC_KEY", "99");
    set("TREEDUCE_STATIC_CHILD_INDEX", "0");
  };
  const std::vector<std::tuple<const char*, const char*, std::string>> cases = {
      {"TREEDUCE_STATIC_LEAF", "10.0.1.1",
       "TREEDUCE_STATIC_LEAF is '10.0.1.1', not the leaf switch's data address as IPv4:PORT "
       "(10.0.1.1:4791)."},
      {"TREEDUCE_STATIC_LEAF", "leaf0:4791", "not the leaf switch's data address"},
      {"TREEDUCE_STATIC_LEAF", "10.0.1.1:0", "not the leaf switch's data address"},
      {"TREEDUCE_STATIC_TREE_ID", "65536",
       "TREEDUCE_STATIC_TREE_ID is '65536', not a whole number from 0 to 65535."},
      {"TREEDUCE_STATIC_KEY", "0xg",
       "TREEDUCE_STATIC_KEY is '0xg', not a 64-bit key (decimal, or hexadecimal after 0x)."},
      {"TREEDUCE_STATIC_KEY", "18446744073709551616", "not a 64-bit key"},
      {"TREEDUCE_STATIC_KEY", "-1", "not a 64-bit key"},
      {"TREEDUCE_STATIC_CHILD_INDEX", "64",
       "TREEDUCE_STATIC_CHILD_INDEX is '64', not a whole number from 0 to 63."},
      {"TREEDUCE_STATIC_SLOTS", "12",
       "TREEDUCE_STATIC_SLOTS is 12; it must be a power of two from 1 to 4096."},
      {"TREEDUCE_STATIC_PAYLOAD_BYTES", "128",
       "TREEDUCE_STATIC_PAYLOAD_BYTES is 128; it must be a power of two from 256 to 8192."},
      {"TREEDUCE_STATIC_DTYPES", "f32,f33",
       "TREEDUCE_STATIC_DTYPES is 'f32,f33': 'f33' is not an element type (a comma list of "
       "names, or all)."},
      {"TREEDUCE_STATIC_OPS", "sum,", "TREEDUCE_STATIC_OPS is 'sum,': '' is not an operation"},
      {"TREEDUCE_STATIC_DETERMINISTIC", "yes",
       "TREEDUCE_STATIC_DETERMINISTIC is 'yes', not a whole number from 0 to 1."},
      {"TREEDUCE_STATIC_SWITCHES", "leaf0",
       "TREEDUCE_STATIC_SWITCHES is 'leaf0': 'leaf0' is not NAME:PROFILE[:DTYPES[:OPS]] "
       "(switches separated by ';', root first)."},
      {"TREEDUCE_STATIC_SWITCHES", "leaf0:tofino:i32:sum:x", "is not NAME:PROFILE"},
      {"TREEDUCE_STATIC_SWITCHES", "leaf0:tofino:i33", "'i33' is not an element type"},
      {"TREEDUCE_MANAGER", "am:7000",
       "TREEDUCE_MANAGER and TREEDUCE_STATIC_LEAF are both set; a job takes its tree from one of "
       "them."},
  };
  for (const auto& [var, value, needle] : cases) {
    SCOPED_TRACE(std::string(var) + "=" + value);
    base();
    set(var, value);
    expect_error(needle);
  }
  // The tree id, key and child index are required with a leaf; nothing static without one.
  for (const char* missing :
       {"TREEDUCE_STATIC_TREE_ID", "TREEDUCE_STATIC_KEY", "TREEDUCE_STATIC_CHILD_INDEX"}) {
    base();
    vars.erase(missing);
    expect_error(std::string(missing) +
                 " is not set; a static tree (TREEDUCE_STATIC_LEAF) needs its tree id, key and "
                 "this rank's child index as the switch has them.");
  }
  base();
  vars.erase("TREEDUCE_STATIC_LEAF");
  expect_error(
      "TREEDUCE_STATIC_TREE_ID is set but TREEDUCE_STATIC_LEAF is not: a static tree starts with "
      "its leaf switch's data address.");
}

// TREEDUCE_DEBUG: set to anything but "" or "0".
TEST(DebugVariable, EmptyAndZeroAreOff) {
  EXPECT_FALSE(treeduce::host::debug_on(nullptr));
  EXPECT_FALSE(treeduce::host::debug_on(""));
  EXPECT_FALSE(treeduce::host::debug_on("0"));
  EXPECT_TRUE(treeduce::host::debug_on("1"));
  EXPECT_TRUE(treeduce::host::debug_on("yes"));
}
