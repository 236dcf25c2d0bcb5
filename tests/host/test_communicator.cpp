// libtreeduce through its C++ and C APIs, against a real switch core on loopback: N ranks run as
// threads of this process, each a Communicator with a static tree whose leaf is a FakeSwitch (a
// dp::Core behind a UDP socket on 127.0.0.1). Each rank binds its own 127.0.0.x address because
// the core checks a CONTRIB's source address. Results are checked bit for bit against expected
// values that are exact whatever the arrival order (lab/README.md, "Inputs and why the
// expected results are exact"). The fallback cases run the real host-side reduction (Gloo).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "pair_reference.h"
#include "treeduce/dataplane/core.h"
#include "treeduce/host/communicator.h"
#include "treeduce/lab/exact_inputs.h"
#include "udp_transport.h"

using namespace treeduce;
using namespace treeduce::host;

extern "C" int treeduce_test_c_api(const char* leaf_address, const char* bind_address,
                                   unsigned short port, const char* store, char* message,
                                   size_t message_len);

namespace {

// The API's Result, not treeduce::Result<T> (status.h, through udp_transport.h).
using treeduce::host::Result;

constexpr std::uint16_t kTreeId = 7;
constexpr std::uint64_t kKey = 0x5eed'1234'abcd'0001ull;

std::uint32_t loopback(std::uint32_t last) { return 0x7F000000u | last; }  // 127.0.0.last

std::string ip_string(std::uint32_t ip) {
  in_addr a{htonl(ip)};
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, buf, sizeof buf);
  return buf;
}

// A UDP port free on `ip` now (the kernel's pick; another process could take it before us, which
// the kernel's ephemeral range makes unlikely).
std::uint16_t free_port(std::uint32_t ip) {
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// Rank r binds 127.0.0.(10 + r).
std::uint32_t rank_ip(std::uint32_t r) { return loopback(10 + r); }

// A one-switch fabric: the root of one tree whose children are the ranks. Frames go through a
// real dp::Core: received datagrams get Ethernet/IPv4/UDP headers in front, frames out lose them
// and go to the IPv4 address and port their headers name. It can lose a share of the datagrams
// (both ways, seeded) and die (swallow everything) after a number of datagrams.
class FakeSwitch {
 public:
  struct Config {
    std::uint32_t world = 2;
    std::uint32_t slots = 8;
    std::uint32_t payload_bytes = 256;
    std::uint32_t dtype_mask = kAllDTypesMask;
    std::uint32_t op_mask = kAllOpsMask;
    std::vector<TreeSwitch> models{};  // what the tree's static assignment says of its switches
    double loss = 0;
    std::uint64_t die_after = UINT64_MAX;  // datagrams received before it stops answering
    // Answer every CONTRIB first with a forged NACK for its chunk (from the switch's own
    // address: the most a spoofer can do), with no MAC or one under another key.
    bool forge_nacks = false;
  };

  explicit FakeSwitch(const Config& cfg) : cfg_(cfg), rng_(12345) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(loopback(1));
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    self_.ip = loopback(1);
    self_.port = ntohs(a.sin_port);
    const int rcvbuf = 8 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    for (std::uint32_t r = 0; r < cfg.world; ++r) ports_.push_back(free_port(rank_ip(r)));
    core_ = std::make_unique<dp::Core>(dp::CoreConfig{self_, 0, 1});
    proto::TreeConfig t;
    t.tree_id = kTreeId;
    t.key = kKey;
    t.role = proto::Role::root;
    for (std::uint32_t r = 0; r < cfg.world; ++r) {
      proto::ChildConfig c;
      c.addr.ip = rank_ip(r);
      c.addr.port = ports_[r];
      t.children.push_back(c);
    }
    t.slots = cfg.slots;
    t.payload_bytes = cfg.payload_bytes;
    t.dtype_mask = cfg.dtype_mask;
    t.op_mask = cfg.op_mask;
    EXPECT_TRUE(core_->install_tree(t).ok());
    thread_ = std::thread([this] { run(); });
  }
  ~FakeSwitch() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  std::string leaf_address() const {
    return ip_string(self_.ip) + ":" + std::to_string(self_.port);
  }
  std::uint16_t port_of(std::uint32_t rank) const { return ports_[rank]; }
  std::uint64_t received() const { return received_.load(); }
  bool dead() const { return received_.load() > cfg_.die_after; }

  // A rank's options: its own address and port, the static tree of this switch.
  Options options(std::uint32_t rank, const std::string& job, Path path) const {
    Options o;
    o.job = job;
    o.rank = rank;
    o.world_size = cfg_.world;
    o.bind_address = ip_string(rank_ip(rank));
    o.port = ports_[rank];
    o.path = path;
    o.op_timeout_ms = 30000;
    o.join_timeout_ms = 30000;
    o.static_tree.leaf_address = leaf_address();
    o.static_tree.tree_id = kTreeId;
    o.static_tree.key = kKey;
    o.static_tree.child_index = static_cast<std::uint16_t>(rank);
    o.static_tree.slots = cfg_.slots;
    o.static_tree.payload_bytes = cfg_.payload_bytes;
    o.static_tree.dtype_mask = cfg_.dtype_mask;
    o.static_tree.op_mask = cfg_.op_mask;
    o.static_tree.switches = cfg_.models;
    return o;
  }

 private:
  bool lose() { return cfg_.loss > 0 && std::uniform_real_distribution<>(0, 1)(rng_) < cfg_.loss; }

  void run() {
    std::vector<std::uint8_t> frame(proto::kMaxFrameBytes);
    std::vector<dp::TxFrame> tx(proto::kMaxChildren + 1);
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 5) <= 0) continue;
      sockaddr_in src{};
      socklen_t slen = sizeof src;
      const ssize_t n = recvfrom(fd_, frame.data() + 42, frame.size() - 42, 0,
                                 reinterpret_cast<sockaddr*>(&src), &slen);
      if (n <= 0) continue;
      if (received_.fetch_add(1) + 1 > cfg_.die_after || lose()) continue;
      if (cfg_.forge_nacks && static_cast<std::size_t>(n) >= sizeof(proto::TdHdr))
        forge(src, frame);
      proto::Endpoint from;
      from.ip = ntohl(src.sin_addr.s_addr);
      from.port = ntohs(src.sin_port);
      proto::write_l2_l4(frame.data(), from, self_, static_cast<std::size_t>(n));
      const dp::RxFrame rx{frame.data(), 42 + static_cast<std::size_t>(n)};
      std::size_t ntx = 0;
      core_->process_burst(&rx, 1, tx.data(), tx.size(), &ntx);
      for (std::size_t i = 0; i < ntx; ++i) {
        if (lose()) continue;
        const auto ip = proto::load_header<proto::Ipv4Hdr>(tx[i].hdr + 14);
        const auto udp = proto::load_header<proto::UdpHdr>(tx[i].hdr + 34);
        sockaddr_in dst{};
        dst.sin_family = AF_INET;
        dst.sin_addr.s_addr = ip.dst_addr.raw;  // both already in network order
        dst.sin_port = udp.dst_port.raw;
        iovec iov[2] = {{tx[i].hdr + 42, sizeof(proto::TdHdr)},
                        {const_cast<std::uint8_t*>(tx[i].payload), tx[i].payload_len}};
        msghdr m{};
        m.msg_name = &dst;
        m.msg_namelen = sizeof dst;
        m.msg_iov = iov;
        m.msg_iovlen = 2;
        sendmsg(fd_, &m, 0);
      }
    }
  }

  // A NACK for the CONTRIB in `frame` (after 42 bytes of room) that its sender must not believe.
  void forge(const sockaddr_in& to, const std::vector<std::uint8_t>& frame) {
    proto::TdHdr h = proto::load_header<proto::TdHdr>(frame.data() + 42);
    if (h.opcode != static_cast<std::uint8_t>(proto::Opcode::contrib)) return;
    h.opcode = static_cast<std::uint8_t>(proto::Opcode::nack);
    h.reason = static_cast<std::uint8_t>(proto::Reason::bad_key);
    h.count.set(0);
    h.ncontrib.set(0);
    h.key = forged_++ % 2 == 0 ? proto::be64::of(0) : proto::nack_mac(proto::be64::of(kKey ^ 1), h);
    sendto(fd_, &h, sizeof h, 0, reinterpret_cast<const sockaddr*>(&to), sizeof to);
  }

  Config cfg_;
  std::mt19937_64 rng_;
  std::uint64_t forged_ = 0;
  int fd_ = -1;
  proto::Endpoint self_;
  std::vector<std::uint16_t> ports_;
  std::unique_ptr<dp::Core> core_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> received_{0};
  std::thread thread_;
};

// Runs fn(rank) on one thread per rank and waits for all.
void run_ranks(std::uint32_t world, const std::function<void(std::uint32_t)>& fn) {
  std::vector<std::thread> t;
  for (std::uint32_t r = 0; r < world; ++r) t.emplace_back(fn, r);
  for (auto& x : t) x.join();
}

std::unique_ptr<Communicator> make(const Options& o) {
  Result r = Result::internal;
  std::string error;
  auto c = Communicator::create(o, &r, &error);
  EXPECT_EQ(r, Result::ok) << error;
  EXPECT_NE(c, nullptr) << error;
  return c;
}

// A fresh rendezvous directory for the host-side reduction of one test.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/treeduce-test-comm-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// One rank's buffers for one case: its input and the expected result, as wire bits.
struct CaseData {
  std::vector<std::uint8_t> in, want;
  CaseData(const exact::Case& c, std::uint32_t rank, std::uint32_t world, std::uint64_t seed = 1)
      : in(c.count * dtype_size(c.dtype)), want(in.size()) {
    const exact::Inputs inputs(seed, c, world);
    for (std::size_t i = 0; i < c.count; ++i) {
      exact::store(c.dtype, in.data(), i, inputs.element(rank, i));
      exact::store(c.dtype, want.data(), i, inputs.expected(i));
    }
  }
};

// Allreduce of one case on `c`, in place or not; true when the result is exact.
::testing::AssertionResult run_case(Communicator& comm, const exact::Case& c, bool in_place,
                                    Result expect = Result::ok) {
  CaseData d(c, comm.rank(), comm.world_size());
  std::vector<std::uint8_t> out(d.in.size(), 0xA5);
  if (in_place) out = d.in;
  const void* send = in_place ? out.data() : d.in.data();
  const Result r = comm.allreduce(send, out.data(), c.count, c.dtype, c.op);
  const std::string what = std::string(name(c.dtype)) + " " + std::string(name(c.op)) +
                           " count=" + std::to_string(c.count) + (in_place ? " in place" : "") +
                           " rank " + std::to_string(comm.rank());
  if (r != expect) {
    return ::testing::AssertionFailure()
           << what << ": " << to_string(r) << " (" << comm.last_error() << ")";
  }
  if (r == Result::ok && out != d.want) {
    std::size_t bad = 0;
    while (exact::load(c.dtype, out.data(), bad) == exact::load(c.dtype, d.want.data(), bad)) ++bad;
    return ::testing::AssertionFailure()
           << what << ": element " << bad << " is "
           << exact::show(c.dtype, exact::load(c.dtype, out.data(), bad)) << ", want "
           << exact::show(c.dtype, exact::load(c.dtype, d.want.data(), bad));
  }
  return ::testing::AssertionSuccess();
}

// Allreduce of (d, op) with pair_reference.h's inputs; true when the result is exact.
::testing::AssertionResult run_ref_case(Communicator& comm, DType d, ReduceOp op, std::size_t count,
                                        bool in_place, std::uint64_t seed) {
  const ref::Bytes in = ref::input(d, op, comm.rank(), count, seed);
  const ref::Bytes want = ref::expected(d, op, comm.world_size(), count, seed);
  ref::Bytes out(in.size(), 0xA5);
  if (in_place) out = in;
  const Result r = comm.allreduce(in_place ? out.data() : in.data(), out.data(), count, d, op);
  const std::string what = std::string(name(d)) + " " + std::string(name(op)) +
                           " count=" + std::to_string(count) + (in_place ? " in place" : "") +
                           " rank " + std::to_string(comm.rank());
  if (r != Result::ok)
    return ::testing::AssertionFailure()
           << what << ": " << to_string(r) << " (" << comm.last_error() << ")";
  const std::size_t s = dtype_size(d);
  for (std::size_t i = 0; i < count; ++i)
    if (std::memcmp(out.data() + i * s, want.data() + i * s, s) != 0)
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << ref::show(d, out.data() + i * s) << ", want "
             << ref::show(d, want.data() + i * s);
  return ::testing::AssertionSuccess();
}

// --- In-network path ---------------------------------------------------------------------------

// Every dtype x op, one element, a partial chunk, and several windows, in place and not.
TEST(Communicator, EveryDtypeAndOpIsExact) {
  FakeSwitch sw({.world = 3});
  run_ranks(3, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "exact", Path::network));
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->path(), Path::network);
    EXPECT_TRUE(comm->offloads(DType::e4m3, ReduceOp::max));
    std::uint64_t ops = 0;
    for (const auto& [d, op] : ref::defined_pairs()) {
      // 1 element; 100 (a partial last chunk for every dtype); 5000 (at least 2.5 windows of
      // 8 slots of 256 bytes for every dtype, 20 windows of f64_i32).
      for (const std::size_t count : {1u, 100u, 5000u}) {
        for (std::uint32_t iter = 0; iter < 2; ++iter) {
          // The types and operations of before issue 14 with the lab's inputs, as treeduce-perf
          // checks them; every pair with pair_reference.h's.
          if (d <= DType::i32 && op <= ReduceOp::max) {
            EXPECT_TRUE(run_case(*comm, {d, op, count, iter}, iter == 1));
          }
          EXPECT_TRUE(run_ref_case(*comm, d, op, count, iter == 1, 100 + iter));
          ops += (d <= DType::i32 && op <= ReduceOp::max) ? 2 : 1;
        }
      }
    }
    const Stats s = comm->stats();
    EXPECT_EQ(s.network_ops, ops);
    EXPECT_EQ(s.fallback_ops, 0u);
    EXPECT_EQ(s.fallback_reason, "");
  });
}

// Four operations outstanding at once, started by two threads in an agreed order and completed
// by the other thread.
TEST(Communicator, NonBlockingOperationsFromTwoThreads) {
  constexpr std::uint32_t kWorld = 2, kOps = 4;
  FakeSwitch sw({.world = kWorld});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "nonblocking", Path::network));
    ASSERT_NE(comm, nullptr);
    // Different sizes and types: ops matched out of order across ranks would fail loudly.
    std::vector<exact::Case> cases;
    std::vector<CaseData> data;
    for (std::uint32_t i = 0; i < kOps; ++i) {
      cases.push_back({i % 2 == 0 ? DType::i32 : DType::bf16, ReduceOp::sum, 700 + 900 * i, i});
      data.emplace_back(cases.back(), rank, kWorld);
    }
    std::vector<std::vector<std::uint8_t>> out(kOps);
    std::vector<Request> req(kOps);
    std::atomic<std::uint32_t> turn{0};
    std::atomic<std::uint32_t> started{0};
    auto worker = [&](std::uint32_t parity) {
      for (std::uint32_t i = parity; i < kOps; i += 2) {
        while (turn.load() != i) std::this_thread::yield();
        out[i].assign(data[i].in.size(), 0);
        EXPECT_EQ(comm->iallreduce(data[i].in.data(), out[i].data(), cases[i].count, cases[i].dtype,
                                   cases[i].op, &req[i]),
                  Result::ok);
        started.fetch_add(1);
        turn.store(i + 1);
      }
      while (started.load() != kOps) std::this_thread::yield();
      // Complete the other thread's requests: test until done, then wait (a no-op by then
      // would be an error: the request is gone).
      for (std::uint32_t i = 1 - parity; i < kOps; i += 2) {
        Result r;
        while ((r = comm->test(req[i])) == Result::in_progress) std::this_thread::yield();
        EXPECT_EQ(r, Result::ok) << comm->last_error();
        EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank " << rank;
        EXPECT_EQ(comm->wait(req[i]), Result::invalid_argument);
      }
    };
    std::thread a(worker, 0), b(worker, 1);
    a.join();
    b.join();
    EXPECT_EQ(comm->stats().network_ops, kOps);
  });
}

TEST(Communicator, ReduceBroadcastBarrier) {
  constexpr std::uint32_t kWorld = 3;
  FakeSwitch sw({.world = kWorld});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "rbb", Path::network));
    ASSERT_NE(comm, nullptr);
    // Reduce to rank 1: only rank 1's buffer changes.
    const exact::Case c{DType::f32, ReduceOp::sum, 1000, 0};
    CaseData d(c, rank, kWorld);
    std::vector<std::uint8_t> out(d.in.size(), 0x5A);
    EXPECT_EQ(comm->reduce(d.in.data(), out.data(), c.count, c.dtype, c.op, 1), Result::ok);
    if (rank == 1) {
      EXPECT_EQ(out, d.want);
    } else {
      EXPECT_EQ(out, std::vector<std::uint8_t>(d.in.size(), 0x5A));
    }
    EXPECT_EQ(comm->reduce(d.in.data(), nullptr, c.count, c.dtype, c.op, 0),
              rank == 0 ? Result::invalid_argument : Result::ok);
    // The root's reduce above failed before it started; the others must not be left waiting.
    if (rank == 0) {
      EXPECT_EQ(comm->reduce(d.in.data(), out.data(), c.count, c.dtype, c.op, 0), Result::ok);
    }
    EXPECT_EQ(comm->reduce(d.in.data(), out.data(), c.count, c.dtype, c.op, kWorld),
              Result::invalid_argument);
    // A non-root's recv is never looked at (MPI_Reduce's recvbuf there is insignificant): one
    // that overlaps its send is no error; the root's is.
    std::vector<std::uint8_t> own = d.in;
    own.resize(d.in.size() + 4);
    EXPECT_EQ(comm->reduce(own.data(), rank == 1 ? out.data() : own.data() + 4, c.count, c.dtype,
                           c.op, 1),
              Result::ok)
        << comm->last_error();
    if (rank == 1) {
      EXPECT_EQ(out, d.want);
    }
    // Broadcast from rank 2: any bytes, an odd length (7 e4m3, padded to 8 on the wire), and
    // NaN patterns a float sum would not carry through.
    std::vector<std::uint8_t> b7(7), b1000(4000);
    for (std::size_t i = 0; i < b7.size(); ++i) b7[i] = rank == 2 ? 0x7F + i : 0;
    for (std::size_t i = 0; i < b1000.size(); ++i)
      b1000[i] = rank == 2 ? (i * 37 + 0xFF) & 0xFF : i;
    std::vector<std::uint8_t> want7(7), want1000(4000);
    for (std::size_t i = 0; i < 7; ++i) want7[i] = 0x7F + i;
    for (std::size_t i = 0; i < 4000; ++i) want1000[i] = (i * 37 + 0xFF) & 0xFF;
    EXPECT_EQ(comm->broadcast(b7.data(), 7, DType::e4m3, 2), Result::ok);
    EXPECT_EQ(b7, want7);
    EXPECT_EQ(comm->broadcast(b1000.data(), 1000, DType::f32, 2), Result::ok);
    EXPECT_EQ(b1000, want1000);
    EXPECT_EQ(comm->barrier(), Result::ok);
    EXPECT_EQ(comm->stats().fallback_ops, 0u);
  });
}

TEST(Communicator, ZeroCountAndBadArguments) {
  FakeSwitch sw({.world = 1});
  auto comm = make(sw.options(0, "args", Path::network));
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->allreduce(nullptr, nullptr, 0, DType::f32, ReduceOp::sum), Result::ok);
  float x = 1;
  EXPECT_EQ(comm->allreduce(&x, nullptr, 1, DType::f32, ReduceOp::sum), Result::invalid_argument);
  EXPECT_NE(comm->last_error(), "");
  EXPECT_EQ(comm->allreduce(&x, &x, 1, static_cast<DType>(kNumDTypes), ReduceOp::sum),
            Result::invalid_argument);
  EXPECT_EQ(comm->allreduce(&x, &x, 1, DType::f32, static_cast<ReduceOp>(kNumReduceOps)),
            Result::invalid_argument);
  EXPECT_EQ(comm->iallreduce(&x, &x, 1, DType::f32, ReduceOp::sum, nullptr),
            Result::invalid_argument);
  EXPECT_EQ(comm->test(12345), Result::invalid_argument);
  EXPECT_EQ(comm->allreduce(&x, &x, 1, DType::f32, ReduceOp::sum), Result::ok);
  EXPECT_EQ(x, 1.0f);
  EXPECT_EQ(comm->last_error(), "");

  Result r = Result::ok;
  std::string error;
  Options bad = sw.options(0, "args", Path::network);
  bad.rank = 1;
  EXPECT_EQ(Communicator::create(bad, &r, &error), nullptr);
  EXPECT_EQ(r, Result::invalid_argument);
  EXPECT_NE(error, "");
}

// A manager address without a port is refused at creation, naming it (gRPC would dial 443).
TEST(Communicator, ManagerAddressNeedsAPort) {
  for (const std::string a :
       {"manager", "10.0.0.1", "10.0.0.1:", ":9300", "[::1]", "m:0", "m:65536", "m:93x0"}) {
    SCOPED_TRACE(a);
    Options o;
    o.job = "addr";
    o.world_size = 1;
    o.manager = a;
    o.insecure = true;
    Result r = Result::ok;
    std::string error;
    EXPECT_EQ(Communicator::create(o, &r, &error), nullptr);
    EXPECT_EQ(r, Result::invalid_argument);
    EXPECT_NE(error.find("'" + a + "'"), std::string::npos) << error;
  }
  // gRPC's target syntax is gRPC's: a Unix socket is not refused for want of a port (the job
  // then falls back, as with any manager that does not answer, within its join deadline).
  for (const std::string a : {"unix:/nonexistent/treeduce-manager.sock"}) {
    Options o;
    o.job = "addr";
    o.world_size = 1;
    o.manager = a;
    o.insecure = true;
    Result r = Result::ok;
    std::string error;
    auto comm = Communicator::create(o, &r, &error);
    EXPECT_EQ(error.find("has no port"), std::string::npos) << error;
    EXPECT_EQ(error.find("has the port"), std::string::npos) << error;
  }
}

// Many operations in flight at once (pipelined through the window), some in place, issued by one
// thread and waited for by another, under 10% loss: each completes exactly, in start order.
TEST(Communicator, PipelinedOperationsUnderLossIssuedAndWaitedOnDifferentThreads) {
  constexpr std::uint32_t kWorld = 3, kOps = 24;
  FakeSwitch sw({.world = kWorld, .slots = 4, .loss = 0.1});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "pipelined", Path::auto_select));
    ASSERT_NE(comm, nullptr);
    ASSERT_EQ(comm->path(), Path::network) << comm->path_reason();
    std::vector<exact::Case> cases;
    std::vector<CaseData> data;
    std::vector<std::vector<std::uint8_t>> out(kOps);
    for (std::uint32_t i = 0; i < kOps; ++i) {
      // 1 to 4 chunks each: several collectives share the 4-slot window.
      cases.push_back({i % 3 == 0 ? DType::i32 : DType::f32, ReduceOp::sum, 1 + 61 * i, i});
      data.emplace_back(cases.back(), rank, kWorld, 7);
      out[i] = i % 4 == 1 ? data[i].in : std::vector<std::uint8_t>(data[i].in.size(), 0xA5);
    }
    std::vector<Request> req(kOps);
    std::atomic<std::uint32_t> issued{0};
    std::vector<std::uint32_t> finished;  // by the waiting thread, in the order it saw them
    std::thread waiter([&] {
      for (std::uint32_t i = 0; i < kOps; ++i) {
        while (issued.load() <= i) std::this_thread::yield();
        EXPECT_EQ(comm->wait(req[i]), Result::ok) << comm->last_error();
        finished.push_back(i);
      }
    });
    for (std::uint32_t i = 0; i < kOps; ++i) {
      const void* send = i % 4 == 1 ? out[i].data() : data[i].in.data();
      ASSERT_EQ(comm->iallreduce(send, out[i].data(), cases[i].count, cases[i].dtype, cases[i].op,
                                 &req[i]),
                Result::ok);
      issued.store(i + 1);
    }
    waiter.join();
    for (std::uint32_t i = 0; i < kOps; ++i)
      EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank " << rank;
    EXPECT_EQ(finished.size(), kOps);
    const Stats st = comm->stats();
    EXPECT_EQ(st.network_ops, kOps);
    EXPECT_EQ(st.fallback_ops, 0u);
  });
}

TEST(Communicator, RecoversFromLoss) {
  constexpr std::uint32_t kWorld = 3;
  FakeSwitch sw({.world = kWorld, .loss = 0.1});
  std::atomic<std::uint64_t> retransmits{0};
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "loss", Path::network));
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 5000, 0}, false));
    EXPECT_TRUE(run_case(*comm, {DType::bf16, ReduceOp::max, 3000, 0}, true));
    EXPECT_TRUE(run_case(*comm, {DType::i32, ReduceOp::sum, 2000, 0}, false));
    EXPECT_TRUE(run_case(*comm, {DType::e5m2, ReduceOp::min, 1, 0}, false));
    retransmits += comm->stats().retransmits;
  });
  EXPECT_GT(retransmits.load(), 0u);
}

// --- Failures and fallback ----------------------------------------------------------------------

// The dead-switch tests below allow 30 retransmissions (3.3 to 3.8 s of silence) instead of the
// default 80 (9.7 to 10.3 s): what they check does not depend on the number.
constexpr std::uint32_t kDeadRetries = 30;

// Path::network: a switch that dies mid-operation gives timeout once a chunk has used up its
// retransmissions (the engine's bound; not the test's clock), never a hang.
TEST(Communicator, DeadSwitchTimesOutOnNetworkPath) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld, .die_after = 40});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "dead-network", Path::network);
    o.max_retries = kDeadRetries;
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 20000, 0}, false, Result::timeout));
    EXPECT_NE(comm->last_error().find("stopped answering"), std::string::npos)
        << comm->last_error();
    EXPECT_NE(comm->last_error().find("after 30 retransmissions (3.3 to 3.8 s of silence)"),
              std::string::npos)
        << comm->last_error();
    // The leaf answered the first chunks: the route and the address worked.
    EXPECT_NE(comm->last_error().find("results had come back before (the route and the address "
                                      "worked), so the leaf, a switch above it or another rank "
                                      "stopped"),
              std::string::npos)
        << comm->last_error();
    EXPECT_GE(comm->stats().retransmits, 30u) << "the timeout came from the retransmission bound";
    EXPECT_EQ(comm->stats().fallback_ops, 0u);
  });
  EXPECT_TRUE(sw.dead());
}

// A leaf that never answers (a wrong address, no route, a rank that never started: the switch
// cannot complete a chunk): the sentence says that nothing ever came back, names the route and the
// address to check, and what this rank knows of the others (a static tree: nothing, and what
// they must agree on). A leaf that answered before says that instead.
TEST(Communicator, SilentLeafSaysWhatToCheck) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld, .die_after = 0});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "silent-leaf", Path::network);
    o.max_retries = kDeadRetries;
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 1000, 0}, false, Result::timeout));
    const std::string e = comm->last_error();
    const std::string leaf = sw.leaf_address();
    const std::string ip = leaf.substr(0, leaf.rfind(':'));
    for (const std::string& part :
         {"The network stopped answering: a chunk sent to the leaf switch at " + leaf +
              " got no result after 30 retransmissions",
          "no result ever came back to this rank, so check the route from this host to " + ip +
              " (ip route get " + ip + "), that " + leaf +
              " is the leaf switch's data address and that switch runs, and that every rank "
              "started",
          std::string("with a static tree this rank cannot know whether the other rank started: "
                      "every rank of the 2 must run with tree id ") +
              std::to_string(kTreeId)}) {
      EXPECT_NE(e.find(part), std::string::npos) << "missing: " << part << "\nin: " << e;
    }
    EXPECT_EQ(e.find("results had come back before"), std::string::npos) << e;
  });
}

// Path::auto: the same failure falls back to host-side reduction, with the same inputs (in
// place: the communicator kept a copy), an exact result, a warning and a count.
TEST(Communicator, DeadSwitchFallsBackToHost) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld, .die_after = 40});
  TempDir store;
  ::testing::internal::CaptureStderr();
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "dead-auto", Path::auto_select);
    o.fallback_store = store.path();
    o.max_retries = kDeadRetries;
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->path(), Path::network);
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 20000, 0}, true));
    EXPECT_EQ(comm->path(), Path::host);
    EXPECT_NE(comm->path_reason().find("stopped answering"), std::string::npos);
    EXPECT_FALSE(comm->offloads(DType::f32, ReduceOp::sum));
    // Later operations go straight to the host path.
    EXPECT_TRUE(run_case(*comm, {DType::e4m3, ReduceOp::max, 333, 0}, false));
    const Stats s = comm->stats();
    EXPECT_EQ(s.network_ops, 0u);
    EXPECT_EQ(s.fallback_ops, 2u);
    EXPECT_EQ(s.fallback_reason, comm->path_reason());
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  for (const char* rank : {"rank 0", "rank 1"}) {
    EXPECT_NE(err.find(std::string("treeduce: warning: ") + rank +
                       " falls back to host-side reduction: the network stopped answering"),
              std::string::npos)
        << err;
  }
}

// Several operations in flight when the switch dies: the oldest not done and every later one
// fall back in start order, each exact (in place ones from the kept input), warned once.
TEST(Communicator, DeadSwitchWithPipelinedOperationsFallsBackInOrder) {
  constexpr std::uint32_t kWorld = 2, kOps = 6;
  FakeSwitch sw({.world = kWorld, .die_after = 40});
  TempDir store;
  ::testing::internal::CaptureStderr();
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "dead-pipelined", Path::auto_select);
    o.fallback_store = store.path();
    o.max_retries = kDeadRetries;
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    std::vector<CaseData> data;
    std::vector<std::vector<std::uint8_t>> out(kOps);
    std::vector<Request> req(kOps);
    for (std::uint32_t i = 0; i < kOps; ++i) {
      const exact::Case c{DType::f32, ReduceOp::sum, 3000 + i, i};
      data.emplace_back(c, rank, kWorld);
      out[i] = i % 2 ? data[i].in : std::vector<std::uint8_t>(data[i].in.size(), 0);
      ASSERT_EQ(comm->iallreduce(i % 2 ? out[i].data() : data[i].in.data(), out[i].data(), c.count,
                                 c.dtype, c.op, &req[i]),
                Result::ok);
    }
    for (std::uint32_t i = 0; i < kOps; ++i) {
      EXPECT_EQ(comm->wait(req[i]), Result::ok) << comm->last_error();
      EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank " << rank;
    }
    const Stats s = comm->stats();
    EXPECT_EQ(s.network_ops + s.fallback_ops, kOps);
    EXPECT_GT(s.fallback_ops, 0u);
    EXPECT_EQ(comm->path(), Path::host);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string warn = "treeduce: warning: rank 0 falls back";
  ASSERT_NE(err.find(warn), std::string::npos) << err;
  EXPECT_EQ(err.find(warn, err.find(warn) + 1), std::string::npos) << err;  // said once
}

// A tree whose leaf (a Tofino-like model) reduces 32-bit integer sum, min and max only: every
// other pair falls back per call, said on every such call with the call's size and the switch
// model that cannot reduce it; offloaded pairs stay in the network. With Path::network such a
// call is refused with that reason.
TEST(Communicator, NotOffloadableFallsBackPerCallNamingTheSwitchModel) {
  constexpr std::uint32_t kWorld = 2;
  const std::uint32_t ints = bit(DType::i32) | bit(DType::u32);
  const std::uint32_t arith = bit(ReduceOp::sum) | bit(ReduceOp::min) | bit(ReduceOp::max);
  const FakeSwitch::Config cfg{.world = kWorld,
                               .dtype_mask = ints,
                               .op_mask = arith,
                               .models = {{"leaf0", "tofino", ints, arith}}};
  FakeSwitch sw(cfg);
  TempDir store;
  ::testing::internal::CaptureStderr();
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "mask", Path::auto_select);
    o.fallback_store = store.path();
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    for (const DType d : kAllDTypes)
      for (const ReduceOp op : kAllReduceOps)
        EXPECT_EQ(comm->offloads(d, op),
                  (d == DType::i32 || d == DType::u32) &&
                      (op == ReduceOp::sum || op == ReduceOp::min || op == ReduceOp::max))
            << name(d) << " " << name(op);
    EXPECT_TRUE(run_ref_case(*comm, DType::f64, ReduceOp::sum, 1024, false, 1));
    EXPECT_EQ(comm->stats().fallback_reason,
              "allreduce of 1024 f64 sum on the host path: switch 'leaf0' (profile tofino) does "
              "not reduce f64 sum");
    EXPECT_TRUE(run_ref_case(*comm, DType::u32, ReduceOp::max, 1000, false, 2));
    EXPECT_TRUE(run_ref_case(*comm, DType::f64, ReduceOp::sum, 10, true, 3));
    EXPECT_TRUE(run_ref_case(*comm, DType::i64, ReduceOp::bxor, 7, false, 4));
    EXPECT_EQ(comm->stats().fallback_reason,
              "allreduce of 7 i64 bxor on the host path: switch 'leaf0' (profile tofino) does "
              "not reduce i64 bxor");
    EXPECT_TRUE(run_ref_case(*comm, DType::f32_i32, ReduceOp::minloc, 300, false, 5));
    EXPECT_TRUE(run_ref_case(*comm, DType::i32, ReduceOp::min, 10, false, 6));
    EXPECT_EQ(comm->path(), Path::network);
    const Stats s = comm->stats();
    EXPECT_EQ(s.network_ops, 2u);
    EXPECT_EQ(s.fallback_ops, 4u);
    EXPECT_NE(s.fallback_reason.find("f32_i32 minloc"), std::string::npos) << s.fallback_reason;
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  std::size_t warnings = 0;
  for (auto p = err.find("treeduce: warning: rank 0: "); p != std::string::npos;
       p = err.find("treeduce: warning: rank 0: ", p + 1)) {
    ++warnings;
  }
  EXPECT_EQ(warnings, 4u) << err;  // every host-side call, the repeated f64 sum too
  EXPECT_NE(err.find("treeduce: warning: rank 1: allreduce of 10 f64 sum on the host path: "
                     "switch 'leaf0' (profile tofino) does not reduce f64 sum\n"),
            std::string::npos)
      << err;

  // Path::network: refused, with the model named.
  FakeSwitch sw2({.world = 1, .dtype_mask = ints, .op_mask = arith, .models = cfg.models});
  auto comm = make(sw2.options(0, "mask-network", Path::network));
  ASSERT_NE(comm, nullptr);
  EXPECT_TRUE(run_case(*comm, {DType::f16, ReduceOp::sum, 10, 0}, false, Result::refused));
  EXPECT_EQ(comm->last_error(),
            "Switch 'leaf0' (profile tofino) does not reduce f16 sum, and the path is network.");
  EXPECT_TRUE(run_case(*comm, {DType::i32, ReduceOp::sum, 10, 0}, false));
}

// A static tree given without its switches' models still says which pair it cannot reduce.
TEST(Communicator, NotOffloadableWithoutModelsNamesThePair) {
  FakeSwitch sw({.world = 1, .dtype_mask = kAllDTypesMask & ~bit(DType::f16)});
  auto comm = make(sw.options(0, "mask-static", Path::network));
  ASSERT_NE(comm, nullptr);
  EXPECT_FALSE(comm->offloads(DType::f16, ReduceOp::max));
  EXPECT_TRUE(comm->offloads(DType::u8, ReduceOp::land));
  EXPECT_TRUE(run_case(*comm, {DType::f16, ReduceOp::max, 10, 0}, false, Result::refused));
  EXPECT_EQ(comm->last_error(),
            "The tree (given without its switches' models) does not reduce f16 max, and the path "
            "is network.");
  // An undefined pair is a wrong call on every path, never a fallback.
  std::int32_t x = 1;
  EXPECT_EQ(comm->allreduce(&x, &x, 1, DType::f64, ReduceOp::lor), Result::invalid_argument);
  EXPECT_EQ(comm->last_error(),
            "The pair f64 lor is not a reduction: lor (logical or) is defined on integer types "
            "only, not on floating-point types.");
  EXPECT_FALSE(comm->offloads(DType::f64, ReduceOp::lor));
}

// The options' transport: one this build lacks, ibverbs with no RDMA device (this machine has
// none), or an out-of-range UDP setting is a sentence on the network path, never a crash and
// never a silent default; a valid one runs. (The variables that fill TransportOptions are
// test_environment.cpp's.)
TEST(Communicator, TransportIsChosenByTheOptions) {
  FakeSwitch sw({.world = 1});
  Result r = Result::ok;
  std::string error;
  Options o = sw.options(0, "transport", Path::network);
#ifndef TREEDUCE_TEST_VERBS
  o.transport.kind = TransportKind::verbs;
  EXPECT_EQ(Communicator::create(o, &r, &error), nullptr);
  EXPECT_EQ(r, Result::unavailable);
  EXPECT_NE(error.find("This build has no verbs transport; it knows udp"), std::string::npos)
      << error;
#else
  o.transport.kind = TransportKind::verbs;
  EXPECT_EQ(Communicator::create(o, &r, &error), nullptr);
  EXPECT_EQ(r, Result::unavailable);
  EXPECT_NE(error.find("The verbs transport could not start"), std::string::npos) << error;
#endif
  o.transport.kind = TransportKind::udp;
  for (const std::uint32_t ports : {0u, 65u}) {
    o.transport.udp_send_ports = ports;
    error.clear();
    EXPECT_EQ(Communicator::create(o, &r, &error), nullptr) << ports << " send ports";
    EXPECT_EQ(r, Result::unavailable);
    EXPECT_NE(error.find("The udp transport could not start: "), std::string::npos) << error;
  }
  o.transport.udp_send_ports = 4;
  o.transport.udp_gro = false;
  auto comm = make(o);
  ASSERT_NE(comm, nullptr);
  float x = 2;
  EXPECT_EQ(comm->allreduce(&x, &x, 1, DType::f32, ReduceOp::sum), Result::ok);
  EXPECT_EQ(x, 2.0f);
  EXPECT_EQ(comm->stats().network_ops, 1u);
}

// Path::host: every collective on the hosts, nothing sent to the switch.
TEST(Communicator, HostPathSendsNothingToTheSwitch) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld});
  TempDir store;
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "forced-host", Path::host);
    o.fallback_store = store.path();
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->path(), Path::host);
    EXPECT_EQ(comm->path_reason(), "host-side reduction was asked for (path = host)");
    EXPECT_FALSE(comm->offloads(DType::f32, ReduceOp::sum));
    EXPECT_TRUE(run_case(*comm, {DType::bf16, ReduceOp::sum, 3000, 0}, false));
    EXPECT_TRUE(run_case(*comm, {DType::i32, ReduceOp::max, 3, 0}, true));
    EXPECT_EQ(comm->barrier(), Result::ok);
    const Stats s = comm->stats();
    EXPECT_EQ(s.network_ops, 0u);
    EXPECT_EQ(s.fallback_ops, 3u);
    EXPECT_EQ(s.fallback_reason, "") << "asked for, not a fallback";
  });
  EXPECT_EQ(sw.received(), 0u);
}

// A blocking allreduce started while non-blocking ones are queued waits its turn: operations
// complete in start order on every rank (sizes differ per position, so a blocking call that
// overtook a queued one would pair different operations across ranks and fail, or hang).
TEST(Communicator, BlockingCallWaitsForQueuedOperations) {
  constexpr std::uint32_t kWorld = 2, kQueued = 3;
  FakeSwitch sw({.world = kWorld});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "order", Path::network));
    ASSERT_NE(comm, nullptr);
    std::vector<exact::Case> cases;
    std::vector<CaseData> data;
    for (std::uint32_t i = 0; i <= kQueued; ++i) {
      cases.push_back({DType::i32, ReduceOp::sum, 3000 + 1000 * i, i});
      data.emplace_back(cases.back(), rank, kWorld);
    }
    std::vector<std::vector<std::uint8_t>> out(kQueued + 1);
    std::vector<Request> req(kQueued);
    for (std::uint32_t i = 0; i < kQueued; ++i) {
      out[i].assign(data[i].in.size(), 0);
      ASSERT_EQ(comm->iallreduce(data[i].in.data(), out[i].data(), cases[i].count, cases[i].dtype,
                                 cases[i].op, &req[i]),
                Result::ok);
    }
    out[kQueued].assign(data[kQueued].in.size(), 0);
    EXPECT_EQ(comm->allreduce(data[kQueued].in.data(), out[kQueued].data(), cases[kQueued].count,
                              cases[kQueued].dtype, cases[kQueued].op),
              Result::ok)
        << comm->last_error();
    // The blocking call returned: everything started before it is done.
    for (std::uint32_t i = 0; i < kQueued; ++i) {
      EXPECT_EQ(comm->test(req[i]), Result::ok) << "operation " << i << ": " << comm->last_error();
      EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank " << rank;
    }
    EXPECT_EQ(out[kQueued], data[kQueued].want);
    // And after it, blocking calls run again (on the caller's thread, nothing being queued).
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 1000, 9}, false));
    EXPECT_EQ(comm->stats().network_ops, kQueued + 2);
  });
}

// A blocking call runs on the caller's thread when nothing is queued (no hand-off), here with a
// busy poll, while another thread of the same rank queues non-blocking operations behind it: the
// queued ones wake the caller's poll, wait for the blocking one and run after it on the progress
// thread; everything completes exactly, in start order. Rank 1 holds its contribution to the
// blocking call back until rank 0's other thread has queued its operations, so they are queued
// while the blocking call is in flight, whatever the scheduling.
TEST(Communicator, BlockingCallOnTheCallersThreadWhileAnotherThreadQueues) {
  constexpr std::uint32_t kWorld = 2, kQueued = 5, kSlots = 8;
  FakeSwitch sw({.world = kWorld, .slots = kSlots});
  std::vector<exact::Case> cases;
  // The blocking call: 40 chunks of 256 bytes (five windows); then small queued ones, one chunk
  // up to three.
  cases.push_back({DType::f32, ReduceOp::sum, 40 * 64, 0});
  for (std::uint32_t i = 1; i <= kQueued; ++i)
    cases.push_back({DType::i32, ReduceOp::sum, 2 + 60 * i, i});
  std::atomic<bool> queued{false};
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "caller-runs", Path::network);
    o.transport.busy_poll_us = 2000;  // the caller polls: a queued operation must end the poll
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    std::vector<CaseData> data;
    std::vector<std::vector<std::uint8_t>> out;
    for (const exact::Case& c : cases) {
      data.emplace_back(c, rank, kWorld);
      out.emplace_back(data.back().in.size(), 0xA5);
    }
    if (rank == 1) {
      while (!queued.load()) std::this_thread::yield();
      for (std::uint32_t i = 0; i <= kQueued; ++i) {
        EXPECT_EQ(comm->allreduce(data[i].in.data(), out[i].data(), cases[i].count, cases[i].dtype,
                                  cases[i].op),
                  Result::ok)
            << comm->last_error();
        EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank 1";
      }
      return;
    }
    std::vector<Request> req(kQueued + 1);
    std::vector<bool> first_done_when(kQueued + 1, false);
    std::thread other([&] {
      // The blocking call is in flight once its first window reached the switch (rank 1 sends
      // nothing before `queued`).
      while (sw.received() < kSlots) std::this_thread::yield();
      for (std::uint32_t i = 1; i <= kQueued; ++i) {
        ASSERT_EQ(comm->iallreduce(data[i].in.data(), out[i].data(), cases[i].count, cases[i].dtype,
                                   cases[i].op, &req[i]),
                  Result::ok);
      }
      queued.store(true);
      for (std::uint32_t i = 1; i <= kQueued; ++i) {
        EXPECT_EQ(comm->wait(req[i]), Result::ok)
            << "operation " << i << ": " << comm->last_error();
        // In start order: the blocking call's result is whole before any later one completes.
        first_done_when[i] = out[0] == data[0].want;
      }
    });
    EXPECT_EQ(comm->allreduce(data[0].in.data(), out[0].data(), cases[0].count, cases[0].dtype,
                              cases[0].op),
              Result::ok)
        << comm->last_error();
    other.join();
    for (std::uint32_t i = 0; i <= kQueued; ++i)
      EXPECT_EQ(out[i], data[i].want) << "operation " << i << " rank 0";
    for (std::uint32_t i = 1; i <= kQueued; ++i)
      EXPECT_TRUE(first_done_when[i]) << "operation " << i << " completed before operation 0";
    EXPECT_EQ(comm->stats().network_ops, kQueued + 1);
    EXPECT_EQ(comm->stats().fallback_ops, 0u);
  });
}

// Forged NACKs for every chunk in flight, from the switch's own address and port, with no MAC or
// one under another key: libtreeduce ignores them all and every operation completes exactly on
// the network path (with verification off, the first would fail it as refused).
TEST(Communicator, ForgedNacksAreIgnored) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld, .forge_nacks = true});
  run_ranks(kWorld, [&](std::uint32_t rank) {
    auto comm = make(sw.options(rank, "forged-nacks", Path::network));
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(run_case(*comm, {DType::f32, ReduceOp::sum, 3000, 0}, false));
    EXPECT_TRUE(run_case(*comm, {DType::i32, ReduceOp::max, 1000, 0}, true));
    EXPECT_EQ(comm->stats().network_ops, 2u);
    EXPECT_EQ(comm->stats().fallback_ops, 0u);
  });
}

// A switch that refuses (here: the ranks carry the wrong job key, so it NACKs bad_key): the
// network path reports the reason, auto redoes the operation on the hosts. Its NACKs carry a
// MAC under the key the ranks sent, so they verify.
TEST(Communicator, SwitchRefusalFallsBack) {
  constexpr std::uint32_t kWorld = 2;
  FakeSwitch sw({.world = kWorld});
  TempDir store;
  ::testing::internal::CaptureStderr();
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options o = sw.options(rank, "refused-network", Path::network);
    o.static_tree.key = kKey + 1;
    auto net = make(o);
    ASSERT_NE(net, nullptr);
    EXPECT_TRUE(run_case(*net, {DType::i32, ReduceOp::sum, 100, 0}, false, Result::refused));
    EXPECT_NE(net->last_error().find("NACK bad_key"), std::string::npos) << net->last_error();
    net.reset();
    o.path = Path::auto_select;
    o.job = "refused-auto";
    o.fallback_store = store.path();
    auto comm = make(o);
    ASSERT_NE(comm, nullptr);
    EXPECT_TRUE(run_case(*comm, {DType::i32, ReduceOp::sum, 100, 0}, true));
    EXPECT_EQ(comm->path(), Path::host);
    EXPECT_EQ(comm->stats().fallback_ops, 1u);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("falls back to host-side reduction: a switch refused the operation (NACK "
                     "bad_key)"),
            std::string::npos)
      << err;
}

// A manager nobody answers at: network fails creation, auto falls back at creation (the join
// timeout ends the wait; a hang would be the test's timeout).
TEST(Communicator, UnreachableManager) {
  constexpr std::uint32_t kWorld = 2;
  TempDir store;
  const std::string manager = "127.0.0.1:" + std::to_string(free_port(loopback(1)));
  Options o;
  o.job = "no-manager";
  o.manager = manager;
  o.insecure = true;
  o.host = "127.0.0.10";
  o.path = Path::network;
  o.join_timeout_ms = 2000;
  Result r = Result::ok;
  std::string error;
  EXPECT_EQ(Communicator::create(o, &r, &error), nullptr);
  EXPECT_EQ(r, Result::unavailable) << error;
  EXPECT_NE(error.find(manager), std::string::npos) << error;

  ::testing::internal::CaptureStderr();
  run_ranks(kWorld, [&](std::uint32_t rank) {
    Options a = o;
    a.rank = rank;
    a.world_size = kWorld;
    a.host = ip_string(rank_ip(rank));
    a.path = Path::auto_select;
    a.fallback_store = store.path();
    auto comm = make(a);
    ASSERT_NE(comm, nullptr);
    EXPECT_EQ(comm->path(), Path::host);
    EXPECT_NE(comm->path_reason().find(manager), std::string::npos) << comm->path_reason();
    EXPECT_TRUE(run_case(*comm, {DType::f16, ReduceOp::min, 500, 0}, false));
    EXPECT_EQ(comm->stats().fallback_ops, 1u);
    // The fallback at creation is the stats' reason too (docs/host.md, section 5).
    EXPECT_EQ(comm->stats().fallback_reason, comm->path_reason());
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("treeduce: warning: rank 1 falls back to host-side reduction: rank 1 could "
                     "not join job 'no-manager' at the Aggregation Manager at " +
                     manager + ": "),
            std::string::npos)
      << err;
}

// No manager, no tree, Path::network: a clear error at creation.
TEST(Communicator, NetworkPathWithoutTreeIsUnavailable) {
  Options o;
  o.job = "nothing";
  o.path = Path::network;
  Result r = Result::ok;
  std::string error;
  EXPECT_EQ(Communicator::create(o, &r, &error), nullptr);
  EXPECT_EQ(r, Result::unavailable);
  EXPECT_NE(error.find("no static tree"), std::string::npos) << error;
}

// The public entry point: no Options to fill is a sentence, not a crash.
TEST(Communicator, OptionsFromEnvironmentNeedsOptions) {
  std::string err;
  EXPECT_EQ(options_from_environment(nullptr, &err), Result::invalid_argument);
  EXPECT_EQ(err, "options_from_environment needs an Options to fill.");
}

// --- Transport -----------------------------------------------------------------------------------

// Same-size packets leave as GSO super-datagrams (where the kernel has it) yet arrive as separate
// datagrams; with several send ports, slot s leaves from port s mod N.
class UdpTransportTest : public ::testing::TestWithParam<bool> {};

TEST_P(UdpTransportTest, SegmentsAndSpreadsSourcePorts) {
  const bool offloads = GetParam();
  const int rx = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(loopback(1));
  ASSERT_EQ(bind(rx, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(rx, reinterpret_cast<sockaddr*>(&a), &len);
  UdpTransportOptions u;
  u.bind_address = "127.0.0.10";
  u.port = free_port(rank_ip(0));
  u.leaf_address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  u.payload_bytes = 256;
  u.send_ports = 4;
  u.gso = offloads;
  u.gro = offloads;
  std::string error;
  auto t = make_udp_transport(u, &error);
  ASSERT_NE(t, nullptr) << error;
  std::vector<std::uint8_t> payload(256 * 16);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i);
  std::vector<OutPacket> p(16);
  for (std::uint16_t i = 0; i < 16; ++i) {
    p[i].td = proto::TdHdr{};
    p[i].td.slot.set(i);
    p[i].td.chunk.set(std::uint32_t{i});
    p[i].payload = payload.data() + 256 * i;
    p[i].payload_len = i == 15 ? 100 : 256;
  }
  ASSERT_EQ(t->send(p.data(), p.size()), "");
  std::vector<std::uint16_t> port_of_slot(16, 0);
  for (int got = 0; got < 16; ++got) {
    pollfd pf{rx, POLLIN, 0};
    ASSERT_EQ(poll(&pf, 1, 2000), 1) << got << " datagrams arrived";
    std::uint8_t buf[2048];
    sockaddr_in src{};
    socklen_t sl = sizeof src;
    const ssize_t n = recvfrom(rx, buf, sizeof buf, 0, reinterpret_cast<sockaddr*>(&src), &sl);
    const auto td = proto::load_header<proto::TdHdr>(buf);
    const std::uint32_t chunk = td.chunk.get();
    ASSERT_LT(chunk, 16u);
    EXPECT_EQ(n, static_cast<ssize_t>(32 + p[chunk].payload_len));
    EXPECT_EQ(std::memcmp(buf + 32, p[chunk].payload, p[chunk].payload_len), 0);
    port_of_slot[chunk] = ntohs(src.sin_port);
  }
  EXPECT_EQ(port_of_slot[0], u.port);  // socket 0 is the receive socket
  for (std::size_t s = 0; s < 16; ++s) {
    EXPECT_EQ(port_of_slot[s], port_of_slot[s % 4]) << "slot " << s;
    if (s > 0 && s < 4) {
      EXPECT_NE(port_of_slot[s], port_of_slot[0]);
    }
  }
  EXPECT_EQ(t->stats().sent, 16u);
  // Per socket: 4 packets, of which socket 3's last is short (slot 15): 3 GSO messages of 4
  // and one of 3 (+ the short one alone).
  if (offloads) {
    EXPECT_EQ(t->stats().gso_sends, 4u) << "this kernel lacks UDP GSO (Linux < 4.18)?";
  } else {
    EXPECT_EQ(t->stats().gso_sends, 0u);
  }
  close(rx);
}

INSTANTIATE_TEST_SUITE_P(Offloads, UdpTransportTest, ::testing::Bool());

// --- C API ------------------------------------------------------------------------------------

TEST(CApi, AllreduceAndErrors) {
  FakeSwitch sw({.world = 1});
  TempDir store;
  char message[512] = "";
  const Options o = sw.options(0, "c-api", Path::network);
  EXPECT_EQ(treeduce_test_c_api(o.static_tree.leaf_address.c_str(), o.bind_address.c_str(), o.port,
                                store.path().c_str(), message, sizeof message),
            0)
      << message;
}

}  // namespace
