// The ibverbs raw-packet transport (host/src/verbs_transport.h) without a device: the no-device
// path of make_verbs_transport, and the pure parts (options, MAC parsing, frame building,
// received-frame classification, the flow steering rule, error sentences). Nothing here opens a
// device: send/receive on a live QP are not tested (no RDMA hardware where this was written).
#include "verbs_transport.h"

#include <arpa/inet.h>
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <string>
#include <vector>

namespace proto = treeduce::proto;
using treeduce::host::make_verbs_transport;
using treeduce::host::OutPacket;
using treeduce::host::RxDatagram;
using treeduce::host::VerbsTransportOptions;
namespace detail = treeduce::host::detail;

namespace {

VerbsTransportOptions good_options() {
  VerbsTransportOptions o;
  o.local_address = "10.0.0.2";
  o.port = 47111;
  o.local_mac = "02:00:00:00:00:02";
  o.leaf_address = "10.0.0.1:47110";
  o.leaf_mac = "02:00:00:00:00:01";
  o.payload_bytes = 1024;
  return o;
}

detail::VerbsResolved resolved() {
  detail::VerbsResolved r;
  EXPECT_EQ(detail::validate_options(good_options(), &r), "");
  return r;
}

proto::TdHdr contrib_header(std::uint16_t count) {
  proto::TdHdr td{};
  td.version = proto::kProtocolVersion;
  td.opcode = static_cast<std::uint8_t>(proto::Opcode::contrib);
  td.tree_id.set(std::uint16_t{7});
  td.slot.set(std::uint16_t{3});
  td.count.set(count);
  td.ncontrib.set(std::uint16_t{1});
  td.chunk.set(std::uint32_t{42});
  td.seq.set(std::uint32_t{5});
  td.key.set(std::uint64_t{0x1122334455667788u});
  return td;
}

bool device_present() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return false;
  ibv_free_device_list(list);
  return n > 0;
}

void expect_sentence(const std::string& err, const std::string& needle) {
  EXPECT_NE(err.find(needle), std::string::npos) << err;
  ASSERT_FALSE(err.empty());
  EXPECT_EQ(err.back(), '.') << err;
}

}  // namespace

TEST(VerbsTransport, NoDeviceSaysSoAndSuggestsUdp) {
  if (device_present()) GTEST_SKIP() << "an RDMA device is present; the no-device path is not";
  std::string err;
  auto t = make_verbs_transport(good_options(), &err);
  EXPECT_EQ(t, nullptr);
  EXPECT_EQ(err,
            "No RDMA device found (ibv_get_device_list returned none); use the UDP transport.");
}

TEST(VerbsTransport, BadOptionsAreReportedBeforeAnyDevice) {
  VerbsTransportOptions o = good_options();
  o.leaf_mac = "";
  std::string err;
  EXPECT_EQ(make_verbs_transport(o, &err), nullptr);
  expect_sentence(err, "leaf switch MAC");
}

TEST(VerbsTransport, ValidateGoodOptions) {
  detail::VerbsResolved r;
  ASSERT_EQ(detail::validate_options(good_options(), &r), "");
  EXPECT_EQ(r.self.ip, 0x0a000002u);
  EXPECT_EQ(r.self.port, 47111);
  EXPECT_EQ(r.self.mac[5], 0x02);
  EXPECT_EQ(r.leaf.ip, 0x0a000001u);
  EXPECT_EQ(r.leaf.port, 47110);
  EXPECT_EQ(r.leaf.mac[5], 0x01);
  EXPECT_EQ(r.frame_bytes, proto::kFrameHeaderBytes + 1024);
}

TEST(VerbsTransport, ValidateBadOptions) {
  struct Case {
    void (*mutate)(VerbsTransportOptions&);
    const char* needle;
  };
  const Case cases[] = {
      {[](VerbsTransportOptions& o) { o.port_num = 0; }, "port number"},
      {[](VerbsTransportOptions& o) { o.local_address = "10.0.0"; }, "local address"},
      {[](VerbsTransportOptions& o) { o.local_address = "0.0.0.0"; }, "0.0.0.0"},
      {[](VerbsTransportOptions& o) { o.port = 0; }, "local UDP port"},
      {[](VerbsTransportOptions& o) { o.local_mac = "02:00:00:00:00"; }, "local MAC"},
      {[](VerbsTransportOptions& o) { o.local_mac = "01:00:5e:00:00:01"; }, "unicast"},
      {[](VerbsTransportOptions& o) { o.local_mac = "00:00:00:00:00:00"; }, "local MAC"},
      {[](VerbsTransportOptions& o) { o.leaf_address = "10.0.0.1"; }, "a.b.c.d:port"},
      {[](VerbsTransportOptions& o) { o.leaf_address = "10.0.0.1:0"; }, "a.b.c.d:port"},
      {[](VerbsTransportOptions& o) { o.leaf_mac = "ff:ff:ff:ff:ff:ff"; }, "no ARP"},
      {[](VerbsTransportOptions& o) { o.payload_bytes = 1000; }, "power of two"},
      {[](VerbsTransportOptions& o) { o.payload_bytes = 16384; }, "power of two"},
      {[](VerbsTransportOptions& o) { o.send_ring = 8; }, "send ring"},
      {[](VerbsTransportOptions& o) { o.recv_ring = 100000; }, "receive ring"},
  };
  for (const Case& c : cases) {
    VerbsTransportOptions o = good_options();
    c.mutate(o);
    detail::VerbsResolved r;
    expect_sentence(detail::validate_options(o, &r), c.needle);
  }
}

TEST(VerbsTransport, BuildTxFrameIsAValidFrameToTheLeaf) {
  const detail::VerbsResolved r = resolved();
  std::vector<std::uint8_t> payload(256);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i * 7);
  const OutPacket p{contrib_header(64), payload.data(), 256};
  std::vector<std::uint8_t> buf(r.frame_bytes, 0xee);
  const std::size_t len = detail::build_tx_frame(buf.data(), buf.size(), r.self, r.leaf, p);
  ASSERT_EQ(len, proto::kFrameHeaderBytes + 256);

  // What the leaf switch sees.
  proto::Parsed parsed;
  ASSERT_EQ(proto::parse_frame(buf.data(), len, r.leaf.ip, r.leaf.port, &parsed),
            proto::Reason::none);
  EXPECT_EQ(parsed.src_ip, r.self.ip);
  EXPECT_EQ(parsed.dst_ip, r.leaf.ip);
  EXPECT_EQ(parsed.src_port, r.self.port);
  EXPECT_EQ(std::memcmp(parsed.src_mac, r.self.mac, 6), 0);
  const auto eth = proto::load_header<proto::EtherHdr>(buf.data());
  EXPECT_EQ(std::memcmp(eth.dst, r.leaf.mac, 6), 0);
  EXPECT_EQ(std::memcmp(&parsed.td, &p.td, sizeof(proto::TdHdr)), 0);
  ASSERT_EQ(parsed.payload_len, 256u);
  EXPECT_EQ(std::memcmp(parsed.payload, payload.data(), 256), 0);
  EXPECT_EQ(parsed.payload, buf.data() + proto::kFrameHeaderBytes);
  EXPECT_EQ(buf[len], 0xee) << "nothing written past the frame";

  // Too small a buffer: nothing built.
  EXPECT_EQ(detail::build_tx_frame(buf.data(), len - 1, r.self, r.leaf, p), 0u);
}

TEST(VerbsTransport, ClassifyRxFrame) {
  const detail::VerbsResolved r = resolved();
  std::vector<std::uint8_t> payload(512, 0x5a);
  proto::TdHdr td = contrib_header(128);
  td.opcode = static_cast<std::uint8_t>(proto::Opcode::result);
  std::vector<std::uint8_t> frame(proto::kFrameHeaderBytes + 512 + 10, 0);  // + Ethernet padding
  const std::size_t len =
      proto::build_frame(frame.data(), r.leaf, r.self, td, payload.data(), payload.size());
  RxDatagram d{};
  ASSERT_TRUE(detail::classify_rx_frame(frame.data(), frame.size(), r.self, r.leaf, &d));
  EXPECT_EQ(d.data, frame.data() + proto::kFrameHeaderBytes - sizeof(proto::TdHdr));
  EXPECT_EQ(d.len, sizeof(proto::TdHdr) + 512);
  EXPECT_EQ(std::memcmp(d.data, &td, sizeof td), 0);

  // Truncated.
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len - 1, r.self, r.leaf, &d));
  // From another address, or the leaf's address but another port.
  proto::Endpoint other = r.leaf;
  other.ip = 0x0a000009;
  proto::build_frame(frame.data(), other, r.self, td, payload.data(), payload.size());
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
  other = r.leaf;
  other.port = 9;
  proto::build_frame(frame.data(), other, r.self, td, payload.data(), payload.size());
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
  // To another port or address of ours.
  proto::Endpoint me = r.self;
  me.port = 1234;
  proto::build_frame(frame.data(), r.leaf, me, td, payload.data(), payload.size());
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
  me = r.self;
  me.ip = 0x0a000003;
  proto::build_frame(frame.data(), r.leaf, me, td, payload.data(), payload.size());
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
  // An unknown treeduce version from the leaf is passed on (the engine decides).
  td.version = 99;
  proto::build_frame(frame.data(), r.leaf, r.self, td, payload.data(), payload.size());
  EXPECT_TRUE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
  // Not IPv4.
  frame[12] = 0x86;
  frame[13] = 0xdd;
  EXPECT_FALSE(detail::classify_rx_frame(frame.data(), len, r.self, r.leaf, &d));
}

TEST(VerbsTransport, FlowRuleSteersOurUdpPort) {
  const detail::VerbsResolved r = resolved();
  detail::FlowRule rule;
  std::memset(&rule, 0xab, sizeof rule);
  detail::make_flow_rule(r.self, 2, &rule);
  EXPECT_EQ(rule.attr.type, IBV_FLOW_ATTR_NORMAL);
  EXPECT_EQ(rule.attr.size, sizeof(detail::FlowRule));
  EXPECT_EQ(rule.attr.num_of_specs, 3);
  EXPECT_EQ(rule.attr.port, 2);
  EXPECT_EQ(rule.attr.comp_mask, 0u);
  EXPECT_EQ(rule.eth.type, IBV_FLOW_SPEC_ETH);
  EXPECT_EQ(rule.eth.size, sizeof(ibv_flow_spec_eth));
  EXPECT_EQ(std::memcmp(rule.eth.val.dst_mac, r.self.mac, 6), 0);
  EXPECT_EQ(rule.eth.val.ether_type, htons(0x0800));
  EXPECT_EQ(rule.eth.mask.ether_type, 0xffff);
  EXPECT_EQ(rule.eth.mask.src_mac[0], 0) << "any source MAC";
  EXPECT_EQ(rule.ipv4.type, IBV_FLOW_SPEC_IPV4);
  EXPECT_EQ(rule.ipv4.size, sizeof(ibv_flow_spec_ipv4));
  EXPECT_EQ(rule.ipv4.val.dst_ip, htonl(r.self.ip));
  EXPECT_EQ(rule.ipv4.mask.dst_ip, 0xffffffffu);
  EXPECT_EQ(rule.ipv4.mask.src_ip, 0u);
  EXPECT_EQ(rule.udp.type, IBV_FLOW_SPEC_UDP);
  EXPECT_EQ(rule.udp.size, sizeof(ibv_flow_spec_tcp_udp));
  EXPECT_EQ(rule.udp.val.dst_port, htons(r.self.port));
  EXPECT_EQ(rule.udp.mask.dst_port, 0xffff);
  EXPECT_EQ(rule.udp.mask.src_port, 0);
}

TEST(VerbsTransport, ErrorSentencesNameTheCallAndErrno) {
  const std::string e =
      detail::verbs_error("ibv_create_qp", "raw packet QP on mlx5_0 port 1", EPERM);
  expect_sentence(e, "ibv_create_qp (raw packet QP on mlx5_0 port 1) failed: ");
  expect_sentence(e, "(errno " + std::to_string(EPERM) + ")");
  expect_sentence(e, "CAP_NET_RAW");
  const std::string f = detail::verbs_error("ibv_reg_mr", "4 bytes", ENOMEM);
  expect_sentence(f, std::strerror(ENOMEM));
  EXPECT_EQ(f.find("CAP_NET_RAW"), std::string::npos);
}
