#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "treeduce/protocol/reasons.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::proto {
namespace {

using namespace treeduce::dp::testing;
using treeduce::dp::Event;

// The layout is normative (docs/protocol.md): offsets are part of the protocol.
static_assert(offsetof(TdHdr, version) == 0 && offsetof(TdHdr, opcode) == 1 &&
              offsetof(TdHdr, dtype) == 2 && offsetof(TdHdr, op) == 3 &&
              offsetof(TdHdr, tree_id) == 4 && offsetof(TdHdr, child) == 6 &&
              offsetof(TdHdr, slot) == 8 && offsetof(TdHdr, slot_ver) == 10 &&
              offsetof(TdHdr, reason) == 11 && offsetof(TdHdr, count) == 12 &&
              offsetof(TdHdr, ncontrib) == 14 && offsetof(TdHdr, chunk) == 16 &&
              offsetof(TdHdr, seq) == 20 && offsetof(TdHdr, key) == 24);

// Reason codes travel in NACKs: docs/protocol.md section 6 lists these values.
static_assert(static_cast<int>(Reason::bad_version) == 11);
static_assert(static_cast<int>(Reason::unknown_tree) == 14);
static_assert(static_cast<int>(Reason::bad_key) == 15);
static_assert(static_cast<int>(Reason::chunk_mismatch) == 22);
static_assert(static_cast<int>(Reason::nack_received) == 29);
static_assert(static_cast<int>(Reason::wrong_shard) == 30);
static_assert(kNumReasons == 32);
static_assert(static_cast<int>(Opcode::contrib) == 1 && static_cast<int>(Opcode::result) == 2 &&
              static_cast<int>(Opcode::nack) == 3);

TEST(Wire, ByteLayoutIsBigEndian) {
  TdHdr h = hdr(Opcode::contrib, 0x01020304, 0x0506, 0x0708);
  std::uint8_t b[32];
  store_header(b, h);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[1], 1);
  EXPECT_EQ(b[5], 5);  // tree 5
  EXPECT_EQ(b[6], 0x05);
  EXPECT_EQ(b[7], 0x06);
  EXPECT_EQ(b[12], 0x07);
  EXPECT_EQ(b[13], 0x08);
  EXPECT_EQ(b[16], 0x01);
  EXPECT_EQ(b[19], 0x04);
  EXPECT_EQ(b[24], 0x11);
  EXPECT_EQ(b[31], 0x88);
}

TEST(Wire, Ipv4ChecksumEqualsTheBytewiseSum) {
  std::mt19937 rng(16);
  for (int i = 0; i < 20000; ++i) {
    std::uint8_t b[sizeof(Ipv4Hdr)];
    // Random headers, and some with long runs of 0xFF that carry through every fold.
    for (auto& x : b) x = i % 4 == 0 ? 0xFF : static_cast<std::uint8_t>(rng());
    b[rng() % sizeof b] = static_cast<std::uint8_t>(rng());
    Ipv4Hdr ip;
    std::memcpy(&ip, b, sizeof b);
    ASSERT_EQ(ipv4_checksum(ip), inet_checksum(b, sizeof b)) << i;
  }
}

TEST(Wire, BuildThenParseRoundTrips) {
  const auto f = frame(child_ep(0), hdr(Opcode::contrib, 9, 0, 3), {1, 2, 3});
  ASSERT_EQ(f.size(), 74u + 12);
  Parsed p;
  ASSERT_EQ(parse_frame(f.data(), f.size(), kSwitch.ip, kSwitch.port, &p), Reason::none);
  EXPECT_EQ(p.src_ip, child_ep(0).ip);
  EXPECT_EQ(p.src_port, 50000);
  EXPECT_EQ(p.payload_len, 12u);
  EXPECT_EQ(p.td.chunk.get(), 9u);
  const auto ip = load_header<Ipv4Hdr>(f.data() + 14);
  EXPECT_EQ(ipv4_checksum(ip), 0);
  EXPECT_EQ(ip.total_length.get(), 20u + 8 + 32 + 12);
  // Ethernet padding after the datagram is ignored.
  auto padded = f;
  padded.resize(f.size() + 10, 0);
  ASSERT_EQ(parse_frame(padded.data(), padded.size(), kSwitch.ip, kSwitch.port, &p), Reason::none);
  EXPECT_EQ(p.payload_len, 12u);
}

TEST(Wire, EveryTruncationIsRejected) {
  const auto f = frame(child_ep(0), hdr(Opcode::contrib, 9, 0, 3), {1, 2, 3});
  Parsed p;
  for (std::size_t len = 0; len < f.size(); ++len) {
    std::vector<std::uint8_t> t(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_NE(parse_frame(t.data(), t.size(), kSwitch.ip, kSwitch.port, &p), Reason::none) << len;
  }
}

TEST(Wire, EachL2L4CheckHasItsReason) {
  const auto good = frame(child_ep(0), hdr(Opcode::contrib, 9, 0, 3), {1, 2, 3});
  Parsed p;
  const auto check = [&](std::size_t off, std::uint8_t v, Reason want) {
    auto f = good;
    f[off] = v;
    EXPECT_EQ(parse_frame(f.data(), f.size(), kSwitch.ip, kSwitch.port, &p), want) << off;
  };
  check(12, 0x86, Reason::not_ipv4);
  check(14, 0x46, Reason::ip_bad_header);
  check(14 + 8, 63, Reason::ip_bad_checksum);  // TTL changed, checksum not
  check(14 + 20 + 2, 0x12, Reason::wrong_port);
  check(14 + 20 + 5, 0x00, Reason::udp_bad_length);
  check(42, 2, Reason::bad_version);
  EXPECT_EQ(parse_frame(good.data(), good.size(), kSwitch.ip + 1, kSwitch.port, &p),
            Reason::not_for_us);
  EXPECT_EQ(parse_frame(nullptr, 100, kSwitch.ip, kSwitch.port, &p), Reason::too_short);
}

// A datagram to the switch whose IPv4 and UDP lengths agree but leave no room for the treeduce
// header: the frame reaches 74 bytes only through padding. docs/protocol.md: too_short, not
// ip_bad_length (the IPv4 length is consistent).
TEST(Wire, ConsistentButShortDatagramIsTooShort) {
  for (std::size_t td_bytes : {std::size_t{0}, std::size_t{1}, std::size_t{31}}) {
    std::vector<std::uint8_t> f(kFrameHeaderBytes + 16, 0);
    write_l2_l4(f.data(), child_ep(0), kSwitch, td_bytes);
    Parsed p;
    EXPECT_EQ(parse_frame(f.data(), f.size(), kSwitch.ip, kSwitch.port, &p), Reason::too_short)
        << td_bytes;
  }
  // A short datagram to another port or address keeps the reason that says so.
  std::vector<std::uint8_t> f(kFrameHeaderBytes, 0);
  write_l2_l4(f.data(), child_ep(0), kSwitch, 4);
  Parsed p;
  EXPECT_EQ(parse_frame(f.data(), f.size(), kSwitch.ip, kSwitch.port + 1, &p), Reason::wrong_port);
  EXPECT_EQ(parse_frame(f.data(), f.size(), kSwitch.ip + 1, kSwitch.port, &p), Reason::not_for_us);
}

TEST(Wire, BigEndianFieldsConvertOnce) {
  be32 v = be32::of(0x01020304);
  std::uint8_t b[4];
  std::memcpy(b, &v, 4);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(b[3], 4);
  EXPECT_EQ(v.get(), 0x01020304u);
  v.set(7);
  EXPECT_EQ(v.get(), 7u);
  EXPECT_EQ(v, be32::of(7));
}

TEST(Wire, SerialArithmeticWraps) {
  EXPECT_TRUE(serial_after(1, 0));
  EXPECT_TRUE(serial_after(0, 0xFFFFFFFF));
  EXPECT_FALSE(serial_after(0xFFFFFFFF, 0));
  EXPECT_FALSE(serial_after(5, 5));
}

TEST(Wire, PayloadSizes) {
  EXPECT_TRUE(valid_payload_bytes(256));
  EXPECT_TRUE(valid_payload_bytes(8192));
  EXPECT_FALSE(valid_payload_bytes(128));
  EXPECT_FALSE(valid_payload_bytes(16384));
  EXPECT_FALSE(valid_payload_bytes(1000));
}

TEST(Counters, NamesComeFromTheXMacro) {
  EXPECT_EQ(name(Reason::bad_key), "bad_key");
  EXPECT_EQ(name(Event::nack_sent), "nack_sent");
  EXPECT_TRUE(nacks(Reason::unknown_tree));
  EXPECT_FALSE(nacks(Reason::stale_chunk));
  EXPECT_EQ(name(static_cast<Reason>(200)), "?");
  for (std::size_t i = 0; i < kNumReasons; ++i) {
    EXPECT_FALSE(description(static_cast<Reason>(i)).empty());
  }
}

// docs/protocol.md section 2.1 is normative: a row per dtype code with its name and size, and a
// row per op code with its name, exactly as dtype.h has them.
TEST(Wire, TheDocumentedCodeTablesAreTheCodes) {
  std::ifstream in(std::string(TREEDUCE_SOURCE_ROOT) + "/docs/protocol.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  for (DType d : kAllDTypes) {
    const std::string row = "\n| " + std::to_string(static_cast<unsigned>(d)) + " | `" +
                            std::string(name(d)) + "` | " + std::to_string(dtype_size(d)) + " | ";
    EXPECT_NE(doc.find(row), std::string::npos) << row;
  }
  for (ReduceOp op : kAllReduceOps) {
    const std::string row = "\n| " + std::to_string(static_cast<unsigned>(op)) + " | `" +
                            std::string(name(op)) + "` | ";
    EXPECT_NE(doc.find(row), std::string::npos) << row;
  }
  // Nothing beyond the last codes: the next one would be a new row.
  EXPECT_EQ(doc.find("\n| " + std::to_string(kNumDTypes) + " | `"), std::string::npos);
}

/// The bytes after `label` on its line of docs/protocol.md, as hex pairs.
std::vector<std::uint8_t> doc_hex(const std::string& doc, const std::string& label) {
  const std::size_t at = doc.find("\n" + label);
  if (at == std::string::npos) return {};
  const std::size_t start = at + 1 + label.size();
  std::istringstream line(doc.substr(start, doc.find('\n', start) - start));
  std::vector<std::uint8_t> out;
  for (std::string b; line >> b;)
    out.push_back(static_cast<std::uint8_t>(std::stoul(b, nullptr, 16)));
  return out;
}

// The test vector of docs/protocol.md section 2.2, read from the page: its message is the NACK
// header the fields it names make, and nack_mac() gives its MAC.
TEST(NackMac, TheDocumentedTestVector) {
  std::ifstream in(std::string(TREEDUCE_SOURCE_ROOT) + "/docs/protocol.md");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const auto key = doc_hex(doc, "nack-mac key:");
  const auto msg = doc_hex(doc, "nack-mac message:");
  const auto mac = doc_hex(doc, "nack-mac result:");
  ASSERT_EQ(key.size(), 8u);
  ASSERT_EQ(msg.size(), kNackMacCovered);
  ASSERT_EQ(mac.size(), 8u);
  TdHdr n{};
  n.version = kProtocolVersion;
  n.opcode = static_cast<std::uint8_t>(Opcode::nack);
  n.dtype = static_cast<std::uint8_t>(DType::f32);
  n.op = static_cast<std::uint8_t>(ReduceOp::sum);
  n.tree_id.set(7);
  n.child.set(2);
  n.slot.set(13 % 8);
  n.slot_ver = (13 / 8) % 2;
  n.reason = static_cast<std::uint8_t>(Reason::bad_key);
  n.chunk.set(13);
  n.seq.set(3);
  EXPECT_EQ(std::memcmp(&n, msg.data(), msg.size()), 0) << "the message is the NACK's bytes 0-23";
  const be64 contrib_key = be64::of(0x0123456789ABCDEFull);
  EXPECT_EQ(std::memcmp(&contrib_key, key.data(), 8), 0) << "the key bytes are big-endian";
  n.key = nack_mac(contrib_key, n);
  EXPECT_EQ(std::memcmp(&n.key, mac.data(), 8), 0);
  EXPECT_TRUE(nack_verifies(0x0123456789ABCDEFull, n));
  EXPECT_FALSE(nack_verifies(0x0123456789ABCDEEull, n));
  // Every other field is bound: changing any of bytes 0-23 breaks the MAC.
  for (std::size_t i = 0; i < kNackMacCovered; ++i) {
    TdHdr m = n;
    reinterpret_cast<std::uint8_t*>(&m)[i] ^= 0x10;
    EXPECT_FALSE(nack_verifies(0x0123456789ABCDEFull, m)) << "byte " << i;
  }
}

}  // namespace
}  // namespace treeduce::proto
