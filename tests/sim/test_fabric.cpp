// Fast properties of the switch core on the simulated fabric (unit suite).
#include <gtest/gtest.h>

#include "scenario.h"

namespace treeduce::sim {
namespace {

LinkModel lossy(double loss, double dup = 0.02) {
  LinkModel l;
  l.loss = loss;
  l.dup = dup;
  l.delay_ns = 2000;
  l.jitter_ns = 6000;  // larger than the delay: frames overtake each other
  return l;
}

TEST(Fabric, LosslessSingleSwitch) {
  Scenario s;
  s.link = LinkModel{};
  run_scenario(s);
}

// Every defined dtype x op on a two-level tree with loss, duplication and reordering; the
// results are checked against inputs' independently computed expected values (exact::Inputs)
// wherever the world allows exact sums, which is everywhere but the narrow floats' sums here.
// Pipelining (ProtocolEngine::enqueue): 24 collectives of about 3 chunks each, 8 queued ahead
// per host, stream through a 4-slot window on a two-level tree under loss, duplication and
// reordering; every element of every collective is exact and every switch saw each chunk once.
TEST(Fabric, PipelinedCollectivesLossyReordered) {
  for (std::uint64_t seed : {11u, 12u, 13u, 14u}) {
    Scenario s;
    s.fanins = {2, 3};
    s.link = lossy(0.05, 0.05);
    s.bytes = 1024;
    s.collectives = 24;
    s.pipeline = 8;
    s.seed = seed;
    s.dtype = seed % 2 ? DType::i32 : DType::f32;
    run_scenario(s);
    if (HasFatalFailure()) return;
  }
}

// On a lossless fabric the queued collectives overlap: 16 collectives of 2 chunks take less
// virtual time with 8 queued ahead than one at a time, since two of them fill the 4-slot window
// in one round trip instead of each using half of it.
TEST(Fabric, PipelinedCollectivesOverlap) {
  Scenario s;
  s.fanins = {4};
  s.link = LinkModel{};
  s.bytes = 512;
  s.collectives = 16;
  std::uint64_t one_at_a_time = 0, pipelined = 0;
  run_scenario(s, nullptr, &one_at_a_time);
  s.pipeline = 8;
  run_scenario(s, nullptr, &pipelined);
  EXPECT_LT(pipelined * 3, one_at_a_time * 2) << pipelined << " vs " << one_at_a_time;
}

TEST(Fabric, EveryDtypeAndOpTwoLevelsLossy) {
  std::size_t independent = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp o : kAllReduceOps) {
      if (!op_defined(d, o)) continue;
      Scenario s;
      s.dtype = d;
      s.op = o;
      s.fanins = {3, 4};
      s.link = lossy(0.05);
      s.seed = 100 + static_cast<unsigned>(d) * 3 + static_cast<unsigned>(o);
      independent += uses_exact_inputs(s, 12);
      run_scenario(s);
      if (HasFatalFailure()) return;
    }
  }
  EXPECT_GE(independent, 110u - 4);  // f16, bf16, e4m3, e5m2 sums over 12 hosts: not exact
}

// The same in deterministic mode, with 8- and 16-byte elements filling 256-byte payloads of 32
// and 16 elements, one slot, and three levels.
TEST(Fabric, WideElementsDeterministicOneSlot) {
  for (DType d :
       {DType::f64, DType::i64, DType::u64, DType::f64_i32, DType::f32_i32, DType::i32_i32}) {
    for (ReduceOp o : kAllReduceOps) {
      if (!op_defined(d, o)) continue;
      Scenario s;
      s.dtype = d;
      s.op = o;
      s.fanins = {2, 2, 3};
      s.deterministic = true;
      s.slots = 1;
      s.link = lossy(0.05, 0.05);
      s.seed = 300 + static_cast<unsigned>(d) * 13 + static_cast<unsigned>(o);
      s.collectives = 3;
      run_scenario(s);
      if (HasFatalFailure()) return;
    }
  }
}

// A pair with no meaning (f32 band, i32 minloc, f32_i32 sum) or a code no switch knows never
// starts: the leaf switch refuses the first CONTRIB with a bad_dtype_op NACK, the host stops with
// that reason, and nothing is reduced anywhere.
TEST(Fabric, UndefinedPairsAreRefusedByTheLeaf) {
  const std::pair<std::uint8_t, std::uint8_t> cases[] = {
      {static_cast<std::uint8_t>(DType::f32), static_cast<std::uint8_t>(ReduceOp::band)},
      {static_cast<std::uint8_t>(DType::i32), static_cast<std::uint8_t>(ReduceOp::minloc)},
      {static_cast<std::uint8_t>(DType::f32_i32), static_cast<std::uint8_t>(ReduceOp::sum)},
      {static_cast<std::uint8_t>(DType::f64), static_cast<std::uint8_t>(ReduceOp::lxor)},
  };
  for (const auto& [dt, op] : cases) {
    const DType d = static_cast<DType>(dt);
    const ReduceOp o = static_cast<ReduceOp>(op);
    const std::string what = std::string(name(d)) + " " + std::string(name(o));
    Fabric fab(5, LinkModel{});
    TopoNode root = build_tree(fab, {2, 2});
    JobSpec j;
    j.tree_id = 3;
    j.dtype = d;
    j.op = o;
    j.root = root;
    j.inputs.push_back(std::vector<std::vector<std::uint8_t>>(
        4, std::vector<std::uint8_t>(64 * dtype_size(d), 1)));
    ASSERT_EQ(fab.add_job(j), 0) << what;
    EXPECT_FALSE(fab.run(1'000'000)) << what;
    for (const HostNode* h : fab.hosts(0)) {
      EXPECT_EQ(h->final_status, host::Status::refused) << what;
      EXPECT_EQ(h->engine->nack_reason(), proto::Reason::bad_dtype_op) << what;
    }
    std::uint64_t refused = 0;
    for (int sw = 0; sw < 3; ++sw) {
      const dp::Counters* c = fab.core(sw).tree_counters(3);
      ASSERT_NE(c, nullptr);
      refused += c->drop(dp::DropReason::bad_dtype_op);
      EXPECT_EQ(c->event(dp::Event::contrib_accepted), 0u) << what;
    }
    EXPECT_GE(refused, 4u) << what;  // every host's first CONTRIB at least
  }
}

TEST(Fabric, ThreeLevelsTenPercentLoss) {
  Scenario s;
  s.dtype = DType::bf16;
  s.fanins = {2, 3, 2};
  s.link = lossy(0.10, 0.05);
  s.seed = 5;
  s.bytes = 16384;
  s.collectives = 3;
  FabricStats st;
  run_scenario(s, &st);
  // The links really did lose and duplicate (a check on the test itself).
  EXPECT_GT(st.lost, st.sent / 20);
  EXPECT_GT(st.duplicated, st.sent / 50);
}

TEST(Fabric, FanIn64AndFanIn1) {
  Scenario s;
  s.dtype = DType::e4m3;
  s.fanins = {64};
  s.link = lossy(0.02);
  s.bytes = 1024;
  run_scenario(s);
  s.fanins = {1, 1, 1};
  s.dtype = DType::i32;
  run_scenario(s);
}

TEST(Fabric, IrregularTree) {
  Fabric fab(9, lossy(0.05));
  // root: a host, a leaf with 3 hosts, an inner switch over a leaf with 1 host and a host.
  TopoNode leaf1{fab.add_switch(), {TopoNode{}, TopoNode{}, TopoNode{}}};
  TopoNode leaf2{fab.add_switch(), {TopoNode{}}};
  TopoNode inner{fab.add_switch(), {leaf2, TopoNode{}}};
  TopoNode root{fab.add_switch(), {TopoNode{}, leaf1, inner}};
  Scenario s;
  s.dtype = DType::f16;
  std::mt19937_64 rng(3);
  const JobSpec spec = make_job(s, root, rng);
  ASSERT_EQ(fab.add_job(spec), 0);
  ASSERT_TRUE(fab.run());
  expect_results(fab, 0, "irregular");
  expect_exact_counts(fab, fab.job(0), fab.job(0).root, true, "irregular");
}

// Deterministic mode: non-integer data, so that the order of additions matters; the result must
// be bit-identical to the child-order reference for every loss/reorder pattern.
TEST(Fabric, DeterministicBitIdenticalOver20Seeds) {
  for (DType d : {DType::f32, DType::bf16}) {
    std::vector<std::vector<std::uint8_t>> first;
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      Scenario s;
      s.dtype = d;
      s.fanins = {3, 3};
      s.deterministic = true;
      s.exact = false;
      s.link = lossy(0.05, 0.05);
      s.seed = seed;
      s.bytes = 1024;
      const auto out = run_scenario(s);
      if (seed == 1) first = out;
      EXPECT_EQ(out, first) << "seed " << seed;
    }
  }
}

// Normal mode with the same non-integer data really does depend on order: the test above would
// catch a deterministic mode that was not.
TEST(Fabric, NormalModeIsOrderDependentOnInexactData) {
  int differs = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) {
    Scenario s;
    s.fanins = {8};
    s.exact = false;
    s.link = lossy(0.0, 0.0);
    s.seed = seed;
    Fabric fab(s.seed, s.link);
    std::mt19937_64 rng(s.data_seed);
    TopoNode root = build_tree(fab, s.fanins);
    const JobSpec spec = make_job(s, root, rng);
    ASSERT_EQ(fab.add_job(spec), 0);
    ASSERT_TRUE(fab.run());
    if (fab.hosts(0)[0]->outputs[0] != reference(spec, 0)) ++differs;
  }
  EXPECT_GT(differs, 0);
}

// Two jobs share both switches of a two-level fabric: different trees, keys, dtypes, ops and
// modes. Each gets exactly its own reference.
TEST(Fabric, ConcurrentJobsOnSharedSwitches) {
  Fabric fab(77, lossy(0.05));
  const int root = fab.add_switch();
  const int leaf_a = fab.add_switch();
  const int leaf_b = fab.add_switch();
  std::mt19937_64 rng(1);
  Scenario a;
  a.tree_id = 10;
  a.key = 0xAAAA;
  a.dtype = DType::f32;
  Scenario b;
  b.tree_id = 11;
  b.key = 0xBBBB;
  b.dtype = DType::f64_i32;
  b.op = ReduceOp::maxloc;
  b.deterministic = true;
  b.slots = 2;
  const TopoNode ta{root,
                    {TopoNode{leaf_a, {TopoNode{}, TopoNode{}}}, TopoNode{leaf_b, {TopoNode{}}}}};
  const TopoNode tb{
      root,
      {TopoNode{leaf_b, {TopoNode{}, TopoNode{}, TopoNode{}}}, TopoNode{leaf_a, {TopoNode{}}}}};
  ASSERT_EQ(fab.add_job(make_job(a, ta, rng)), 0);
  ASSERT_EQ(fab.add_job(make_job(b, tb, rng)), 1);
  ASSERT_TRUE(fab.run());
  expect_results(fab, 0, "job a");
  expect_results(fab, 1, "job b");
  expect_exact_counts(fab, fab.job(0), fab.job(0).root, true, "job a");
  expect_exact_counts(fab, fab.job(1), fab.job(1).root, true, "job b");
}

std::vector<std::uint8_t> frame_from(const dp::Endpoint& src, const dp::Endpoint& dst,
                                     const dp::TdHdr& td, std::size_t payload_len) {
  std::vector<std::uint8_t> f(dp::kFrameHeaderBytes + payload_len);
  std::vector<std::uint8_t> payload(payload_len, 0x3C);
  dp::build_frame(f.data(), src, dst, td, payload.data(), payload_len);
  return f;
}

dp::TdHdr contrib_hdr(std::uint16_t tree, std::uint64_t key, std::uint32_t chunk,
                      std::uint32_t slots, std::uint32_t seq, std::uint16_t child,
                      std::uint16_t count) {
  dp::TdHdr h{};
  h.version = dp::kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(dp::Opcode::contrib);
  h.dtype = static_cast<std::uint8_t>(DType::f32);
  h.tree_id.set(tree);
  h.child.set(child);
  h.slot.set(static_cast<std::uint16_t>(chunk % slots));
  h.slot_ver = static_cast<std::uint8_t>((chunk / slots) % 2);
  h.count.set(count);
  h.ncontrib.set(std::uint16_t{1});
  h.chunk.set(chunk);
  h.seq.set(seq);
  h.key.set(key);
  return h;
}

// Wrong key, unknown tree (mid-run, from outside) and stale collectives (from a member's address,
// after the run) are dropped and counted, and never change a result or a slot.
TEST(Fabric, InjectedBadTrafficIsCountedAndHarmless) {
  Scenario s;
  s.fanins = {4};
  s.link = lossy(0.03);
  s.slots = 4;
  Fabric fab(s.seed, s.link);
  std::mt19937_64 rng(s.data_seed);
  TopoNode root = build_tree(fab, s.fanins);
  const JobSpec spec = make_job(s, root, rng);
  ASSERT_EQ(fab.add_job(spec), 0);
  const dp::Endpoint rogue = Fabric::rogue_addr();
  const dp::Endpoint sw = fab.switch_addr(0);
  const std::uint16_t n = 64;
  for (std::uint64_t t = 1000; t < 200'000; t += 20'000) {
    const auto chunk = static_cast<std::uint32_t>(t / 20'000);
    fab.inject(0, frame_from(rogue, sw, contrib_hdr(s.tree_id, 0xBAD, chunk, 4, 0, 0, n), 4 * n),
               t);
    fab.inject(0, frame_from(rogue, sw, contrib_hdr(999, s.key, chunk, 4, 0, 0, n), 4 * n), t);
  }
  ASSERT_TRUE(fab.run());
  expect_results(fab, 0, "injected");
  expect_exact_counts(fab, fab.job(0), fab.job(0).root, true, "injected", false);
  EXPECT_EQ(fab.core(0).tree_counters(s.tree_id)->drop(dp::DropReason::bad_key), 10u);
  const dp::Counters& c = fab.core(0).counters();
  EXPECT_EQ(c.drop(dp::DropReason::bad_key), 10u);
  EXPECT_EQ(c.drop(dp::DropReason::unknown_tree), 10u);
  EXPECT_EQ(c.event(dp::Event::nack_sent), 20u);  // NACKs to the rogue address

  // After the run: a member's packets from the first collective (seq 0) are stale now.
  const auto* h0 = fab.hosts(0)[0];
  const std::uint32_t last = static_cast<std::uint32_t>(total_chunks(spec) - 1);
  dp::SlotView before;
  ASSERT_EQ(fab.core(0).slot_view(s.tree_id, last % 4, (last / 4) % 2, &before), 0);
  const auto stale_seq_before = c.drop(dp::DropReason::stale_seq);
  const auto stale_chunk_before = c.drop(dp::DropReason::stale_chunk);
  // Same chunk as the slot holds, older collective: stale_seq.
  fab.inject(0, frame_from(h0->addr, sw, contrib_hdr(s.tree_id, s.key, last, 4, 0, 0, n), 4 * n),
             fab.now() + 10);
  // An old chunk of the first collective: stale_chunk.
  fab.inject(0, frame_from(h0->addr, sw, contrib_hdr(s.tree_id, s.key, 1, 4, 0, 0, n), 4 * n),
             fab.now() + 10);
  // A newer chunk carrying an older collective sequence: stale_seq, the slot is not reset.
  fab.inject(0,
             frame_from(h0->addr, sw, contrib_hdr(s.tree_id, s.key, last + 4, 4, 0, 0, n), 4 * n),
             fab.now() + 10);
  fab.run(fab.now() + 1'000'000);
  EXPECT_EQ(c.drop(dp::DropReason::stale_seq), stale_seq_before + 2);
  EXPECT_EQ(c.drop(dp::DropReason::stale_chunk), stale_chunk_before + 1);
  dp::SlotView after;
  ASSERT_EQ(fab.core(0).slot_view(s.tree_id, last % 4, (last / 4) % 2, &after), 0);
  EXPECT_EQ(after.chunk, before.chunk);
  EXPECT_EQ(after.bitmap, before.bitmap);
  EXPECT_EQ(after.ncontrib, before.ncontrib);
  dp::SlotView next;
  ASSERT_EQ(fab.core(0).slot_view(s.tree_id, (last + 4) % 4, ((last + 4) / 4) % 2, &next), 0);
  EXPECT_NE(next.chunk, last + 4);
}

// A second job's trees are installed on the switches while the first job's packets flow; both
// jobs end with exact results.
TEST(Fabric, TreeInstalledWhileAnotherJobRuns) {
  Fabric fab(21, lossy(0.05));
  const int root = fab.add_switch();
  const int leaf = fab.add_switch();
  std::mt19937_64 rng(4);
  Scenario a;
  a.tree_id = 1;
  a.bytes = 32 * 1024;
  Scenario b;
  b.tree_id = 2;
  b.key = 0xB;
  b.dtype = DType::bf16;
  b.op = ReduceOp::min;
  const TopoNode ta{root, {TopoNode{leaf, {TopoNode{}, TopoNode{}}}, TopoNode{}}};
  const TopoNode tb{root, {TopoNode{}, TopoNode{leaf, {TopoNode{}, TopoNode{}, TopoNode{}}}}};
  ASSERT_EQ(fab.add_job(make_job(a, ta, rng)), 0);
  ASSERT_FALSE(fab.run(100'000));  // job a is mid-flight
  ASSERT_GT(fab.core(root).tree_counters(1)->event(dp::Event::result_multicast), 0u);
  ASSERT_EQ(fab.add_job(make_job(b, tb, rng)), 1);
  ASSERT_TRUE(fab.run());
  expect_results(fab, 0, "job a");
  expect_results(fab, 1, "job b");
  expect_exact_counts(fab, fab.job(0), fab.job(0).root, true, "job a");
  expect_exact_counts(fab, fab.job(1), fab.job(1).root, true, "job b");
}

// Spoofed NACKs: a stranger who knows everything of the headers but the job's key sends every
// host, throughout the run and from the leaf switch's own address, a NACK for every chunk of
// every collective, with no MAC (key 0, as a switch that predates the MAC sends) or a MAC under a
// wrong key. The hosts ignore them all (counted as nack_unverified), and every collective
// completes exactly. The genuine NACKs of TreeRemovedWhileRunningRefusesHosts still refuse.
TEST(Fabric, SpoofedNacksAreIgnoredAndCollectivesCompleteExactly) {
  Scenario s;
  s.fanins = {4};
  s.link = lossy(0.02);
  s.slots = 4;
  s.bytes = 4096;
  Fabric fab(s.seed, s.link);
  std::mt19937_64 rng(s.data_seed);
  TopoNode root = build_tree(fab, s.fanins);
  const JobSpec spec = make_job(s, root, rng);
  ASSERT_EQ(fab.add_job(spec), 0);
  const std::size_t per_coll = total_chunks(spec) / spec.inputs.size();
  std::uint64_t spoofed = 0;
  for (std::uint64_t t = 500; t < 300'000; t += 7'000) {
    for (const HostNode* h : fab.hosts(0)) {
      for (std::uint32_t chunk = 0; chunk < total_chunks(spec); ++chunk) {
        dp::TdHdr n = contrib_hdr(s.tree_id, 0, chunk, s.slots,
                                  static_cast<std::uint32_t>(chunk / per_coll), h->index, 0);
        n.opcode = static_cast<std::uint8_t>(dp::Opcode::nack);
        n.reason = static_cast<std::uint8_t>(dp::DropReason::bad_dtype_op);
        n.ncontrib.set(0);
        if ((chunk + t / 7'000) % 2 == 1) n.key = proto::nack_mac(proto::be64::of(s.key ^ 1), n);
        fab.inject_to_address(frame_from(fab.switch_addr(0), h->addr, n, 0), t);
        ++spoofed;
      }
    }
  }
  ASSERT_TRUE(fab.run());
  expect_results(fab, 0, "spoofed NACKs");
  std::uint64_t unverified = 0;
  for (const HostNode* h : fab.hosts(0)) {
    EXPECT_EQ(h->final_status, host::Status::done);
    EXPECT_EQ(h->engine->nack_reason(), proto::Reason::none);
    unverified += h->engine->stats().nack_unverified;
  }
  // Those for a chunk then in flight reached the MAC check; the rest were not in flight.
  EXPECT_GT(unverified, 0u);
  EXPECT_LT(unverified, spoofed);
}

// A tree removed while its packets flow: the rest are dropped as unknown_tree and NACKed, and the
// hosts learn why.
TEST(Fabric, TreeRemovedWhileRunningRefusesHosts) {
  Scenario s;
  s.fanins = {2};
  s.bytes = 64 * 1024;
  Fabric fab(1, LinkModel{});
  std::mt19937_64 rng(1);
  TopoNode root = build_tree(fab, s.fanins);
  ASSERT_EQ(fab.add_job(make_job(s, root, rng)), 0);
  ASSERT_FALSE(fab.run(20'000));  // stop early
  ASSERT_TRUE(fab.core(0).remove_tree(s.tree_id).ok());
  ASSERT_FALSE(fab.run());
  for (const HostNode* h : fab.hosts(0)) {
    EXPECT_EQ(h->final_status, host::Status::refused);
    EXPECT_EQ(h->engine->nack_reason(), dp::DropReason::unknown_tree);
  }
  EXPECT_GT(fab.core(0).counters().drop(dp::DropReason::unknown_tree), 0u);
}

// A late duplicate in the same burst as the next use of its slot version. Switches read their
// frames every 10 us, links take 2 us and duplicate a third of the frames, the copy 20 us late:
// with S = 1 a copy of chunk c reaches the switch in the burst that completes chunk c + 2 in
// the same slot version, just before it. The switch answers the copy with chunk c's RESULT and
// must defer chunk c + 2 until that RESULT is sent; no RESULT, at any level, may carry another
// chunk's data under its header. Checked in flight, as a receiver that trusts headers would see
// it (the hosts' window logic ignores such frames).
TEST(Fabric, NoResultCarriesAnotherChunksDataUnderLateDuplicates) {
  std::uint64_t deferred = 0, checked = 0;
  for (const std::vector<int>& fanins :
       {std::vector<int>{2}, std::vector<int>{4}, std::vector<int>{2, 2}}) {
    for (std::uint32_t slots : {1u, 2u}) {
      for (std::uint64_t seed = 1; seed <= 5; ++seed) {
        Scenario s;
        s.fanins = fanins;
        s.slots = slots;
        s.link.loss = 0.01;
        s.link.dup = 0.3;
        s.link.delay_ns = 2'000;
        s.link.switch_poll_ns = 10'000;
        s.link.dup_delay_ns = 20'000 * slots;
        s.collectives = 3;
        s.bytes = 8192;
        s.seed = seed;
        const std::string what = describe(s) + " slots " + std::to_string(slots);
        Fabric fab(s.seed, s.link);
        std::mt19937_64 rng(s.data_seed);
        TopoNode root = build_tree(fab, s.fanins);
        ASSERT_EQ(fab.add_job(make_job(s, root, rng)), 0);
        fab.check_results_in_flight(true);
        ASSERT_TRUE(fab.run()) << what;
        expect_results(fab, 0, what);
        EXPECT_EQ(fab.stats().wrong_results, 0u) << what;
        checked += fab.stats().results_checked;
        const int switches = fanins.size() == 1 ? 1 : 3;
        for (int sw = 0; sw < switches; ++sw)
          deferred += fab.core(sw).counters().event(dp::Event::tx_deferred);
      }
    }
  }
  // The hazard really happened (a check on the test itself).
  EXPECT_GT(deferred, 0u);
  EXPECT_GT(checked, 1000u);
}

// The adaptive retransmission timer (host::RtoEstimator) on the simulated fabric: with 10% loss,
// duplication and reordering, results stay exact and no host's timeout climbs towards the
// ceiling (a chunk delayed by another rank's loss recovery is overtaken and gives no sample; the
// first attempt at an estimator fed those waits into every rank's timeout); without loss but with
// reordering, no host retransmits at all. One-chunk collectives (nothing can overtake them) and
// 32-chunk ones. Virtual time: nothing here depends on the machine's speed.
TEST(Fabric, AdaptiveTimerUnderLossStaysLowAndLosslessNeverRetransmits) {
  for (const std::size_t bytes : {std::size_t{256}, std::size_t{8192}}) {
    for (const double loss : {0.10, 0.0}) {
      Scenario s;
      s.fanins = {2, 4};
      s.link = lossy(loss, 0.05);
      s.bytes = bytes;
      s.collectives = 20;  // sizes shrink by 3 elements per collective
      s.seed = 31;
      const std::string what = describe(s) + " bytes " + std::to_string(bytes);
      Fabric fab(s.seed, s.link);
      std::mt19937_64 rng(s.data_seed);
      TopoNode root = build_tree(fab, s.fanins);
      const JobSpec spec = make_job(s, std::move(root), rng);
      ASSERT_TRUE(spec.adaptive_rto);
      const int job = fab.add_job(spec);
      ASSERT_EQ(job, 0) << what;
      ASSERT_TRUE(fab.run()) << what;
      expect_results(fab, job, what);
      std::uint64_t retx = 0;
      for (const HostNode* h : fab.hosts(job)) {
        const host::RtoEstimator& est = h->engine->rto_estimator();
        EXPECT_GT(est.samples(), 0u) << what;
        // The floor is 50 us, the ceiling 1 ms; a round trip here is tens of microseconds.
        EXPECT_LT(est.rto(fab.now()), spec.rto.ceiling_ns / 4) << what;
        retx += h->engine->stats().retransmits;
      }
      if (loss == 0.0) {
        EXPECT_EQ(retx, 0u) << what;
      } else {
        EXPECT_GT(retx, 0u) << what;  // the links did lose
      }
    }
  }
}

}  // namespace
}  // namespace treeduce::sim
