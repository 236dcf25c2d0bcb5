// The DPDK transport on net_ring0, a ring PMD whose TX queue feeds its own RX queue: what send()
// puts on the wire comes straight back. Tests either read those frames themselves (to check the
// headers), configure the local address equal to the leaf's (so that the looped-back frames are
// "from the leaf" and "for us"), or inject frames they built with proto::build_frame. The EAL is
// initialised once in main() (the transport never does), with no huge pages and no PCI.
#include <gtest/gtest.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "../support/test_eal.h"
#include "dpdk_transport.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kPort[] = "net_ring0";
constexpr std::uint32_t kLeafIp = 0x0a000001;   // 10.0.0.1
constexpr std::uint32_t kLocalIp = 0x0a000002;  // 10.0.0.2
constexpr std::uint16_t kLeafPort = 47110;
constexpr std::uint16_t kLocalPort = 5000;
constexpr std::uint8_t kLeafMac[6] = {0x02, 0, 0, 0, 0, 0x01};
constexpr std::uint8_t kLocalMac[6] = {0x02, 0, 0, 0, 0, 0x02};
constexpr std::uint32_t kPayload = 256;

rte_mempool* g_inject_pool = nullptr;

DpdkTransportOptions options() {
  DpdkTransportOptions o;
  o.port_name = kPort;
  o.local_address = "10.0.0.2";
  o.local_port = kLocalPort;
  o.leaf_address = "10.0.0.1:47110";
  o.leaf_mac = "02:00:00:00:00:01";
  o.payload_bytes = kPayload;
  o.mbufs = 1023;
  return o;
}

// Local address = the leaf's: frames the transport sends come back to it as frames from the leaf.
DpdkTransportOptions loopback_options() {
  DpdkTransportOptions o = options();
  o.local_address = "10.0.0.1";
  o.local_port = kLeafPort;
  return o;
}

std::unique_ptr<Transport> make(const DpdkTransportOptions& o) {
  std::string err;
  auto t = make_dpdk_transport(o, &err);
  EXPECT_NE(t, nullptr) << err;
  EXPECT_EQ(err, "");
  return t;
}

proto::TdHdr header(std::uint32_t chunk, std::uint16_t count) {
  proto::TdHdr td{};
  td.version = proto::kProtocolVersion;
  td.opcode = static_cast<std::uint8_t>(proto::Opcode::contrib);
  td.dtype = 1;
  td.op = 0;
  td.tree_id.set(std::uint16_t{7});
  td.slot.set(static_cast<std::uint16_t>(chunk % 16));
  td.count.set(count);
  td.ncontrib.set(std::uint16_t{1});
  td.chunk.set(chunk);
  td.seq.set(std::uint32_t{3});
  td.key.set(std::uint64_t{0x1122334455667788});
  return td;
}

std::vector<std::uint8_t> payload(std::uint32_t chunk, std::size_t len) {
  std::vector<std::uint8_t> p(len);
  for (std::size_t i = 0; i < len; ++i) p[i] = static_cast<std::uint8_t>(chunk * 31 + i);
  return p;
}

// Puts a frame on the port's TX queue (which is its RX queue on net_ring).
void inject(const std::vector<std::uint8_t>& frame) {
  rte_mbuf* m = rte_pktmbuf_alloc(g_inject_pool);
  ASSERT_NE(m, nullptr);
  char* d = rte_pktmbuf_append(m, static_cast<std::uint16_t>(frame.size()));
  ASSERT_NE(d, nullptr);
  std::memcpy(d, frame.data(), frame.size());
  std::uint16_t port = 0;
  ASSERT_EQ(rte_eth_dev_get_port_by_name(kPort, &port), 0);
  ASSERT_EQ(rte_eth_tx_burst(port, 0, &m, 1), 1);
}

std::vector<std::uint8_t> frame(const proto::Endpoint& src, const proto::Endpoint& dst,
                                const proto::TdHdr& td, const std::vector<std::uint8_t>& pl) {
  std::vector<std::uint8_t> f(proto::kFrameHeaderBytes + pl.size());
  f.resize(proto::build_frame(f.data(), src, dst, td, pl.data(), pl.size()));
  return f;
}

proto::Endpoint leaf() {
  proto::Endpoint e;
  std::memcpy(e.mac, kLeafMac, 6);
  e.ip = kLeafIp;
  e.port = kLeafPort;
  return e;
}

proto::Endpoint local() {
  proto::Endpoint e;
  std::memcpy(e.mac, kLocalMac, 6);
  e.ip = kLocalIp;
  e.port = kLocalPort;
  return e;
}

// Receives until `want` datagrams arrived or a second passed; copies them out.
std::vector<std::vector<std::uint8_t>> receive_all(Transport& t, std::size_t want) {
  std::vector<std::vector<std::uint8_t>> got;
  const auto end = Clock::now() + std::chrono::seconds(1);
  while (got.size() < want && Clock::now() < end) {
    std::string err;
    for (const RxDatagram& d : t.receive(10'000'000, &err))
      got.emplace_back(d.data, d.data + d.len);
    EXPECT_EQ(err, "");
  }
  return got;
}

TEST(DpdkTransport, RejectsBadOptions) {
  std::string err;
  DpdkTransportOptions o = options();
  o.port_name = "net_nothere0";
  EXPECT_EQ(make_dpdk_transport(o, &err), nullptr);
  EXPECT_NE(err.find("no DPDK port 'net_nothere0'"), std::string::npos) << err;
  o = options();
  o.leaf_mac.clear();
  err.clear();
  EXPECT_EQ(make_dpdk_transport(o, &err), nullptr);
  EXPECT_NE(err.find("no ARP"), std::string::npos) << err;
  o = options();
  o.leaf_mac = "02:00:00:00:00";
  err.clear();
  EXPECT_EQ(make_dpdk_transport(o, &err), nullptr);
  EXPECT_NE(err.find("is not aa:bb"), std::string::npos) << err;
  o = options();
  o.leaf_address = "10.0.0.1";
  err.clear();
  EXPECT_EQ(make_dpdk_transport(o, &err), nullptr);
  EXPECT_NE(err.find("a.b.c.d:port"), std::string::npos) << err;
  o = options();
  o.local_address = "ten";
  err.clear();
  EXPECT_EQ(make_dpdk_transport(o, &err), nullptr);
  EXPECT_NE(err.find("not an IPv4 address"), std::string::npos) << err;
  // The port is still usable after the failures.
  EXPECT_NE(make(options()), nullptr);
}

TEST(DpdkTransport, SendBuildsWholeFrames) {
  DpdkTransportOptions o = options();
  o.local_mac = "02:00:00:00:00:02";
  auto t = make(o);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->batch(), 64u);
  std::vector<std::vector<std::uint8_t>> pls;
  std::vector<OutPacket> out;
  for (std::uint32_t c = 0; c < 5; ++c) {
    pls.push_back(payload(c, c == 4 ? 16 : kPayload));  // the last one short
  }
  for (std::uint32_t c = 0; c < 5; ++c) {
    out.push_back({header(c, static_cast<std::uint16_t>(pls[c].size())), pls[c].data(),
                   static_cast<std::uint32_t>(pls[c].size())});
  }
  ASSERT_EQ(t->send(out.data(), out.size()), "");
  EXPECT_EQ(t->stats().sent, 5u);
  EXPECT_EQ(t->stats().send_errors, 0u);

  // Read the looped-back frames ourselves, as the leaf would see them.
  std::uint16_t port = 0;
  ASSERT_EQ(rte_eth_dev_get_port_by_name(kPort, &port), 0);
  rte_mbuf* m[16];
  const std::uint16_t n = rte_eth_rx_burst(port, 0, m, 16);
  ASSERT_EQ(n, 5);
  for (std::uint16_t i = 0; i < n; ++i) {
    SCOPED_TRACE(i);
    const auto* f = rte_pktmbuf_mtod(m[i], const std::uint8_t*);
    const std::size_t len = rte_pktmbuf_pkt_len(m[i]);
    EXPECT_EQ(len, proto::kFrameHeaderBytes + pls[i].size());
    const auto eth = proto::load_header<proto::EtherHdr>(f);
    EXPECT_EQ(std::memcmp(eth.dst, kLeafMac, 6), 0);
    EXPECT_EQ(std::memcmp(eth.src, kLocalMac, 6), 0);
    const auto ip = proto::load_header<proto::Ipv4Hdr>(f + sizeof(proto::EtherHdr));
    EXPECT_EQ(ip.fragment.get(), 0x4000);  // DF
    proto::Parsed ps;
    ASSERT_EQ(proto::parse_frame(f, len, kLeafIp, kLeafPort, &ps), proto::Reason::none);
    EXPECT_EQ(ps.src_ip, kLocalIp);
    EXPECT_EQ(ps.src_port, kLocalPort);
    EXPECT_EQ(std::memcmp(&ps.td, &out[i].td, sizeof(proto::TdHdr)), 0);
    ASSERT_EQ(ps.payload_len, pls[i].size());
    EXPECT_EQ(std::memcmp(ps.payload, pls[i].data(), pls[i].size()), 0);
  }
  rte_pktmbuf_free_bulk(m, n);

  // A payload larger than the transport's size is an error sentence, nothing sent.
  std::vector<std::uint8_t> big(kPayload + 1);
  const OutPacket p{header(9, 1), big.data(), static_cast<std::uint32_t>(big.size())};
  EXPECT_NE(t->send(&p, 1).find("exceeds"), std::string::npos);
  EXPECT_EQ(t->stats().sent, 5u);
}

TEST(DpdkTransport, ReceivesFromTheLeafOnlyAndCountsForeignFrames) {
  auto t = make(options());
  ASSERT_NE(t, nullptr);
  const auto pl0 = payload(0, kPayload), pl1 = payload(1, 40);
  inject(frame(leaf(), local(), header(0, kPayload), pl0));
  proto::Endpoint other = leaf();
  other.ip = 0x0a000009;
  inject(frame(other, local(), header(5, kPayload), pl0));  // another sender
  proto::Endpoint other_port = leaf();
  other_port.port = 47111;
  inject(frame(other_port, local(), header(5, kPayload), pl0));  // the leaf, another port
  proto::Endpoint not_me = local();
  not_me.port = 5001;
  inject(frame(leaf(), not_me, header(5, kPayload), pl0));  // not our port
  not_me = local();
  not_me.ip = 0x0a000003;
  inject(frame(leaf(), not_me, header(5, kPayload), pl0));                        // not our address
  inject(frame(leaf(), local(), header(5, kPayload), payload(5, kPayload + 8)));  // too long
  std::vector<std::uint8_t> arp(60, 0);
  std::memcpy(arp.data(), kLocalMac, 6);
  arp[12] = 0x08;
  arp[13] = 0x06;
  inject(arp);  // not IPv4
  inject(frame(leaf(), local(), header(1, 40), pl1));

  const auto got = receive_all(*t, 2);
  ASSERT_EQ(got.size(), 2u);
  const proto::TdHdr h0 = header(0, kPayload), h1 = header(1, 40);
  ASSERT_EQ(got[0].size(), sizeof(proto::TdHdr) + kPayload);
  EXPECT_EQ(std::memcmp(got[0].data(), &h0, sizeof h0), 0);
  EXPECT_EQ(std::memcmp(got[0].data() + sizeof h0, pl0.data(), kPayload), 0);
  ASSERT_EQ(got[1].size(), sizeof(proto::TdHdr) + 40);
  EXPECT_EQ(std::memcmp(got[1].data(), &h1, sizeof h1), 0);
  EXPECT_EQ(std::memcmp(got[1].data() + sizeof h1, pl1.data(), 40), 0);
  EXPECT_EQ(t->stats().received, 2u);
  EXPECT_EQ(t->stats().foreign, 6u);

  // What the transport itself sends goes to the leaf, not to us: foreign when it loops back.
  const OutPacket p{header(2, kPayload), pl0.data(), kPayload};
  ASSERT_EQ(t->send(&p, 1), "");
  std::string err;
  EXPECT_TRUE(t->receive(20'000'000, &err).empty());
  EXPECT_EQ(t->stats().foreign, 7u);
}

TEST(DpdkTransport, RoundTripOnLoopbackInBatches) {
  auto t = make(loopback_options());
  ASSERT_NE(t, nullptr);
  constexpr std::uint32_t kPackets = 300;
  std::vector<std::vector<std::uint8_t>> pls;
  for (std::uint32_t c = 0; c < kPackets; ++c) pls.push_back(payload(c, kPayload));
  std::vector<std::vector<std::uint8_t>> got;
  for (std::uint32_t c = 0; c < kPackets;) {
    std::vector<OutPacket> out;
    for (; c < kPackets && out.size() < t->batch(); ++c) {
      out.push_back({header(c, kPayload), pls[c].data(), kPayload});
    }
    ASSERT_EQ(t->send(out.data(), out.size()), "");
    for (auto& d : receive_all(*t, out.size())) got.push_back(std::move(d));
  }
  EXPECT_EQ(t->stats().sent, kPackets);
  EXPECT_EQ(t->stats().send_errors, 0u);
  EXPECT_EQ(t->stats().received, kPackets);
  EXPECT_EQ(t->stats().foreign, 0u);
  ASSERT_EQ(got.size(), kPackets);
  for (std::uint32_t c = 0; c < kPackets; ++c) {
    const proto::TdHdr h = header(c, kPayload);
    ASSERT_EQ(got[c].size(), sizeof h + kPayload);
    EXPECT_EQ(std::memcmp(got[c].data(), &h, sizeof h), 0) << c;
    EXPECT_EQ(std::memcmp(got[c].data() + sizeof h, pls[c].data(), kPayload), 0) << c;
  }
}

// A thread the EAL did not start (the communicator's progress thread, an application's) has no
// lcore id, so no mempool cache: the transport makes it an lcore while it drives the port, and
// the lcore, with what its caches held, goes back when the thread ends.
TEST(DpdkTransport, AThreadThatDrivesItIsAnLcoreUntilItEnds) {
  auto t = make(loopback_options());
  ASSERT_NE(t, nullptr);
  const unsigned lcores = rte_lcore_count();
  const std::vector<std::uint8_t> pl = payload(1, kPayload);
  unsigned id = LCORE_ID_ANY, before = 0, during = 0;
  std::size_t cached = 0, received = 0;
  std::thread([&] {
    before = rte_lcore_id();
    const OutPacket p{header(1, kPayload), pl.data(), kPayload};
    for (int i = 0; i < 8; ++i) {
      if (!t->send(&p, 1).empty()) return;
      received += receive_all(*t, 1).size();
    }
    id = rte_lcore_id();
    during = rte_lcore_count();
    // The mbufs went back to this lcore's cache of some pool, not to the pools' rings.
    rte_mempool_walk(
        [](rte_mempool* mp, void* arg) {
          if (const rte_mempool_cache* c = rte_mempool_default_cache(mp, rte_lcore_id())) {
            *static_cast<std::size_t*>(arg) += c->len;
          }
        },
        &cached);
  }).join();
  EXPECT_EQ(received, 8u);
  EXPECT_EQ(before, LCORE_ID_ANY);
  ASSERT_NE(id, LCORE_ID_ANY);
  EXPECT_EQ(during, lcores + 1);
  EXPECT_GT(cached, 0u);
  // Gone with the thread, its caches emptied into the pools.
  EXPECT_EQ(rte_lcore_count(), lcores);
  std::pair<unsigned, std::size_t> left{id, 0};
  rte_mempool_walk(
      [](rte_mempool* mp, void* arg) {
        auto* l = static_cast<std::pair<unsigned, std::size_t>*>(arg);
        if (const rte_mempool_cache* c = rte_mempool_default_cache(mp, l->first)) {
          l->second += c->len;
        }
      },
      &left);
  EXPECT_EQ(left.second, 0u);
  // The thread that started the EAL keeps its lcore and needs no other.
  EXPECT_NE(rte_lcore_id(), LCORE_ID_ANY);
}

TEST(DpdkTransport, AFullPortCountsLossesAndNeverBlocks) {
  // Nobody reads: the ring, then the pool, fill up. Each send() returns within its bound and
  // counts what did not fit as send errors; what went out comes back intact.
  // 255 mbufs: the pool runs dry first; 8191: net_ring's ring (1024) fills first, and each send()
  // waits its 100 ms bound.
  for (const std::uint32_t mbufs : {255u, 8191u}) {
    SCOPED_TRACE(mbufs);
    DpdkTransportOptions o = loopback_options();
    o.mbufs = mbufs;
    auto t = make(o);
    ASSERT_NE(t, nullptr);
    const auto pl = payload(1, kPayload);
    std::vector<OutPacket> out;
    for (std::uint32_t c = 0; c < t->batch(); ++c)
      out.push_back({header(c, kPayload), pl.data(), kPayload});
    for (int i = 0; i < 40 && t->stats().send_errors == 0; ++i) {
      const auto start = Clock::now();
      ASSERT_EQ(t->send(out.data(), out.size()), "");
      EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
    }
    EXPECT_GT(t->stats().send_errors, 0u);
    const std::uint64_t sent = t->stats().sent;
    EXPECT_EQ(sent + t->stats().send_errors,
              out.size() * ((sent + t->stats().send_errors) / out.size()));
    EXPECT_EQ(receive_all(*t, sent).size(), sent);
    EXPECT_EQ(t->stats().received, sent);
    // And the port works again once drained.
    ASSERT_EQ(t->send(out.data(), 1), "");
    EXPECT_EQ(receive_all(*t, 1).size(), 1u);
  }
}

TEST(DpdkTransport, ReceiveReturnsEmptyWhenTheTimePasses) {
  auto t = make(options());
  ASSERT_NE(t, nullptr);
  std::string err;
  auto start = Clock::now();
  EXPECT_TRUE(t->receive(0, &err).empty());
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(500));
  start = Clock::now();
  EXPECT_TRUE(t->receive(30'000'000, &err).empty());
  const auto took = Clock::now() - start;
  EXPECT_GE(took, std::chrono::milliseconds(30));
  EXPECT_LT(took, std::chrono::seconds(2));
  EXPECT_EQ(err, "");
}

TEST(DpdkTransport, WakeEndsABlockedReceive) {
  auto t = make(options());
  ASSERT_NE(t, nullptr);
  std::string err;
  // From another thread, while receive() waits.
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t->wake();
  });
  auto start = Clock::now();
  EXPECT_TRUE(t->receive(10'000'000'000, &err).empty());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  waker.join();
  // A wake() before receive() ends the next wait at once, and only that one.
  t->wake();
  start = Clock::now();
  EXPECT_TRUE(t->receive(10'000'000'000, &err).empty());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  start = Clock::now();
  EXPECT_TRUE(t->receive(20'000'000, &err).empty());
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(20));
  // Data that is there is returned even when a wake() is pending.
  auto pl = payload(0, kPayload);
  inject(frame(leaf(), local(), header(0, kPayload), pl));
  t->wake();
  EXPECT_EQ(t->receive(10'000'000'000, &err).size(), 1u);
  EXPECT_TRUE(t->receive(10'000'000'000, &err).empty());  // the wake() still ends this one
}

// Zero-copy TX: frames read back as the leaf would see them (chained or not), as bytes.
std::vector<std::vector<std::uint8_t>> read_frames(rte_mbuf** m, std::uint16_t n) {
  std::vector<std::vector<std::uint8_t>> out;
  for (std::uint16_t i = 0; i < n; ++i) {
    std::vector<std::uint8_t> f(rte_pktmbuf_pkt_len(m[i]));
    const void* d = rte_pktmbuf_read(m[i], 0, static_cast<std::uint32_t>(f.size()), f.data());
    if (d != f.data()) std::memcpy(f.data(), d, f.size());
    out.push_back(f);
  }
  return out;
}

// The payload a frame carries, checked to be a datagram from us to the leaf.
std::vector<std::uint8_t> payload_of(const std::vector<std::uint8_t>& f, proto::TdHdr* td) {
  proto::Parsed ps;
  EXPECT_EQ(proto::parse_frame(f.data(), f.size(), kLeafIp, kLeafPort, &ps), proto::Reason::none);
  *td = ps.td;
  return {ps.payload, ps.payload + ps.payload_len};
}

DpdkTransportOptions zero_copy_options() {
  DpdkTransportOptions o = options();
  o.tx_mode = DpdkTransportOptions::TxMode::zero_copy_any;  // net_ring keeps the mbufs: a PMD
                                                            // that holds references
  return o;
}

TEST(DpdkTransport, ZeroCopySendsTheCallersBytesAndHoldsThemUntilThePmdFreesTheFrame) {
  testing::internal::CaptureStderr();
  auto t = make(zero_copy_options());
  const std::string said = testing::internal::GetCapturedStderr();
  ASSERT_NE(t, nullptr);
  EXPECT_NE(said.find("TX zero-copy"), std::string::npos) << said;
  std::uint16_t port = 0;
  ASSERT_EQ(rte_eth_dev_get_port_by_name(kPort, &port), 0);
  std::vector<std::uint8_t> buf(3 * kPayload - 100);  // the last chunk short
  for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<std::uint8_t>(i * 7 + 3);
  std::vector<OutPacket> out;
  for (std::uint32_t c = 0; c < 3; ++c) {
    const std::uint32_t len = std::min<std::uint32_t>(kPayload, buf.size() - c * kPayload);
    out.push_back({header(c, static_cast<std::uint16_t>(len)), buf.data() + c * kPayload, len});
  }
  EXPECT_FALSE(t->references(buf.data(), buf.size()));
  ASSERT_EQ(t->send(out.data(), out.size()), "");
  // The frames sit in the ring, pointing into buf.
  EXPECT_TRUE(t->references(buf.data(), buf.size()));
  EXPECT_TRUE(t->references(buf.data() + 2 * kPayload, 1));
  EXPECT_FALSE(t->references(buf.data() + buf.size(), 16));  // just past it
  std::vector<std::uint8_t> other(16);
  EXPECT_FALSE(t->references(other.data(), other.size()));

  rte_mbuf* m[8];
  const std::uint16_t n = rte_eth_rx_burst(port, 0, m, 8);
  ASSERT_EQ(n, 3);
  for (std::uint16_t i = 0; i < n; ++i) EXPECT_EQ(m[i]->nb_segs, 2) << "not zero-copy";
  const auto frames = read_frames(m, n);
  for (std::uint32_t c = 0; c < 3; ++c) {
    proto::TdHdr td;
    const auto pl = payload_of(frames[c], &td);
    EXPECT_EQ(std::memcmp(&td, &out[c].td, sizeof td), 0);
    ASSERT_EQ(pl.size(), out[c].payload_len);
    EXPECT_EQ(std::memcmp(pl.data(), out[c].payload, pl.size()), 0);
  }
  // Each frame holds its own chunk: freeing the first two leaves the third referenced.
  rte_pktmbuf_free_bulk(m, 2);
  EXPECT_FALSE(t->references(buf.data(), 2 * kPayload));
  EXPECT_TRUE(t->references(buf.data(), buf.size()));
  rte_pktmbuf_free(m[2]);
  EXPECT_FALSE(t->references(buf.data(), buf.size()));
}

TEST(DpdkTransport, ZeroCopyRetransmissionSendsTheSameBytesAgain) {
  auto t = make(zero_copy_options());
  ASSERT_NE(t, nullptr);
  std::uint16_t port = 0;
  ASSERT_EQ(rte_eth_dev_get_port_by_name(kPort, &port), 0);
  std::vector<std::uint8_t> buf = payload(4, kPayload);
  const std::vector<std::uint8_t> want = buf;
  const OutPacket p{header(4, kPayload), buf.data(), kPayload};
  // The first transmission, read and freed; then a retransmission while another copy of the
  // frame is still in the ring: both carry the caller's bytes, the references end with the last.
  ASSERT_EQ(t->send(&p, 1), "");
  rte_mbuf* m[4];
  ASSERT_EQ(rte_eth_rx_burst(port, 0, m, 4), 1);
  auto f = read_frames(m, 1);
  rte_pktmbuf_free(m[0]);
  EXPECT_FALSE(t->references(buf.data(), buf.size()));
  ASSERT_EQ(t->send(&p, 1), "");
  ASSERT_EQ(t->send(&p, 1), "");
  ASSERT_EQ(rte_eth_rx_burst(port, 0, m, 4), 2);
  const auto again = read_frames(m, 2);
  proto::TdHdr td;
  EXPECT_EQ(payload_of(f[0], &td), want);
  EXPECT_EQ(payload_of(again[0], &td), want);
  EXPECT_EQ(payload_of(again[1], &td), want);
  EXPECT_EQ(td.chunk.get(), 4u);
  rte_pktmbuf_free(m[0]);
  EXPECT_TRUE(t->references(buf.data(), buf.size()));
  rte_pktmbuf_free(m[1]);
  EXPECT_FALSE(t->references(buf.data(), buf.size()));
}

TEST(DpdkTransport, ZeroCopyFramesRoundTripThroughTheTransportsOwnReceive) {
  // Chained frames that come back (net_ring) are taken apart by receive(), which frees them:
  // then nothing is referenced.
  DpdkTransportOptions o = loopback_options();
  o.tx_mode = DpdkTransportOptions::TxMode::zero_copy_any;
  auto t = make(o);
  ASSERT_NE(t, nullptr);
  std::vector<std::vector<std::uint8_t>> pls;
  std::vector<OutPacket> out;
  for (std::uint32_t c = 0; c < 40; ++c) pls.push_back(payload(c, kPayload - c));
  for (std::uint32_t c = 0; c < 40; ++c) {
    out.push_back({header(c, static_cast<std::uint16_t>(pls[c].size())), pls[c].data(),
                   static_cast<std::uint32_t>(pls[c].size())});
  }
  ASSERT_EQ(t->send(out.data(), out.size()), "");
  EXPECT_TRUE(t->references(pls[39].data(), 1));
  const auto got = receive_all(*t, 40);
  ASSERT_EQ(got.size(), 40u);
  for (std::uint32_t c = 0; c < 40; ++c) {
    ASSERT_EQ(got[c].size(), sizeof(proto::TdHdr) + pls[c].size());
    EXPECT_EQ(std::memcmp(got[c].data() + sizeof(proto::TdHdr), pls[c].data(), pls[c].size()), 0);
  }
  for (const auto& pl : pls) EXPECT_FALSE(t->references(pl.data(), pl.size()));
}

TEST(DpdkTransport, CopiesWhereThePmdTakesNoChainsOrWhenAsked) {
  // net_null0 advertises no multi-segment TX: even when zero-copy is asked for, payloads are
  // copied, it says so, and nothing is referenced after send().
  DpdkTransportOptions o = zero_copy_options();
  o.port_name = "net_null0";
  testing::internal::CaptureStderr();
  auto t = make(o);
  std::string said = testing::internal::GetCapturedStderr();
  ASSERT_NE(t, nullptr);
  EXPECT_NE(said.find("takes no multi-segment frames"), std::string::npos) << said;
  auto pl = payload(1, kPayload);
  const OutPacket p{header(1, kPayload), pl.data(), kPayload};
  ASSERT_EQ(t->send(&p, 1), "");
  EXPECT_EQ(t->stats().sent, 1u);
  EXPECT_FALSE(t->references(pl.data(), pl.size()));
  t.reset();

  // On net_ring, asked to copy: one segment per frame with the bytes in it, no reference.
  o = options();
  o.tx_mode = DpdkTransportOptions::TxMode::copy;
  testing::internal::CaptureStderr();
  t = make(o);
  said = testing::internal::GetCapturedStderr();
  ASSERT_NE(t, nullptr);
  EXPECT_NE(said.find("zero-copy switched off"), std::string::npos) << said;
  ASSERT_EQ(t->send(&p, 1), "");
  EXPECT_FALSE(t->references(pl.data(), pl.size()));
  std::uint16_t port = 0;
  ASSERT_EQ(rte_eth_dev_get_port_by_name(kPort, &port), 0);
  rte_mbuf* m[2];
  ASSERT_EQ(rte_eth_rx_burst(port, 0, m, 2), 1);
  EXPECT_EQ(m[0]->nb_segs, 1);
  const auto f = read_frames(m, 1);
  rte_pktmbuf_free(m[0]);
  proto::TdHdr td;
  EXPECT_EQ(payload_of(f[0], &td), pl);
  t.reset();

  // By default (automatic) net_ring, which keeps the frames, copies too.
  testing::internal::CaptureStderr();
  t = make(options());
  said = testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("TX copies"), std::string::npos) << said;
}

}  // namespace
}  // namespace treeduce::host

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!treeduce::test_support::init_test_eal(argv[0], "tdhostdpdk", {"net_ring0", "net_null0"}))
    return 1;
  treeduce::host::g_inject_pool =
      rte_pktmbuf_pool_create("test_inject", 511, 0, 0, RTE_MBUF_DEFAULT_BUF_SIZE, SOCKET_ID_ANY);
  if (treeduce::host::g_inject_pool == nullptr) {
    std::fprintf(stderr, "no mbuf pool\n");
    return 1;
  }
  const int rc = RUN_ALL_TESTS();
  rte_mempool_free(treeduce::host::g_inject_pool);
  rte_eal_cleanup();
  return rc;
}
