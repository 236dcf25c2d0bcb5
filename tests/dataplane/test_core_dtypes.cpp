// The switch core with every element type and operation: each defined (dtype, op) is accepted
// and exact through a one-level and a two-level tree, in normal and deterministic mode, with
// 1-, 2-, 4-, 8- and 16-byte elements; every pair with no meaning and every code the switch does
// not know is NACKed as bad_dtype_op and counted; a tree's masks refuse what they leave out; the
// count and length limits follow each type's size. Expected results come from the lab's exact
// inputs (exact_inputs.h), computed without the kernels.
#include <gtest/gtest.h>

#include <string>

#include "test_util.h"
#include "treeduce/lab/exact_inputs.h"

namespace treeduce::dp {
namespace {

using namespace testing;
using Bytes = std::vector<std::uint8_t>;

constexpr std::uint32_t kPayload = 256;
constexpr std::uint32_t kSlots = 4;

Bytes frame_to(const Endpoint& src, const Endpoint& dst, const TdHdr& h, const Bytes& payload) {
  Bytes f(kFrameHeaderBytes + payload.size());
  build_frame(f.data(), src, dst, h, payload.data(), payload.size());
  return f;
}

// A CONTRIB of `payload` for chunk `chunk` from child `child` with `ncontrib` hosts below it.
TdHdr contrib(DType d, ReduceOp op, std::uint32_t chunk, std::uint16_t child, std::size_t count,
              std::uint16_t ncontrib = 1) {
  TdHdr h =
      hdr(Opcode::contrib, chunk, child, static_cast<std::uint16_t>(count), d, kSlots, 0, ncontrib);
  h.op = static_cast<std::uint8_t>(op);
  return h;
}

// A frame the core sent, as the next hop receives it.
Bytes wire(const TxFrame& f) {
  Bytes b(f.hdr, f.hdr + kFrameHeaderBytes);
  b.insert(b.end(), f.payload, f.payload + f.payload_len);
  return b;
}

std::vector<TxFrame> feed(Core& core, const Bytes& f, std::vector<TxFrame>& tx) {
  RxFrame rx{f.data(), f.size()};
  std::size_t n = 0;
  EXPECT_EQ(core.process_burst(&rx, 1, tx.data(), tx.size(), &n), 1u);
  return {tx.begin(), tx.begin() + static_cast<std::ptrdiff_t>(n)};
}

// `world` ranks' inputs for one chunk of `count` elements and the expected result.
struct ChunkData {
  std::vector<Bytes> in;
  Bytes want;
};
ChunkData chunk_data(DType d, ReduceOp op, std::size_t count, std::uint32_t world,
                     std::uint32_t iter) {
  const exact::Inputs inputs(99, exact::Case{d, op, count, iter}, world);
  ChunkData c{std::vector<Bytes>(world, Bytes(count * dtype_size(d))),
              Bytes(count * dtype_size(d))};
  for (std::size_t i = 0; i < count; ++i) {
    for (std::uint32_t r = 0; r < world; ++r)
      exact::store(d, c.in[r].data(), i, inputs.element(r, i));
    exact::store(d, c.want.data(), i, inputs.expected(i));
  }
  return c;
}

::testing::AssertionResult same(DType d, const TxFrame& f, const Bytes& want) {
  if (f.payload_len != want.size())
    return ::testing::AssertionFailure()
           << "payload of " << f.payload_len << " bytes, not " << want.size();
  for (std::size_t i = 0; i < want.size() / dtype_size(d); ++i) {
    const exact::Elem got = exact::load(d, f.payload, i), w = exact::load(d, want.data(), i);
    if (!(got == w))
      return ::testing::AssertionFailure()
             << "element " << i << " is " << exact::show(d, got) << ", not " << exact::show(d, w);
  }
  return ::testing::AssertionSuccess();
}

std::string what(DType d, ReduceOp op, bool det, std::size_t count) {
  return std::string(name(d)) + " " + std::string(name(op)) + (det ? " det" : "") + " count " +
         std::to_string(count);
}

// One switch, three hosts: the root multicasts the exact result to each.
TEST(CoreDtypes, EveryDefinedPairOneLevel) {
  std::size_t pairs = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      ++pairs;
      for (bool det : {false, true}) {
        Harness h;
        ASSERT_TRUE(h.core.install_tree(tree_cfg(3, true, det, kSlots, kPayload)).ok());
        // A full payload, then a short last chunk in the other slot.
        const std::size_t full = kPayload / dtype_size(d);
        for (std::uint32_t chunk : {0u, 1u}) {
          const std::size_t count = chunk == 0 ? full : full / 2 - 1;
          const ChunkData c = chunk_data(d, op, count, 3, chunk);
          std::vector<TxFrame> out;
          for (std::uint16_t k : {2, 0, 1}) {
            out = h.feed(frame_to(child_ep(k), kSwitch, contrib(d, op, chunk, k, count), c.in[k]));
            if (k != 1) {
              ASSERT_TRUE(out.empty()) << what(d, op, det, count);
            }
          }
          ASSERT_EQ(out.size(), 3u) << what(d, op, det, count);
          for (const TxFrame& f : out) {
            EXPECT_EQ(td_of(f).opcode, static_cast<std::uint8_t>(Opcode::result));
            EXPECT_EQ(td_of(f).dtype, static_cast<std::uint8_t>(d));
            EXPECT_EQ(td_of(f).op, static_cast<std::uint8_t>(op));
            EXPECT_EQ(td_of(f).count.get(), count);
            EXPECT_TRUE(same(d, f, c.want)) << what(d, op, det, count);
          }
        }
        EXPECT_EQ(h.core.counters().event(Event::contrib_accepted), 6u);
        EXPECT_EQ(h.core.counters().event(Event::nack_sent), 0u);
      }
    }
  }
  EXPECT_EQ(pairs, 110u);
}

// Two leaves (two hosts and one) under a root: partials go up in the wire type, the root's RESULT
// comes down through the leaves to every host, exact.
TEST(CoreDtypes, EveryDefinedPairTwoLevels) {
  const Endpoint root_ep = ep(1, kDefaultUdpPort);
  const Endpoint leaf_ep[2] = {ep(11, kDefaultUdpPort), ep(12, kDefaultUdpPort)};
  const std::uint16_t hosts_of[2] = {2, 1};
  std::vector<TxFrame> tx(kMaxChildren * 4);
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      for (bool det : {false, true}) {
        Core root(CoreConfig{root_ep});
        TreeConfig rc = tree_cfg(2, true, det, kSlots, kPayload);
        rc.children = {{leaf_ep[0], 2}, {leaf_ep[1], 1}};
        ASSERT_TRUE(root.install_tree(rc).ok());
        std::unique_ptr<Core> leaf[2];
        for (int l = 0; l < 2; ++l) {
          leaf[l] = std::make_unique<Core>(CoreConfig{leaf_ep[l]});
          TreeConfig lc = tree_cfg(hosts_of[l], false, det, kSlots, kPayload);
          lc.parent = root_ep;
          lc.index_at_parent = static_cast<std::uint16_t>(l);
          lc.children.clear();
          for (std::uint16_t k = 0; k < hosts_of[l]; ++k)
            lc.children.push_back({child_ep(static_cast<std::uint16_t>(10 * l + k)), 1});
          ASSERT_TRUE(leaf[l]->install_tree(lc).ok());
        }
        const std::size_t count = kPayload / dtype_size(d);
        const std::uint32_t chunk = 5;  // slot 1, version 1
        const ChunkData c = chunk_data(d, op, count, 3, 0);
        // Ranks 0 and 1 under leaf 0, rank 2 under leaf 1; leaf 1's partial arrives first.
        std::vector<Bytes> partials(2);
        for (int l : {1, 0}) {
          std::vector<TxFrame> out;
          for (std::uint16_t k = 0; k < hosts_of[l]; ++k) {
            const std::uint32_t rank = l == 0 ? k : 2;
            out = feed(*leaf[l],
                       frame_to(child_ep(static_cast<std::uint16_t>(10 * l + k)), leaf_ep[l],
                                contrib(d, op, chunk, k, count), c.in[rank]),
                       tx);
          }
          ASSERT_EQ(out.size(), 1u) << what(d, op, det, count);
          EXPECT_EQ(td_of(out[0]).ncontrib.get(), hosts_of[l]);
          partials[static_cast<std::size_t>(l)] = wire(out[0]);
        }
        EXPECT_TRUE(feed(root, partials[1], tx).empty());
        const auto results = feed(root, partials[0], tx);
        ASSERT_EQ(results.size(), 2u) << what(d, op, det, count);
        std::vector<Bytes> down;
        for (const TxFrame& f : results) {
          EXPECT_TRUE(same(d, f, c.want)) << what(d, op, det, count) << " at the root";
          down.push_back(wire(f));
        }
        for (int l = 0; l < 2; ++l) {
          const auto out = feed(*leaf[l], down[static_cast<std::size_t>(l)], tx);
          ASSERT_EQ(out.size(), hosts_of[l]) << what(d, op, det, count);
          for (const TxFrame& f : out) {
            EXPECT_EQ(td_of(f).ncontrib.get(), 3);
            EXPECT_TRUE(same(d, f, c.want)) << what(d, op, det, count) << " at leaf " << l;
          }
        }
      }
    }
  }
}

// Every pair with no meaning, and every code no switch knows (dtype 17..255, op 12..255), is
// refused with a bad_dtype_op NACK, counted, and touches no slot.
TEST(CoreDtypes, UndefinedPairsAndUnknownCodesAreNacked) {
  Harness h;
  ASSERT_TRUE(h.core.install_tree(tree_cfg(2, true, false, kSlots, kPayload)).ok());
  std::uint64_t sent = 0;
  const auto expect_nack = [&](std::uint8_t dt, std::uint8_t op) {
    TdHdr t = hdr(Opcode::contrib, 0, 0, 1, DType::f32, kSlots);
    t.dtype = dt;
    t.op = op;
    const auto out = h.feed(frame_to(child_ep(0), kSwitch, t, Bytes(4, 0)));
    ++sent;
    ASSERT_EQ(out.size(), 1u) << int(dt) << " " << int(op);
    const TdHdr n = td_of(out[0]);
    EXPECT_EQ(n.opcode, static_cast<std::uint8_t>(Opcode::nack));
    EXPECT_EQ(n.reason, static_cast<std::uint8_t>(DropReason::bad_dtype_op))
        << int(dt) << " " << int(op);
    // The NACK echoes the codes it refuses, so the host can say which.
    EXPECT_EQ(n.dtype, dt);
    EXPECT_EQ(n.op, op);
  };
  std::size_t undefined = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (op_defined(d, op)) continue;
      ++undefined;
      expect_nack(static_cast<std::uint8_t>(d), static_cast<std::uint8_t>(op));
    }
  }
  EXPECT_EQ(undefined, kNumDTypes * kNumReduceOps - 110);
  for (unsigned dt = kNumDTypes; dt <= 255; ++dt) expect_nack(static_cast<std::uint8_t>(dt), 0);
  for (unsigned op = kNumReduceOps; op <= 255; ++op) expect_nack(0, static_cast<std::uint8_t>(op));
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_dtype_op), sent);
  EXPECT_EQ(h.core.tree_counters(5)->drop(DropReason::bad_dtype_op), sent);
  EXPECT_EQ(h.core.counters().event(Event::nack_sent), sent);
  EXPECT_EQ(h.core.counters().event(Event::contrib_accepted), 0u);
  SlotView v;
  ASSERT_EQ(h.core.slot_view(5, 0, 0, &v), 0);
  EXPECT_EQ(v.state, SlotState::empty);
}

// A tree allows only what its masks name: i8 and f64, sum and bxor. f64 bxor has no meaning,
// i8 max is masked out by ops, u8 sum by dtypes.
TEST(CoreDtypes, TheTreesMasksRefuseWhatTheyLeaveOut) {
  Harness h;
  TreeConfig t = tree_cfg(1, true, false, kSlots, kPayload);
  t.dtype_mask = bit(DType::i8) | bit(DType::f64);
  t.op_mask = bit(ReduceOp::sum) | bit(ReduceOp::bxor);
  ASSERT_TRUE(h.core.install_tree(t).ok());
  struct Case {
    DType d;
    ReduceOp op;
    bool accepted;
  };
  const Case cases[] = {
      {DType::i8, ReduceOp::sum, true},   {DType::i8, ReduceOp::bxor, true},
      {DType::f64, ReduceOp::sum, true},  {DType::f64, ReduceOp::bxor, false},
      {DType::i8, ReduceOp::max, false},  {DType::u8, ReduceOp::sum, false},
      {DType::f32, ReduceOp::sum, false}, {DType::i8, ReduceOp::minloc, false},
  };
  std::uint32_t chunk = 0;
  std::uint64_t refused = 0;
  for (const Case& c : cases) {
    const auto out = h.feed(frame_to(child_ep(0), kSwitch, contrib(c.d, c.op, chunk, 0, 2),
                                     Bytes(2 * dtype_size(c.d), 3)));
    ASSERT_EQ(out.size(), 1u);
    const TdHdr td = td_of(out[0]);
    if (c.accepted) {
      EXPECT_EQ(td.opcode, static_cast<std::uint8_t>(Opcode::result)) << what(c.d, c.op, false, 2);
      ++chunk;
    } else {
      EXPECT_EQ(td.opcode, static_cast<std::uint8_t>(Opcode::nack)) << what(c.d, c.op, false, 2);
      EXPECT_EQ(td.reason, static_cast<std::uint8_t>(DropReason::bad_dtype_op));
      ++refused;
    }
  }
  EXPECT_EQ(h.core.counters().drop(DropReason::bad_dtype_op), refused);
}

// The element count limit and the payload length follow the type's size: payload_bytes /
// dtype_size elements at most (256 i8, 16 f64_i32 in 256 bytes), count x dtype_size bytes.
TEST(CoreDtypes, CountAndLengthFollowTheElementSize) {
  for (DType d : kAllDTypes) {
    const ReduceOp op = is_pair(d) ? ReduceOp::minloc : ReduceOp::max;
    const std::size_t es = dtype_size(d), max = kPayload / es;
    Harness h;
    ASSERT_TRUE(h.core.install_tree(tree_cfg(1, true, false, kSlots, kPayload)).ok());
    auto out = h.feed(
        frame_to(child_ep(0), kSwitch, contrib(d, op, 0, 0, max + 1), Bytes((max + 1) * es, 0)));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(td_of(out[0]).reason, static_cast<std::uint8_t>(DropReason::bad_count)) << name(d);
    // One byte short of count x dtype_size.
    out = h.feed(frame_to(child_ep(0), kSwitch, contrib(d, op, 0, 0, max), Bytes(max * es - 1, 0)));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(td_of(out[0]).reason, static_cast<std::uint8_t>(DropReason::bad_length)) << name(d);
    // A whole element too many for the count.
    out = h.feed(frame_to(child_ep(0), kSwitch, contrib(d, op, 0, 0, max - 1), Bytes(max * es, 0)));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(td_of(out[0]).reason, static_cast<std::uint8_t>(DropReason::bad_length)) << name(d);
    out = h.feed(frame_to(child_ep(0), kSwitch, contrib(d, op, 0, 0, max), Bytes(max * es, 0)));
    ASSERT_EQ(out.size(), 1u);
    EXPECT_EQ(td_of(out[0]).opcode, static_cast<std::uint8_t>(Opcode::result)) << name(d);
    EXPECT_EQ(out[0].payload_len, max * es);
  }
}

// f64_i32's padding: garbage on input, zero in every result, through normal and deterministic
// mode and a partial sent up.
TEST(CoreDtypes, PairPaddingIsIgnoredAndZeroed) {
  for (bool det : {false, true}) {
    for (bool root : {true, false}) {
      Harness h;
      ASSERT_TRUE(h.core.install_tree(tree_cfg(2, root, det, kSlots, kPayload)).ok());
      Bytes a(16 * 3, 0xFF), b(16 * 3, 0xEE);  // NaN values with payloads, and garbage
      for (std::size_t i = 0; i < 3; ++i) {
        const double x = static_cast<double>(i), y = -static_cast<double>(i);
        const std::int32_t ia = 7, ib = -7;
        std::memcpy(&a[16 * i], &x, 8);
        std::memcpy(&a[16 * i + 8], &ia, 4);
        std::memcpy(&b[16 * i], &y, 8);
        std::memcpy(&b[16 * i + 8], &ib, 4);
      }
      h.feed(frame_to(child_ep(0), kSwitch, contrib(DType::f64_i32, ReduceOp::minloc, 0, 0, 3), a));
      const auto out = h.feed(
          frame_to(child_ep(1), kSwitch, contrib(DType::f64_i32, ReduceOp::minloc, 0, 1, 3), b));
      ASSERT_EQ(out.size(), root ? 2u : 1u);
      for (std::size_t i = 0; i < 3; ++i) {
        double v;
        std::int32_t idx;
        std::uint32_t pad;
        std::memcpy(&v, out[0].payload + 16 * i, 8);
        std::memcpy(&idx, out[0].payload + 16 * i + 8, 4);
        std::memcpy(&pad, out[0].payload + 16 * i + 12, 4);
        // 0 vs -0 at i = 0: -0 is below +0.
        EXPECT_EQ(std::bit_cast<std::uint64_t>(v),
                  std::bit_cast<std::uint64_t>(-static_cast<double>(i)));
        EXPECT_EQ(idx, -7);
        EXPECT_EQ(pad, 0u) << det << root;
      }
    }
  }
}

}  // namespace
}  // namespace treeduce::dp
