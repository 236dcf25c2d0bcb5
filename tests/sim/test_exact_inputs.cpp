// The lab's exactly checkable inputs (lab/include/treeduce/lab/exact_inputs.h) against the scalar
// reference kernels: for every defined (dtype, op), the expected result computed independently
// by Inputs::expected() is what the switch's arithmetic gives under any grouping and order of the
// ranks, with partials emitted in the wire type at every level, as a tree of switches does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "treeduce/aggregation/kernels.h"
#include "treeduce/lab/exact_inputs.h"

namespace treeduce::exact {
namespace {

using Bytes = std::vector<std::uint8_t>;

// One switch: the children's payloads folded in the given order (deterministic mode's reduce),
// emitted in the wire type.
Bytes fold(DType d, ReduceOp op, const std::vector<const Bytes*>& kids, std::size_t count) {
  const agg::KernelTable* k = agg::kernels_for(agg::Isa::scalar);
  std::vector<const void*> ptrs;
  for (const Bytes* b : kids) ptrs.push_back(b->data());
  std::vector<std::uint8_t> acc(count * acc_size(d));
  Bytes out(count * dtype_size(d));
  k->reduce_fn(d, op)(acc.data(), ptrs.data(), ptrs.size(), count);
  k->emit_fn(d)(out.data(), acc.data(), count);
  return out;
}

// The ranks' inputs reduced by a random tree: shuffle, cut into groups of 1..4, fold each group,
// repeat until one payload is left.
Bytes random_tree(DType d, ReduceOp op, std::vector<Bytes> level, std::size_t count,
                  std::mt19937_64& rng) {
  while (level.size() > 1) {
    std::shuffle(level.begin(), level.end(), rng);
    std::vector<Bytes> up;
    for (std::size_t at = 0; at < level.size();) {
      const std::size_t n = std::min<std::size_t>(1 + rng() % 4, level.size() - at);
      std::vector<const Bytes*> kids;
      for (std::size_t j = 0; j < n; ++j) kids.push_back(&level[at + j]);
      up.push_back(fold(d, op, kids, count));
      at += n;
    }
    level = std::move(up);
  }
  return fold(d, op, {&level[0]}, count);  // the root emits even a single child's payload
}

// The inputs make the hard cases common: both logical results, wrapped integer sums, MINLOC ties
// won by the lower index, NaN values, and the padding garbage of f64_i32 on input.
TEST(ExactInputs, HardCasesAreCommon) {
  constexpr std::uint32_t kWorld = 4;
  constexpr std::size_t kCount = 2000;
  for (ReduceOp op : {ReduceOp::land, ReduceOp::lor, ReduceOp::lxor}) {
    const Inputs in(3, Case{DType::i16, op, kCount, 0}, kWorld);
    std::size_t ones = 0, low_byte_zero = 0;
    for (std::size_t i = 0; i < kCount; ++i) {
      ones += bits_of(in.expected(i));
      for (std::uint32_t r = 0; r < kWorld; ++r) {
        const std::uint64_t v = bits_of(in.element(r, i));
        low_byte_zero += v != 0 && (v & 0xFF) == 0;
      }
    }
    EXPECT_GT(ones, kCount / 8) << name(op);
    EXPECT_LT(ones, kCount - kCount / 8) << name(op);
    EXPECT_GT(low_byte_zero, kCount / 8) << name(op);
  }
  {
    const Inputs in(3, Case{DType::u8, ReduceOp::sum, kCount, 0}, kWorld);
    std::size_t wrapped = 0;
    for (std::size_t i = 0; i < kCount; ++i) {
      std::uint64_t s = 0;
      for (std::uint32_t r = 0; r < kWorld; ++r) s += bits_of(in.element(r, i));
      wrapped += s > 0xFF;
      EXPECT_EQ(bits_of(in.expected(i)), s & 0xFF);
    }
    EXPECT_GT(wrapped, kCount / 2);
  }
  for (DType d : {DType::f32_i32, DType::f64_i32, DType::i32_i32}) {
    const Inputs in(3, Case{d, ReduceOp::minloc, kCount, 0}, kWorld);
    const std::size_t vs = d == DType::f64_i32 ? 8 : 4;
    std::size_t nan = 0, ties = 0, pad = 0;
    for (std::size_t i = 0; i < kCount; ++i) {
      const Elem e = in.expected(i);
      std::int32_t want_i;
      std::memcpy(&want_i, e.b.data() + vs, 4);
      std::size_t same = 0;
      bool lowest = true;
      for (std::uint32_t r = 0; r < kWorld; ++r) {
        const Elem x = in.element(r, i);
        std::int32_t xi;
        std::memcpy(&xi, x.b.data() + vs, 4);
        if (std::memcmp(x.b.data(), e.b.data(), vs) == 0) {
          ++same;
          if (xi < want_i) lowest = false;
        }
        if (d == DType::f64_i32 && (x.b[12] | x.b[13] | x.b[14] | x.b[15]) != 0) ++pad;
      }
      EXPECT_TRUE(lowest) << name(d) << " element " << i << ": " << show(d, e);
      ties += same > 1;
      if (d == DType::f32_i32) nan += bits_of(e) == agg::kCanonicalNanF32;
      if (d == DType::f64_i32) {
        nan += bits_of(e) == agg::kCanonicalNanF64;
        EXPECT_EQ(e.b[12] | e.b[13] | e.b[14] | e.b[15], 0);
      }
    }
    EXPECT_GT(ties, kCount / 8) << name(d);
    if (d != DType::i32_i32) {
      EXPECT_GT(nan, kCount / 32) << name(d);
    }
    if (d == DType::f64_i32) {
      EXPECT_GT(pad, kCount) << name(d);
    }
  }
}

TEST(ExactInputs, EveryPairIsExactUnderAnyTree) {
  std::mt19937_64 rng(11);
  std::size_t pairs = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      ++pairs;
      for (std::uint32_t world : {1u, 2u, 3u, 5u, 8u}) {
        if (is_float(d) && op == ReduceOp::sum && sum_bound(d, world) == 0) continue;
        const std::size_t count = 700;
        const Inputs in(7, Case{d, op, count, world}, world);
        std::vector<Bytes> ranks(world, Bytes(count * dtype_size(d)));
        Bytes want(count * dtype_size(d));
        for (std::size_t i = 0; i < count; ++i) {
          for (std::uint32_t r = 0; r < world; ++r) store(d, ranks[r].data(), i, in.element(r, i));
          store(d, want.data(), i, in.expected(i));
        }
        for (int trial = 0; trial < 3; ++trial) {
          const Bytes got = random_tree(d, op, ranks, count, rng);
          for (std::size_t i = 0; i < count; ++i) {
            ASSERT_EQ(load(d, got.data(), i), load(d, want.data(), i))
                << name(d) << " " << name(op) << " world " << world << " element " << i << ": "
                << show(d, load(d, got.data(), i)) << " vs " << show(d, load(d, want.data(), i));
          }
        }
      }
    }
  }
  // 8 integer types x 10 operations, 6 float types x 4, 3 pair types x 2.
  EXPECT_EQ(pairs, 110u);
}

}  // namespace
}  // namespace treeduce::exact
