// The communicator: chooses the path (in-network or host-side) at creation and per operation,
// runs every operation in start order on one progress thread, and falls back loudly.
// docs/host.md describes the behaviour; this file is where the decisions are taken.
#include "treeduce/host/communicator.h"

#include <arpa/inet.h>

#include <array>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "host_reducer.h"
#ifdef TREEDUCE_HAVE_DPDK
#include "dpdk_transport.h"
#endif
#ifdef TREEDUCE_HAVE_VERBS
#include "verbs_transport.h"
#endif
#include "manager_client.h"
#include "treeduce/host/protocol_engine.h"
#include "udp_transport.h"

namespace treeduce::host {

const char* to_string(Result r) noexcept {
  switch (r) {
    case Result::ok:
      return "ok";
    case Result::in_progress:
      return "in_progress";
    case Result::invalid_argument:
      return "invalid_argument";
    case Result::unavailable:
      return "unavailable";
    case Result::timeout:
      return "timeout";
    case Result::refused:
      return "refused";
    case Result::failed:
      return "failed";
    case Result::internal:
      return "internal";
  }
  return "unknown";
}

namespace {

// Retransmission: the first timeout is well above a loaded host's round trip through one or two
// switches, and the backoff caps at 128 ms. A chunk that gets no answer is sent 1 + 30 times
// over 1 + (2 + 4 + ... + 128) + 23 x 128 = 3199 ms: a dead switch fails the operation (or
// starts the fallback) about 3.2 s after its last answer (docs/host.md, "Failures").
constexpr std::uint64_t kRtoInitialNs = 1'000'000;
constexpr std::uint64_t kRtoMaxNs = 128'000'000;
constexpr std::uint32_t kMaxRetries = 30;
constexpr std::size_t kMaxBatch = 64;

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}

// A variable of the UDP transport's tuning (docs/host.md, "Environment"): not in Options
// because only this transport has it.
std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// A whole-number transport variable from `min` to `max`; `fallback` when unset or empty. A
// malformed or out-of-range value is a sentence in *err (the first one wins) and `fallback`:
// a typo must not quietly run another configuration than the one asked for.
std::uint32_t env_u32(const char* name, std::uint32_t fallback, std::uint32_t min,
                      std::uint32_t max, std::string* err) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  const std::string_view s(v);
  std::uint32_t x = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
  if (ec == std::errc() && p == s.data() + s.size() && x >= min && x <= max) return x;
  if (err->empty()) {
    *err = std::string(name) + " is '" + v + "', not a whole number from " + std::to_string(min) +
           " to " + std::to_string(max);
  }
  return fallback;
}

std::string dtype_op(DType d, ReduceOp op) {
  return std::string(name(d)) + " " + std::string(name(op));
}

// One operation, from its start to the test()/wait() that returns its result. `done` and the
// result are written by the progress thread under the communicator's mutex.
struct Op {
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  bool done = false;
  bool claimed = false;  // a thread is blocked in wait() on it: nobody else may complete it
  Result result = Result::ok;
  std::string error;
};

class CommunicatorImpl final : public Communicator {
 public:
  explicit CommunicatorImpl(const Options& opt) : opt_(opt) {}

  ~CommunicatorImpl() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    stop_.store(true);
    work_cv_.notify_all();
    if (transport_) transport_->wake();
    if (progress_.joinable()) progress_.join();
    if (manager_) manager_->leave();
  }

  // Everything create() does after validating the options. Returns ok or the error.
  Result init(std::string* error) {
    if (opt_.path == Path::host) {
      use_host("host-side reduction was asked for (path = host)", false);
      std::fprintf(stderr, "treeduce: info: rank %u uses host-side reduction: %s\n", opt_.rank,
                   reason_.c_str());
      // Every rank asked for the host path: they all rendezvous here, at creation.
      if (!connect_host()) {
        *error = host_error_;
        return Result::failed;
      }
    } else if (!opt_.manager.empty()) {
      manager_ = ManagerClient::make(opt_.manager);
      JoinRequest jr;
      jr.job = opt_.job;
      jr.rank = opt_.rank;
      jr.world_size = opt_.world_size;
      jr.host = opt_.host;
      jr.port = port();
      jr.slots = opt_.slots;
      jr.payload_bytes = opt_.payload_bytes;
      jr.deterministic = opt_.deterministic;
      jr.wait_ms = opt_.join_timeout_ms;
      const JoinOutcome o = manager_->join(jr);
      if (o.result == Result::ok) {
        tree_ = o.tree;
      } else {
        manager_.reset();
        // The client's reason names the manager; say which one if it does not.
        std::string why = as_phrase(o.reason);
        if (why.find(opt_.manager) == std::string::npos) {
          why = "the Aggregation Manager at " + opt_.manager + " gave the job no tree" +
                (why.empty() ? "" : ": " + why);
        }
        if (o.result == Result::invalid_argument || opt_.path == Path::network) {
          *error = capitalise(why) + ".";
          return o.result;
        }
        use_host(why, true);
      }
    } else if (!opt_.static_tree.leaf_address.empty()) {
      tree_ = opt_.static_tree;
    } else {
      const std::string why =
          "no Aggregation Manager (TREEDUCE_MANAGER) and no static tree are set";
      if (opt_.path == Path::network) {
        *error = capitalise(why) + ", and the path is network.";
        return Result::unavailable;
      }
      use_host(why, true);
    }
    if (path_ == Path::network) {
      std::string why;
      if (const Result r = open_network(&why); r != Result::ok) {
        if (opt_.path == Path::network) {
          *error = capitalise(why) + ".";
          return r;
        }
        use_host(why, true);
      }
    }
    progress_ = std::thread([this] { progress(); });
    return Result::ok;
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
    Request req = 0;
    const Result r = iallreduce(send, recv, count, dtype, op, &req);
    return r == Result::ok ? wait(req) : r;
  }

  Result iallreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                    Request* req) override {
    std::string why;
    if (req == nullptr) {
      why = "The request pointer is null.";
    } else if (static_cast<std::size_t>(dtype) >= kNumDTypes) {
      why = "The element type " + std::to_string(static_cast<int>(dtype)) + " is not a DType.";
    } else if (static_cast<std::size_t>(op) >= kNumReduceOps) {
      why = "The operation " + std::to_string(static_cast<int>(op)) + " is not a ReduceOp.";
    } else if (count != 0 && (send == nullptr || recv == nullptr)) {
      why = "The send or receive buffer is null.";
    }
    std::lock_guard lk(mu_);
    if (!why.empty()) {
      last_error_ = why;
      return Result::invalid_argument;
    }
    const Request id = next_request_++;
    Op& o = ops_[id];
    o.send = send;
    o.recv = recv;
    o.count = count;
    o.dtype = dtype;
    o.op = op;
    *req = id;
    if (count == 0) {
      o.done = true;  // nothing to reduce, on any rank: no packet, no rendezvous
    } else {
      queue_.push_back(&o);
      work_cv_.notify_one();
    }
    return Result::ok;
  }

  Result test(Request req) override { return complete(req, false); }
  Result wait(Request req) override { return complete(req, true); }

  Result reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                std::uint32_t root) override {
    if (root >= opt_.world_size)
      return invalid("The root " + std::to_string(root) + " is not a rank of this communicator.");
    // An unknown dtype fails in allreduce(), with its sentence, before any scratch is sized.
    if (opt_.rank == root || static_cast<std::size_t>(dtype) >= kNumDTypes) {
      return allreduce(send, recv, count, dtype, op);
    }
    // A non-root reduces into scratch: its recv is never written and may be null.
    std::vector<std::uint8_t> scratch(count * dtype_size(dtype));
    return allreduce(send, scratch.data(), count, dtype, op);
  }

  Result broadcast(void* buf, std::size_t count, DType dtype, std::uint32_t root) override {
    if (root >= opt_.world_size)
      return invalid("The root " + std::to_string(root) + " is not a rank of this communicator.");
    if (static_cast<std::size_t>(dtype) >= kNumDTypes) {
      return invalid("The element type " + std::to_string(static_cast<int>(dtype)) +
                     " is not a DType.");
    }
    if (count != 0 && buf == nullptr) return invalid("The buffer is null.");
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
  // A sentence of another layer ("Binding ... failed: ...") as a phrase to embed in ours.
  static std::string as_phrase(std::string s) {
    if (!s.empty() && s.back() == '.') s.pop_back();
    if (s.size() > 1 && s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'a' && s[1] <= 'z') {
      s[0] = static_cast<char>(s[0] - 'A' + 'a');
    }
    return s;
  }

  static std::string capitalise(std::string s) {
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 'a' + 'A');
    return s;
  }

  Result invalid(const std::string& why) {
    std::lock_guard lk(mu_);
    last_error_ = why;
    return Result::invalid_argument;
  }

  std::uint16_t port() const {
    return opt_.port != 0 ? opt_.port : static_cast<std::uint16_t>(29000 + opt_.rank % 1000);
  }

  // tree_ does not change once init() is done: no lock needed.
  bool offloadable(DType dtype, ReduceOp op) const {
    return (tree_.dtype_mask >> static_cast<unsigned>(dtype) & 1u) != 0 &&
           (tree_.op_mask >> static_cast<unsigned>(op) & 1u) != 0;
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

  // Sets up the in-network path for tree_; `*why` is a phrase when it cannot.
  Result open_network(std::string* why) {
    const TreeAssignment& t = tree_;
    if (t.slots == 0 || (t.slots & (t.slots - 1)) != 0 ||
        !proto::valid_payload_bytes(t.payload_bytes)) {
      *why = "the tree's window (" + std::to_string(t.slots) + " slots) or payload size (" +
             std::to_string(t.payload_bytes) + " bytes) is not a power of two in range";
      return Result::invalid_argument;
    }
    if (opt_.world_size > 0xFFFF) {
      *why = "a tree holds at most 65535 ranks, not " + std::to_string(opt_.world_size);
      return Result::invalid_argument;
    }
    const std::string bind = !opt_.bind_address.empty() ? opt_.bind_address
                             : is_ipv4(opt_.host)       ? opt_.host
                                                        : "0.0.0.0";
    std::string err;
    const char* kind = std::getenv("TREEDUCE_TRANSPORT");
    const std::string transport = kind != nullptr && *kind != '\0' ? kind : "udp";
    if (transport == "udp") {
      UdpTransportOptions u;
      u.bind_address = bind;
      u.port = port();
      u.leaf_address = t.leaf_address;
      u.payload_bytes = t.payload_bytes;
      u.send_ports = env_u32("TREEDUCE_UDP_SEND_PORTS", 1, 1, 64, &err);
      u.gso = env_u32("TREEDUCE_UDP_GSO", 0, 0, 1, &err) != 0;
      u.gro = env_u32("TREEDUCE_UDP_GRO", 1, 0, 1, &err) != 0;
      if (err.empty()) transport_ = make_udp_transport(u, &err);
#ifdef TREEDUCE_HAVE_VERBS
    } else if (transport == "verbs") {
      // Raw Ethernet frames on an RDMA NIC: no ARP, so both MACs come from the environment.
      VerbsTransportOptions v;
      v.device = env_str("TREEDUCE_VERBS_DEVICE");
      v.port_num = static_cast<std::uint8_t>(env_u32("TREEDUCE_VERBS_PORT", 1, 1, 255, &err));
      v.local_address = bind;
      v.port = port();
      v.local_mac = env_str("TREEDUCE_LOCAL_MAC");
      v.leaf_address = t.leaf_address;
      v.leaf_mac = env_str("TREEDUCE_LEAF_MAC");
      v.payload_bytes = t.payload_bytes;
      if (err.empty()) transport_ = make_verbs_transport(v, &err);
#endif
#ifdef TREEDUCE_HAVE_DPDK
    } else if (transport == "dpdk") {
      // The process initialises the EAL with the port probed (docs/host.md): a traffic generator
      // or benchmark that links libtreeduce owns its DPDK set-up. No ARP: both MACs are given.
      // Or libtreeduce starts the EAL itself, with the arguments it is given.
      if (const std::string eal = env_str("TREEDUCE_DPDK_EAL"); !eal.empty()) {
        err = init_eal_once(eal);
      }
      DpdkTransportOptions d;
      d.port_name = env_str("TREEDUCE_DPDK_PORT");
      d.local_address = bind;
      d.local_port = port();
      d.local_mac = env_str("TREEDUCE_LOCAL_MAC");
      d.leaf_address = t.leaf_address;
      d.leaf_mac = env_str("TREEDUCE_LEAF_MAC");
      d.payload_bytes = t.payload_bytes;
      if (err.empty()) transport_ = make_dpdk_transport(d, &err);
#endif
    } else {
      err = "TREEDUCE_TRANSPORT is \"" + transport + "\"; this build knows udp" +
#ifdef TREEDUCE_HAVE_DPDK
            ", dpdk" +
#endif
#ifdef TREEDUCE_HAVE_VERBS
            ", verbs" +
#endif
            std::string(" (dpdk and verbs are built when DPDK and rdma-core are found)");
    }
    if (!transport_) {
      *why = "the " + transport + " transport could not start: " + as_phrase(err);
      return Result::unavailable;
    }
    EngineConfig ec;
    ec.tree_id = t.tree_id;
    ec.key = t.key;
    ec.child_index = t.child_index;
    ec.world = static_cast<std::uint16_t>(opt_.world_size);
    ec.slots = t.slots;
    ec.payload_bytes = t.payload_bytes;
    ec.rto_initial_ns = opt_.rto_us == 0
                            ? kRtoInitialNs
                            : std::min<std::uint64_t>(opt_.rto_us * 1000ull, kRtoMaxNs);
    ec.rto_max_ns = kRtoMaxNs;
    ec.max_retries = kMaxRetries;
    engine_ = std::make_unique<ProtocolEngine>(ec);
    std::lock_guard lk(mu_);
    path_ = Path::network;
    return Result::ok;
  }

  // test() and wait(): the request's result once it is done, and the request is then gone.
  Result complete(Request req, bool block) {
    std::unique_lock lk(mu_);
    const auto it = ops_.find(req);
    if (it == ops_.end() || it->second.claimed) {
      last_error_ =
          "Request " + std::to_string(req) +
          (it == ops_.end() ? " is not pending (it was never started, or has completed already)."
                            : " is being waited for by another thread.");
      return Result::invalid_argument;
    }
    // The element, not the iterator: ops_ may rehash while we wait (another thread starts an
    // operation), which invalidates iterators but not references.
    Op& o = it->second;
    if (!o.done) {
      if (!block) return Result::in_progress;
      o.claimed = true;
      done_cv_.wait(lk, [&] { return o.done; });
    }
    const Result r = o.result;
    last_error_ = o.error;
    ops_.erase(req);
    return r;
  }

  // The progress thread: runs operations one at a time, in the order they were started, so
  // that every rank runs the same sequence on whichever path each one takes.
  void progress() {
    std::unique_lock lk(mu_);
    for (;;) {
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (Op* o : queue_) {
          o->result = Result::failed;
          o->error = "The communicator was destroyed before the operation ran.";
          o->done = true;
        }
        queue_.clear();
        done_cv_.notify_all();
        return;
      }
      Op* o = queue_.front();
      queue_.pop_front();
      lk.unlock();
      std::string err;
      Result r = Result::internal;
      try {
        r = execute(*o, &err);
      } catch (const std::exception& e) {
        // Out of memory for an in-place copy, or a library throwing: the operation fails, the
        // process lives. The engine may be mid-collective: never send into it again.
        err = std::string("Internal error: ") + e.what() + ".";
        engine_broken_ = engine_broken_ || (engine_ && engine_->status() == Status::running);
      }
      lk.lock();
      o->result = r;
      o->error = r == Result::ok ? std::string() : err;
      o->done = true;
      done_cv_.notify_all();
    }
  }

  // Runs one operation on the path it should take. Progress thread only.
  Result execute(const Op& o, std::string* err) {
    ++op_index_;
    Path p;
    {
      std::lock_guard lk(mu_);
      p = path_;
    }
    if (p == Path::network) {
      std::string why;
      if (!offloadable(o.dtype, o.op)) {
        why = "the tree cannot reduce " + dtype_op(o.dtype, o.op) + " in the network";
        if (opt_.path == Path::network) {
          *err = capitalise(why) + ", and the path is network.";
          return Result::refused;
        }
        // Per call: other (dtype, op) pairs stay in the network. Warned once per pair.
        const unsigned bit =
            static_cast<unsigned>(o.dtype) * kNumReduceOps + static_cast<unsigned>(o.op);
        if ((warned_ >> bit & 1u) == 0) {
          warned_ |= 1u << bit;
          warn_fallback(why);
        }
        {
          std::lock_guard lk(mu_);
          stats_.fallback_reason = why;
        }
        return run_host(o, o.send, err);
      }
      if (manager_ && !manager_->tree_usable(&why)) {
        why = "the Aggregation Manager says the job's tree is no longer usable: " + why;
        if (opt_.path == Path::network) {
          *err = capitalise(why) + ".";
          return Result::unavailable;
        }
        use_host(why, true);
        return run_host(o, o.send, err);
      }
      if (engine_broken_) {
        *err = "The in-network path cannot resume after an operation was abandoned midway.";
        return Result::unavailable;
      }
      // In place with a fallback possible: keep the input, since the network path overwrites it
      // chunk by chunk and a failed operation is redone on the host path from the same input.
      // Costs one copy of the buffer per in-place operation (docs/host.md).
      const bool keep = opt_.path == Path::auto_select && o.send == o.recv;
      const std::size_t bytes = o.count * dtype_size(o.dtype);
      if (keep) {
        const auto* in = static_cast<const std::uint8_t*>(o.send);
        saved_.assign(in, in + bytes);
      }
      const Result r = run_network(o, &why);
      if (r == Result::ok) {
        std::lock_guard lk(mu_);
        ++stats_.network_ops;
        stats_.bytes += bytes;
        return r;
      }
      if (opt_.path == Path::network || stop_.load()) {
        *err = capitalise(why) + ".";
        return r;
      }
      use_host(why, true);
      return run_host(o, keep ? saved_.data() : o.send, err);
    }
    return run_host(o, o.send, err);
  }

  Result run_network(const Op& o, std::string* why) {
    if (engine_->start(o.send, o.recv, o.count, o.dtype, o.op) != Status::running) {
      *why = "the protocol engine refused to start the operation";
      return Result::internal;
    }
    const std::uint64_t deadline = now_ns() + std::uint64_t{opt_.op_timeout_ms} * 1'000'000u;
    const std::size_t cap = std::min(out_.size(), transport_->batch());
    std::string io;
    Result abandoned = Result::ok;
    while (engine_->status() == Status::running) {
      const std::uint64_t t = now_ns();
      if (stop_.load()) {
        *why = "the communicator was destroyed during the operation";
        abandoned = Result::failed;
        break;
      }
      if (t >= deadline) {
        *why = "the in-network allreduce did not finish within " +
               std::to_string(opt_.op_timeout_ms) + " ms (op_timeout_ms)";
        abandoned = Result::timeout;
        break;
      }
      const std::size_t n = engine_->poll(t, out_.data(), cap);
      if (n != 0) io = transport_->send(out_.data(), n);
      if (!io.empty() || engine_->status() != Status::running) break;
      const std::uint64_t until = std::min(engine_->next_deadline(), deadline);
      const std::uint64_t t2 = now_ns();
      const auto rx = transport_->receive(until > t2 ? until - t2 : 0, &io);
      if (!io.empty()) break;
      for (const RxDatagram& d : rx) {
        if (d.len < sizeof(proto::TdHdr)) continue;
        engine_->on_packet(proto::load_header<proto::TdHdr>(d.data), d.data + sizeof(proto::TdHdr),
                           d.len - sizeof(proto::TdHdr));
      }
    }
    {
      std::lock_guard lk(mu_);
      stats_.retransmits = engine_->stats().retransmits;
    }
    if (!io.empty()) {
      *why = "the UDP transport failed: " + as_phrase(io);
      abandoned = Result::unavailable;
    }
    if (abandoned != Result::ok) {
      // The engine has no way to abandon a collective, and the ranks may disagree on how far the
      // stream got: this communicator's network path is over.
      engine_broken_ = engine_->status() == Status::running;
      return abandoned;
    }
    switch (engine_->status()) {
      case Status::done:
        return Result::ok;
      case Status::timeout:
        *why = "the network stopped answering (leaf switch " + tree_.leaf_address +
               " or a switch above it: a chunk got no result after " + std::to_string(kMaxRetries) +
               " retransmissions, about 3.2 s)";
        return Result::timeout;
      case Status::refused:
        *why = "a switch refused the operation (NACK " +
               std::string(proto::name(engine_->nack_reason())) + ")";
        return Result::refused;
      case Status::bad_result:
        *why =
            "a result from the network failed its checks (wrong length, type or number of "
            "contributions)";
        return Result::failed;
      default:
        *why = "the protocol engine stopped in an unexpected state";
        return Result::internal;
    }
  }

  // Host-side reduction, connected on first use: all ranks reach this point for the same
  // operation, since their path decisions agree.
  bool connect_host() {
    if (host_) return true;
    if (!host_error_.empty())
      return false;  // a failed rendezvous is not retried: it would
                     // block every later operation for its timeout
    HostReducerOptions h;
    h.job = opt_.job;
    h.rank = opt_.rank;
    h.world_size = opt_.world_size;
    h.store_dir =
        !opt_.fallback_store.empty() ? opt_.fallback_store : "/tmp/treeduce-gloo-" + opt_.job;
    h.bind_address = !opt_.fallback_address.empty() ? opt_.fallback_address
                     : !opt_.bind_address.empty()   ? opt_.bind_address
                     : is_ipv4(opt_.host)           ? opt_.host
                                                    : "127.0.0.1";
    h.timeout_ms = std::max(opt_.join_timeout_ms, opt_.op_timeout_ms);
    std::string err;
    host_ = make_gloo_reducer(h, &err);
    if (!host_)
      host_error_ = "Host-side reduction could not connect the ranks: " + as_phrase(err) + ".";
    return host_ != nullptr;
  }

  Result run_host(const Op& o, const void* send, std::string* err) {
    if (!connect_host()) {
      *err = host_error_;
      return Result::failed;
    }
    // Every rank runs the same sequence of operations, but a switch that dies mid-collective can
    // leave one rank with the result of operation k and another without: the first falls back at
    // k+1, the second at k, and their host-side operations would pair k+1 with k. So each host
    // operation first checks, with a 2-element allreduce, that all ranks are at the same one; a
    // mismatch is an error on every rank, never a wrong result. Costs one small Gloo collective
    // per host-side operation (docs/host.md, "Failures").
    const auto idx = static_cast<std::int32_t>(op_index_ & 0x3FFFFFFF);
    std::int32_t at[2] = {idx, -idx};
    if (std::string e = host_->allreduce(at, at, 2, DType::i32, ReduceOp::max); !e.empty()) {
      *err = "Host-side reduction failed: " + as_phrase(e) + ".";
      return Result::failed;
    }
    if (at[0] != -at[1]) {
      *err =
          "The ranks disagree on which collective the network path failed at (this rank is at "
          "operation " +
          std::to_string(idx) + ", another at " + std::to_string(at[0] == idx ? -at[1] : at[0]) +
          "): the job cannot go on safely; restart it.";
      return Result::failed;
    }
    if (std::string e = host_->allreduce(send, o.recv, o.count, o.dtype, o.op); !e.empty()) {
      *err = "Host-side reduction failed: " + as_phrase(e) + ".";
      return Result::failed;
    }
    std::lock_guard lk(mu_);
    ++stats_.fallback_ops;
    stats_.bytes += o.count * dtype_size(o.dtype);
    return Result::ok;
  }

  const Options opt_;
  TreeAssignment tree_;  // written before the progress thread starts, then read only
  std::unique_ptr<ManagerClient> manager_;

  // Progress thread only (after init()).
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<ProtocolEngine> engine_;
  std::unique_ptr<HostReducer> host_;
  std::string host_error_;
  bool engine_broken_ = false;
  std::uint64_t op_index_ = 0;       // operations executed: the same sequence on every rank
  std::uint32_t warned_ = 0;         // (dtype, op) pairs already warned about, one bit each
  std::vector<std::uint8_t> saved_;  // in-place input kept for a fallback; reused
  std::array<OutPacket, kMaxBatch> out_{};

  // Shared, under mu_.
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the progress thread: an operation queued, or stopping
  std::condition_variable done_cv_;  // waiters: an operation completed
  std::deque<Op*> queue_;
  std::unordered_map<Request, Op> ops_;  // node-based: Op addresses stay valid in queue_
  Request next_request_ = 1;
  bool stopping_ = false;
  Path path_ = Path::network;
  std::string reason_;
  Stats stats_;
  std::string last_error_;

  std::atomic<bool> stop_{false};  // read by the progress thread inside an operation
  std::thread progress_;
};

}  // namespace

std::unique_ptr<Communicator> Communicator::create(const Options& opt, Result* result,
                                                   std::string* error) {
  Result local_result;
  std::string local_error;
  Result& r = result != nullptr ? *result : local_result;
  std::string& e = error != nullptr ? *error : local_error;
  e.clear();
  if (opt.world_size == 0 || opt.rank >= opt.world_size) {
    e = "The rank " + std::to_string(opt.rank) + " is not below the world size " +
        std::to_string(opt.world_size) + ".";
    r = Result::invalid_argument;
    return nullptr;
  }
  if (opt.path != Path::auto_select && opt.path != Path::network && opt.path != Path::host) {
    e = "The path " + std::to_string(static_cast<int>(opt.path)) + " is not auto, network or host.";
    r = Result::invalid_argument;
    return nullptr;
  }
  auto c = std::make_unique<CommunicatorImpl>(opt);
  r = c->init(&e);
  if (r != Result::ok) return nullptr;
  return c;
}

}  // namespace treeduce::host
