// The integer types and f64 on every path against the semantics stated in the tests themselves
// (intsem.h), not against scalar_ops.h:
// - every 8-bit operand pair for every operation (load, accumulate, reduce, emit);
// - every 16-bit value against a sample of the other operand, both ways round (every pair: the
//   slow suite, test_exhaustive.cpp);
// - random and extreme 32- and 64-bit operands, wrap at the extremes;
// - f64's signed zeros, NaNs, infinities and subnormals;
// - order independence: every permutation of the payloads gives the same bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "intsem.h"
#include "testdata.h"
#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

using treeduce::testing::expected;
using treeduce::testing::expected_load;

template <class T>
::testing::AssertionResult same_values(const std::vector<T>& want, const std::vector<T>& got,
                                       const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      using P = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
      return ::testing::AssertionFailure()
             << "element " << i << " (a=" << static_cast<P>(a[i]) << ", b=" << static_cast<P>(b[i])
             << "): want " << static_cast<P>(want[i]) << ", got " << static_cast<P>(got[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// acc = a (as raw accumulator bits), then every kernel of (d, op) on a path, each checked
// element by element against intsem.h: load(b), accumulate(a, b), reduce(a, b), reduce(a, b, a),
// emit.
template <class T>
void check_pairs(DType d, const std::vector<T>& a, const std::vector<T>& b) {
  const std::size_t n = a.size();
  for (Isa isa : supported_isas()) {
    const KernelTable& t = *kernels_for(isa);
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      SCOPED_TRACE(::testing::Message() << name(isa) << " " << name(d) << " " << name(op));
      std::vector<T> want(n), got(n);

      for (std::size_t i = 0; i < n; ++i) want[i] = expected_load(op, b[i]);
      t.load_fn(d, op)(got.data(), b.data(), n);
      ASSERT_TRUE(same_values(want, got, b, b)) << "load";

      for (std::size_t i = 0; i < n; ++i) want[i] = expected(op, a[i], b[i]);
      got = a;
      t.accumulate_fn(d, op)(got.data(), b.data(), n);
      ASSERT_TRUE(same_values(want, got, a, b)) << "accumulate";

      for (std::size_t i = 0; i < n; ++i) want[i] = expected(op, expected_load(op, a[i]), b[i]);
      const void* two[] = {a.data(), b.data()};
      t.reduce_fn(d, op)(got.data(), two, 2, n);
      ASSERT_TRUE(same_values(want, got, a, b)) << "reduce k=2";

      for (std::size_t i = 0; i < n; ++i) want[i] = expected(op, want[i], a[i]);
      const void* three[] = {a.data(), b.data(), a.data()};
      t.reduce_fn(d, op)(got.data(), three, 3, n);
      ASSERT_TRUE(same_values(want, got, a, b)) << "reduce k=3";
    }
    std::vector<T> out(n);
    t.emit_fn(d)(out.data(), a.data(), n);
    ASSERT_TRUE(same_values(a, out, a, a)) << name(isa) << " emit";
  }
}

template <class T>
void every_8bit_pair(DType d) {
  std::vector<T> a(1u << 16), b(1u << 16);
  for (unsigned k = 0; k < (1u << 16); ++k) {
    a[k] = static_cast<T>(k >> 8);
    b[k] = static_cast<T>(k & 0xFF);
  }
  check_pairs(d, a, b);
}

TEST(Exhaustive8, EveryOperandPairOfI8) { every_8bit_pair<std::int8_t>(DType::i8); }
TEST(Exhaustive8, EveryOperandPairOfU8) { every_8bit_pair<std::uint8_t>(DType::u8); }

// Every 16-bit value against a sample of the other operand (edges, bit patterns, random), in both
// positions.
template <class T>
void every_16bit_value(DType d) {
  std::vector<std::uint16_t> sample = {0,      1,      2,      3,      0xFFFF, 0xFFFE, 0x7FFF,
                                       0x8000, 0x8001, 0x00FF, 0x0100, 0x0080, 0xFF7F, 0x5555,
                                       0xAAAA, 0x1234, 0xFEDC, 0x4000, 0xC000, 0x0101};
  std::mt19937_64 rng(16);
  while (sample.size() < 32) sample.push_back(static_cast<std::uint16_t>(rng()));
  std::vector<T> all, s;
  for (std::uint16_t x : sample) {
    for (unsigned v = 0; v < (1u << 16); ++v) {
      all.push_back(static_cast<T>(v));
      s.push_back(static_cast<T>(x));
    }
  }
  check_pairs(d, all, s);
  check_pairs(d, s, all);
}

TEST(Sample16, EveryValueOfI16AgainstASample) { every_16bit_value<std::int16_t>(DType::i16); }
TEST(Sample16, EveryValueOfU16AgainstASample) { every_16bit_value<std::uint16_t>(DType::u16); }

// 32- and 64-bit: random operands with the extremes, 0, +-1 and small values mixed in (testdata.h),
// over several vectors and a tail.
template <class T>
void random_wide(DType d) {
  std::mt19937_64 rng(3264);
  constexpr std::size_t n = 4099;
  for (int round = 0; round < 8; ++round) {
    const auto pa = treeduce::testing::random_payload(d, n, rng);
    const auto pb = treeduce::testing::random_payload(d, n, rng);
    std::vector<T> a(n), b(n);
    std::memcpy(a.data(), pa.data(), n * sizeof(T));
    std::memcpy(b.data(), pb.data(), n * sizeof(T));
    check_pairs(d, a, b);
  }
}

TEST(Wide, RandomAndExtremeI32) { random_wide<std::int32_t>(DType::i32); }
TEST(Wide, RandomAndExtremeU32) { random_wide<std::uint32_t>(DType::u32); }
TEST(Wide, RandomAndExtremeI64) { random_wide<std::int64_t>(DType::i64); }
TEST(Wide, RandomAndExtremeU64) { random_wide<std::uint64_t>(DType::u64); }

// Wrap at the extremes, written out: max + 1 = min; min + (all ones) = max; max * 2 = all ones but
// bit 0 (-2, or the unsigned max - 1); max * max = 1; min * (all ones) = min (-min wraps to min,
// and unsigned 0 * max = 0).
template <class T>
void wraps(DType d) {
  using L = std::numeric_limits<T>;
  constexpr std::size_t n = 67;  // vectors and a tail on every path
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(::testing::Message() << name(isa) << " " << name(d));
    const KernelTable& t = *kernels_for(isa);
    auto run = [&](ReduceOp op, T x, T y) {
      std::vector<T> acc(n, x), in(n, y);
      t.accumulate_fn(d, op)(acc.data(), in.data(), n);
      for (std::size_t i = 1; i < n; ++i) EXPECT_EQ(acc[i], acc[0]);
      return acc[n - 1];
    };
    const auto all_ones = static_cast<T>(~T{0});    // -1, or the unsigned maximum
    const auto ones_but_1 = static_cast<T>(~T{1});  // -2, or the unsigned maximum - 1
    EXPECT_EQ(run(ReduceOp::sum, L::max(), T{1}), L::min());
    EXPECT_EQ(run(ReduceOp::sum, L::min(), all_ones), L::max());
    EXPECT_EQ(run(ReduceOp::prod, L::max(), T{2}), ones_but_1);
    EXPECT_EQ(run(ReduceOp::prod, L::max(), L::max()), T{1});
    EXPECT_EQ(run(ReduceOp::prod, L::min(), all_ones), L::min());  // -min = min; 0 * max = 0
    EXPECT_EQ(run(ReduceOp::min, L::min(), L::max()), L::min());
    EXPECT_EQ(run(ReduceOp::max, L::min(), L::max()), L::max());
    EXPECT_EQ(run(ReduceOp::min, T{0}, all_ones), L::is_signed ? all_ones : T{0});
  }
}

TEST(Wide, WrapAtTheExtremes) {
  wraps<std::int8_t>(DType::i8);
  wraps<std::uint8_t>(DType::u8);
  wraps<std::int16_t>(DType::i16);
  wraps<std::uint16_t>(DType::u16);
  wraps<std::int32_t>(DType::i32);
  wraps<std::uint32_t>(DType::u32);
  wraps<std::int64_t>(DType::i64);
  wraps<std::uint64_t>(DType::u64);
}

// f64 on every path: hand-picked operands, each case repeated over vectors and a tail.
TEST(F64, SignedZerosNansInfinitiesAndSubnormals) {
  const double nan_payload = std::bit_cast<double>(0xFFF0000000000123ull);  // signalling, negative
  const double quiet = std::bit_cast<double>(0x7FF8000000ABCDEFull);
  const double sub = std::bit_cast<double>(1ull);  // 2^-1074
  struct Case {
    double a, b;
    ReduceOp op;
    std::uint64_t want;  // accumulator bits (min/max: exact; sum/prod: NaN checked after emit)
  };
  const auto bits = [](double x) { return std::bit_cast<std::uint64_t>(x); };
  const Case cases[] = {
      {0.0, -0.0, ReduceOp::min, bits(-0.0)},
      {-0.0, 0.0, ReduceOp::min, bits(-0.0)},
      {0.0, -0.0, ReduceOp::max, bits(0.0)},
      {-0.0, 0.0, ReduceOp::max, bits(0.0)},
      {nan_payload, 1.0, ReduceOp::min, kCanonicalNanF64},
      {1.0, nan_payload, ReduceOp::min, kCanonicalNanF64},
      {quiet, -INFINITY, ReduceOp::max, kCanonicalNanF64},
      {INFINITY, quiet, ReduceOp::max, kCanonicalNanF64},
      {-INFINITY, 5.0, ReduceOp::min, bits(-INFINITY)},
      {INFINITY, 5.0, ReduceOp::max, bits(INFINITY)},
      {sub, -sub, ReduceOp::min, bits(-sub)},
      {sub, 0.0, ReduceOp::max, bits(sub)},
      {sub, sub, ReduceOp::sum, bits(2 * sub)},  // no flush to zero
      {-0.0, -0.0, ReduceOp::sum, bits(-0.0)},
      {0x1p-1000, 0x1p-74, ReduceOp::prod, bits(sub)},  // subnormal result, exact
      {INFINITY, -INFINITY, ReduceOp::sum, kCanonicalNanF64},
      {0.0, INFINITY, ReduceOp::prod, kCanonicalNanF64},
      {0x1p1000, 0x1p100, ReduceOp::prod, bits(INFINITY)},
      {1.0, 0x1p-53, ReduceOp::sum, bits(1.0)},  // binary64 rounding: ties to even
      {1.0, 0x1.8p-53, ReduceOp::sum, bits(1.0 + 0x1p-52)},
  };
  constexpr std::size_t n = 21;
  for (Isa isa : supported_isas()) {
    const KernelTable& t = *kernels_for(isa);
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << name(isa) << " " << name(c.op) << "(" << c.a << ", " << c.b << ")");
      std::vector<double> acc(n), a(n, c.a), b(n, c.b), out(n);
      t.load_fn(DType::f64, c.op)(acc.data(), a.data(), n);
      ASSERT_EQ(std::memcmp(acc.data(), a.data(), n * 8), 0) << "load keeps every bit";
      t.accumulate_fn(DType::f64, c.op)(acc.data(), b.data(), n);
      t.emit_fn(DType::f64)(out.data(), acc.data(), n);
      for (std::size_t i = 0; i < n; ++i) {
        if (c.op == ReduceOp::min || c.op == ReduceOp::max) {
          ASSERT_EQ(bits(acc[i]), c.want) << "accumulator " << i;
        }
        ASSERT_EQ(bits(out[i]), c.want) << "emitted " << i;
      }
    }
  }
}

// Order independence: integer operations (modular arithmetic, exact min/max, bitwise, logical)
// and float min/max give the same bits for every order of the payloads, on every path, through
// reduce and through load + accumulate.
void check_permutations(DType d, ReduceOp op, std::mt19937_64& rng) {
  constexpr std::size_t kK = 4, n = 77;
  std::vector<std::vector<unsigned char>> in;
  for (std::size_t j = 0; j < kK; ++j) in.push_back(treeduce::testing::random_payload(d, n, rng));
  const std::size_t size = acc_size(d);
  std::vector<unsigned char> first;
  for (Isa isa : supported_isas()) {
    const KernelTable& t = *kernels_for(isa);
    std::array<std::size_t, kK> order;
    std::iota(order.begin(), order.end(), 0);
    do {
      SCOPED_TRACE(::testing::Message()
                   << name(isa) << " " << name(d) << " " << name(op) << " order " << order[0]
                   << order[1] << order[2] << order[3]);
      std::vector<const void*> ptrs;
      for (std::size_t j : order) ptrs.push_back(in[j].data());
      std::vector<unsigned char> r(n * size), s(n * size);
      t.reduce_fn(d, op)(r.data(), ptrs.data(), kK, n);
      t.load_fn(d, op)(s.data(), ptrs[0], n);
      for (std::size_t j = 1; j < kK; ++j) t.accumulate_fn(d, op)(s.data(), ptrs[j], n);
      if (first.empty()) first = r;
      ASSERT_EQ(r, first) << "reduce";
      ASSERT_EQ(s, first) << "load + accumulate";
    } while (std::next_permutation(order.begin(), order.end()));
  }
}

TEST(Order, EveryPermutationGivesTheSameBits) {
  std::mt19937_64 rng(24);
  for (DType d : kAllDTypes) {
    if (is_pair(d)) continue;
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      if (is_float(d) && (op == ReduceOp::sum || op == ReduceOp::prod)) continue;  // rounding
      check_permutations(d, op, rng);
    }
  }
}

}  // namespace
}  // namespace treeduce::agg
