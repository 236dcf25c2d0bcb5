// treeduce-refhost: one host rank of a treeduce job on the kernel's UDP stack, driven by the
// reference protocol engine (host::ProtocolEngine). Integration tests start one per rank against
// real switch processes and check that every allreduce result is exactly the expected one.
// lab/README.md describes the command line, the order of the cases, how inputs are chosen and
// why every expected result is exact whatever the arrival order and tree shape.
#include <CLI/CLI.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"
#include "treeduce/host/protocol_engine.h"
#include "treeduce/lab/exact_inputs.h"

namespace {

using namespace treeduce;
using namespace treeduce::exact;

// Exit codes (README.md): a test tells a wrong result from a broken setup by them.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;      // at least one case failed or was wrong
constexpr int kExitUsage = 2;       // bad command line, or a configuration we cannot check exactly
constexpr int kExitRunTimeout = 3;  // --timeout-ms passed before every case ran
constexpr int kExitSystem = 4;      // socket error
constexpr int kExitSignal = 128;    // + the signal number, as a shell reports it

// ---------------------------------------------------------------------------------------------
// I/O

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

std::optional<sockaddr_in> parse_endpoint(const std::string& s) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return std::nullopt;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, s.substr(0, colon).c_str(), &a.sin_addr) != 1) return std::nullopt;
  const std::string port = s.substr(colon + 1);
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p > 65535) return std::nullopt;
  a.sin_port = htons(static_cast<std::uint16_t>(p));
  return a;
}

struct PortStats {
  std::uint64_t foreign = 0;      // datagrams not from the leaf switch
  std::uint64_t malformed = 0;    // shorter than a treeduce header, or truncated
  std::uint64_t send_errors = 0;  // datagrams the kernel refused (counted as lost)
};

// The rank's one UDP socket, non-blocking, with batches both ways: headers and payloads go out
// through an iovec pair straight from the engine's packets and the send buffer, without a copy.
class Port {
 public:
  static constexpr std::size_t kBatch = 64;

  Port(const sockaddr_in& leaf, std::uint32_t payload_bytes)
      : leaf_(leaf), rx_stride_(sizeof(proto::TdHdr) + payload_bytes) {
    rx_buf_.resize(kBatch * rx_stride_);
    for (std::size_t i = 0; i < kBatch; ++i) {
      tx_msgs_[i].msg_hdr.msg_name = &leaf_;
      tx_msgs_[i].msg_hdr.msg_namelen = sizeof leaf_;
      tx_msgs_[i].msg_hdr.msg_iov = &tx_iov_[2 * i];
      tx_msgs_[i].msg_hdr.msg_iovlen = 2;
      rx_iov_[i] = {rx_buf_.data() + i * rx_stride_, rx_stride_};
    }
  }
  ~Port() {
    if (fd_ >= 0) close(fd_);
  }
  Port(const Port&) = delete;
  Port& operator=(const Port&) = delete;

  // Returns an error sentence, empty on success.
  std::string open(const sockaddr_in& bind_addr) {
    fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return std::string("socket: ") + std::strerror(errno);
    // DF on every datagram: the protocol requires it and switches drop fragments, so a datagram
    // too large for the path must fail loudly here (EMSGSIZE) rather than be fragmented.
    const int pmtu = IP_PMTUDISC_DO;
    setsockopt(fd_, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
    // A window's results arrive as one burst; the kernel caps this at net.core.rmem_max.
    const int rcvbuf = 4 << 20;
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (bind(fd_, reinterpret_cast<const sockaddr*>(&bind_addr), sizeof bind_addr) != 0) {
      return std::string("bind: ") + std::strerror(errno);
    }
    return {};
  }
  int fd() const { return fd_; }
  const PortStats& stats() const { return stats_; }

  // Send n packets (n <= kBatch). A datagram the kernel refuses for a reason the network may fix
  // (no route or neighbour yet, buffers) counts as lost: the engine's timer retransmits it.
  // Returns an error sentence for anything else, empty on success.
  std::string send(const host::OutPacket* p, std::size_t n, const std::uint64_t deadline) {
    for (std::size_t i = 0; i < n; ++i) {
      tx_iov_[2 * i] = {const_cast<proto::TdHdr*>(&p[i].td), sizeof(proto::TdHdr)};
      tx_iov_[2 * i + 1] = {const_cast<std::uint8_t*>(p[i].payload), p[i].payload_len};
    }
    std::size_t done = 0;
    while (done < n) {
      const int r = sendmmsg(fd_, &tx_msgs_[done], static_cast<unsigned>(n - done), 0);
      if (r > 0) {
        done += static_cast<std::size_t>(r);
        continue;
      }
      switch (errno) {
        case EINTR:
          break;
        case EAGAIN: {  // socket buffer full: wait until it drains, within the run's bound
          pollfd pfd{fd_, POLLOUT, 0};
          const std::uint64_t t = now_ns();
          if (t >= deadline) return {};  // the caller notices the deadline
          const timespec ts = to_timespec(std::min<std::uint64_t>(deadline - t, 10'000'000));
          ppoll(&pfd, 1, &ts, nullptr);
          break;
        }
        case ENOBUFS:
        case ENETUNREACH:
        case EHOSTUNREACH:
        case EHOSTDOWN:
        case EPERM:  // a firewall rule
          ++stats_.send_errors;
          ++done;
          break;
        case EMSGSIZE:
          return "a " + std::to_string(sizeof(proto::TdHdr) + p[done].payload_len) +
                 "-byte datagram exceeds the path MTU to the leaf; use a smaller --payload or a "
                 "larger MTU";
        default:
          return std::string("sendmmsg: ") + std::strerror(errno);
      }
    }
    return {};
  }

  // Receive what is queued (up to a few batches) and feed the engine every datagram from the leaf.
  // Returns an error sentence for a socket error, empty otherwise.
  std::string receive(host::ProtocolEngine& engine) {
    for (int batch = 0; batch < 4; ++batch) {
      for (std::size_t i = 0; i < kBatch; ++i) {
        msghdr& h = rx_msgs_[i].msg_hdr;
        h = msghdr{};
        h.msg_name = &rx_from_[i];
        h.msg_namelen = sizeof rx_from_[i];
        h.msg_iov = &rx_iov_[i];
        h.msg_iovlen = 1;
      }
      const int r = recvmmsg(fd_, rx_msgs_.data(), kBatch, 0, nullptr);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN) return {};
        return std::string("recvmmsg: ") + std::strerror(errno);
      }
      for (int i = 0; i < r; ++i) {
        const msghdr& h = rx_msgs_[static_cast<std::size_t>(i)].msg_hdr;
        const sockaddr_in& from = rx_from_[static_cast<std::size_t>(i)];
        const std::size_t len = rx_msgs_[static_cast<std::size_t>(i)].msg_len;
        if (from.sin_addr.s_addr != leaf_.sin_addr.s_addr || from.sin_port != leaf_.sin_port) {
          ++stats_.foreign;
          continue;
        }
        if (len < sizeof(proto::TdHdr) || (h.msg_flags & MSG_TRUNC) != 0) {
          ++stats_.malformed;
          continue;
        }
        const std::uint8_t* d = rx_buf_.data() + static_cast<std::size_t>(i) * rx_stride_;
        engine.on_packet(proto::load_header<proto::TdHdr>(d), d + sizeof(proto::TdHdr),
                         len - sizeof(proto::TdHdr));
      }
      if (static_cast<std::size_t>(r) < kBatch) return {};
    }
    return {};
  }

  static timespec to_timespec(std::uint64_t ns) {
    return timespec{static_cast<time_t>(ns / 1'000'000'000u),
                    static_cast<long>(ns % 1'000'000'000u)};
  }

 private:
  int fd_ = -1;
  sockaddr_in leaf_;
  std::size_t rx_stride_;
  std::vector<std::uint8_t> rx_buf_;
  std::array<mmsghdr, kBatch> tx_msgs_{};
  std::array<iovec, 2 * kBatch> tx_iov_{};
  std::array<mmsghdr, kBatch> rx_msgs_{};
  std::array<iovec, kBatch> rx_iov_{};
  std::array<sockaddr_in, kBatch> rx_from_{};
  PortStats stats_;
};

// ---------------------------------------------------------------------------------------------
// The run

struct Options {
  std::string leaf, bind = "0.0.0.0:50000";
  std::uint16_t tree = 0, child = 0, world = 0, rank = 0;
  std::uint64_t key = 0;
  std::uint32_t slots = host::EngineConfig{}.slots;
  std::uint32_t payload = host::EngineConfig{}.payload_bytes;
  std::vector<std::string> dtypes = {"f32", "f16", "bf16", "e4m3", "e5m2", "i32"};
  std::vector<std::string> ops = {"sum", "min", "max"};
  std::vector<std::size_t> counts = {1, 1000, 65537};
  std::uint32_t iters = 1;
  std::uint64_t seed = 1;
  std::uint64_t rto_us = host::EngineConfig{}.rto_initial_ns / 1000;
  std::uint64_t rto_max_us = host::EngineConfig{}.rto_max_ns / 1000;
  std::uint32_t max_retries = host::EngineConfig{}.max_retries;
  std::uint64_t timeout_ms = 60'000;
  bool json = false;
};

// How a case ended, beyond the engine's own statuses.
enum class Outcome { ok, wrong, failed, run_timeout, interrupted, io_error };

class Runner {
 public:
  Runner(const Options& o, host::ProtocolEngine& e, Port& p, int signal_fd, std::uint64_t deadline,
         std::size_t max_count)
      : opt(o),
        engine(e),
        port(p),
        sigfd(signal_fd),
        run_deadline(deadline),
        send_buf(max_count * kMaxElemBytes),
        recv_buf(max_count * kMaxElemBytes),
        want_buf(max_count * kMaxElemBytes) {}

  int signo = 0;      // the signal that interrupted the run
  std::string error;  // the socket error that ended it

  // Run one case and report it; returns its outcome.
  Outcome run(const Case& c) {
    const Inputs in(opt.seed, c, opt.world);
    std::uint8_t* send = send_buf.data();
    std::uint8_t* want = want_buf.data();
    for (std::size_t i = 0; i < c.count; ++i) {
      store(c.dtype, send, i, in.element(opt.rank, i));
      store(c.dtype, want, i, in.expected(i));
    }
    // A byte pattern no chunk of ours leaves behind, so a chunk never written shows up as wrong.
    std::memset(recv_buf.data(), 0xA5, c.count * dtype_size(c.dtype));
    const std::uint64_t t0 = now_ns();
    Outcome o = engine.start(send, recv_buf.data(), c.count, c.dtype, c.op) == host::Status::running
                    ? drive()
                    : Outcome::failed;
    const std::uint64_t us = (now_ns() - t0) / 1000;

    std::size_t first_bad = 0, bad = 0;
    if (o == Outcome::ok &&
        std::memcmp(recv_buf.data(), want, c.count * dtype_size(c.dtype)) != 0) {
      o = Outcome::wrong;
      for (std::size_t i = c.count; i-- > 0;) {
        if (load(c.dtype, recv_buf.data(), i) != load(c.dtype, want, i)) {
          first_bad = i;
          ++bad;
        }
      }
    }
    report(c, us, o, first_bad, bad);
    return o;
  }

 private:
  // Drive the engine through one collective until it ends, the run's time is up or a signal
  // arrives.
  Outcome drive() {
    std::array<pollfd, 2> pfd = {pollfd{port.fd(), POLLIN, 0}, pollfd{sigfd, POLLIN, 0}};
    while (engine.status() == host::Status::running) {
      const std::uint64_t t = now_ns();
      if (t >= run_deadline) return Outcome::run_timeout;
      const std::size_t n = engine.poll(t, out.data(), out.size());
      if (n != 0) {
        error = port.send(out.data(), n, run_deadline);
        if (!error.empty()) return Outcome::io_error;
      }
      if (engine.status() != host::Status::running) break;
      const std::uint64_t until = std::min(engine.next_deadline(), run_deadline);
      const std::uint64_t now = now_ns();
      const timespec ts = Port::to_timespec(until > now ? until - now : 0);
      if (ppoll(pfd.data(), pfd.size(), &ts, nullptr) < 0) {
        if (errno == EINTR) continue;
        error = std::string("ppoll: ") + std::strerror(errno);
        return Outcome::io_error;
      }
      if ((pfd[1].revents & POLLIN) != 0) {
        signalfd_siginfo si;
        if (read(sigfd, &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
          signo = static_cast<int>(si.ssi_signo);
          return Outcome::interrupted;
        }
      }
      if ((pfd[0].revents & POLLIN) != 0) {
        error = port.receive(engine);
        if (!error.empty()) return Outcome::io_error;
      }
    }
    return engine.status() == host::Status::done ? Outcome::ok : Outcome::failed;
  }

  void report(const Case& c, std::uint64_t us, Outcome o, std::size_t first_bad, std::size_t bad) {
    std::string status;  // for failed cases: timeout, refused(bad_key), ...
    switch (o) {
      case Outcome::ok:
      case Outcome::wrong:
        break;
      case Outcome::failed:
        switch (engine.status()) {
          case host::Status::timeout:
            status = "timeout";
            break;
          case host::Status::refused:
            status = "refused(" + std::string(proto::name(engine.nack_reason())) + ")";
            break;
          case host::Status::bad_result:
            status = "bad_result";
            break;
          default:
            status = "invalid";
        }
        break;
      case Outcome::run_timeout:
        status = "run_timeout";
        break;
      case Outcome::interrupted:
        status = "interrupted";
        break;
      case Outcome::io_error:
        status = "io_error";
        break;
    }
    const std::string dt(name(c.dtype)), op(name(c.op));
    const auto got = [&] { return show(c.dtype, load(c.dtype, recv_buf.data(), first_bad)); };
    const auto want = [&] { return show(c.dtype, load(c.dtype, want_buf.data(), first_bad)); };
    if (opt.json) {
      std::printf(R"({"dtype":"%s","op":"%s","count":%zu,"iter":%u,"time_us":%llu,)", dt.c_str(),
                  op.c_str(), c.count, c.iter, static_cast<unsigned long long>(us));
      if (o == Outcome::ok) {
        std::printf(R"("result":"ok"})"
                    "\n");
      } else if (o == Outcome::wrong) {
        std::printf(R"("result":"wrong","first_bad":%zu,"bad":%zu,"got":"%s","want":"%s"})"
                    "\n",
                    first_bad, bad, got().c_str(), want().c_str());
      } else {
        std::printf(R"("result":"failed","status":"%s"})"
                    "\n",
                    status.c_str());
      }
    } else {
      std::printf("%s %s count=%zu iter=%u time_us=%llu ", dt.c_str(), op.c_str(), c.count, c.iter,
                  static_cast<unsigned long long>(us));
      if (o == Outcome::ok) {
        std::printf("ok\n");
      } else if (o == Outcome::wrong) {
        std::printf("WRONG first_bad=%zu bad=%zu got=%s want=%s\n", first_bad, bad, got().c_str(),
                    want().c_str());
      } else {
        std::printf("FAILED status=%s\n", status.c_str());
      }
    }
    std::fflush(stdout);
  }

  const Options& opt;
  host::ProtocolEngine& engine;
  Port& port;
  int sigfd;
  std::uint64_t run_deadline;
  std::vector<std::uint8_t> send_buf, recv_buf, want_buf;
  std::array<host::OutPacket, Port::kBatch> out{};
};

template <class E, std::size_t N>
std::string known_names(const std::array<E, N>& all) {
  std::string s;
  for (E e : all) s += (s.empty() ? "" : ", ") + std::string(name(e));
  return s;
}

int usage(const std::string& sentence) {
  std::fprintf(stderr, "treeduce-refhost: %s\n", sentence.c_str());
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{
      "treeduce-refhost: one host rank of a treeduce job on kernel UDP, checking exact "
      "allreduce results (lab/README.md)"};
  app.add_option("--leaf", opt.leaf, "leaf switch data address A.B.C.D:PORT")->required();
  app.add_option("--bind", opt.bind, "local address A.B.C.D:PORT (port 0: any)")
      ->capture_default_str();
  app.add_option("--tree", opt.tree, "tree id")->required();
  app.add_option("--key", opt.key, "job key (0x for hex)")->required();
  app.add_option("--child", opt.child, "this host's child index at its leaf switch")->required();
  app.add_option("--world", opt.world, "hosts in the tree")->required();
  app.add_option("--rank", opt.rank, "rank in the job, 0..world-1 (selects this rank's input)")
      ->required();
  app.add_option("--slots", opt.slots, "slots per tree, as installed on the switches")
      ->capture_default_str();
  app.add_option("--payload", opt.payload, "payload bytes per packet, as installed")
      ->capture_default_str();
  app.add_option("--dtypes", opt.dtypes, "element types, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--ops", opt.ops, "operations, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--counts", opt.counts, "element counts, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "iterations of each case")->capture_default_str();
  app.add_option("--seed", opt.seed, "input seed (same on every rank)")->capture_default_str();
  app.add_option("--rto-us", opt.rto_us, "initial retransmission timeout")->capture_default_str();
  app.add_option("--rto-max-us", opt.rto_max_us, "retransmission timeout cap")
      ->capture_default_str();
  app.add_option("--max-retries", opt.max_retries, "retransmissions of a chunk before it fails")
      ->capture_default_str();
  app.add_option("--timeout-ms", opt.timeout_ms, "bound on the whole run (exit 3)")
      ->capture_default_str();
  app.add_flag("--json", opt.json, "one JSON object per case instead of text");
  // Extras are collected rather than refused so that a mistyped flag is what gets reported, not
  // the required option CLI11 checks for first.
  app.allow_extras();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    if (app.remaining().empty()) return usage(std::string(e.what()) + " (see --help)");
  }
  if (!app.remaining().empty()) return usage("unknown argument '" + app.remaining()[0] + "'");

  const auto leaf = parse_endpoint(opt.leaf);
  if (!leaf || leaf->sin_port == 0)
    return usage("--leaf: expected A.B.C.D:PORT, got '" + opt.leaf + "'");
  const auto local = parse_endpoint(opt.bind);
  if (!local) return usage("--bind: expected A.B.C.D:PORT, got '" + opt.bind + "'");
  if (opt.world == 0) return usage("--world must be at least 1");
  if (opt.rank >= opt.world) {
    return usage("--rank " + std::to_string(opt.rank) + " is not below --world " +
                 std::to_string(opt.world));
  }
  if (!std::has_single_bit(opt.slots)) return usage("--slots must be a power of two");
  if (!proto::valid_payload_bytes(opt.payload)) {
    return usage("--payload must be a power of two from 256 to 8192");
  }
  if (opt.rto_us == 0 || opt.rto_max_us < opt.rto_us) {
    return usage("--rto-us must be positive and at most --rto-max-us");
  }
  if (opt.iters == 0) return usage("--iters must be at least 1");
  std::vector<DType> dtypes;
  for (const auto& s : opt.dtypes) {
    const auto d = parse_dtype(s);
    if (!d) return usage("--dtypes: unknown type '" + s + "' (" + known_names(kAllDTypes) + ")");
    dtypes.push_back(*d);
  }
  std::vector<ReduceOp> ops;
  for (const auto& s : opt.ops) {
    const auto o = parse_op(s);
    if (!o)
      return usage("--ops: unknown operation '" + s + "' (" + known_names(kAllReduceOps) + ")");
    ops.push_back(*o);
  }
  if (dtypes.empty() || ops.empty()) return usage("--dtypes and --ops must name at least one");
  std::vector<std::pair<DType, ReduceOp>> pairs;
  if (const std::string why = defined_pairs(dtypes, ops, &pairs); !why.empty()) return usage(why);
  std::size_t max_count = 0;
  for (const std::size_t n : opt.counts) {
    if (n == 0) return usage("--counts must all be at least 1");
    max_count = std::max(max_count, n);
  }
  for (const DType d : dtypes) {
    if (!is_float(d) || std::find(ops.begin(), ops.end(), ReduceOp::sum) == ops.end()) continue;
    if (sum_bound(d, opt.world) == 0) {
      return usage("--world " + std::to_string(opt.world) + " is too large for exact " +
                   std::string(name(d)) + " sums (at most " +
                   std::to_string(std::int64_t{1} << float_info(d).sig_bits) + " ranks); leave " +
                   std::string(name(d)) + " or sum out");
    }
  }

  // SIGINT and SIGTERM arrive through a descriptor polled with the socket: no handler, no EINTR
  // races, and a signal during a long stretch of sending is seen at the next wait.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigprocmask(SIG_BLOCK, &sigs, nullptr);
  const int sigfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) {
    std::fprintf(stderr, "treeduce-refhost: signalfd: %s\n", std::strerror(errno));
    return kExitSystem;
  }

  Port port(*leaf, opt.payload);
  if (const std::string err = port.open(*local); !err.empty()) {
    std::fprintf(stderr, "treeduce-refhost: %s (%s)\n", err.c_str(), opt.bind.c_str());
    return kExitSystem;
  }
  host::EngineConfig ec;
  ec.tree_id = opt.tree;
  ec.key = opt.key;
  ec.child_index = opt.child;
  ec.world = opt.world;
  ec.slots = opt.slots;
  ec.payload_bytes = opt.payload;
  ec.rto_initial_ns = opt.rto_us * 1000;
  ec.rto_max_ns = opt.rto_max_us * 1000;
  ec.max_retries = opt.max_retries;
  host::ProtocolEngine engine(ec);  // one for the whole run: chunk and seq continue across cases

  // Every rank runs the same collectives in the same order (README.md): dtype, then op, then
  // count, then iteration, each in command-line order; pairs with no meaning are left out.
  std::vector<Case> cases;
  for (const auto& [d, op] : pairs) {
    for (const std::size_t n : opt.counts) {
      for (std::uint32_t it = 0; it < opt.iters; ++it) cases.push_back(Case{d, op, n, it});
    }
  }
  std::fprintf(stderr,
               "treeduce-refhost: rank %u of %u, tree %u child %u, leaf %s, %zu cases, seed %llu\n",
               opt.rank, opt.world, opt.tree, opt.child, opt.leaf.c_str(), cases.size(),
               static_cast<unsigned long long>(opt.seed));
  const std::uint64_t start = now_ns();
  Runner runner(opt, engine, port, sigfd, start + opt.timeout_ms * 1'000'000, max_count);
  std::size_t passed = 0, failed = 0;
  Outcome stop = Outcome::ok;
  for (const Case& c : cases) {
    const Outcome o = runner.run(c);
    ++(o == Outcome::ok ? passed : failed);
    if (o == Outcome::run_timeout || o == Outcome::interrupted || o == Outcome::io_error) {
      stop = o;
      break;
    }
  }

  std::fprintf(opt.json ? stderr : stdout, "refhost: %zu passed, %zu failed\n", passed, failed);
  const host::EngineStats& es = engine.stats();
  const PortStats& ps = port.stats();
  std::fprintf(
      stderr,
      "treeduce-refhost: sent=%llu retransmits=%llu results=%llu duplicates=%llu "
      "ignored=%llu nack_unverified=%llu foreign=%llu malformed=%llu send_errors=%llu "
      "elapsed_ms=%llu\n",
      static_cast<unsigned long long>(es.sent), static_cast<unsigned long long>(es.retransmits),
      static_cast<unsigned long long>(es.results), static_cast<unsigned long long>(es.duplicates),
      static_cast<unsigned long long>(es.ignored),
      static_cast<unsigned long long>(es.nack_unverified),
      static_cast<unsigned long long>(ps.foreign), static_cast<unsigned long long>(ps.malformed),
      static_cast<unsigned long long>(ps.send_errors),
      static_cast<unsigned long long>((now_ns() - start) / 1'000'000));
  switch (stop) {
    case Outcome::run_timeout:
      std::fprintf(stderr, "treeduce-refhost: --timeout-ms %llu passed; %zu cases not run\n",
                   static_cast<unsigned long long>(opt.timeout_ms), cases.size() - passed - failed);
      return kExitRunTimeout;
    case Outcome::interrupted:
      std::fprintf(stderr, "treeduce-refhost: stopped by signal %d\n", runner.signo);
      return kExitSignal + runner.signo;
    case Outcome::io_error:
      std::fprintf(stderr, "treeduce-refhost: %s\n", runner.error.c_str());
      return kExitSystem;
    default:
      return failed == 0 ? kExitOk : kExitFailed;
  }
}
