// The communicator: joins the job, asks the path policy (path_policy.h) which path it and each
// operation take, and runs operations through the request queue (request_queue.h) on the network
// loop (network_loop.h) or the host path (host_path.h), falling back loudly. docs/host.md
// describes the behaviour; this file puts the parts together.
#include "treeduce/host/communicator.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "environment.h"
#include "errors.h"
#include "grpc_tls.h"
#include "host_path.h"
#include "manager_client.h"
#include "network_loop.h"
#include "path_policy.h"
#include "request_queue.h"
#include "transport.h"
#include "treeduce/host/protocol_engine.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::host {

namespace {

// Retransmission: by default each chunk's first timeout comes from the adaptive timer
// (RtoEstimator: the measured per-chunk latency, 10 ms before the first sample, within 2 to
// 32 ms); TREEDUCE_RTO_US fixes it instead. The backoff doubles it up to 128 ms. A chunk that
// gets no answer is sent 1 + max_retries times (80 by default: over 2 + (4 + ... + 128) +
// 74 x 128 = 9726 ms with the first timeout at the 2 ms floor, to 32 + 64 + 79 x 128 = 10208 ms
// at the 32 ms ceiling, and one timeout more, at most 64 ms, when the stall rule deferred the
// chunk): a dead switch fails the operation (or starts the fallback) 9.7 to 10.3 s after its
// last answer (docs/host.md, "Time bounds"; silence_ms() in network_loop.h).
constexpr std::uint64_t kRtoMaxNs = 128'000'000;

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}

// The MTU of the interface that holds the IPv4 address `ip`, or 0 when none does.
std::uint32_t interface_mtu(const std::string& ip) {
  in_addr want{};
  if (inet_pton(AF_INET, ip.c_str(), &want) != 1) return 0;
  ifaddrs* all = nullptr;
  if (getifaddrs(&all) != 0) return 0;
  std::string name;
  for (const ifaddrs* i = all; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if (reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
      name = i->ifa_name;
      break;
    }
  }
  freeifaddrs(all);
  if (name.empty() || name.size() >= IFNAMSIZ) return 0;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ifreq req{};
  std::memcpy(req.ifr_name, name.c_str(), name.size());
  const int r = ioctl(fd, SIOCGIFMTU, &req);
  close(fd);
  return r == 0 && req.ifr_mtu > 0 ? static_cast<std::uint32_t>(req.ifr_mtu) : 0;
}

// Options::payload_bytes 0: the largest payload the protocol allows (a power of two, 256 to
// 8192) whose datagram (IPv4, UDP, treeduce headers) fits the MTU of this host's data interface;
// 1024 when the interface is unknown. Every rank of a job on one fabric finds the same.
std::uint32_t payload_for_path(const std::string& local_ip) {
  const std::uint32_t mtu = interface_mtu(local_ip);
  if (mtu == 0) return 1024;
  const std::size_t headers = sizeof(proto::Ipv4Hdr) + sizeof(proto::UdpHdr) + sizeof(proto::TdHdr);
  std::uint32_t p = static_cast<std::uint32_t>(proto::kMaxPayloadBytes);
  while (p > proto::kMinPayloadBytes && p + headers > mtu) p /= 2;
  return p;
}

std::string dtype_op(DType d, ReduceOp op) {
  return std::string(name(d)) + " " + std::string(name(op));
}

// A count whose bytes do not fit a size_t is no buffer (it would wrap to a small size).
treeduce::Status check_count(std::size_t count, DType dtype) {
  if (count > SIZE_MAX / dtype_size(dtype))
    return invalid_argument("The count " + std::to_string(count) + " of " +
                            std::string(name(dtype)) + " is more bytes than memory can hold.");
  return treeduce::Status::Ok();
}

// Why an operation cannot start, or ok.
treeduce::Status check_operation(const void* send, const void* recv, std::size_t count, DType dtype,
                                 ReduceOp op) {
  if (static_cast<std::size_t>(dtype) >= kNumDTypes)
    return invalid_argument("The element type " + std::to_string(static_cast<int>(dtype)) +
                            " is not a DType.");
  if (static_cast<std::size_t>(op) >= kNumReduceOps)
    return invalid_argument("The operation " + std::to_string(static_cast<int>(op)) +
                            " is not a ReduceOp.");
  if (!op_defined(dtype, op))
    return invalid_argument("The pair " + dtype_op(dtype, op) +
                            " is not a reduction: " + std::string(op_refusal(dtype, op)) + ".");
  if (count != 0 && (send == nullptr || recv == nullptr))
    return invalid_argument("The send or receive buffer is null.");
  if (auto s = check_count(count, dtype); !s.ok()) return s;
  // In place is the same buffer; a partial overlap would read results as inputs.
  const auto a = reinterpret_cast<std::uintptr_t>(send);
  const auto b = reinterpret_cast<std::uintptr_t>(recv);
  const std::size_t bytes = count * dtype_size(dtype);
  if (a != b && bytes != 0 && a < b + bytes && b < a + bytes)
    return invalid_argument(
        "The send and receive buffers overlap without being the same buffer (in place).");
  return treeduce::Status::Ok();
}

bool has(std::uint32_t mask, unsigned bit) { return (mask >> bit & 1u) != 0; }

// Whether masks offload a pair: both bits and a defined pair (manager.proto Assignment).
bool mask_offloads(std::uint32_t dtypes, std::uint32_t ops, DType d, ReduceOp op) {
  // A value outside the enums (a cast from an int) is no pair, and no shift beyond the mask.
  if (static_cast<std::size_t>(d) >= kNumDTypes || static_cast<std::size_t>(op) >= kNumReduceOps)
    return false;
  return has(dtypes, static_cast<unsigned>(d)) && has(ops, static_cast<unsigned>(op)) &&
         op_defined(d, op);
}

// Why the tree cannot reduce (d, op), naming the switch model that cannot (a phrase): "switch
// 'leaf0' (profile tofino) does not reduce f64 sum". The switches come root first; every one that
// lacks the pair is named, up to three.
std::string not_offloaded(const TreeAssignment& t, DType d, ReduceOp op) {
  const std::string pair = dtype_op(d, op);
  std::vector<const TreeSwitch*> lacking;
  for (const TreeSwitch& s : t.switches)
    if (!mask_offloads(s.dtype_mask, s.op_mask, d, op)) lacking.push_back(&s);
  if (lacking.empty()) {
    return t.switches.empty()
               ? "the tree (given without its switches' models) does not reduce " + pair
               : "the tree does not reduce " + pair;
  }
  std::string who;
  const std::size_t shown = std::min<std::size_t>(lacking.size(), 3);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) who += i + 1 == shown && lacking.size() == shown ? " and " : ", ";
    who += "'" + lacking[i]->name + "' (profile " + lacking[i]->profile + ")";
  }
  if (lacking.size() > shown) who += " and " + std::to_string(lacking.size() - shown) + " more";
  return (lacking.size() == 1 ? "switch " : "switches ") + who +
         (lacking.size() == 1 ? " does not reduce " : " do not reduce ") + pair;
}

// An operation stream() took from the feed.
struct StreamItem {
  Operation op;
  std::uint64_t index = 0;         // op_index_: the same sequence on every rank
  std::vector<std::uint8_t> kept;  // in-place input kept for a fallback
};

// stream()'s operations in order, oldest first: a FIFO over a vector whose elements (and their
// `kept` buffers) are reused, so that an operation on the network path allocates nothing here
// (a std::deque made per stream() allocated twice per blocking call).
class StreamItems {
 public:
  bool empty() const { return head_ == size_; }
  StreamItem& front() { return v_[head_]; }
  StreamItem& push() {
    if (head_ == size_) head_ = size_ = 0;  // empty: start again at the front
    if (size_ == v_.size()) {
      // Full: move what is still in flight to the front, or grow.
      if (head_ != 0) {
        std::rotate(v_.begin(), v_.begin() + static_cast<std::ptrdiff_t>(head_), v_.end());
        size_ -= head_;
        head_ = 0;
      }
      if (size_ == v_.size()) v_.emplace_back();
    }
    return v_[size_++];
  }
  void pop() { ++head_; }

 private:
  std::vector<StreamItem> v_;
  std::size_t head_ = 0, size_ = 0;  // [head_, size_) in flight
};

class CommunicatorImpl final : public Communicator {
 public:
  explicit CommunicatorImpl(const Options& opt) : opt_(opt), host_(opt_) {}

  ~CommunicatorImpl() override {
    stop_.store(true);
    if (network_) network_->wake();
    if (queue_) queue_->stop();
    if (manager_) manager_->leave();
  }

  // Everything create() does after validating the options.
  treeduce::Status init() {
    std::optional<Obstacle> obstacle;
    if (opt_.path == Path::host) {
      // decide_path() says host below.
    } else if (!opt_.manager.empty()) {
      manager_ = ManagerClient::make(opt_.manager, opt_.tls_ca, opt_.tls_cert, opt_.tls_key,
                                     opt_.tls_server_name);
      JoinRequest jr;
      jr.job = opt_.job;
      jr.rank = opt_.rank;
      jr.world_size = opt_.world_size;
      jr.host = opt_.host;
      jr.port = port();
      jr.payload_bytes =
          opt_.payload_bytes != 0 ? opt_.payload_bytes : payload_for_path(local_ip());
      jr.slots = opt_.slots != 0 ? opt_.slots : proto::default_window(jr.payload_bytes);
      jr.deterministic = opt_.deterministic;
      jr.wait_ms = opt_.join_timeout_ms;
      const JoinOutcome o = manager_->join(jr);
      if (o.result == Result::ok) {
        tree_ = o.tree;
      } else {
        manager_.reset();
        // The client's reason names the manager; say which one if it does not. A wrong request
        // (another rank cannot start, a rank started twice) is the manager's sentence as is:
        // the manager gave no tree because the job itself is wrong.
        std::string why = as_phrase(o.reason);
        if (why.find(opt_.manager) == std::string::npos && o.result != Result::invalid_argument) {
          why = "the Aggregation Manager at " + opt_.manager + " gave the job no tree" +
                (why.empty() ? "" : ": " + why);
        }
        obstacle = Obstacle{to_code(o.result), why, o.result == Result::invalid_argument};
      }
    } else if (!opt_.static_tree.leaf_address.empty()) {
      tree_ = opt_.static_tree;
    } else {
      obstacle = Obstacle{Code::unavailable,
                          "no Aggregation Manager (TREEDUCE_MANAGER) and no static tree are set"};
      obstacle->say_path = true;
    }
    if (opt_.path != Path::host && !obstacle) obstacle = open_network();
    const PathDecision d = decide_path(opt_.path, obstacle);
    switch (d.verdict) {
      case Verdict::network:
        path_ = Path::network;
        break;
      case Verdict::host:
        use_host(d.reason, false);
        std::fprintf(stderr, "treeduce: info: rank %u uses host-side reduction: %s\n", opt_.rank,
                     reason_.c_str());
        // Every rank asked for the host path: they all rendezvous here, at creation.
        if (auto s = host_.connect(); !s.ok()) return s;
        break;
      case Verdict::fall_back:
      case Verdict::fall_back_once:
        use_host(d.reason, true);
        break;
      case Verdict::fail:
        return d.error;
    }
    queue_ = std::make_unique<RequestQueue>([this](Feed& f) { run_feed(f); },
                                            /*caller_runs=*/true,
                                            [this] {
                                              if (network_) network_->wake();
                                            });
    return treeduce::Status::Ok();
  }

  bool offloads(DType dtype, ReduceOp op) const override {
    std::lock_guard lk(mu_);
    return path_ == Path::network && offloadable(dtype, op);
  }
  Path path() const override {
    std::lock_guard lk(mu_);
    return path_;
  }
  std::string path_reason() const override {
    std::lock_guard lk(mu_);
    return reason_;
  }

  Result allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                   ReduceOp op) override {
    if (auto s = check_operation(send, recv, count, dtype, op); !s.ok()) return report(s);
    return report(queue_->run({send, recv, count, dtype, op}));
  }

  Result iallreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                    Request* req) override {
    if (req == nullptr) return report(invalid_argument("The request pointer is null."));
    if (auto s = check_operation(send, recv, count, dtype, op); !s.ok()) return report(s);
    *req = queue_->start({send, recv, count, dtype, op});
    return Result::ok;
  }

  Result test(Request req) override { return complete(req, false); }
  Result wait(Request req) override { return complete(req, true); }

  Result reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                std::uint32_t root) override {
    if (root >= opt_.world_size) return report(not_a_rank(root));
    if (opt_.rank == root) return allreduce(send, recv, count, dtype, op);
    // Every check before the scratch is sized. A non-root's recv is never looked at: it may be
    // null, or anything, as MPI_Reduce's recvbuf on a non-root.
    if (auto s = check_operation(send, send, count, dtype, op); !s.ok()) return report(s);
    // A non-root reduces into scratch: its recv is never written and may be null.
    std::vector<std::uint8_t> scratch(count * dtype_size(dtype));
    return allreduce(send, scratch.data(), count, dtype, op);
  }

  Result broadcast(void* buf, std::size_t count, DType dtype, std::uint32_t root) override {
    if (root >= opt_.world_size) return report(not_a_rank(root));
    if (static_cast<std::size_t>(dtype) >= kNumDTypes) {
      return report(invalid_argument("The element type " + std::to_string(static_cast<int>(dtype)) +
                                     " is not a DType."));
    }
    if (count != 0 && buf == nullptr) return report(invalid_argument("The buffer is null."));
    if (auto s = check_count(count, dtype); !s.ok()) return report(s);
    // An int32 sum of the root's bytes and everyone else's zeros is the root's bytes, exactly,
    // for any bit pattern (a wrapping integer sum with zeros is the identity). Padding to whole
    // int32s costs a copy of the buffer each way.
    const std::size_t bytes = count * dtype_size(dtype);
    std::vector<std::uint32_t> in((bytes + 3) / 4, 0), out(in.size());
    if (opt_.rank == root && bytes != 0) std::memcpy(in.data(), buf, bytes);
    const Result r = allreduce(in.data(), out.data(), in.size(), DType::i32, ReduceOp::sum);
    if (r == Result::ok && opt_.rank != root && bytes != 0) std::memcpy(buf, out.data(), bytes);
    return r;
  }

  Result barrier() override {
    std::int32_t in = 0, out = 0;
    return allreduce(&in, &out, 1, DType::i32, ReduceOp::sum);
  }

  std::uint32_t rank() const override { return opt_.rank; }
  std::uint32_t world_size() const override { return opt_.world_size; }
  Stats stats() const override {
    std::lock_guard lk(mu_);
    return stats_;
  }
  std::string last_error() const override {
    std::lock_guard lk(mu_);
    return last_error_;
  }

 private:
  // The API's edge: the sentence becomes last_error() ("" after a success), the code a Result.
  Result report(const treeduce::Status& s) {
    std::lock_guard lk(mu_);
    last_error_ = s.message();
    return to_result(s);
  }

  treeduce::Status not_a_rank(std::uint32_t root) const {
    return invalid_argument("The root " + std::to_string(root) +
                            " is not a rank of this communicator.");
  }

  // test() and wait(): the request's result once it is done, and the request is then gone.
  Result complete(Request req, bool block) {
    const std::optional<treeduce::Status> s = queue_->complete(req, block);
    if (!s) return Result::in_progress;
    return report(*s);
  }

  // The local IPv4 address of the data path ("0.0.0.0": any).
  std::string local_ip() const {
    return !opt_.bind_address.empty() ? opt_.bind_address
           : is_ipv4(opt_.host)       ? opt_.host
                                      : "0.0.0.0";
  }

  std::uint16_t port() const {
    return opt_.port != 0 ? opt_.port : static_cast<std::uint16_t>(29000 + opt_.rank % 1000);
  }

  // tree_ does not change once init() is done: no lock needed.
  bool offloadable(DType dtype, ReduceOp op) const {
    return mask_offloads(tree_.dtype_mask, tree_.op_mask, dtype, op);
  }

  // The one line every fallback decision prints (docs/host.md, "Logging"): SHARP's silent
  // fallback is what users complain about most.
  void warn_fallback(const std::string& why) const {
    std::fprintf(stderr, "treeduce: warning: rank %u falls back to host-side reduction: %s\n",
                 opt_.rank, why.c_str());
  }

  // The whole communicator moves to host-side reduction, for good: every rank takes the same
  // decision (the manager's answer and the tree's state are the same for all), so they all meet
  // in the host reducer's rendezvous. `warn`: a fallback (warning) rather than a request.
  void use_host(const std::string& why, bool warn) {
    {
      std::lock_guard lk(mu_);
      path_ = Path::host;
      reason_ = why;
      if (warn) stats_.fallback_reason = why;
    }
    if (warn) warn_fallback(why);
  }

  // Sets up the in-network path for tree_: nullopt, or why it cannot.
  std::optional<Obstacle> open_network() {
    const TreeAssignment& t = tree_;
    // The protocol's rules (protocol/tree.h), as every switch of the tree applies them.
    auto bad = proto::check_slots(t.slots);
    if (!bad) bad = proto::check_payload_bytes(t.payload_bytes);
    if (bad) {
      bad->pop_back();  // a phrase here: no full stop
      return Obstacle{Code::invalid_argument, "the tree given to this rank is not valid: " + *bad};
    }
    if (opt_.world_size > proto::kMaxTreeHosts) {
      return Obstacle{Code::invalid_argument, "a tree holds at most " +
                                                  std::to_string(proto::kMaxTreeHosts) +
                                                  " ranks, not " + std::to_string(opt_.world_size)};
    }
    TransportEndpoints at;
    at.bind_address = local_ip();
    at.port = port();
    at.leaf_address = t.leaf_address;
    at.payload_bytes = t.payload_bytes;
    auto transport = make_transport(opt_.transport, at);
    if (!transport.ok()) {
      return Obstacle{transport.status().code(),
                      std::string("the ") + name(opt_.transport.kind) +
                          " transport could not start: " + as_phrase(transport.status().message())};
    }
    EngineConfig ec;
    ec.tree_id = t.tree_id;
    ec.key = t.key;
    ec.child_index = t.child_index;
    ec.world = static_cast<std::uint16_t>(opt_.world_size);
    ec.slots = t.slots;
    ec.payload_bytes = t.payload_bytes;
    ec.adaptive_rto = opt_.rto_us == 0;
    if (!ec.adaptive_rto) {
      ec.rto_initial_ns = std::min<std::uint64_t>(opt_.rto_us * 1000ull, kRtoMaxNs);
    }
    ec.rto_max_ns = kRtoMaxNs;
    ec.max_retries = opt_.max_retries;
    network_ =
        std::make_unique<NetworkLoop>(std::move(transport).value(), ec, t.leaf_address, peers(),
                                      opt_.op_timeout_ms, stop_, opt_.transport.busy_poll_us);
    return std::nullopt;
  }

  // What this rank knows of the others, for the sentence of a network that stopped answering: the
  // manager's Join returned only once every rank had joined; a static tree knows nothing of them.
  std::string peers() const {
    const std::string n = std::to_string(opt_.world_size);
    if (manager_) {
      return "all " + n + " ranks joined job '" + opt_.job + "' at the Aggregation Manager at " +
             opt_.manager;
    }
    if (opt_.world_size == 1) return {};
    char key[32];
    std::snprintf(key, sizeof key, "0x%llx", static_cast<unsigned long long>(tree_.key));
    const std::string others =
        opt_.world_size == 2
            ? "whether the other rank"
            : "which of the other " + std::to_string(opt_.world_size - 1) + " ranks";
    return "with a static tree this rank cannot know " + others + " started: every rank of the " +
           n + " must run with tree id " + std::to_string(tree_.tree_id) + ", key " + key +
           " and its own child index, as the switch was configured";
  }

  // The request queue's runner: what the feed has, in order. Operations that go to the network
  // stream through it back to back (stream()); any other runs alone (execute()).
  void run_feed(Feed& feed) {
    while (const Operation* next = feed.peek()) {
      const Operation o = *next;
      if (network_ready(o)) {
        stream(feed);
        continue;
      }
      feed.take();
      feed.complete(execute(o));
    }
  }

  // Whether `o` goes to the network now, with nothing in its way (execute_on_path() says why
  // when it does not).
  bool network_ready(const Operation& o) {
    {
      std::lock_guard lk(mu_);
      if (path_ != Path::network) return false;
    }
    std::string why;
    return offloadable(o.dtype, o.op) && !network_->broken() &&
           !(manager_ && !manager_->tree_usable(&why));
  }

  // Operations the feed has for the network, back to back through the window (docs/host.md,
  // "Pipelining"), each completed as its last result comes in. When the stream stops, the
  // oldest operation not done and the later ones it had taken fall back (or fail) in order, as
  // one operation on its own would.
  void stream(Feed& feed) {
    struct Source final : StreamSource {
      Source(CommunicatorImpl& owner, Feed& f) : c(owner), feed(f), items(owner.stream_items_) {}
      bool next(Operation* out) override {
        const Operation* o = feed.peek();
        if (o == nullptr || !c.network_ready(*o)) return false;
        StreamItem& it = items.push();
        it.op = *o;
        it.index = ++c.op_index_;
        it.kept.clear();
        if (c.opt_.path == Path::auto_select && o->send == o->recv) {
          const auto* in = static_cast<const std::uint8_t*>(o->send);
          it.kept.assign(in, in + o->count * dtype_size(o->dtype));
        }
        feed.take();
        *out = it.op;
        return true;
      }
      void done() override {
        const StreamItem& it = items.front();
        {
          std::lock_guard lk(c.mu_);
          c.stats_.retransmits = c.network_->retransmits();
          ++c.stats_.network_ops;
          c.stats_.bytes += it.op.count * dtype_size(it.op.dtype);
        }
        items.pop();
        feed.complete(treeduce::Status::Ok());
      }
      CommunicatorImpl& c;
      Feed& feed;
      StreamItems& items;  // taken, not done
    } src(*this, feed);
    std::optional<Obstacle> failed;
    try {
      failed = network_->run_stream(src);
    } catch (const std::exception& e) {
      network_->set_broken();
      while (!src.items.empty()) {
        src.items.pop();
        feed.complete(internal_error(std::string("Internal error: ") + e.what() + "."));
      }
      return;
    }
    {
      std::lock_guard lk(mu_);
      stats_.retransmits = network_->retransmits();
    }
    if (!failed) return;
    failed->fatal = failed->fatal || stop_.load();
    if (std::string gone;
        failed->code == Code::deadline_exceeded && manager_ && !manager_->tree_usable(&gone)) {
      failed->why += "; the Aggregation Manager says: " + as_phrase(gone);
    }
    const PathDecision d = decide_path(opt_.path, failed);
    bool first = true;
    while (!src.items.empty()) {
      const StreamItem& it = src.items.front();
      const void* send = it.kept.empty() ? it.op.send : it.kept.data();
      treeduce::Status s;
      try {
        // After the first has moved the communicator to the host path, the rest just run there.
        s = first || path() == Path::network ? fall_back(it.op, d, send, it.index)
                                             : run_host(it.op, send, it.index);
      } catch (const std::exception& e) {
        s = internal_error(std::string("Internal error: ") + e.what() + ".");
      }
      first = false;
      src.items.pop();
      feed.complete(std::move(s));
    }
  }

  // Runs one operation on the path it should take; one thread at a time (the request queue's).
  // Never throws: out of memory for an in-place copy, or a library throwing, fails the
  // operation and the process lives.
  treeduce::Status execute(const Operation& o) {
    try {
      return execute_on_path(o);
    } catch (const std::exception& e) {
      // The engine may be mid-collective: never send into it again.
      if (network_) network_->set_broken();
      return internal_error(std::string("Internal error: ") + e.what() + ".");
    }
  }

  treeduce::Status execute_on_path(const Operation& o) {
    const std::uint64_t index = ++op_index_;
    Path p;
    {
      std::lock_guard lk(mu_);
      p = path_;
    }
    if (p != Path::network) return run_host(o, o.send, index);

    // Whatever stands in the network path's way before the operation starts.
    std::optional<Obstacle> before;
    std::string why;
    if (!offloadable(o.dtype, o.op)) {
      before = Obstacle{Code::failed_precondition, not_offloaded(tree_, o.dtype, o.op)};
      before->this_call_only = true;
      before->say_path = true;
    } else if (manager_ && !manager_->tree_usable(&why)) {
      before = Obstacle{Code::unavailable,
                        "the Aggregation Manager says the job's tree is no longer usable: " + why};
    } else if (network_->broken()) {
      before = Obstacle{Code::unavailable,
                        "the in-network path cannot resume after an operation was abandoned "
                        "midway"};
      before->fatal = true;
    }
    if (before) return fall_back(o, decide_path(opt_.path, before), o.send, index);

    // In place with a fallback possible: keep the input, since the network path overwrites it
    // chunk by chunk and a failed operation is redone on the host path from the same input.
    // Costs one copy of the buffer per in-place operation (docs/host.md).
    const bool keep = opt_.path == Path::auto_select && o.send == o.recv;
    const std::size_t bytes = o.count * dtype_size(o.dtype);
    if (keep) {
      const auto* in = static_cast<const std::uint8_t*>(o.send);
      saved_.assign(in, in + bytes);
    }
    std::optional<Obstacle> failed = network_->run(o);
    {
      std::lock_guard lk(mu_);
      stats_.retransmits = network_->retransmits();
      if (!failed) {
        ++stats_.network_ops;
        stats_.bytes += bytes;
      }
    }
    if (!failed) return treeduce::Status::Ok();
    failed->fatal = failed->fatal || stop_.load();
    // The manager may know why the network went quiet (a switch of the tree failed).
    if (std::string gone;
        failed->code == Code::deadline_exceeded && manager_ && !manager_->tree_usable(&gone)) {
      failed->why += "; the Aggregation Manager says: " + as_phrase(gone);
    }
    return fall_back(o, decide_path(opt_.path, failed), keep ? saved_.data() : o.send, index);
  }

  // What the path policy decided for an operation the network path cannot take.
  treeduce::Status fall_back(const Operation& o, const PathDecision& d, const void* send,
                             std::uint64_t index) {
    switch (d.verdict) {
      case Verdict::fail:
        return d.error;
      case Verdict::fall_back_once: {
        // Per call: other (dtype, op) pairs stay in the network. Said on every such call, with
        // its size, so that no host-side call is silent (SHARP's fallback is).
        const std::string why = "allreduce of " + std::to_string(o.count) + " " +
                                dtype_op(o.dtype, o.op) + " on the host path: " + d.reason;
        std::fprintf(stderr, "treeduce: warning: rank %u: %s\n", opt_.rank, why.c_str());
        {
          std::lock_guard lk(mu_);
          stats_.fallback_reason = why;
        }
        return run_host(o, send, index);
      }
      default:
        use_host(d.reason, true);
        return run_host(o, send, index);
    }
  }

  treeduce::Status run_host(const Operation& o, const void* send, std::uint64_t index) {
    treeduce::Status s = host_.run(o, send, index);
    if (s.ok()) {
      std::lock_guard lk(mu_);
      ++stats_.fallback_ops;
      stats_.bytes += o.count * dtype_size(o.dtype);
    }
    return s;
  }

  const Options opt_;
  TreeAssignment tree_;  // written in init(), then read only
  std::unique_ptr<ManagerClient> manager_;

  // The request queue's running operation only (after init()).
  std::unique_ptr<NetworkLoop> network_;
  HostPath host_;
  std::uint64_t op_index_ = 0;       // operations executed: the same sequence on every rank
  StreamItems stream_items_;         // stream()'s operations taken and not done; reused
  std::vector<std::uint8_t> saved_;  // in-place input kept for a fallback; reused

  // Shared, under mu_.
  mutable std::mutex mu_;
  Path path_ = Path::network;
  std::string reason_;
  Stats stats_;
  std::string last_error_;

  std::atomic<bool> stop_{false};        // read by the network loop inside an operation
  std::unique_ptr<RequestQueue> queue_;  // last: stopped first
};

// "" when the options say how to talk to the manager: all three TLS files, or insecure alone.
std::string manager_tls_problem(const Options& o) {
  const std::string bad =
      tls::check({o.tls_ca, o.tls_cert, o.tls_key, o.insecure},
                 "TREEDUCE_TLS_CA, TREEDUCE_TLS_CERT and TREEDUCE_TLS_KEY", "TREEDUCE_INSECURE=1");
  if (bad.empty()) return bad;
  std::string out = "The Aggregation Manager at " + o.manager + " cannot be used: " + bad;
  return out;
}

// Why a static tree given in code cannot be a switch's (the environment's parser applies the same
// rules to TREEDUCE_STATIC_*), or "": a programming error, refused on every path rather than
// fallen back from with auto.
std::string static_tree_problem(const TreeAssignment& t) {
  const std::string& a = t.leaf_address;
  if (!is_leaf_address(a))
    return "The static tree's leaf address '" + a +
           "' is not the leaf switch's data address as IPv4:PORT (10.0.1.1:4791).";
  if (auto bad = proto::check_slots(t.slots)) return "The static tree's " + *bad;
  if (auto bad = proto::check_payload_bytes(t.payload_bytes)) return "The static tree's " + *bad;
  if (t.child_index >= proto::kMaxChildren)
    return "The static tree's child index " + std::to_string(t.child_index) + " is not below " +
           std::to_string(proto::kMaxChildren) + ".";
  return {};
}

// "" when `a` is HOST:PORT (HOST a name, an IPv4 address or a bracketed IPv6 one, PORT 1..65535),
// else why not. Without a port gRPC would dial 443, the HTTPS port, and fail much later.
std::string manager_address_problem(const std::string& a) {
  // gRPC's own target syntax (unix:/path, dns:///host:port, ipv4:..., ...) is gRPC's to check.
  for (const char* scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"})
    if (a.rfind(scheme, 0) == 0) return {};
  const auto colon = a.rfind(':');
  const bool bracketed = !a.empty() && a.front() == '[';
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size() ||
      (bracketed && a[colon - 1] != ']')) {
    return "The Aggregation Manager address '" + a +
           "' has no port: give it as HOST:PORT (TREEDUCE_MANAGER=manager.example:9300).";
  }
  const std::string port = a.substr(colon + 1);
  unsigned long p = 0;
  for (char ch : port) {
    if (ch < '0' || ch > '9' || p > 65535) {
      p = 65536;
      break;
    }
    p = p * 10 + static_cast<unsigned long>(ch - '0');
  }
  if (p == 0 || p > 65535)
    return "The Aggregation Manager address '" + a + "' has the port '" + port +
           "'; a port is a number from 1 to 65535.";
  return {};
}

}  // namespace

std::string report_unstartable(const UnstartableRank& who, const std::string& why) {
  const std::string self = who.rank ? "Rank " + std::to_string(*who.rank) : "This rank";
  if (who.manager.empty())
    return "The other ranks cannot be told (no TREEDUCE_MANAGER): they find out only when their "
           "operations time out.";
  if (who.job.empty())
    return "The other ranks cannot be told (no job name to tell the Aggregation Manager at " +
           who.manager + "): they wait for this rank until their join timeout.";
  if (const std::string bad = manager_address_problem(who.manager); !bad.empty())
    return "The other ranks cannot be told: " + bad;
  // Read directly: the variables in question may be the malformed ones.
  const tls::TlsOptions t = tls::from_environment();
  const std::string no = (t.insecure || t.secure())
                             ? ManagerClient::make(who.manager, t.ca, t.cert, t.key, t.server_name)
                                   ->abort(who.job, who.rank, why)
                             : "no TLS certificates and no TREEDUCE_INSECURE=1";
  if (no.empty())
    return self + " told the Aggregation Manager at " + who.manager + ", which fails job '" +
           who.job + "' for every rank.";
  return self + " could not tell the Aggregation Manager at " + who.manager + " (" + no +
         "): the other ranks wait for it until their join timeout.";
}

Result options_from_environment(Options* out, std::string* error) {
  return options_from_environment(out, error, {});
}

Result options_from_environment(Options* out, std::string* error,
                                const std::map<std::string, std::string>& overrides) {
  if (out == nullptr) {
    if (error != nullptr) *error = "options_from_environment needs an Options to fill.";
    return Result::invalid_argument;
  }
  const EnvLookup env = [&overrides](const char* n) -> const char* {
    const auto it = overrides.find(n);
    return it != overrides.end() ? it->second.c_str() : std::getenv(n);
  };
  const treeduce::Status s = parse_environment(env, out);
  // A rank that cannot start says so to the manager, so that the others fail now rather than
  // wait for it (docs/host.md, "Environment").
  std::string message = s.message();
  if (!s.ok()) message += " " + report_unstartable(what_is_known(env), s.message());
  if (error != nullptr) *error = message;
  return to_result(s);
}

std::unique_ptr<Communicator> Communicator::create(const Options& opt, Result* result,
                                                   std::string* error) {
  treeduce::Status s;
  std::unique_ptr<CommunicatorImpl> c;
  if (opt.world_size == 0 || opt.rank >= opt.world_size) {
    s = invalid_argument("The rank " + std::to_string(opt.rank) + " is not below the world size " +
                         std::to_string(opt.world_size) + ".");
  } else if (opt.join_timeout_ms == 0 || opt.op_timeout_ms == 0) {
    // 0 is not "no bound": every wait in the library is bounded, and 0 would fail every join or
    // every in-network operation at once.
    s = invalid_argument(
        std::string(opt.join_timeout_ms == 0 ? "join_timeout_ms" : "op_timeout_ms") +
        " is 0; give a bound in milliseconds (the defaults are 30000 and 60000).");
  } else if (opt.job.empty()) {
    // The job names the manager's job and the host path's rendezvous: without one, unrelated
    // programs would meet in the same store.
    s = invalid_argument("The job name is empty; give every rank of the job the same name.");
  } else if (opt.path != Path::auto_select && opt.path != Path::network && opt.path != Path::host) {
    s = invalid_argument("The path " + std::to_string(static_cast<int>(opt.path)) +
                         " is not auto, network or host.");
  } else if (std::string why = opt.manager.empty() ? "" : manager_address_problem(opt.manager);
             !why.empty()) {
    s = invalid_argument(why);
  } else if (std::string wrong = !opt.manager.empty() || opt.path == Path::host ||
                                         opt.static_tree.leaf_address.empty()
                                     ? ""
                                     : static_tree_problem(opt.static_tree);
             !wrong.empty()) {
    s = invalid_argument(wrong);
  } else if (std::string bad =
                 opt.manager.empty() || opt.path == Path::host ? "" : manager_tls_problem(opt);
             !bad.empty()) {
    s = invalid_argument(bad);
  } else {
    c = std::make_unique<CommunicatorImpl>(opt);
    s = c->init();
    if (!s.ok()) c.reset();
  }
  if (result != nullptr) *result = to_result(s);
  if (error != nullptr) *error = s.message();
  return c;
}

}  // namespace treeduce::host
