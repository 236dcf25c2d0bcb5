// ARP and ICMP echo replies: hand-built requests in, replies checked field by field; malformed,
// foreign and truncated frames never answered and never read or written out of bounds.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "treeduce/dataplane/neighbor.h"

namespace treeduce::dp {
namespace {

using namespace treeduce::proto;  // the headers these tests build by hand

const Endpoint kSelf{{0x02, 0x00, 0x00, 0x00, 0x00, 0x01}, 0x0A000001, 47110};  // 10.0.0.1
const std::uint8_t kHostMac[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x99};
constexpr std::uint32_t kHostIp = 0x0A000063;  // 10.0.0.99

// Ones'-complement sum folded with modulo 65535 arithmetic: a different derivation from
// inet_checksum(), so the tests do not just repeat the code under test.
bool checksum_ok(const std::uint8_t* p, std::size_t len) {
  std::uint64_t sum = 0;
  for (std::size_t i = 0; i < len; ++i) sum += (i % 2 == 0 ? 256u : 1u) * p[i];
  return sum % 65535 == 0 && sum != 0;
}

std::vector<std::uint8_t> arp_request(std::uint32_t target, std::uint16_t oper = 1) {
  std::vector<std::uint8_t> f(42);
  std::memset(f.data(), 0xFF, 6);
  std::memcpy(f.data() + 6, kHostMac, 6);
  f[12] = 0x08, f[13] = 0x06;
  const std::uint8_t arp[] = {0, 1, 8, 0, 6, 4, 0, static_cast<std::uint8_t>(oper)};
  std::memcpy(f.data() + 14, arp, sizeof arp);
  std::memcpy(f.data() + 22, kHostMac, 6);
  const std::uint32_t spa = bswap_be(kHostIp), tpa = bswap_be(target);
  std::memcpy(f.data() + 28, &spa, 4);
  std::memcpy(f.data() + 38, &tpa, 4);
  return f;
}

std::vector<std::uint8_t> echo_request(std::uint32_t dst, std::size_t data_len) {
  const std::size_t ip_len = 20 + 8 + data_len;
  std::vector<std::uint8_t> f(14 + ip_len);
  std::memcpy(f.data(), kSelf.mac, 6);
  std::memcpy(f.data() + 6, kHostMac, 6);
  f[12] = 0x08, f[13] = 0x00;
  Ipv4Hdr ip{};
  ip.version_ihl = 0x45;
  ip.total_length.set(static_cast<std::uint16_t>(ip_len));
  ip.fragment.set(std::uint16_t{0x4000});
  ip.ttl = 64;
  ip.protocol = 1;
  ip.src_addr.set(kHostIp);
  ip.dst_addr.set(dst);
  ip.hdr_checksum.set(ipv4_checksum(ip));
  store_header(f.data() + 14, ip);
  std::uint8_t* icmp = f.data() + 34;
  icmp[0] = 8;                     // echo request
  icmp[4] = 0x12, icmp[5] = 0x34;  // identifier
  icmp[6] = 0x00, icmp[7] = 0x07;  // sequence
  for (std::size_t i = 0; i < data_len; ++i) icmp[8 + i] = static_cast<std::uint8_t>(i * 7 + 1);
  const std::uint16_t c = bswap_be(inet_checksum(icmp, 8 + data_len));
  std::memcpy(icmp + 2, &c, 2);
  return f;
}

TEST(Neighbor, AnswersArpRequestForOurAddress) {
  auto req = arp_request(kSelf.ip);
  std::uint8_t out[128];
  std::size_t n = 0;
  ASSERT_EQ(answer_neighbor(req.data(), req.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::arp_reply);
  ASSERT_EQ(n, 60u);
  EXPECT_EQ(std::memcmp(out, kHostMac, 6), 0);       // to the requester
  EXPECT_EQ(std::memcmp(out + 6, kSelf.mac, 6), 0);  // from us
  EXPECT_EQ(out[12], 0x08);
  EXPECT_EQ(out[13], 0x06);
  EXPECT_EQ(out[21], 2);                              // oper: reply
  EXPECT_EQ(std::memcmp(out + 22, kSelf.mac, 6), 0);  // sender MAC: ours
  const std::uint8_t our_ip[] = {10, 0, 0, 1}, host_ip[] = {10, 0, 0, 99};
  EXPECT_EQ(std::memcmp(out + 28, our_ip, 4), 0);
  EXPECT_EQ(std::memcmp(out + 32, kHostMac, 6), 0);  // target: the requester
  EXPECT_EQ(std::memcmp(out + 38, host_ip, 4), 0);
  for (std::size_t i = 42; i < 60; ++i) EXPECT_EQ(out[i], 0) << "padding byte " << i;
}

TEST(Neighbor, IgnoresArpForOthersAndArpReplies) {
  std::uint8_t out[128];
  std::size_t n = 99;
  auto other = arp_request(0x0A000002);
  EXPECT_EQ(answer_neighbor(other.data(), other.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::ignored);
  EXPECT_EQ(n, 0u);
  auto reply = arp_request(kSelf.ip, 2);
  EXPECT_EQ(answer_neighbor(reply.data(), reply.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::ignored);
  auto bad = arp_request(kSelf.ip);
  bad[18] = 8;  // hlen
  EXPECT_EQ(answer_neighbor(bad.data(), bad.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::malformed);
}

TEST(Neighbor, AnswersEchoRequestWithSameIdSequenceAndData) {
  for (std::size_t data : {0, 1, 18, 56, 1472}) {
    SCOPED_TRACE(data);
    auto req = echo_request(kSelf.ip, data);
    std::vector<std::uint8_t> out(2048);
    std::size_t n = 0;
    ASSERT_EQ(answer_neighbor(req.data(), req.size(), kSelf, out.data(), out.size(), &n),
              NeighborVerdict::echo_reply);
    ASSERT_EQ(n, std::max<std::size_t>(req.size(), 60));
    EXPECT_EQ(std::memcmp(out.data(), kHostMac, 6), 0);
    EXPECT_EQ(std::memcmp(out.data() + 6, kSelf.mac, 6), 0);
    EXPECT_TRUE(checksum_ok(out.data() + 14, 20)) << "IPv4 header checksum";
    EXPECT_EQ(std::memcmp(out.data() + 26, req.data() + 30, 4), 0);  // src = request's dst
    EXPECT_EQ(std::memcmp(out.data() + 30, req.data() + 26, 4), 0);  // dst = request's src
    EXPECT_EQ(out[34], 0);                                           // echo reply
    EXPECT_TRUE(checksum_ok(out.data() + 34, 8 + data)) << "ICMP checksum";
    EXPECT_EQ(std::memcmp(out.data() + 38, req.data() + 38, 4 + data), 0);  // id, seq, data
  }
}

TEST(Neighbor, RefusesBrokenOrForeignEcho) {
  std::vector<std::uint8_t> out(2048);
  std::size_t n = 0;
  auto other = echo_request(0x0A000002, 8);
  EXPECT_EQ(answer_neighbor(other.data(), other.size(), kSelf, out.data(), out.size(), &n),
            NeighborVerdict::ignored);
  auto bad_icmp = echo_request(kSelf.ip, 8);
  bad_icmp[40] ^= 1;  // data corrupted: ICMP checksum wrong
  EXPECT_EQ(answer_neighbor(bad_icmp.data(), bad_icmp.size(), kSelf, out.data(), out.size(), &n),
            NeighborVerdict::malformed);
  auto bad_ip = echo_request(kSelf.ip, 8);
  bad_ip[22] ^= 1;  // TTL changed without the checksum
  EXPECT_EQ(answer_neighbor(bad_ip.data(), bad_ip.size(), kSelf, out.data(), out.size(), &n),
            NeighborVerdict::malformed);
  auto long_ip = echo_request(kSelf.ip, 8);
  long_ip[17] += 4;  // IPv4 total length beyond the frame (checksum fixed below)
  Ipv4Hdr ip = load_header<Ipv4Hdr>(long_ip.data() + 14);
  ip.hdr_checksum.set(0);
  ip.hdr_checksum.set(ipv4_checksum(ip));
  store_header(long_ip.data() + 14, ip);
  EXPECT_EQ(answer_neighbor(long_ip.data(), long_ip.size(), kSelf, out.data(), out.size(), &n),
            NeighborVerdict::malformed);
  auto big = echo_request(kSelf.ip, 1000);
  EXPECT_EQ(answer_neighbor(big.data(), big.size(), kSelf, out.data(), 100, &n),
            NeighborVerdict::no_room);
}

TEST(Neighbor, UdpAndOtherEtherTypesAreNotNeighborTraffic) {
  auto f = echo_request(kSelf.ip, 8);
  f[23] = 17;  // UDP
  std::uint8_t out[128];
  std::size_t n = 0;
  EXPECT_EQ(answer_neighbor(f.data(), f.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::not_neighbor);
  f[12] = 0x86, f[13] = 0xDD;  // IPv6
  EXPECT_EQ(answer_neighbor(f.data(), f.size(), kSelf, out, sizeof out, &n),
            NeighborVerdict::not_neighbor);
}

TEST(Neighbor, EveryTruncationIsSafe) {
  // Every prefix of a valid ARP request and echo request: answered only when whole, never read
  // past the end (ASan builds check that), never crash.
  std::vector<std::uint8_t> out(2048);
  for (auto full : {arp_request(kSelf.ip), echo_request(kSelf.ip, 40)}) {
    for (std::size_t len = 0; len < full.size(); ++len) {
      std::vector<std::uint8_t> cut(full.begin(), full.begin() + static_cast<long>(len));
      std::size_t n = 0;
      const NeighborVerdict v = answer_neighbor(cut.empty() ? nullptr : cut.data(), len, kSelf,
                                                out.data(), out.size(), &n);
      EXPECT_NE(v, NeighborVerdict::arp_reply) << len;
      EXPECT_NE(v, NeighborVerdict::echo_reply) << len;
    }
  }
}

}  // namespace
}  // namespace treeduce::dp

namespace treeduce::dp {
namespace {

// The switch resolves its next hops with its own requests; what it learns comes from parse_arp.
TEST(ArpRequest, RoundTripsThroughAnswerAndParse) {
  Endpoint asker;
  asker.mac[0] = 0x02;
  asker.mac[5] = 0x10;
  asker.ip = 0x0A010001;
  Endpoint target;
  target.mac[0] = 0x02;
  target.mac[5] = 0x20;
  target.ip = 0x0A010002;
  std::uint8_t req[kArpFrameBytes];
  write_arp_request(req, asker, target.ip);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(req[i], 0xFF);
  ArpSender s;
  ASSERT_TRUE(parse_arp(req, sizeof req, &s));
  EXPECT_TRUE(s.request);
  EXPECT_EQ(s.ip, asker.ip);
  EXPECT_EQ(s.target_ip, target.ip);
  EXPECT_EQ(std::memcmp(s.mac, asker.mac, 6), 0);

  std::uint8_t rep[128];
  std::size_t n = 0;
  ASSERT_EQ(answer_neighbor(req, sizeof req, target, rep, sizeof rep, &n),
            NeighborVerdict::arp_reply);
  ASSERT_TRUE(parse_arp(rep, n, &s));
  EXPECT_FALSE(s.request);
  EXPECT_EQ(s.ip, target.ip);
  EXPECT_EQ(s.target_ip, asker.ip);
  EXPECT_EQ(std::memcmp(s.mac, target.mac, 6), 0);
  EXPECT_EQ(std::memcmp(rep, asker.mac, 6), 0);  // unicast back to the asker

  // Nothing to learn from probes (sender 0.0.0.0), truncated frames, or non-ARP frames.
  std::uint8_t probe[kArpFrameBytes];
  Endpoint zero = asker;
  zero.ip = 0;
  write_arp_request(probe, zero, target.ip);
  EXPECT_FALSE(parse_arp(probe, sizeof probe, &s));
  EXPECT_FALSE(parse_arp(req, 41, &s));
  EXPECT_FALSE(parse_arp(nullptr, 0, &s));
  std::uint8_t not_arp[kArpFrameBytes];
  std::memcpy(not_arp, req, sizeof req);
  not_arp[12] = 0x08;
  not_arp[13] = 0x00;
  EXPECT_FALSE(parse_arp(not_arp, sizeof not_arp, &s));
}

}  // namespace
}  // namespace treeduce::dp
