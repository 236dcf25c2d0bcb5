// The adaptive retransmission timeout on a fake clock: samples -> timeout, floor and ceiling,
// the peak's memory; and in the engine: Karn's rule, needless retransmissions, overtaken chunks,
// backoff, and lossless runs whose results come late that never retransmit.
#include <gtest/gtest.h>

#include <vector>

#include "treeduce/host/protocol_engine.h"
#include "treeduce/host/rto_estimator.h"

namespace treeduce::host {
namespace {

RtoConfig rcfg() {
  RtoConfig c;
  c.initial_ns = 10'000;
  c.floor_ns = 1'000;
  c.ceiling_ns = 100'000;
  c.peak_window_ns = 1'000'000;
  return c;
}

TEST(RtoEstimator, InitialThenTheLargestSample) {
  RtoEstimator e(rcfg());
  EXPECT_EQ(e.rto(0), 10'000u);
  e.sample(2'000, 0);
  EXPECT_EQ(e.srtt_ns(), 2'000u);  // RFC 6298's first sample: SRTT R, RTTVAR R/2
  EXPECT_EQ(e.rttvar_ns(), 1'000u);
  EXPECT_EQ(e.rto(0), 2'000u);
  e.sample(3'000, 10);
  e.sample(1'500, 20);
  EXPECT_EQ(e.rto(20), 3'000u);  // no margin above it (rto_estimator.cpp says why)
  EXPECT_EQ(e.srtt_ns(), 2'000u - 250u + 375u - 265u + 187u);
  EXPECT_EQ(e.min_ns(), 1'500u);
  EXPECT_EQ(e.samples(), 3u);
}

TEST(RtoEstimator, FloorAndCeiling) {
  RtoEstimator lo(rcfg());
  for (int i = 0; i < 40; ++i) lo.sample(100, 0);
  EXPECT_EQ(lo.rto(0), 1'000u);  // floor
  RtoEstimator hi(rcfg());
  hi.sample(190'000, 0);
  EXPECT_EQ(hi.rto(0), 100'000u);  // ceiling
  RtoConfig c = rcfg();
  c.initial_ns = 500;
  EXPECT_EQ(RtoEstimator(c).rto(0), 1'000u);  // the initial value is clamped too
  c.floor_ns = 200'000;                       // floor above the ceiling: the floor wins
  EXPECT_EQ(RtoEstimator(c).rto(0), 200'000u);
}

TEST(RtoEstimator, PeakIsRememberedForOneToTwoWindows) {
  RtoEstimator e(rcfg());
  e.sample(2'000, 0);
  e.sample(40'000, 100);  // a stall
  for (int i = 0; i < 60; ++i) e.sample(2'000, 200);
  EXPECT_EQ(e.rto(200), 40'000u);  // SRTT forgot the stall, the peak did not
  EXPECT_LT(e.srtt_ns(), 3'000u);
  e.sample(2'000, 1'000'000);  // a new window: the stall is the previous window's peak
  EXPECT_EQ(e.rto(1'000'000), 40'000u);
  EXPECT_EQ(e.rto(1'999'999), 40'000u);
  EXPECT_EQ(e.rto(2'000'000), 2'000u);  // the window of the stall is gone
  EXPECT_EQ(e.rto(3'000'000), 1'000u);  // two idle windows: nothing remembered, the floor
  e.sample(2'500, 5'000'000);           // long idle: both windows expire
  EXPECT_EQ(e.rto(5'000'000), 2'500u);
}

// --- In the engine --------------------------------------------------------------------------

EngineConfig ecfg() {
  EngineConfig c;
  c.tree_id = 3;
  c.key = 99;
  c.child_index = 0;
  c.world = 4;
  c.slots = 4;
  c.payload_bytes = 256;  // 64 f32
  c.rto_max_ns = 1'000'000;
  c.max_retries = 30;
  c.adaptive_rto = true;
  c.rto = rcfg();
  return c;
}

proto::TdHdr result_for(const OutPacket& p) {
  proto::TdHdr r = p.td;
  r.opcode = static_cast<std::uint8_t>(proto::Opcode::result);
  r.ncontrib.set(std::uint16_t{4});
  return r;
}

void answer(ProtocolEngine& e, const OutPacket& p, std::uint64_t now) {
  e.on_packet(result_for(p), p.payload, p.payload_len, now);
}

TEST(AdaptiveRto, FirstTimeoutFollowsTheSamplesAndBacksOff) {
  ProtocolEngine e(ecfg());
  std::vector<float> in(64 * 8), out(in.size());
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  OutPacket p[8];
  ASSERT_EQ(e.poll(0, p, 8), 4u);
  EXPECT_EQ(e.next_deadline(), 10'000u);  // the initial value before any sample
  for (int i = 0; i < 4; ++i) answer(e, p[i], 2'000);
  EXPECT_EQ(e.stats().rto_samples, 4u);
  const std::uint64_t rto = e.rto_estimator().rto(2'000);
  ASSERT_EQ(e.poll(2'000, p, 8), 4u);
  EXPECT_EQ(e.next_deadline(), 2'000 + rto);
  // No answer at all: one chunk goes again (the probe), its timer doubled; the other three wait
  // one more timeout, for the stream is stalled, not lossy.
  std::uint64_t t = 2'000 + rto;
  ASSERT_EQ(e.poll(t, p, 8), 1u);
  const OutPacket probe = p[0];
  EXPECT_EQ(e.stats().retransmits, 1u);
  EXPECT_EQ(e.next_deadline(), t + rto);
  // The probe's RESULT comes: the stream moves.
  answer(e, probe, t + 10);
  EXPECT_EQ(e.poll(t + 10, p, 8), 0u);
  // Still no answer for the others: they waited once, and now go again.
  ASSERT_EQ(e.poll(t + rto, p, 8), 3u);
  EXPECT_EQ(e.stats().retransmits, 4u);
  EXPECT_EQ(e.next_deadline(), t + 3 * rto);  // their timers doubled
}

// Deferred once only: ranks whose probes wait for each other's deferred chunks must not wait
// for ever. Stalled stream, no RESULT at all: after the first timeout one chunk goes; after the
// second, the deferred ones go too.
TEST(AdaptiveRto, ADeferredChunkGoesAtItsNextTimeout) {
  ProtocolEngine e(ecfg());
  std::vector<float> in(64 * 2), out(in.size());
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  OutPacket p[8];
  ASSERT_EQ(e.poll(0, p, 8), 2u);
  ASSERT_EQ(e.poll(10'000, p, 8), 1u);  // the initial 10 us: one probe
  ASSERT_EQ(e.poll(20'000, p, 8), 1u);  // the deferred chunk, one timeout later
  EXPECT_NE(p[0].td.chunk.get(), 0u);
  EXPECT_EQ(e.stats().retransmits, 2u);
}

TEST(AdaptiveRto, KarnsRuleRetransmittedChunksGiveNoSample) {
  ProtocolEngine e(ecfg());
  std::vector<float> in(64), out(64);
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  OutPacket p[4];
  ASSERT_EQ(e.poll(0, p, 4), 1u);
  ASSERT_EQ(e.poll(10'000, p, 4), 1u);  // the initial timeout: retransmitted
  answer(e, p[0], 15'000);              // which copy does this answer? unknown
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(e.stats().rto_samples, 0u);
  EXPECT_EQ(e.rto_estimator().rto(15'000), 10'000u);
}

TEST(AdaptiveRto, ANeedlessRetransmissionTeachesTheTimer) {
  ProtocolEngine e(ecfg());
  std::vector<float> in(64), out(64);
  OutPacket p[4];
  // One clean sample first: the shortest round trip is 2000.
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.poll(0, p, 4), 1u);
  answer(e, p[0], 2'000);
  const std::uint64_t rto = e.rto_estimator().rto(2'000);  // 2000
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.poll(10'000, p, 4), 1u);
  ASSERT_EQ(e.poll(10'000 + rto, p, 4), 1u);  // timed out and retransmitted
  // The RESULT comes 100 ns after the retransmission, far less than a round trip: it answers the
  // first transmission, whose latency rto + 100 the timer now learns.
  answer(e, p[0], 10'000 + rto + 100);
  EXPECT_EQ(e.stats().spurious, 1u);
  EXPECT_EQ(e.stats().rto_samples, 2u);
  EXPECT_EQ(e.rto_estimator().rto(20'000), rto + 100);
  // A RESULT a whole round trip after the retransmission stays ambiguous.
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.poll(100'000, p, 4), 1u);
  const std::uint64_t d = e.next_deadline();
  ASSERT_EQ(e.poll(d, p, 4), 1u);
  answer(e, p[0], d + 2'000);
  EXPECT_EQ(e.stats().rto_samples, 2u);
}

TEST(AdaptiveRto, AnOvertakenChunkGivesNoSample) {
  ProtocolEngine e(ecfg());
  std::vector<float> in(64 * 8), out(in.size());
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  OutPacket a[8], b[8];
  ASSERT_EQ(e.poll(0, a, 8), 4u);      // chunks 0-3 at t=0
  answer(e, a[0], 1'000);              // in order: a sample
  ASSERT_EQ(e.poll(1'000, b, 8), 1u);  // chunk 4 at t=1000, in slot 0
  answer(e, a[1], 1'200);              // in order: a sample
  answer(e, b[0], 2'000);              // chunk 4: a sample of 1000
  EXPECT_EQ(e.stats().rto_samples, 3u);
  const std::uint64_t srtt = e.rto_estimator().srtt_ns();
  // Chunks 2 and 3 were overtaken by chunk 4: they waited for someone's loss recovery, say.
  answer(e, a[3], 9'000);
  answer(e, a[2], 9'000);
  EXPECT_EQ(e.stats().rto_samples, 3u);
  EXPECT_EQ(e.rto_estimator().srtt_ns(), srtt);
  EXPECT_EQ(e.rto_estimator().rto(9'000), 1'200u);
  // Within one batch too: chunk 6's RESULT before chunk 5's makes chunk 5's no sample.
  ASSERT_EQ(e.poll(9'000, b, 8), 3u);  // chunks 5, 6, 7
  answer(e, b[1], 10'000);
  answer(e, b[0], 10'500);
  EXPECT_EQ(e.stats().rto_samples, 4u);
}

// 16 slots and the library's adaptive timer: 10 ms before the first sample, 2 to 32 ms, a peak
// remembered for one to two seconds.
EngineConfig library_timer() {
  EngineConfig c = ecfg();
  c.slots = 16;
  c.rto.initial_ns = 10'000'000;
  c.rto.floor_ns = 2'000'000;
  c.rto.ceiling_ns = 32'000'000;
  c.rto.peak_window_ns = 1'000'000'000;
  return c;
}

// A lossless run in which results come late and in bursts, as when a rank is descheduled: with
// the adaptive timer and the library's defaults (10 ms before the first sample, 2 to 32 ms), no
// chunk is retransmitted. The first stall holds the first chunk, while the initial timeout holds
// (the ranks' skew at the start of a job); the later ones, over 1.7 s of fake time, are within
// the peak the timer remembers. (A first stall longer than any seen before, once samples brought
// the timeout down, does retransmit: no timer can tell it from a loss.) Time is the fake clock.
TEST(AdaptiveRto, LatenessInOrderNeverRetransmits) {
  ProtocolEngine e(library_timer());
  std::vector<float> in(64 * 8192), out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 1000);
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  struct Pending {
    OutPacket p;
    std::uint64_t due;
  };
  std::vector<Pending> q;
  std::uint64_t now = 0;
  std::uint64_t served = 0;
  OutPacket out_p[64];
  while (e.status() == Status::running) {
    const std::size_t n = e.poll(now, out_p, 64);
    for (std::size_t i = 0; i < n; ++i) {
      // 200 us per chunk, and every 512th chunk waits 6 ms more (a rank's scheduler slice):
      // the chunks behind it in the window wait for it in order.
      const std::uint64_t stall = (served + i) % 512 == 0 ? 6'000'000 : 0;
      const std::uint64_t base = q.empty() ? now : std::max(now, q.back().due);
      q.push_back({out_p[i], base + 200'000 + stall});
    }
    served += n;
    ASSERT_FALSE(q.empty());
    now = std::max(now, q.front().due);
    answer(e, q.front().p, now);
    q.erase(q.begin());
  }
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(e.stats().retransmits, 0u);
  EXPECT_EQ(out, in);
}

// A slowdown in order beyond anything the timer has seen: the switch (or the slowest rank) goes
// from 200 us to 1.5 ms per chunk, so a chunk waits 24 ms behind the 15 before it, against the
// 3.2 ms the timer learned. RESULTs keep coming in order, one every 1.5 ms, sooner than any
// timeout (2 ms at the least), so no chunk is taken for lost: each timeout finds its chunk waiting
// its turn and starts again (EngineStats::held); none is retransmitted. Held chunks give no
// sample, so the timer does not learn the wait, and need not.
TEST(AdaptiveRto, ASlowdownInOrderNeverRetransmits) {
  ProtocolEngine e(library_timer());
  std::vector<float> in(64 * 2048), out(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 1000);
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  std::vector<std::pair<OutPacket, std::uint64_t>> q;  // sent, answered at
  std::uint64_t now = 0, served = 0;
  OutPacket out_p[64];
  while (e.status() == Status::running) {
    const std::size_t n = e.poll(now, out_p, 64);
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t service = served + i < 1024 ? 200'000 : 1'500'000;
      const std::uint64_t base = q.empty() ? now : std::max(now, q.back().second);
      q.push_back({out_p[i], base + service});
    }
    served += n;
    ASSERT_FALSE(q.empty());
    // Timers that run out before the next RESULT are polled at their time.
    if (const std::uint64_t d = e.next_deadline(); d < q.front().second) {
      now = std::max(now, d);
      continue;
    }
    now = std::max(now, q.front().second);
    answer(e, q.front().first, now);
    q.erase(q.begin());
  }
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(e.stats().retransmits, 0u);
  EXPECT_GT(e.stats().held, 0u);  // the timers did run out
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace treeduce::host
