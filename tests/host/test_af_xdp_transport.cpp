// The af_xdp transport (host/src/af_xdp_transport.h): the TX frame accounting; the XDP program's
// port matching, run by the kernel on crafted frames (BPF_PROG_TEST_RUN); and the transport on
// a veth pair in a network namespace of this test's own (unshare: nothing outside it is seen or
// left behind), against a kernel UDP socket as the leaf, in generic and native XDP mode, with
// the kernel still receiving what is not treeduce's. Bad configurations give one sentence. The
// parts that need the kernel need root (CAP_BPF, CAP_NET_ADMIN) and skip without it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bpf/bpf.h>
#include <linux/bpf.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "af_xdp_transport.h"
#include "treeduce/protocol/wire.h"

namespace {

using namespace treeduce;
using namespace treeduce::host;

TEST(FramePool, TakesEveryFrameOnceAndTakesBackOnlyItsOwn) {
  detail::FramePool p(4 * 2048, 8, 2048);
  EXPECT_EQ(p.free(), 8u);
  std::set<std::uint64_t> got;
  std::uint64_t a = 0;
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(p.take(&a));
    EXPECT_EQ(a % 2048, 0u);
    EXPECT_GE(a, 4u * 2048);
    EXPECT_LT(a, 12u * 2048);
    got.insert(a);
  }
  EXPECT_EQ(got.size(), 8u);
  EXPECT_EQ(p.in_flight(), 8u);
  EXPECT_FALSE(p.take(&a));  // all in flight: the caller waits for completions
  // Completions in any order.
  EXPECT_TRUE(p.give_back(6 * 2048));
  EXPECT_TRUE(p.give_back(4 * 2048));
  EXPECT_EQ(p.free(), 2u);
  // Refused: given back twice, not a frame boundary, outside the pool.
  EXPECT_FALSE(p.give_back(6 * 2048));
  EXPECT_FALSE(p.give_back(5 * 2048 + 100));
  EXPECT_FALSE(p.give_back(3 * 2048));
  EXPECT_FALSE(p.give_back(12 * 2048));
  EXPECT_EQ(p.free(), 2u);
  ASSERT_TRUE(p.take(&a));
  EXPECT_TRUE(a == 6 * 2048 || a == 4 * 2048);
  EXPECT_EQ(p.in_flight(), 7u);
}

bool root() { return geteuid() == 0; }

constexpr std::uint32_t kSelf = 0x0a630002;  // 10.99.0.2
constexpr std::uint32_t kLeaf = 0x0a630001;  // 10.99.0.1
constexpr std::uint16_t kPort = 29000;
constexpr std::uint16_t kLeafPort = 47000;

// A RESULT of `chunk`: what the transport carries is opaque to it beyond the chunk the test
// checks.
proto::TdHdr header(std::uint32_t chunk) {
  proto::TdHdr td{};
  td.version = proto::kProtocolVersion;
  td.opcode = static_cast<std::uint8_t>(proto::Opcode::result);
  td.chunk.set(chunk);
  return td;
}

// A treeduce frame from the leaf to us, to be altered by the case.
std::vector<std::uint8_t> frame_to(std::uint32_t ip, std::uint16_t port) {
  proto::Endpoint src, dst;
  src.ip = kLeaf;
  src.port = kLeafPort;
  dst.ip = ip;
  dst.port = port;
  std::vector<std::uint8_t> f(proto::kFrameHeaderBytes + 256);
  std::vector<std::uint8_t> pl(256, 0x5a);
  proto::build_frame(f.data(), src, dst, header(1), pl.data(), pl.size());
  return f;
}

int run(int prog, std::vector<std::uint8_t> f) {
  f.resize(std::max<std::size_t>(f.size(), 14));
  bpf_test_run_opts o;
  treeduce::host::detail::init_bpf_opts(&o);
  o.data_in = f.data();
  o.data_size_in = std::uint32_t(f.size());
  o.repeat = 1;
  EXPECT_EQ(bpf_prog_test_run_opts(prog, &o), 0) << std::strerror(errno);
  return int(o.retval);
}

TEST(AfXdpProgram, RedirectsOnlyTreeduceAddressAndPort) {
  if (!root()) GTEST_SKIP() << "loading BPF needs root";
  detail::LoadedXdpProgram p;
  ASSERT_EQ(p.load(kSelf, kPort), "");
  const int fd = p.program_fd();
  ASSERT_GE(fd, 0);
  // Ours: matched; no socket in the map here, so it falls back to the kernel (XDP_PASS) and is
  // counted as such.
  EXPECT_EQ(run(fd, frame_to(kSelf, kPort)), XDP_PASS);
  EXPECT_EQ(p.matched(), 1u);
  EXPECT_EQ(p.no_socket(), 1u);
  // Another port, another address: the kernel's, unmatched.
  EXPECT_EQ(run(fd, frame_to(kSelf, kPort + 1)), XDP_PASS);
  EXPECT_EQ(run(fd, frame_to(kSelf + 1, kPort)), XDP_PASS);
  // An ARP frame (EtherType 0x0806).
  auto arp = frame_to(kSelf, kPort);
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_EQ(run(fd, arp), XDP_PASS);
  // TCP to our port (the protocol byte), a fragment (MF), IPv4 with options (IHL 6).
  auto tcp = frame_to(kSelf, kPort);
  tcp[14 + 9] = 6;
  EXPECT_EQ(run(fd, tcp), XDP_PASS);
  auto frag = frame_to(kSelf, kPort);
  frag[14 + 6] |= 0x20;
  EXPECT_EQ(run(fd, frag), XDP_PASS);
  auto opts = frame_to(kSelf, kPort);
  opts[14] = 0x46;
  EXPECT_EQ(run(fd, opts), XDP_PASS);
  // Cut inside the UDP header: never read past the end.
  auto cut = frame_to(kSelf, kPort);
  cut.resize(14 + 20 + 4);
  EXPECT_EQ(run(fd, cut), XDP_PASS);
  EXPECT_EQ(p.matched(), 1u) << "only the first frame is treeduce's";
  // Ours again, and a short one of ours (a UDP header, nothing after it) still matches: the
  // transport judges its contents.
  auto bare = frame_to(kSelf, kPort);
  bare.resize(14 + 20 + 8);
  EXPECT_EQ(run(fd, bare), XDP_PASS);
  EXPECT_EQ(p.matched(), 2u);
}

// A veth pair between two network namespaces of this process's own, gone with it: `td0`
// (10.99.0.2, the transport's, in the namespace of the thread gtest runs tests on) and `td1`
// (10.99.0.1, in a namespace of a helper thread's, where the leaf's kernel socket lives; the
// socket keeps that namespace alive once the thread is gone).
class AfXdpVeth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!root() || unshare(CLONE_NEWNET) != 0) return;
    bool leaf_ok = false;
    std::thread([&leaf_ok] {
      if (unshare(CLONE_NEWNET) != 0) return;
      const std::string cmd =
          "ip link set lo up && ip link add td1 mtu 9000 type veth peer name td0 mtu 9000 netns " +
          std::to_string(getpid()) + " && ip addr add 10.99.0.1/24 dev td1 && ip link set td1 up";
      if (std::system(cmd.c_str()) != 0) return;
      leaf_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
      // Room for a batch of 64 jumbo datagrams before the echo reads them.
      const int rcvbuf = 8 << 20;
      setsockopt(leaf_, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(kLeaf);
      a.sin_port = htons(kLeafPort);
      leaf_ok = bind(leaf_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }).join();
    ready_ = leaf_ok && std::system(
                            "ip link set lo up && ip addr add 10.99.0.2/24 dev td0 && "
                            "ip link set td0 up") == 0;
  }

  void SetUp() override {
    if (!root()) GTEST_SKIP() << "needs root (network namespaces, XDP)";
    ASSERT_TRUE(ready_) << "could not make the veth pair";
  }

  AfXdpTransportOptions options(XdpMode mode, std::uint32_t payload = 1024) const {
    AfXdpTransportOptions o;
    o.mode = mode;
    o.local_address = "10.99.0.2";
    o.port = kPort;
    o.leaf_address = "10.99.0.1:47000";
    o.payload_bytes = payload;
    o.frames = 256;
    return o;
  }

  // The leaf: every datagram that arrives within 5 s goes back to where it came from. The count
  // echoed.
  int echo(int want) {
    int n = 0;
    std::vector<std::uint8_t> buf(9000);
    while (n < want) {
      pollfd p{leaf_, POLLIN, 0};
      if (poll(&p, 1, 5000) <= 0) break;
      sockaddr_in from{};
      socklen_t fl = sizeof from;
      const ssize_t k =
          recvfrom(leaf_, buf.data(), buf.size(), 0, reinterpret_cast<sockaddr*>(&from), &fl);
      if (k < 0) break;
      sendto(leaf_, buf.data(), std::size_t(k), 0, reinterpret_cast<sockaddr*>(&from), fl);
      ++n;
    }
    return n;
  }

  // Sends `n` packets of distinct chunks through `t` a batch at a time, the leaf echoes each
  // batch, and every packet comes back with its header and payload intact.
  void round_trip(Transport& t, int n, std::uint32_t size = 1024) {
    std::vector<std::vector<std::uint8_t>> pls;
    std::vector<OutPacket> out;
    for (int i = 0; i < n; ++i) {
      pls.emplace_back(size);
      for (std::uint32_t b = 0; b < size; ++b) pls.back()[b] = std::uint8_t(i * 7 + b * 13 + 1);
    }
    for (int i = 0; i < n; ++i) {
      out.push_back({header(std::uint32_t(i)), pls[std::size_t(i)].data(), size});
    }
    const TransportStats before = t.stats();
    std::set<std::uint32_t> seen;
    for (std::size_t i = 0; i < out.size(); i += t.batch()) {
      const std::size_t k = std::min(t.batch(), out.size() - i);
      ASSERT_EQ(t.send(&out[i], k), "");
      ASSERT_EQ(echo(int(k)), int(k)) << "the leaf's socket did not get every frame";
      // Until every packet of the batch is back, or 5 s pass without one.
      while (seen.size() < i + k) {
        std::string err;
        const std::span<const RxDatagram> got = t.receive(5'000'000'000ull, &err);
        ASSERT_EQ(err, "");
        if (got.empty()) break;
        for (const RxDatagram& d : got) {
          ASSERT_EQ(d.len, sizeof(proto::TdHdr) + size);
          const auto td = proto::load_header<proto::TdHdr>(d.data);
          const std::uint32_t c = td.chunk.get();
          ASSERT_LT(c, std::uint32_t(n));
          EXPECT_EQ(std::memcmp(d.data + sizeof(proto::TdHdr), pls[c].data(), size), 0);
          seen.insert(c);
        }
      }
      ASSERT_EQ(seen.size(), i + k);
    }
    EXPECT_EQ(t.stats().sent - before.sent, std::uint64_t(n));
    EXPECT_EQ(t.stats().received - before.received, std::uint64_t(n));
    EXPECT_EQ(t.stats().send_errors, 0u);
    EXPECT_EQ(t.stats().foreign, 0u);
  }

  static inline bool ready_ = false;
  static inline int leaf_ = -1;
};

TEST_F(AfXdpVeth, RoundTripsInGenericModeAndTheKernelKeepsTheRest) {
  std::string err;
  auto t = make_af_xdp_transport(options(XdpMode::skb), &err);
  ASSERT_NE(t, nullptr) << err;
  round_trip(*t, 300);  // more than the 128 TX frames: completions recycle them
  // A kernel socket on another port of the same address still gets its datagram (and ARP
  // worked, or nothing above would have).
  const int other = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(kSelf);
  a.sin_port = htons(kPort + 1);
  ASSERT_EQ(bind(other, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(sendto(leaf_, "hi", 2, 0, reinterpret_cast<sockaddr*>(&a), sizeof a), 2);
  pollfd p{other, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 5000), 1);
  char b[4];
  EXPECT_EQ(recv(other, b, sizeof b, MSG_DONTWAIT), 2);
  close(other);
}

TEST_F(AfXdpVeth, RoundTripsInAutoModeNativeOnVeth) {
  std::string err;
  auto t = make_af_xdp_transport(options(XdpMode::auto_select), &err);
  ASSERT_NE(t, nullptr) << err;
  round_trip(*t, 100);
}

// 8 KiB payloads: frames of 8266 bytes, three 4 KiB UMEM frames each way (multi-buffer).
TEST_F(AfXdpVeth, RoundTripsJumboFramesInSeveralBuffers) {
  for (const XdpMode mode : {XdpMode::skb, XdpMode::auto_select}) {
    std::string err;
    // 512 RX frames: a batch of 64 frames of three buffers each arrives before it is read.
    auto o = options(mode, 8192);
    o.frames = 1024;
    auto t = make_af_xdp_transport(o, &err);
    ASSERT_NE(t, nullptr) << err;
    round_trip(*t, 100, 8192);
    // A short payload in the same transport is one buffer.
    round_trip(*t, 10, 256);
  }
}

TEST_F(AfXdpVeth, WakeEndsAWaitAndAnEmptyWaitReturnsNothing) {
  std::string err;
  auto t = make_af_xdp_transport(options(XdpMode::skb), &err);
  ASSERT_NE(t, nullptr) << err;
  EXPECT_TRUE(t->receive(0, &err).empty());
  t->wake();
  EXPECT_TRUE(t->receive(60'000'000'000ull, &err).empty());  // returns at once: woken
  EXPECT_EQ(err, "");
}

TEST_F(AfXdpVeth, BadConfigurationsGiveOneSentence) {
  std::string err;
  auto o = options(XdpMode::skb);
  o.interface = "nosuch0";
  EXPECT_EQ(make_af_xdp_transport(o, &err), nullptr);
  EXPECT_EQ(err, "There is no interface 'nosuch0' on this host.");
  // veth has no zero-copy: asked for it, the transport says so.
  err.clear();
  EXPECT_EQ(make_af_xdp_transport(options(XdpMode::zerocopy), &err), nullptr);
  EXPECT_NE(err.find("zero-copy"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  // A queue the interface lacks.
  err.clear();
  o = options(XdpMode::skb);
  o.queue = 7;
  EXPECT_EQ(make_af_xdp_transport(o, &err), nullptr);
  EXPECT_NE(err.find("queue 7"), std::string::npos) << err;
  // A leaf nobody answers ARP for.
  err.clear();
  o = options(XdpMode::skb);
  o.leaf_address = "10.99.0.77:47000";
  o.arp_timeout_ms = 1500;
  EXPECT_EQ(make_af_xdp_transport(o, &err), nullptr);
  EXPECT_NE(err.find("No ARP answer from 10.99.0.77"), std::string::npos) << err;
  // Payloads the protocol does not have.
  err.clear();
  EXPECT_EQ(make_af_xdp_transport(options(XdpMode::skb, 0), &err), nullptr);
  EXPECT_EQ(err, "The payload size must be from 1 to 8192 bytes, not 0.");
  // And after all that, the interface is free again: a transport starts.
  err.clear();
  auto t = make_af_xdp_transport(options(XdpMode::skb), &err);
  EXPECT_NE(t, nullptr) << err;
  // While it holds the interface's XDP hook, a second one is refused in one sentence.
  err.clear();
  auto other = options(XdpMode::skb);
  other.port = kPort + 5;
  EXPECT_EQ(make_af_xdp_transport(other, &err), nullptr);
  EXPECT_NE(err.find("Another XDP program is already attached to td0"), std::string::npos) << err;
  EXPECT_EQ(err.find('\n'), std::string::npos) << err;
}

}  // namespace
