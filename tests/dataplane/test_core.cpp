// The switch core on hand-made frames: every slot state, every refusal, the output frames.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <numeric>
#include <random>
#include <thread>

#include "test_util.h"

namespace treeduce::dp {
namespace {

using namespace testing;

TEST(CoreInstall, RejectsBadConfigs) {
  Core core(CoreConfig{kSwitch});
  TreeConfig t = tree_cfg(2, true);
  TreeConfig bad = t;
  bad.children.clear();
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.children.resize(65);
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.slots = 3;
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.payload_bytes = 1000;
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.dtype_mask = 0;
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.op_mask = 1u << 12;  // no such operation
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  bad = t;
  bad.children[0].hosts = 0;
  EXPECT_EQ(core.install_tree(bad).code(), treeduce::Code::invalid_argument);
  EXPECT_TRUE(core.install_tree(t).ok());
  EXPECT_EQ(core.install_tree(t).code(), treeduce::Code::already_exists);
  EXPECT_EQ(core.tree_count(), 1u);
  EXPECT_TRUE(core.remove_tree(5).ok());
  EXPECT_EQ(core.remove_tree(5).code(), treeduce::Code::not_found);
  EXPECT_EQ(core.tree_count(), 0u);
  SlotView v;
  EXPECT_EQ(core.slot_view(5, 0, 0, &v), -ENOENT);
}

TEST(CoreRoot, CompletesAndMulticastsOneSharedPayload) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(3, true)).ok());
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 2), {1, 2})).empty());
  EXPECT_TRUE(h.feed(frame(child_ep(2), hdr(Opcode::contrib, 0, 2, 2), {10, 20})).empty());
  const auto out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 2), {100, 200}));
  ASSERT_EQ(out.size(), 3u);
  for (std::uint16_t i = 0; i < 3; ++i) {
    const TdHdr td = td_of(out[i]);
    EXPECT_EQ(td.opcode, static_cast<std::uint8_t>(Opcode::result));
    EXPECT_EQ(td.child.get(), i);
    EXPECT_EQ(td.ncontrib.get(), 3);
    EXPECT_EQ(td.count.get(), 2);
    EXPECT_EQ(td.key.get(), 0x1122334455667788ULL);
    const Ipv4Hdr ip = ip_of(out[i]);
    EXPECT_EQ(ip.dst_addr.get(), child_ep(i).ip);
    EXPECT_EQ(ip.src_addr.get(), kSwitch.ip);
    EXPECT_EQ(ipv4_checksum(ip), 0);
    EXPECT_EQ(ip.total_length.get(), 20u + 8 + 32 + 8);
    EXPECT_EQ(out[i].payload, out[0].payload);  // one payload, several headers
    EXPECT_EQ(value(out[i], 0), 111.0f);
    EXPECT_EQ(value(out[i], 1), 222.0f);
    // The output is a frame the receiving host parses.
    std::vector<std::uint8_t> f(out[i].hdr, out[i].hdr + kFrameHeaderBytes);
    f.insert(f.end(), out[i].payload, out[i].payload + out[i].payload_len);
    Parsed p;
    EXPECT_EQ(parse_frame(f.data(), f.size(), child_ep(i).ip, child_ep(i).port, &p),
              DropReason::none);
  }
  SlotView v;
  ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
  EXPECT_EQ(v.state, SlotState::done);
  EXPECT_EQ(v.bitmap, 7u);
  EXPECT_EQ(v.ncontrib, 3u);
}

/// The L2-L4 bytes a frame to `dst` with `udp_payload` bytes must carry, built from scratch.
std::vector<std::uint8_t> l2l4(const Endpoint& src, const Endpoint& dst, std::size_t udp_payload) {
  std::vector<std::uint8_t> b(kFrameHeaderBytes - sizeof(TdHdr));
  write_l2_l4(b.data(), src, dst, udp_payload);
  return b;
}

NextHop hop(std::uint8_t mac_seed, std::uint16_t tag) {
  NextHop h;
  for (std::uint8_t i = 0; i < 6; ++i) {
    h.dst_mac[i] = static_cast<std::uint8_t>(mac_seed + i);
    h.src_mac[i] = static_cast<std::uint8_t>(0xA0 + mac_seed + i);
  }
  h.tag = tag;
  return h;
}

Endpoint via(Endpoint e, const NextHop& h) {
  std::memcpy(e.mac, h.dst_mac, 6);
  return e;
}

Endpoint from(const NextHop& h) {
  Endpoint e = kSwitch;
  std::memcpy(e.mac, h.src_mac, 6);
  return e;
}

TEST(CoreNextHops, ResolvedHopsCarryTheirMacsAndTagsAtEveryLength) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, false, false, 4, 256)).ok());
  TreeHops* old = nullptr;
  const NextHop c0 = hop(0x10, 7), c1{}, up = hop(0x30, 9);  // child 1 not resolved
  EXPECT_EQ(h.core.set_next_hops(6, std::vector<NextHop>{c0, c1}, up, &old).code(),
            treeduce::Code::not_found);
  EXPECT_EQ(old, nullptr);
  EXPECT_EQ(h.core.set_next_hops(5, std::vector<NextHop>{c0}, up, &old).code(),
            treeduce::Code::invalid_argument);
  EXPECT_EQ(old, nullptr);
  // Unresolved at install: the configured MACs, no tag.
  h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 64), std::vector<float>(64, 1)));
  auto out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 64), std::vector<float>(64, 2)));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].hop, kNoHop);
  EXPECT_EQ(std::vector<std::uint8_t>(out[0].hdr, out[0].hdr + 42),
            l2l4(kSwitch, kParent, sizeof(TdHdr) + 256));
  ASSERT_TRUE(h.core.set_next_hops(5, std::vector<NextHop>{c0, c1}, up, &old).ok());
  ASSERT_NE(old, nullptr);
  Core::destroy_hops(old);  // no other thread runs process_burst() here
  // Every payload length: a short one patches the template's lengths and IPv4 checksum (RFC
  // 1624); the bytes must equal headers built from scratch.
  for (std::uint16_t count = 1; count <= 64; ++count) {
    const std::uint32_t chunk = count;
    const std::uint32_t seq = count;
    const auto n = static_cast<std::size_t>(count);
    h.feed(frame(child_ep(0), hdr(Opcode::contrib, chunk, 0, count, DType::f32, 4, seq),
                 std::vector<float>(n, 1)));
    out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, chunk, 1, count, DType::f32, 4, seq),
                       std::vector<float>(n, 2)));
    ASSERT_EQ(out.size(), 1u) << count;
    const std::size_t udp_payload = sizeof(TdHdr) + 4 * n;
    EXPECT_EQ(out[0].hop, 9);
    EXPECT_EQ(std::vector<std::uint8_t>(out[0].hdr, out[0].hdr + 42),
              l2l4(from(up), via(kParent, up), udp_payload))
        << count;
    std::vector<std::uint8_t> f(kFrameHeaderBytes + 4 * n);
    const float r = 3;
    std::vector<float> res(n, r);
    build_frame(f.data(), kParent, kSwitch,
                hdr(Opcode::result, chunk, 3, count, DType::f32, 4, seq, 2), res.data(), 4 * n);
    out = h.feed(f);
    ASSERT_EQ(out.size(), 2u) << count;
    EXPECT_EQ(out[0].hop, 7);
    EXPECT_EQ(std::vector<std::uint8_t>(out[0].hdr, out[0].hdr + 42),
              l2l4(from(c0), via(child_ep(0), c0), udp_payload))
        << count;
    EXPECT_EQ(out[1].hop, kNoHop);
    EXPECT_EQ(std::vector<std::uint8_t>(out[1].hdr, out[1].hdr + 42),
              l2l4(kSwitch, child_ep(1), udp_payload))
        << count;
    EXPECT_EQ(value(out[1], 0), 3.0f);
  }
}

TEST(CoreRoot, DuplicatesAreNeverAddedTwice) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  const auto a = frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 1), {1});
  EXPECT_TRUE(h.feed(a).empty());
  EXPECT_TRUE(h.feed(a).empty());  // pending: dropped
  EXPECT_EQ(h.core.counters().drop(DropReason::duplicate_pending), 1u);
  auto out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 1), {2}));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(value(out[0], 0), 3.0f);
  // Done: a duplicate gets the result back, to that child only, unchanged.
  out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 1), {2}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ip_of(out[0]).dst_addr.get(), child_ep(1).ip);
  EXPECT_EQ(td_of(out[0]).child.get(), 1);
  EXPECT_EQ(value(out[0], 0), 3.0f);
  EXPECT_EQ(h.core.counters().event(Event::result_unicast), 1u);
  EXPECT_EQ(h.core.counters().event(Event::contrib_accepted), 2u);
}

TEST(CoreInner, PartialUpResultDownAndRetention) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, false)).ok());
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 6, 0, 1), {1})).empty());
  auto out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 6, 1, 1), {2}));
  ASSERT_EQ(out.size(), 1u);
  TdHdr up = td_of(out[0]);
  EXPECT_EQ(up.opcode, static_cast<std::uint8_t>(Opcode::contrib));
  EXPECT_EQ(up.child.get(), 3);  // index at parent
  EXPECT_EQ(up.ncontrib.get(), 2);
  EXPECT_EQ(ip_of(out[0]).dst_addr.get(), kParent.ip);
  EXPECT_EQ(value(out[0], 0), 3.0f);
  // Duplicate while waiting on the parent: the partial goes up again.
  out = h.feed(frame(child_ep(0), hdr(Opcode::contrib, 6, 0, 1), {1}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(ip_of(out[0]).dst_addr.get(), kParent.ip);
  EXPECT_EQ(value(out[0], 0), 3.0f);
  EXPECT_EQ(h.core.counters().event(Event::partial_resent), 1u);
  // A RESULT from someone else is refused.
  std::vector<std::uint8_t> f(kFrameHeaderBytes + 4);
  const float r = 42;
  build_frame(f.data(), ep(9, kDefaultUdpPort), kSwitch,
              hdr(Opcode::result, 6, 3, 1, DType::f32, 4, 0, 7), &r, 4);
  EXPECT_TRUE(h.feed(f).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_source), 1u);
  // A RESULT names the receiver's child index at the parent (3); another is dropped, silently.
  build_frame(f.data(), kParent, kSwitch, hdr(Opcode::result, 6, 0, 1, DType::f32, 4, 0, 7), &r, 4);
  EXPECT_TRUE(h.feed(f).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_child), 1u);
  // The parent's RESULT is multicast with the parent's count of contributions.
  build_frame(f.data(), kParent, kSwitch, hdr(Opcode::result, 6, 3, 1, DType::f32, 4, 0, 7), &r, 4);
  out = h.feed(f);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(value(out[1], 0), 42.0f);
  EXPECT_EQ(td_of(out[1]).ncontrib.get(), 7);
  EXPECT_TRUE(h.feed(f).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::duplicate_result), 1u);
  // Retained: a late duplicate from a child is answered from the slot.
  out = h.feed(frame(child_ep(0), hdr(Opcode::contrib, 6, 0, 1), {1}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(value(out[0], 0), 42.0f);
  // The next chunk in the other version does not disturb it.
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 10, 0, 1), {5})).empty());
  out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 6, 1, 1), {2}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(value(out[0], 0), 42.0f);
  // Reuse of the version (chunk 6 + 2 * 4): the old chunk is forgotten, late copies are stale.
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 14, 0, 1), {5})).empty());
  EXPECT_TRUE(h.feed(frame(child_ep(1), hdr(Opcode::contrib, 6, 1, 1), {2})).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::stale_chunk), 1u);
  build_frame(f.data(), kParent, kSwitch, hdr(Opcode::result, 6, 3, 1, DType::f32, 4, 0, 7), &r, 4);
  EXPECT_TRUE(h.feed(f).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::stale_result), 1u);
  EXPECT_EQ(h.core.counters().event(Event::slot_reused), 1u);
}

TEST(CoreRoot, ResultAtRootIsUnexpected) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(1, true)).ok());
  std::vector<std::uint8_t> f(kFrameHeaderBytes + 4);
  const float r = 1;
  build_frame(f.data(), kParent, kSwitch, hdr(Opcode::result, 0, 0, 1), &r, 4);
  EXPECT_TRUE(h.feed(f).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::unexpected_result), 1u);
}

// Every refusal of a CONTRIB from a member is NACKed to the sender with its reason, and changes
// no slot.
TEST(CoreRefusals, EachReasonIsNackedAndCounted) {
  struct Case {
    DropReason want;
    void (*mutate)(TdHdr&, Endpoint&, std::size_t&);
  };
  const Case cases[] = {
      {DropReason::bad_version, [](TdHdr& t, Endpoint&, std::size_t&) { t.version = 9; }},
      {DropReason::unknown_tree, [](TdHdr& t, Endpoint&, std::size_t&) { t.tree_id.set(77); }},
      {DropReason::bad_key, [](TdHdr& t, Endpoint&, std::size_t&) { t.key.set(t.key.get() ^ 1); }},
      {DropReason::bad_child,
       [](TdHdr& t, Endpoint&, std::size_t&) { t.child.set(std::uint16_t{2}); }},
      {DropReason::bad_source, [](TdHdr&, Endpoint& e, std::size_t&) { e = child_ep(1); }},
      {DropReason::bad_dtype_op, [](TdHdr& t, Endpoint&, std::size_t&) { t.op = 12; }},
      {DropReason::bad_dtype_op, [](TdHdr& t, Endpoint&, std::size_t&) { t.dtype = 17; }},
      {DropReason::bad_dtype_op,  // f32 band: a pair with no meaning
       [](TdHdr& t, Endpoint&, std::size_t&) { t.op = static_cast<std::uint8_t>(ReduceOp::band); }},
      {DropReason::bad_count,
       [](TdHdr& t, Endpoint&, std::size_t& n) {
         t.count.set(std::uint16_t{65});
         n = 65;
       }},
      {DropReason::bad_count,
       [](TdHdr& t, Endpoint&, std::size_t& n) {
         t.count.set(0);
         n = 0;
       }},
      {DropReason::bad_length, [](TdHdr&, Endpoint&, std::size_t& n) { n = 3; }},
      {DropReason::bad_slot, [](TdHdr& t, Endpoint&, std::size_t&) { t.slot_ver ^= 1; }},
      {DropReason::bad_slot,
       [](TdHdr& t, Endpoint&, std::size_t&) { t.slot.set(std::uint16_t{1}); }},
      {DropReason::bad_ncontrib,
       [](TdHdr& t, Endpoint&, std::size_t&) { t.ncontrib.set(std::uint16_t{2}); }},
      {DropReason::bad_reserved, [](TdHdr& t, Endpoint&, std::size_t&) { t.reason = 5; }},
  };
  for (const Case& c : cases) {
    Harness h;
    ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
    TdHdr t = hdr(Opcode::contrib, 0, 0, 4);
    Endpoint src = child_ep(0);
    std::size_t n = 4;
    c.mutate(t, src, n);
    std::vector<float> vals(n, 1.0f);
    const auto out = h.feed(frame(src, t, vals));
    ASSERT_EQ(out.size(), 1u) << name(c.want);
    const TdHdr nack = td_of(out[0]);
    EXPECT_EQ(nack.opcode, static_cast<std::uint8_t>(Opcode::nack)) << name(c.want);
    EXPECT_EQ(nack.reason, static_cast<std::uint8_t>(c.want)) << name(c.want);
    EXPECT_EQ(nack.version, kProtocolVersion);
    // The key field is the MAC under the key the CONTRIB carried (here its sender's own, even
    // for bad_key), and never the tree's key.
    EXPECT_EQ(nack.key, proto::nack_mac(t.key, nack)) << name(c.want);
    EXPECT_TRUE(proto::nack_verifies(t.key.get(), nack)) << name(c.want);
    EXPECT_NE(nack.key.get(), tree_cfg(2, true).key) << name(c.want);
    EXPECT_EQ(out[0].payload_len, 0u);
    EXPECT_EQ(ip_of(out[0]).dst_addr.get(), src.ip);
    EXPECT_EQ(h.core.counters().drop(c.want), 1u) << name(c.want);
    EXPECT_EQ(h.core.counters().event(Event::nack_sent), 1u);
    SlotView v;
    ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
    EXPECT_EQ(v.state, SlotState::empty) << name(c.want);
  }
}

TEST(CoreRefusals, MismatchWithTheChunksFirstContribution) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 4), {1, 1, 1, 1})).empty());
  const auto out = h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 3), {1, 1, 1}));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(td_of(out[0]).reason, static_cast<std::uint8_t>(DropReason::chunk_mismatch));
  SlotView v;
  ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
  EXPECT_EQ(v.arrived, 1);
}

// bad_key and bad_source refusals (CONTRIB or RESULT) are noted for the switch's rate-limited
// log with the address the frame claimed; other refusals are not; the array is bounded.
TEST(CoreRefusals, ProbesAreNotedForTheLog) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  TdHdr t = hdr(Opcode::contrib, 0, 0, 4);
  t.key.set(t.key.get() ^ 1);
  h.feed(frame(child_ep(0), t, {1, 1, 1, 1}));                              // bad_key
  h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 0, 4), {1, 1, 1, 1}));  // bad_source
  h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 65), std::vector<float>(65, 1.0f)));
  ASSERT_EQ(h.core.probes().size(), 2u);
  EXPECT_EQ(h.core.probes()[0].src_ip, child_ep(0).ip);
  EXPECT_EQ(h.core.probes()[0].reason, DropReason::bad_key);
  EXPECT_EQ(h.core.probes()[0].tree_id, 5);
  EXPECT_EQ(h.core.probes()[1].src_ip, child_ep(1).ip);
  EXPECT_EQ(h.core.probes()[1].reason, DropReason::bad_source);
  h.core.clear_probes();
  EXPECT_TRUE(h.core.probes().empty());
  for (std::size_t i = 0; i < Core::kMaxProbes + 3; ++i)
    h.feed(frame(child_ep(0), t, {1, 1, 1, 1}));
  EXPECT_EQ(h.core.probes().size(), Core::kMaxProbes);
  EXPECT_EQ(h.core.probes_lost(), 3u);
}

// A flood of refused CONTRIBs: NACKs only while the budget lasts, the rest counted; the drops
// are counted either way, and a refill lets the next refusal be answered again.
TEST(CoreRefusals, NacksStopWhenTheBudgetIsSpent) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  TdHdr t = hdr(Opcode::contrib, 0, 0, 4);
  t.key.set(t.key.get() ^ 1);  // bad_key
  for (int i = 0; i < 5; ++i) EXPECT_EQ(h.feed(frame(child_ep(0), t, {1, 1, 1, 1})).size(), 1u);
  h.core.refill_nacks(3);
  std::size_t answered = 0;
  for (int i = 0; i < 10; ++i) answered += h.feed(frame(child_ep(0), t, {1, 1, 1, 1})).size();
  EXPECT_EQ(answered, 3u);
  EXPECT_EQ(h.core.counters().event(Event::nack_sent), 8u);
  EXPECT_EQ(h.core.counters().event(Event::nack_suppressed), 7u);
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_key), 15u);
  EXPECT_EQ(h.core.probes().size(), 15u);  // still noted for the log
  h.core.refill_nacks(1);
  EXPECT_EQ(h.feed(frame(child_ep(0), t, {1, 1, 1, 1})).size(), 1u);
  EXPECT_TRUE(h.feed(frame(child_ep(0), t, {1, 1, 1, 1})).empty());
  // A budget of 0 answers nothing; the tree's own traffic goes on.
  h.core.refill_nacks(0);
  EXPECT_TRUE(h.feed(frame(child_ep(0), t, {1, 1, 1, 1})).empty());
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 4), {1, 1, 1, 1})).empty());
  EXPECT_EQ(h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 4), {2, 2, 2, 2})).size(),
            2u);  // the RESULT to both children
}

TEST(CoreRefusals, NacksAreNotAnsweredAndNotForUsIsSilent) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  TdHdr t = hdr(Opcode::nack, 0, 0, 0);
  t.tree_id.set(std::uint16_t{77});
  EXPECT_TRUE(h.feed(frame(child_ep(0), t, {})).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::nack_received), 1u);
  t = hdr(Opcode::contrib, 0, 0, 1);
  t.opcode = 9;
  EXPECT_TRUE(h.feed(frame(child_ep(0), t, {1})).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_opcode), 1u);
  // A RESULT for an unknown tree is dropped without a NACK.
  t = hdr(Opcode::result, 0, 0, 1);
  t.tree_id.set(std::uint16_t{77});
  EXPECT_TRUE(h.feed(frame(kParent, t, {1})).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::unknown_tree), 1u);
  EXPECT_EQ(h.core.counters().event(Event::nack_sent), 0u);
}

TEST(CoreRefusals, StaleSequenceOnTheSameChunk) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  EXPECT_TRUE(
      h.feed(frame(child_ep(0), hdr(Opcode::contrib, 8, 0, 1, DType::f32, 4, 3), {1})).empty());
  EXPECT_TRUE(
      h.feed(frame(child_ep(1), hdr(Opcode::contrib, 8, 1, 1, DType::f32, 4, 2), {1})).empty());
  // Newer chunk, older collective: must not reset the slot.
  EXPECT_TRUE(
      h.feed(frame(child_ep(1), hdr(Opcode::contrib, 16, 1, 1, DType::f32, 4, 2), {1})).empty());
  EXPECT_EQ(h.core.counters().drop(DropReason::stale_seq), 2u);
  SlotView v;
  ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
  EXPECT_EQ(v.chunk, 8u);
  EXPECT_EQ(v.arrived, 1);
}

TEST(CoreBurst, StopsWhenTxCannotHoldAMulticast) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(4, true)).ok());
  std::vector<std::vector<std::uint8_t>> frames;
  for (std::uint16_t c = 0; c < 4; ++c) {
    frames.push_back(frame(child_ep(c), hdr(Opcode::contrib, 0, c, 1), {1}));
  }
  std::vector<RxFrame> rx;
  for (const auto& f : frames) rx.push_back({f.data(), f.size()});
  std::size_t n = 0;
  EXPECT_EQ(h.core.process_burst(rx.data(), rx.size(), h.tx.data(), 3, &n), 0u);
  EXPECT_EQ(n, 0u);
  EXPECT_EQ(h.core.process_burst(rx.data(), rx.size(), h.tx.data(), 4, &n), 4u);
  EXPECT_EQ(n, 4u);
  EXPECT_EQ(h.core.counters().event(Event::rx_frames), 4u);
}

TEST(CoreBurst, GarbageIsDroppedNeverCrashes) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  std::mt19937_64 rng(1);
  const auto good = frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 4), {1, 2, 3, 4});
  for (int i = 0; i < 20000; ++i) {
    auto f = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k)
      f[rng() % f.size()] ^= static_cast<std::uint8_t>(1 + rng() % 255);
    f.resize(rng() % (f.size() + 8));
    RxFrame rx{f.data(), f.size()};
    std::size_t n = 0;
    h.core.process_burst(&rx, 1, h.tx.data(), h.tx.size(), &n);
    EXPECT_LE(n, 2u);
  }
  EXPECT_EQ(h.core.counters().event(Event::rx_frames), 20000u);
}

// Deterministic mode: the same bits for every arrival order, with duplicates mixed in.
TEST(CoreDeterministic, ArrivalOrderDoesNotMatter) {
  constexpr std::uint16_t kChildren = 9;
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0, 1000);
  std::vector<std::vector<float>> vals(kChildren, std::vector<float>(64));
  for (auto& v : vals) {
    for (auto& x : v) x = nd(rng);
  }
  std::vector<float> first;
  bool normal_differs = false;
  for (int trial = 0; trial < 30; ++trial) {
    for (bool det : {true, false}) {
      Harness h;
      ASSERT_TRUE(h.core.install_tree(tree_cfg(kChildren, true, det)).ok());
      std::vector<std::uint16_t> order(kChildren);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<TxFrame> out;
      for (std::uint16_t c : order) {
        out = h.feed(frame(child_ep(c), hdr(Opcode::contrib, 0, c, 64), vals[c]));
        if (c % 3 == 0 && out.empty()) {
          EXPECT_TRUE(h.feed(frame(child_ep(c), hdr(Opcode::contrib, 0, c, 64), vals[c])).empty());
        }
      }
      ASSERT_EQ(out.size(), kChildren);
      std::vector<float> got(64);
      std::memcpy(got.data(), out[0].payload, 256);
      if (!det) {
        if (!first.empty() && got != first) normal_differs = true;
        continue;
      }
      if (first.empty()) first = got;
      EXPECT_EQ(got, first) << trial;
    }
  }
  EXPECT_TRUE(normal_differs);  // else the data would not test anything
}

TEST(CoreTreeTable, RemoveAndReinstallWhileTrafficFlows) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  EXPECT_TRUE(h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 1), {1})).empty());
  ASSERT_TRUE(h.core.remove_tree(5).ok());
  EXPECT_EQ(h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 1), {1})).size(), 1u);  // NACK
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true)).ok());
  // A fresh tree: the old contribution is gone.
  EXPECT_TRUE(h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 1), {1})).empty());
  SlotView v;
  ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
  EXPECT_EQ(v.bitmap, 2u);
  EXPECT_NE(h.core.tree_counters(5), nullptr);
  EXPECT_EQ(h.core.tree_counters(6), nullptr);
}

}  // namespace
}  // namespace treeduce::dp

namespace treeduce::dp {
namespace {

using namespace testing;

// Three shards of one switch: each owns slots s with s % 3 == shard, completes only those, and
// counts anything else as wrong_shard without touching its state.
TEST(CoreShards, EachShardOwnsItsSlots) {
  constexpr std::uint32_t kShards = 3, kSlots = 8;
  std::vector<std::unique_ptr<Core>> shards;
  for (std::uint32_t i = 0; i < kShards; ++i) {
    shards.push_back(std::make_unique<Core>(CoreConfig{kSwitch, i, kShards}));
    ASSERT_TRUE(shards[i]->install_tree(tree_cfg(2, true, false, kSlots)).ok());
  }
  EXPECT_EQ(shards[0]->local_slots(kSlots), 3u);  // 0 3 6
  EXPECT_EQ(shards[1]->local_slots(kSlots), 3u);  // 1 4 7
  EXPECT_EQ(shards[2]->local_slots(kSlots), 2u);  // 2 5
  EXPECT_EQ(shards[2]->local_slots(2), 0u);
  std::vector<TxFrame> tx(kMaxChildren);
  for (std::uint32_t chunk = 0; chunk < 2 * kSlots; ++chunk) {
    const std::uint32_t owner = chunk % kSlots % kShards;
    for (std::uint32_t s = 0; s < kShards; ++s) {
      std::size_t got = 0;
      for (std::uint16_t c = 0; c < 2; ++c) {
        const auto f = frame(child_ep(c), hdr(Opcode::contrib, chunk, c, 1, DType::f32, kSlots),
                             {float(chunk + c)});
        RxFrame rx{f.data(), f.size()};
        std::size_t n = 0;
        ASSERT_EQ(shards[s]->process_burst(&rx, 1, tx.data(), tx.size(), &n), 1u);
        got += n;
        if (n == 2) {
          EXPECT_EQ(value(tx[0], 0), float(2 * chunk + 1));
        }
      }
      EXPECT_EQ(got, s == owner ? 2u : 0u) << "chunk " << chunk << " shard " << s;
    }
  }
  for (std::uint32_t s = 0; s < kShards; ++s) {
    const Counters& c = shards[s]->counters();
    const std::uint64_t own = s == 2 ? 4 : 6;  // chunks 0..15: slots owned twice each
    EXPECT_EQ(c.event(Event::result_multicast), own);
    EXPECT_EQ(c.drop(DropReason::wrong_shard), 2 * (2 * kSlots - own));
    SlotView v;
    EXPECT_EQ(shards[s]->slot_view(5, s, 0, &v), 0);
    EXPECT_EQ(shards[s]->slot_view(5, (s + 1) % kShards, 0, &v), -EINVAL);
  }
}

// A control thread installs and unpublishes trees while the datapath thread runs bursts: the
// datapath sees either no tree (unknown_tree) or a whole one, never a torn one. Freed only after
// the datapath has acknowledged a later burst (a hand-made grace period, as rte_rcu_qsbr gives).
TEST(CoreConcurrency, PublishAndUnpublishWhileRunning) {
  Core core(CoreConfig{kSwitch});
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> bursts{0};
  std::thread dp([&] {
    std::vector<TxFrame> tx(kMaxChildren);
    const auto f = frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 1), {1.0f});
    while (!stop.load(std::memory_order_relaxed)) {
      RxFrame rx{f.data(), f.size()};
      std::size_t n = 0;
      core.process_burst(&rx, 1, tx.data(), tx.size(), &n);
      bursts.fetch_add(1, std::memory_order_release);
    }
  });
  for (int i = 0; i < 2000; ++i) {
    ASSERT_TRUE(core.install_tree(tree_cfg(1, true)).ok());
    Tree* t = core.unpublish_tree(5);
    ASSERT_NE(t, nullptr);
    const std::uint64_t b = bursts.load(std::memory_order_acquire);
    while (bursts.load(std::memory_order_acquire) < b + 2) std::this_thread::yield();
    Core::destroy_tree(t);
  }
  stop = true;
  dp.join();
  const Counters& c = core.counters();
  EXPECT_EQ(c.event(Event::rx_frames), bursts.load());
  // Every frame either found the tree (root, one child: a RESULT) or did not (a NACK).
  EXPECT_EQ(c.event(Event::result_multicast) + c.event(Event::result_unicast) +
                c.drop(DropReason::unknown_tree),
            bursts.load());
  EXPECT_EQ(core.unpublish_tree(5), nullptr);
}

}  // namespace
}  // namespace treeduce::dp

namespace treeduce::dp {
namespace {

using namespace testing;

// A duplicate re-sends the partial, then the parent's RESULT arrives in the same burst: both
// output frames are unsent when process_burst() returns, so each keeps its own payload.
TEST(CoreLeaf, PartialAndResultInOneBurstKeepTheirPayloads) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, false)).ok());
  h.feed(frame(child_ep(0), hdr(Opcode::contrib, 0, 0, 2), {1, 2}));
  ASSERT_EQ(h.feed(frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 2), {10, 20})).size(), 1u);
  const auto dup = frame(child_ep(1), hdr(Opcode::contrib, 0, 1, 2), {10, 20});
  const auto res = frame(kParent, hdr(Opcode::result, 0, 3, 2, DType::f32, 4, 0, 9), {7, 8});
  const RxFrame rx[2] = {{dup.data(), dup.size()}, {res.data(), res.size()}};
  std::size_t n = 0;
  ASSERT_EQ(h.core.process_burst(rx, 2, h.tx.data(), h.tx.size(), &n), 2u);
  ASSERT_EQ(n, 3u);  // the partial again, then the RESULT to both children
  EXPECT_EQ(td_of(h.tx[0]).opcode, static_cast<std::uint8_t>(Opcode::contrib));
  EXPECT_EQ(value(h.tx[0], 0), 11.0f);
  EXPECT_EQ(value(h.tx[0], 1), 22.0f);
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(td_of(h.tx[i]).opcode, static_cast<std::uint8_t>(Opcode::result));
    EXPECT_EQ(value(h.tx[i], 0), 7.0f);
    EXPECT_EQ(value(h.tx[i], 1), 8.0f);
  }
  EXPECT_NE(h.tx[0].payload, h.tx[1].payload);
}

// What a receiver that trusts headers sees: each call's output is "transmitted" (copied) before
// the next call, as the daemon does, and every frame's payload must be its own chunk's. A frame
// that process_burst() leaves unconsumed is offered again in the next call.
struct Sent {
  TdHdr td;
  std::uint32_t dst_ip;
  float value;
};
std::vector<Sent> run_bursts(Harness& h, const std::vector<std::vector<std::uint8_t>>& frames,
                             std::size_t* calls = nullptr) {
  std::vector<RxFrame> rx;
  for (const auto& f : frames) rx.push_back({f.data(), f.size()});
  std::vector<Sent> sent;
  std::size_t done = 0, n_calls = 0;
  while (done < rx.size()) {
    std::size_t n = 0;
    const std::size_t used =
        h.core.process_burst(rx.data() + done, rx.size() - done, h.tx.data(), h.tx.size(), &n);
    ++n_calls;
    EXPECT_TRUE(used > 0 || n > 0) << "no progress";
    if (used == 0 && n == 0) break;
    done += used;
    for (std::size_t i = 0; i < n; ++i)
      sent.push_back({td_of(h.tx[i]), ip_of(h.tx[i]).dst_addr.get(),
                      h.tx[i].payload_len != 0 ? value(h.tx[i], 0) : 0.0f});
  }
  if (calls != nullptr) *calls = n_calls;
  return sent;
}

// Child k's value for chunk c, and the sum of two children.
float contribution(std::uint32_t c, std::uint16_t k) { return float(c * 10 + k + 1); }
float sum2(std::uint32_t c) { return contribution(c, 0) + contribution(c, 1); }
std::vector<std::uint8_t> contrib(std::uint32_t c, std::uint16_t k, std::uint32_t slots) {
  return frame(child_ep(k), hdr(Opcode::contrib, c, k, 1, DType::f32, slots), {contribution(c, k)});
}

// The defect found by tests written from docs/protocol.md: a 2-host root tree with S = 1; chunks
// 0 and 1 complete in one burst; the next burst holds child 0's late retransmission of chunk 0,
// then chunk 2 from both children. The unicast RESULT for chunk 0 used to leave with chunk 0's
// header and chunk 2's sum (chunk 2 completes in the same slot version later in the call).
TEST(CoreBursts, AUnicastResultKeepsItsChunksSumWhenTheSlotIsReusedInTheSameBurst) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true, false, 1)).ok());
  auto sent =
      run_bursts(h, {contrib(0, 0, 1), contrib(0, 1, 1), contrib(1, 0, 1), contrib(1, 1, 1)});
  ASSERT_EQ(sent.size(), 4u);  // two multicasts
  std::size_t calls = 0;
  sent = run_bursts(h, {contrib(0, 0, 1), contrib(2, 0, 1), contrib(2, 1, 1)}, &calls);
  ASSERT_EQ(sent.size(), 3u);  // the unicast, then chunk 2's multicast
  EXPECT_EQ(calls, 2u) << "chunk 2's completion must wait for the unicast to be sent";
  EXPECT_EQ(sent[0].td.chunk.get(), 0u);
  EXPECT_EQ(sent[0].dst_ip, child_ep(0).ip);
  for (const Sent& f : sent) EXPECT_EQ(f.value, sum2(f.td.chunk.get())) << f.td.chunk.get();
  EXPECT_EQ(h.core.counters().event(Event::result_unicast), 1u);
  EXPECT_EQ(h.core.counters().event(Event::result_multicast), 3u);
  EXPECT_EQ(h.core.counters().event(Event::tx_deferred), 1u);
  // The deferred frame is counted once, when it is taken, switch-wide and for its tree.
  EXPECT_EQ(h.core.counters().event(Event::rx_frames), 7u);
  EXPECT_EQ(h.core.tree_counters(5)->event(Event::rx_frames), 7u);
}

// With the default burst of 32, frames arriving faster than the window (3 windows of S = 4 in
// one burst) make chunk c + 8 complete in chunk c's slot version while c's multicast is unsent.
TEST(CoreBursts, MulticastsKeepTheirSumsWhenABurstHoldsSeveralWindows) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true, false, 4)).ok());
  std::vector<std::vector<std::uint8_t>> frames;
  for (std::uint32_t c = 0; c < 12; ++c) {
    frames.push_back(contrib(c, 0, 4));
    frames.push_back(contrib(c, 1, 4));
  }
  std::size_t calls = 0;
  const auto sent = run_bursts(h, frames, &calls);
  ASSERT_EQ(sent.size(), 24u);
  EXPECT_EQ(calls, 2u);  // chunk 8 waits for chunk 0's multicast to be sent
  for (const Sent& f : sent) EXPECT_EQ(f.value, sum2(f.td.chunk.get())) << f.td.chunk.get();
}

// A leaf re-sends chunk 0's partial on a duplicate, then completes chunk 2 (S = 1) in the same
// slot version: the re-sent partial must still carry chunk 0's sum.
TEST(CoreBursts, AReSentPartialKeepsItsSum) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, false, false, 1)).ok());
  ASSERT_EQ(run_bursts(h, {contrib(0, 0, 1), contrib(0, 1, 1)}).size(), 1u);
  const auto sent = run_bursts(h, {contrib(0, 1, 1), contrib(2, 0, 1), contrib(2, 1, 1)});
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].td.chunk.get(), 0u);
  for (const Sent& f : sent) {
    EXPECT_EQ(f.td.opcode, static_cast<std::uint8_t>(Opcode::contrib));
    EXPECT_EQ(f.value, sum2(f.td.chunk.get())) << f.td.chunk.get();
  }
  EXPECT_EQ(h.core.counters().event(Event::partial_resent), 1u);
}

// A non-root's RESULT buffer: chunk 0's RESULT is unicast again on a duplicate, then chunk 2
// (S = 1, the same slot version) completes, goes up, and a RESULT for it arrives, all in one
// burst. The parent cannot have answered a partial that was not sent yet, but the core must not
// depend on that: the RESULT waits for the next call.
TEST(CoreBursts, AResultFromTheParentWaitsForTheUnicastBeforeIt) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, false, false, 1)).ok());
  const auto result = [](std::uint32_t c) {
    return frame(kParent, hdr(Opcode::result, c, 3, 1, DType::f32, 1, 0, 7), {1000.0f + float(c)});
  };
  ASSERT_EQ(run_bursts(h, {contrib(0, 0, 1), contrib(0, 1, 1), result(0)}).size(), 3u);
  std::size_t calls = 0;
  const auto sent =
      run_bursts(h, {contrib(0, 0, 1), contrib(2, 0, 1), contrib(2, 1, 1), result(2)}, &calls);
  ASSERT_EQ(sent.size(), 4u);  // chunk 0 to child 0, chunk 2's partial, chunk 2 to both
  EXPECT_EQ(calls, 2u);
  for (const Sent& f : sent) {
    const std::uint32_t c = f.td.chunk.get();
    const bool up = f.td.opcode == static_cast<std::uint8_t>(Opcode::contrib);
    EXPECT_EQ(f.value, up ? sum2(c) : 1000.0f + float(c)) << c;
  }
  EXPECT_EQ(sent[0].td.chunk.get(), 0u);
}

}  // namespace
}  // namespace treeduce::dp
