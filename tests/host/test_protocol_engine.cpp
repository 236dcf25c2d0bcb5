// The reference host protocol logic on its own: window, slot reuse, timers, result checks.
#include <gtest/gtest.h>

#include <vector>

#include "treeduce/host/protocol_engine.h"

namespace treeduce::host {
namespace {

using proto::bswap_be;

EngineConfig cfg() {
  EngineConfig c;
  c.tree_id = 3;
  c.key = 99;
  c.child_index = 2;
  c.world = 4;
  c.slots = 2;
  c.payload_bytes = 256;  // 64 f32
  c.rto_initial_ns = 1000;
  c.rto_max_ns = 8000;
  c.max_retries = 5;
  return c;
}

// The switch's answer to a packet: RESULT with the right fields unless told otherwise.
proto::TdHdr result_for(const OutPacket& p, std::uint16_t ncontrib = 4) {
  proto::TdHdr r = p.td;
  r.opcode = static_cast<std::uint8_t>(proto::Opcode::result);
  r.ncontrib.set(ncontrib);
  return r;
}

TEST(ProtocolEngine, WindowSlotsAndCompletion) {
  ProtocolEngine e(cfg());
  std::vector<float> in(200), out(200, -1);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  EXPECT_EQ(e.start(in.data(), out.data(), 1, DType::f32, ReduceOp::sum), Status::invalid);
  OutPacket p[8];
  ASSERT_EQ(e.poll(0, p, 8), 2u);  // window = 2 slots
  EXPECT_EQ(p[0].td.chunk.get(), 0u);
  EXPECT_EQ(p[1].td.chunk.get(), 1u);
  EXPECT_EQ(p[1].td.slot.get(), 1);
  EXPECT_EQ(p[0].td.count.get(), 64);
  EXPECT_EQ(p[0].td.child.get(), 2);
  EXPECT_EQ(p[0].td.key.get(), 99u);
  EXPECT_EQ(p[0].payload_len, 256u);
  EXPECT_EQ(e.poll(0, p, 8), 0u);
  // Result of chunk 1 first: chunk 3 (slot 1, version 1) may go; chunk 2 still waits for slot 0.
  e.on_packet(result_for(p[1]), p[1].payload, p[1].payload_len);
  OutPacket q[8];
  EXPECT_EQ(e.poll(10, q, 8), 0u);  // in order: chunk 2 needs slot 0
  e.on_packet(result_for(p[0]), p[0].payload, p[0].payload_len);
  ASSERT_EQ(e.poll(20, q, 8), 2u);
  EXPECT_EQ(q[0].td.chunk.get(), 2u);
  EXPECT_EQ(q[0].td.slot_ver, 1);
  EXPECT_EQ(q[1].td.chunk.get(), 3u);
  EXPECT_EQ(q[1].td.count.get(), 200 - 3 * 64);  // the last, short chunk
  EXPECT_EQ(q[1].payload_len, 8u * 4);
  // A duplicate result of an old chunk changes nothing.
  e.on_packet(result_for(p[0]), p[0].payload, p[0].payload_len);
  EXPECT_EQ(e.stats().duplicates, 1u);
  e.on_packet(result_for(q[0]), q[0].payload, q[0].payload_len);
  e.on_packet(result_for(q[1]), q[1].payload, q[1].payload_len);
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(out, in);  // the "result" echoed the payload
  // The next collective continues the chunk stream and bumps the sequence.
  ASSERT_EQ(e.start(in.data(), out.data(), 10, DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.poll(30, p, 8), 1u);
  EXPECT_EQ(p[0].td.chunk.get(), 4u);
  EXPECT_EQ(p[0].td.seq.get(), 1u);
}

// Queued collectives stream through the window: the next one's chunks take the slots the last
// one frees, each carries its own seq, and they complete in queue order even when a later one's
// results come first.
TEST(ProtocolEngine, QueuedCollectivesShareTheWindowAndCompleteInOrder) {
  ProtocolEngine e(cfg());  // 2 slots, 256-byte payloads
  std::vector<float> a(64, 1.f), b(64, 2.f), c(128, 3.f);
  std::vector<float> ra(64), rb(64), rc(128);
  ASSERT_EQ(e.enqueue(a.data(), ra.data(), a.size(), DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.enqueue(b.data(), rb.data(), b.size(), DType::f32, ReduceOp::sum), Status::running);
  ASSERT_EQ(e.enqueue(c.data(), rc.data(), c.size(), DType::f32, ReduceOp::sum), Status::running);
  EXPECT_EQ(e.in_flight(), 3u);
  OutPacket p[8];
  ASSERT_EQ(e.poll(0, p, 8), 2u);  // a's only chunk and b's share the 2-slot window
  EXPECT_EQ(p[0].td.chunk.get(), 0u);
  EXPECT_EQ(p[0].td.seq.get(), 0u);
  EXPECT_EQ(p[1].td.chunk.get(), 1u);
  EXPECT_EQ(p[1].td.seq.get(), 1u);
  // b's result first: b is complete but waits for a; c's chunk 2 needs slot 0, still a's.
  e.on_packet(result_for(p[1]), p[1].payload, p[1].payload_len);
  EXPECT_EQ(e.completed(), 0u);
  OutPacket q[8];
  EXPECT_EQ(e.poll(1, q, 8), 0u);
  e.on_packet(result_for(p[0]), p[0].payload, p[0].payload_len);
  EXPECT_EQ(e.completed(), 2u);  // a, then b at once
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
  EXPECT_EQ(e.status(), Status::running);
  ASSERT_EQ(e.poll(2, q, 8), 2u);  // both of c's chunks, in the slots a and b freed
  EXPECT_EQ(q[0].td.chunk.get(), 2u);
  EXPECT_EQ(q[0].td.seq.get(), 2u);
  EXPECT_EQ(q[1].td.chunk.get(), 3u);
  e.on_packet(result_for(q[1]), q[1].payload, q[1].payload_len);
  EXPECT_EQ(e.completed(), 2u);
  e.on_packet(result_for(q[0]), q[0].payload, q[0].payload_len);
  EXPECT_EQ(e.completed(), 3u);
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(rc, c);
  // A late duplicate of a finished collective's result is not a new one.
  e.on_packet(result_for(q[0]), q[0].payload, q[0].payload_len);
  EXPECT_EQ(e.completed(), 3u);
}

TEST(ProtocolEngine, RetransmitsWithExponentialBackoffThenTimesOut) {
  ProtocolEngine e(cfg());
  std::vector<float> in(10), out(10);
  e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum);
  OutPacket p[4];
  ASSERT_EQ(e.poll(0, p, 4), 1u);
  std::uint64_t t = 0;
  std::vector<std::uint64_t> gaps;
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t d = e.next_deadline();
    gaps.push_back(d - t);
    t = d;
    EXPECT_EQ(e.poll(t - 1, p, 4), 0u);
    ASSERT_EQ(e.poll(t, p, 4), 1u);
  }
  EXPECT_EQ(gaps, (std::vector<std::uint64_t>{1000, 2000, 4000, 8000, 8000}));
  EXPECT_EQ(e.stats().retransmits, 5u);
  EXPECT_EQ(e.poll(e.next_deadline(), p, 4), 0u);
  EXPECT_EQ(e.status(), Status::timeout);
}

// poll()'s `next` is next_deadline() after the call, found in poll()'s own pass (the network
// loop waits on it): with `out` full (a slot still to send: now), with timers running, with a
// chunk deferred by the adaptive timer, and once the collective has timed out (never).
TEST(ProtocolEngine, PollFindsTheNextDeadlineInItsOwnPass) {
  for (const bool adaptive : {false, true}) {
    EngineConfig c = cfg();
    c.adaptive_rto = adaptive;
    c.rto_max_ns = 1'000'000'000;  // a probe's doubled timer outlasts a deferred chunk's
    c.max_retries = 2;
    ProtocolEngine e(c);
    OutPacket p[8];
    std::uint64_t next = 7;
    const auto poll = [&](std::uint64_t now, std::size_t cap) {
      const std::size_t n = e.poll(now, p, cap, &next);
      EXPECT_EQ(next, e.next_deadline()) << "adaptive " << adaptive << ", at " << now;
      return n;
    };
    EXPECT_EQ(poll(0, 8), 0u);  // idle
    EXPECT_EQ(next, UINT64_MAX);
    std::vector<float> in(200), out(200);
    ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum),
              Status::running);
    ASSERT_EQ(poll(0, 1), 1u);  // chunk 1 has its slot and waits for room in `out`
    EXPECT_EQ(next, 0u);
    ASSERT_EQ(poll(0, 8), 1u);
    EXPECT_GT(next, 0u);
    EXPECT_EQ(poll(1, 8), 0u);
    // No answer: both time out at once; retransmissions (with the adaptive timer one chunk
    // goes and the other waits one more timeout) until the collective times out.
    for (int i = 0; i < 20 && e.status() == Status::running; ++i) poll(e.next_deadline(), 8);
    EXPECT_GE(e.stats().retransmits, 2u);
    EXPECT_EQ(e.status(), Status::timeout);
    EXPECT_EQ(next, UINT64_MAX);
  }
}

// A switch's NACK for `p`, as core.cpp builds it: the header echoed, the MAC under the key the
// CONTRIB carried.
proto::TdHdr nack_for(const OutPacket& p, proto::Reason reason) {
  proto::TdHdr n = p.td;
  n.opcode = static_cast<std::uint8_t>(proto::Opcode::nack);
  n.reason = static_cast<std::uint8_t>(reason);
  n.count.set(0);
  n.ncontrib.set(0);
  n.key = proto::nack_mac(p.td.key, n);
  return n;
}

TEST(ProtocolEngine, NackFailsWithTheReason) {
  ProtocolEngine e(cfg());
  std::vector<float> in(10), out(10);
  e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum);
  OutPacket p[4];
  ASSERT_EQ(e.poll(0, p, 4), 1u);
  const proto::TdHdr n = nack_for(p[0], proto::Reason::bad_key);
  proto::TdHdr other = n;
  other.chunk.set(std::uint32_t{7});  // not in flight: ignored
  other.key = proto::nack_mac(p[0].td.key, other);
  e.on_packet(other, nullptr, 0);
  EXPECT_EQ(e.status(), Status::running);
  EXPECT_EQ(e.stats().ignored, 1u);
  e.on_packet(n, nullptr, 0);
  EXPECT_EQ(e.status(), Status::refused);
  EXPECT_EQ(e.nack_reason(), proto::Reason::bad_key);
  EXPECT_EQ(e.stats().nack_unverified, 0u);
}

// Anyone who can send the host a datagram can forge a NACK's header; only the MAC tells the
// switch's apart. Forged ones for a chunk in flight are ignored (counted), the chunk is
// retransmitted on its timer as if the NACK were lost, and the collective completes exactly.
TEST(ProtocolEngine, NackWhoseMacDoesNotVerifyIsIgnored) {
  ProtocolEngine e(cfg());
  std::vector<float> in(10), out(10, -1);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f;
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
  OutPacket p[4];
  ASSERT_EQ(e.poll(0, p, 4), 1u);
  const proto::TdHdr genuine = nack_for(p[0], proto::Reason::bad_source);
  std::vector<proto::TdHdr> forged;
  proto::TdHdr f = genuine;
  f.key.set(0);  // a switch that predates the MAC, or a guess
  forged.push_back(f);
  f.key = proto::nack_mac(proto::be64::of(98), f);  // under another key
  forged.push_back(f);
  f.key = genuine.key;
  f.reason = static_cast<std::uint8_t>(proto::Reason::bad_key);  // the MAC binds the reason
  forged.push_back(f);
  f = genuine;
  f.key.raw ^= 1;  // one bit off
  forged.push_back(f);
  f = genuine;
  f.key = p[0].td.key;  // the job's key itself is no MAC
  forged.push_back(f);
  for (const proto::TdHdr& n : forged) e.on_packet(n, nullptr, 0);
  EXPECT_EQ(e.status(), Status::running);
  EXPECT_EQ(e.stats().nack_unverified, forged.size());
  EXPECT_EQ(e.nack_reason(), proto::Reason::none);
  // The timer runs on: the same CONTRIB again.
  OutPacket r[4];
  ASSERT_EQ(e.poll(e.next_deadline(), r, 4), 1u);
  EXPECT_EQ(e.stats().retransmits, 1u);
  EXPECT_EQ(r[0].td.chunk.get(), p[0].td.chunk.get());
  std::vector<float> sum(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) sum[i] = in[i] * 4;
  e.on_packet(result_for(r[0]), reinterpret_cast<const std::uint8_t*>(sum.data()),
              sum.size() * sizeof(float));
  EXPECT_EQ(e.status(), Status::done);
  EXPECT_EQ(out, sum);
}

TEST(ProtocolEngine, ResultsAreChecked) {
  const auto run = [](auto mutate) {
    ProtocolEngine e(cfg());
    std::vector<float> in(10), out(10);
    e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum);
    OutPacket p[4];
    EXPECT_EQ(e.poll(0, p, 4), 1u);
    proto::TdHdr r = result_for(p[0]);
    std::size_t len = p[0].payload_len;
    mutate(r, len);
    std::vector<std::uint8_t> payload(len);
    e.on_packet(r, payload.data(), len);
    return e.status();
  };
  EXPECT_EQ(run([](proto::TdHdr&, std::size_t&) {}), Status::done);
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) { r.ncontrib.set(std::uint16_t{3}); }),
            Status::bad_result);
  EXPECT_EQ(run([](proto::TdHdr&, std::size_t& l) { l -= 4; }), Status::bad_result);
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) { r.dtype = 1; }), Status::bad_result);
  // Not ours at all: ignored, still running.
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) { r.key.set(r.key.get() + 1); }),
            Status::running);
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) {
              r.tree_id.set(static_cast<std::uint16_t>(r.tree_id.get() + 1));
            }),
            Status::running);
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) { r.seq.set(std::uint32_t{5}); }),
            Status::running);
  EXPECT_EQ(run([](proto::TdHdr& r, std::size_t&) {
              r.child.set(static_cast<std::uint16_t>(r.child.get() + 1));
            }),
            Status::running);
}

// A timeout with the fixed timer and with the adaptive one (its timeout held at 1000 here).
EngineConfig timer_cfg(bool adaptive) {
  EngineConfig c = cfg();
  c.slots = 4;
  c.adaptive_rto = adaptive;
  c.rto.initial_ns = c.rto.floor_ns = c.rto.ceiling_ns = 1000;
  return c;
}

void answer(ProtocolEngine& e, const OutPacket& p, std::uint64_t now) {
  e.on_packet(result_for(p), p.payload, p.payload_len, now);
}

void start(ProtocolEngine& e, std::vector<float>& in, std::vector<float>& out) {
  ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum), Status::running);
}

// A chunk whose timer runs out while RESULTs of the chunks before it keep coming, in order, is
// queued behind them (a slow rank or switch), not lost: its timer starts again and nothing is
// sent, as often as RESULTs keep coming.
TEST(ProtocolEngine, AChunkWaitingItsTurnIsNotRetransmitted) {
  for (const bool adaptive : {false, true}) {
    ProtocolEngine e(timer_cfg(adaptive));
    std::vector<float> in(64 * 4), out(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
    ASSERT_EQ(e.start(in.data(), out.data(), in.size(), DType::f32, ReduceOp::sum),
              Status::running);
    OutPacket p[8], q[8];
    ASSERT_EQ(e.poll(0, p, 8), 4u);  // chunks 0-3, timers at 1000
    answer(e, p[0], 900);
    EXPECT_EQ(e.poll(1000, q, 8), 0u) << "adaptive " << adaptive;
    EXPECT_EQ(e.stats().held, 3u);
    EXPECT_EQ(e.next_deadline(), 1900u);  // a timeout from the RESULT that held them
    answer(e, p[1], 1500);
    EXPECT_EQ(e.poll(1900, q, 8), 0u);
    EXPECT_EQ(e.stats().held, 5u);
    EXPECT_EQ(e.next_deadline(), 2500u);
    answer(e, p[2], 2400);
    EXPECT_EQ(e.poll(2500, q, 8), 0u);
    EXPECT_EQ(e.stats().held, 6u);
    answer(e, p[3], 3100);
    EXPECT_EQ(e.status(), Status::done);
    EXPECT_EQ(e.stats().retransmits, 0u);
    EXPECT_EQ(out, in);
  }
}

// A chunk later in the stream answered first says this one (or its RESULT) was lost: it goes
// again at its timeout, while the chunks after it that still wait their turn are held.
TEST(ProtocolEngine, ALaterChunkAnsweredFirstMeansALoss) {
  for (const bool adaptive : {false, true}) {
    ProtocolEngine e(timer_cfg(adaptive));
    std::vector<float> in(64 * 4), out(in.size());
    start(e, in, out);
    OutPacket p[8], q[8];
    ASSERT_EQ(e.poll(0, p, 8), 4u);
    answer(e, p[1], 500);
    ASSERT_EQ(e.poll(1000, q, 8), 1u) << "adaptive " << adaptive;
    EXPECT_EQ(q[0].td.chunk.get(), 0u);
    EXPECT_EQ(e.stats().retransmits, 1u);
    EXPECT_EQ(e.stats().held, 2u);  // chunks 2 and 3
  }
}

// The last chunk lost (its contribution, or its RESULT to this rank): the RESULTs before it came
// at 40, so it goes again one timeout after them, at 1040, not a timeout after the poll that
// found it waiting.
TEST(ProtocolEngine, ALostLastChunkGoesOneTimeoutAfterTheResultsBeforeIt) {
  for (const bool adaptive : {false, true}) {
    ProtocolEngine e(timer_cfg(adaptive));
    std::vector<float> in(64 * 4), out(in.size());
    start(e, in, out);
    OutPacket p[8], q[8];
    ASSERT_EQ(e.poll(0, p, 8), 4u);
    for (int i = 0; i < 3; ++i) answer(e, p[i], 40);
    EXPECT_EQ(e.poll(1000, q, 8), 0u) << "adaptive " << adaptive;
    EXPECT_EQ(e.next_deadline(), 1040u);
    ASSERT_EQ(e.poll(1040, q, 8), 1u);
    EXPECT_EQ(q[0].td.chunk.get(), 3u);
    EXPECT_EQ(e.stats().held, 1u);
    EXPECT_EQ(e.stats().retransmits, 1u);
  }
}

// One RESULT holds a chunk once, also when it is read after the time poll() runs at (the
// network loop reads its clock, then drains what is queued, then polls): the next timeout needs
// a newer RESULT to be held again.
TEST(ProtocolEngine, OneResultHoldsAChunkOnce) {
  ProtocolEngine e(timer_cfg(false));
  std::vector<float> in(64 * 2), out(in.size());
  start(e, in, out);
  OutPacket p[8], q[8];
  ASSERT_EQ(e.poll(0, p, 8), 2u);
  answer(e, p[0], 1005);
  EXPECT_EQ(e.poll(1000, q, 8), 0u);
  EXPECT_EQ(e.next_deadline(), 2005u);
  ASSERT_EQ(e.poll(2005, q, 8), 1u);
  EXPECT_EQ(q[0].td.chunk.get(), 1u);
  EXPECT_EQ(e.stats().held, 1u);
}

// Only RESULTs of chunks sent once say that the stream moves: one for a retransmitted chunk is a
// repair, and the chunks still unanswered go again at their timeout (fixed timer: no stall rule).
TEST(ProtocolEngine, ARepairedChunksResultHoldsNoOne) {
  ProtocolEngine e(timer_cfg(false));
  std::vector<float> in(64 * 2), out(in.size());
  start(e, in, out);
  OutPacket p[8], q[8];
  ASSERT_EQ(e.poll(0, p, 8), 2u);
  ASSERT_EQ(e.poll(1000, q, 8), 2u);  // no RESULT at all: both go again, timers at 3000
  answer(e, p[0], 1100);
  ASSERT_EQ(e.poll(3000, q, 8), 1u);
  EXPECT_EQ(q[0].td.chunk.get(), 1u);
  EXPECT_EQ(e.stats().held, 0u);
  EXPECT_EQ(e.stats().retransmits, 3u);
}

TEST(ProtocolEngine, InvalidStarts) {
  EngineConfig c = cfg();
  std::vector<float> b(4);
  EXPECT_EQ(ProtocolEngine(c).start(b.data(), b.data(), 0, DType::f32, ReduceOp::sum),
            Status::invalid);
  c.slots = 3;
  EXPECT_EQ(ProtocolEngine(c).start(b.data(), b.data(), 4, DType::f32, ReduceOp::sum),
            Status::invalid);
  c = cfg();
  c.payload_bytes = 100;
  EXPECT_EQ(ProtocolEngine(c).start(b.data(), b.data(), 4, DType::f32, ReduceOp::sum),
            Status::invalid);
}

}  // namespace
}  // namespace treeduce::host
