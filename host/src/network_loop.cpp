// NetworkLoop (network_loop.h): poll the engine, send what it wants sent, receive until its next
// deadline, hand every datagram to it; then say how the operation ended.
#include "network_loop.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <deque>
#include <utility>

namespace treeduce::host {

namespace {

std::uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

Obstacle failure(Code code, std::string why) { return Obstacle{code, std::move(why)}; }

// While only a transport's references keep an operation from completing: how long each
// receive() waits before the references are checked again.
constexpr std::uint64_t kHeldPollNs = 50'000;

// At most this many receives take what is queued before a due retransmission timer fires: a
// bound, so that a flood of datagrams cannot hold the timers off for ever.
constexpr int kDrainRounds = 64;

}  // namespace

NetworkLoop::NetworkLoop(std::unique_ptr<Transport> transport, const EngineConfig& engine,
                         std::string leaf_address, std::string peers, std::uint32_t op_timeout_ms,
                         const std::atomic<bool>& stop, std::uint32_t busy_poll_us)
    : transport_(std::move(transport)),
      engine_(engine),
      leaf_address_(std::move(leaf_address)),
      peers_(std::move(peers)),
      op_timeout_ms_(op_timeout_ms),
      stop_(stop),
      busy_poll_ns_(std::uint64_t{busy_poll_us} * 1000u) {}

// A small allreduce is one round trip through the switch: the wait for its results is most of
// its time, and sleeping in the kernel until they come adds a wake-up (a context switch, and on a
// busy machine a wait for a CPU) to every one. So each wait first polls the transport for up to
// busy_poll_ns_, handing the CPU to anyone else runnable between polls (sched_yield: the switch
// and the other ranks may share this CPU), and only then blocks. Bounded per wait, and only while
// an operation is in flight: an idle communicator never polls.
std::span<const RxDatagram> NetworkLoop::wait_for_input(std::uint64_t until, std::string* io) {
  std::uint64_t t = now_ns();
  if (busy_poll_ns_ != 0 && t < until) {
    const std::uint64_t spin_end = std::min(until, t + busy_poll_ns_);
    for (;;) {
      const auto rx = transport_->receive(0, io);
      if (!rx.empty() || !io->empty()) return rx;
      if (kicked_.load(std::memory_order_acquire) || stop_.load(std::memory_order_relaxed)) break;
      if ((t = now_ns()) >= spin_end) break;
      sched_yield();
    }
  }
  t = now_ns();
  return transport_->receive(until > t ? until - t : 0, io);
}

std::optional<Obstacle> NetworkLoop::run(const Operation& o) {
  struct One final : StreamSource {
    explicit One(const Operation& o1) : op(o1) {}
    bool next(Operation* out) override {
      if (given) return false;
      given = true;
      *out = op;
      return true;
    }
    void done() override {}
    const Operation& op;
    bool given = false;
  } one(o);
  return run_stream(one);
}

std::optional<Obstacle> NetworkLoop::run_stream(StreamSource& src) {
  std::size_t queued = 0;  // operations in the engine, not done
  const std::uint64_t first_done = engine_.completed();
  std::uint64_t reported = first_done;  // engine_.completed() already passed to src.done()
  // The send buffers of the operations queued and not reported, oldest first: an operation is
  // done when the engine has its result AND the transport holds no reference into its send
  // buffer (a zero-copy transport's device may still hold frames that point into it).
  std::deque<std::pair<const void*, std::size_t>> sends;
  // Queue what the source has, up to kMaxStream in flight. Returns false when the engine
  // refused an operation.
  const auto fill = [&] {
    Operation o;
    while (queued < kMaxStream && src.next(&o)) {
      if (engine_.enqueue(o.send, o.recv, o.count, o.dtype, o.op) != Status::running) return false;
      sends.emplace_back(o.send, o.count * dtype_size(o.dtype));
      ++queued;
    }
    return true;
  };
  if (!fill()) return failure(Code::internal, "the protocol engine refused to start the operation");
  if (queued == 0) return std::nullopt;
  const std::uint64_t timeout_ns = std::uint64_t{op_timeout_ms_} * 1'000'000u;
  std::uint64_t deadline = now_ns() + timeout_ns;  // of the oldest operation not done
  const std::size_t cap = std::min(out_.size(), transport_->batch());
  std::string io;
  std::optional<Obstacle> abandoned;
  const auto deliver = [this](std::span<const RxDatagram> rx) {
    const std::uint64_t t3 = rx.empty() ? 0 : now_ns();  // the adaptive timer's samples end here
    for (const RxDatagram& d : rx) {
      if (d.len < sizeof(proto::TdHdr)) continue;
      engine_.on_packet(proto::load_header<proto::TdHdr>(d.data), d.data + sizeof(proto::TdHdr),
                        d.len - sizeof(proto::TdHdr), t3);
    }
  };
  for (;;) {
    // Operations done, in order; then the next ones the source has.
    if (engine_.completed() != reported) {
      const std::uint64_t before = reported;
      while (reported < engine_.completed() &&
             !transport_->references(sends.front().first, sends.front().second)) {
        ++reported;
        --queued;
        sends.pop_front();
        src.done();
      }
      if (reported != before) deadline = now_ns() + timeout_ns;
    }
    // A wake() from here on (an operation queued) ends the next busy poll: fill() takes it.
    kicked_.store(false, std::memory_order_relaxed);
    if (engine_.status() == Status::running || engine_.status() == Status::done) {
      if (!fill()) {
        abandoned = failure(Code::internal, "the protocol engine refused to start the operation");
        break;
      }
    }
    // The network is done, the transport still references a send buffer: wait (receiving, which
    // is what frees them on a loopback PMD) until it lets go.
    const bool held = engine_.status() == Status::done && reported != engine_.completed();
    if (engine_.status() != Status::running && !held) break;
    const std::uint64_t t = now_ns();
    if (stop_.load()) {
      abandoned = failure(Code::cancelled, "the communicator was destroyed during the operation");
      break;
    }
    if (t >= deadline) {
      abandoned = failure(
          Code::deadline_exceeded,
          held ? "the transport's device still held frames pointing into the send buffer " +
                     std::to_string(op_timeout_ms_) + " ms (op_timeout_ms) after the result came"
               : "the in-network allreduce did not finish within " +
                     std::to_string(op_timeout_ms_) + " ms (op_timeout_ms)");
      break;
    }
    // A retransmission timer is due: first take every datagram already queued. A rank that was
    // descheduled past its timers finds their RESULTs waiting in its socket or ring, more than
    // one receive's batch after a long stall; retransmitting those chunks would be spurious
    // (whole windows of them). Only when a timer is due: one receive that finds nothing.
    if (!held && engine_.next_timeout() <= t) {
      for (int round = 0; round < kDrainRounds; ++round) {
        const auto rx = transport_->receive(0, &io);
        if (rx.empty() || !io.empty()) break;
        deliver(rx);
      }
      if (!io.empty()) break;
      if (engine_.status() != Status::running) continue;
    }
    std::uint64_t next = 0;  // the engine's next_deadline(), from poll()'s own pass
    const std::size_t n = held ? 0 : engine_.poll(t, out_.data(), cap, &next);
    if (n != 0) io = transport_->send(out_.data(), n);
    if (!io.empty()) break;
    if (engine_.status() != Status::running && !held) continue;
    const std::uint64_t until =
        held ? std::min(t + kHeldPollNs, deadline) : std::min(next, deadline);
    const auto rx = wait_for_input(until, &io);
    if (!io.empty()) break;
    deliver(rx);
  }
  if (!io.empty()) {
    abandoned = failure(Code::unavailable, "the UDP transport failed: " + as_phrase(io));
  }
  if (abandoned) {
    // The engine has no way to abandon a collective, and the ranks may disagree on how far the
    // stream got: this communicator's network path is over.
    broken_ = engine_.status() == Status::running;
    return abandoned;
  }
  switch (engine_.status()) {
    case Status::done:
    case Status::idle:
      return std::nullopt;
    case Status::timeout:
      return failure(Code::deadline_exceeded, no_answer());
    case Status::refused:
      return failure(Code::failed_precondition,
                     "a switch refused the operation (NACK " +
                         std::string(proto::name(engine_.nack_reason())) + ")");
    case Status::bad_result:
      return failure(Code::aborted,
                     "a result from the network failed its checks (wrong length, type or number "
                     "of contributions)");
    default:
      return failure(Code::internal, "the protocol engine stopped in an unexpected state");
  }
}

// What the rank knows when a chunk got no answer, and what to check, said as it is: whether the
// leaf ever answered this communicator (then the route and the address worked, and something
// stopped since), whether packets came for another tree or key (a static tree that differs from
// the switch's), and what the communicator knows of the other ranks (`peers_`).
std::string NetworkLoop::no_answer() const {
  const EngineStats& st = engine_.stats();
  const std::string ip = leaf_address_.substr(0, leaf_address_.rfind(':'));
  const EngineConfig& c = engine_.config();
  const auto secs = [&](std::uint64_t first_ns) {
    char b[16];
    std::snprintf(b, sizeof b, "%.1f",
                  double(silence_ms(first_ns, c.rto_max_ns, c.max_retries)) / 1e3);
    return std::string(b);
  };
  const std::string span = c.adaptive_rto
                               ? secs(c.rto.floor_ns) + " to " + secs(c.rto.ceiling_ns) + " s"
                               : secs(c.rto_initial_ns) + " s";
  std::string s = "the network stopped answering: a chunk sent to the leaf switch at " +
                  leaf_address_ + " got no result after " + std::to_string(c.max_retries) +
                  " retransmissions (" + span + " of silence); ";
  if (st.results == 0) {
    s += "no result ever came back to this rank, so check the route from this host to " + ip +
         " (ip route get " + ip + "), that " + leaf_address_ +
         " is the leaf switch's data address and that switch runs, and that every rank started";
  } else {
    s += std::to_string(st.results) +
         " results had come back before (the route and the address worked), so the leaf, a "
         "switch above it or another rank stopped";
  }
  if (st.ignored != 0) {
    s += "; " + std::to_string(st.ignored) +
         " packets came back for another tree, key or collective (are the tree id and key the "
         "switch's?)";
  }
  if (st.nack_unverified != 0) {
    s += "; " + std::to_string(st.nack_unverified) +
         " NACKs for chunks in flight were ignored because their MAC did not verify (spoofed, "
         "or from a switch older than NACK MACs, docs/protocol.md section 2.2)";
  }
  if (!peers_.empty()) s += "; " + peers_;
  return s;
}

}  // namespace treeduce::host
