// The network loop (host/src/network_loop.cpp) with fake transports that play a one-rank switch
// (every CONTRIB comes back as its RESULT): one, like a zero-copy transport whose device is slow
// to free its frames, keeps a reference into each payload it sent for three receive() calls
// after the send (an operation must not complete while its send buffer is referenced); another
// plays a rank descheduled past its timers with the RESULTs queued (no spurious retransmission).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <thread>
#include <vector>

#include "network_loop.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {
namespace {

// What a one-rank switch answers a CONTRIB with: its header as a RESULT, its payload.
std::vector<std::uint8_t> result_of(const OutPacket& p) {
  proto::TdHdr td = p.td;
  td.opcode = static_cast<std::uint8_t>(proto::Opcode::result);
  std::vector<std::uint8_t> d(sizeof td + p.payload_len);
  std::memcpy(d.data(), &td, sizeof td);
  std::memcpy(d.data() + sizeof td, p.payload, p.payload_len);
  return d;
}

class HoldingTransport final : public Transport {
 public:
  std::size_t batch() const noexcept override { return 16; }
  std::string send(const OutPacket* p, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) {
      held_.push_back({p[i].payload, p[i].payload_len, receives_ + 3});
      pending_.push_back(result_of(p[i]));
      ++stats_.sent;
    }
    return {};
  }
  std::span<const RxDatagram> receive(std::uint64_t, std::string*) override {
    ++receives_;
    std::erase_if(held_, [&](const Held& h) { return h.until <= receives_; });
    given_.swap(pending_);
    pending_.clear();
    rx_.clear();
    for (const auto& d : given_) rx_.push_back({d.data(), d.size()});
    return {rx_.data(), rx_.size()};
  }
  bool references(const void* p, std::size_t len) override {
    const auto* b = static_cast<const std::uint8_t*>(p);
    for (const Held& h : held_) {
      if (h.addr < b + len && b < h.addr + h.len) return true;
    }
    return false;
  }
  void wake() noexcept override {}
  const TransportStats& stats() const noexcept override { return stats_; }

 private:
  struct Held {
    const std::uint8_t* addr;
    std::size_t len;
    std::uint64_t until;  // released by this receive() call
  };
  std::vector<Held> held_;
  std::vector<std::vector<std::uint8_t>> pending_, given_;
  std::vector<RxDatagram> rx_;
  std::uint64_t receives_ = 0;
  TransportStats stats_;
};

TEST(NetworkLoop, AnOperationCompletesOnlyOnceTheTransportLetsGoOfItsSendBuffer) {
  auto owned = std::make_unique<HoldingTransport>();
  HoldingTransport* t = owned.get();
  EngineConfig ec;
  ec.world = 1;
  ec.slots = 8;
  ec.payload_bytes = 256;
  std::atomic<bool> stop{false};
  NetworkLoop loop(std::move(owned), ec, "10.0.0.1:47110", "", 10'000, stop);

  // Three operations streamed back to back, of 1, 5 and 40 chunks (64 floats each).
  struct Source final : StreamSource {
    std::vector<std::vector<float>> in, out;
    std::size_t given = 0, done_n = 0, held_at_done = 0;
    HoldingTransport* t = nullptr;
    bool next(Operation* o) override {
      if (given == in.size()) return false;
      *o = Operation{in[given].data(), out[given].data(), in[given].size(), DType::f32,
                     ReduceOp::sum};
      ++given;
      return true;
    }
    void done() override {
      const auto& b = in[done_n];
      if (t->references(b.data(), b.size() * sizeof(float))) ++held_at_done;
      ++done_n;
    }
  } src;
  src.t = t;
  for (std::size_t n : {7u, 320u, 2560u}) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.5f + 1.0f;
    src.in.push_back(v);
    src.out.emplace_back(n, 0.0f);
  }
  const auto why = loop.run_stream(src);
  ASSERT_FALSE(why.has_value()) << why->why;
  EXPECT_EQ(src.done_n, 3u);
  EXPECT_EQ(src.held_at_done, 0u) << "an operation completed while its send buffer was held";
  for (std::size_t k = 0; k < 3; ++k) EXPECT_EQ(src.out[k], src.in[k]) << k;
  for (const auto& b : src.in) EXPECT_FALSE(t->references(b.data(), b.size() * sizeof(float)));

  // run() too: it returns only once the buffer is free.
  std::vector<float> in(100, 2.0f), out(100, 0.0f);
  ASSERT_FALSE(loop.run(Operation{in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum}));
  EXPECT_FALSE(t->references(in.data(), in.size() * sizeof(float)));
  EXPECT_EQ(out, in);
}

// Every RESULT is queued the moment its CONTRIB is sent, and receive() hands out one datagram
// at a time; once, with a whole window queued, a waiting receive() first sleeps past every
// retransmission timer, as a rank descheduled for that long would.
class QueuedTransport final : public Transport {
 public:
  std::size_t batch() const noexcept override { return 16; }
  std::string send(const OutPacket* p, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) {
      queue_.push_back(result_of(p[i]));
      ++stats_.sent;
    }
    return {};
  }
  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string*) override {
    if (timeout_ns != 0 && !slept && queue_.size() >= 8) {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the timers are 1 ms
      slept = true;
    }
    if (queue_.empty()) return {};
    given_ = std::move(queue_.front());
    queue_.pop_front();
    rx_ = RxDatagram{given_.data(), given_.size()};
    return {&rx_, 1};
  }
  bool references(const void*, std::size_t) override { return false; }
  void wake() noexcept override {}
  const TransportStats& stats() const noexcept override { return stats_; }
  bool slept = false;

 private:
  std::deque<std::vector<std::uint8_t>> queue_;
  std::vector<std::uint8_t> given_;
  RxDatagram rx_{};
  TransportStats stats_;
};

TEST(NetworkLoop, ADueTimerFirstTakesTheResultsAlreadyQueued) {
  auto owned = std::make_unique<QueuedTransport>();
  QueuedTransport* t = owned.get();
  EngineConfig ec;
  ec.world = 1;
  ec.slots = 8;
  ec.payload_bytes = 256;
  ec.rto_initial_ns = 1'000'000;  // fixed 1 ms: the sleep outlasts every chunk's timer
  std::atomic<bool> stop{false};
  NetworkLoop loop(std::move(owned), ec, "10.0.0.1:47110", "", 10'000, stop);
  std::vector<float> in(64 * 40), out(in.size(), 0.0f);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  ASSERT_FALSE(loop.run(Operation{in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum}));
  ASSERT_TRUE(t->slept);
  EXPECT_EQ(out, in);
  EXPECT_EQ(loop.retransmits(), 0u) << "chunks whose RESULTs were queued went again";
}

}  // namespace
}  // namespace treeduce::host
