// Every SIMD path against the scalar reference, bit for bit, for every dtype x op, every length
// from 0 to 1025, on random data with special values mixed in.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "testdata.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

using treeduce::testing::random_payload;
using treeduce::testing::same_lane;

constexpr std::size_t kMaxLen = 1025;

std::vector<std::uint32_t> lanes_of(const std::vector<unsigned char>& b, std::size_t n) {
  std::vector<std::uint32_t> out(n);
  if (n != 0) std::memcpy(out.data(), b.data(), n * 4);
  return out;
}

// Compares n accumulator lanes; on the first mismatch, says where.
::testing::AssertionResult same_acc(const std::vector<std::uint32_t>& want,
                                    const std::vector<std::uint32_t>& got, bool nan_equal) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (!same_lane(want[i], got[i], nan_equal)) {
      return ::testing::AssertionFailure()
             << "lane " << i << ": scalar 0x" << std::hex << want[i] << ", simd 0x" << got[i];
    }
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult same_bytes(const std::vector<unsigned char>& want,
                                      const std::vector<unsigned char>& got) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure() << "byte " << i << ": scalar 0x" << std::hex
                                           << int{want[i]} << ", simd 0x" << int{got[i]};
    }
  }
  return ::testing::AssertionSuccess();
}

class KernelPath : public ::testing::TestWithParam<Isa> {};

TEST_P(KernelPath, MatchesScalarForEveryDtypeOpAndLength) {
  const KernelTable& ref = *kernels_for(Isa::scalar);
  const KernelTable* simd = kernels_for(GetParam());
  ASSERT_NE(simd, nullptr);
  std::mt19937_64 rng(1234 + static_cast<int>(GetParam()));
  for (DType d : kAllDTypes) {
    const std::size_t es = dtype_size(d);
    for (std::size_t n = 0; n <= kMaxLen; ++n) {
      SCOPED_TRACE(::testing::Message() << name(d) << " n=" << n);
      constexpr std::size_t kK = 5;
      std::vector<std::vector<unsigned char>> in;
      std::vector<const void*> ptrs;
      for (std::size_t j = 0; j < kK; ++j) in.push_back(random_payload(d, n, rng));
      for (auto& p : in) ptrs.push_back(p.data());

      // load: exact, including NaN payloads.
      std::vector<unsigned char> a_ref(n * 4 + 1), a_simd(n * 4 + 1, 0xAB);
      a_ref.back() = 0xAB;
      ref.load_fn(d, ReduceOp::sum)(a_ref.data(), in[0].data(), n);
      simd->load_fn(d, ReduceOp::sum)(a_simd.data(), in[0].data(), n);
      ASSERT_TRUE(same_acc(lanes_of(a_ref, n), lanes_of(a_simd, n), false)) << "load";
      ASSERT_EQ(a_simd.back(), 0xAB) << "load wrote past the end";

      for (ReduceOp op : kAllReduceOps) {
        SCOPED_TRACE(name(op));
        const bool nan_equal = op == ReduceOp::sum && is_float(d);
        // accumulate: start both from the same accumulator, add the other payloads one by one.
        std::vector<unsigned char> r = a_ref, s = a_ref;
        for (std::size_t j = 1; j < kK; ++j) {
          ref.accumulate_fn(d, op)(r.data(), in[j].data(), n);
          simd->accumulate_fn(d, op)(s.data(), in[j].data(), n);
        }
        ASSERT_TRUE(same_acc(lanes_of(r, n), lanes_of(s, n), nan_equal)) << "accumulate";
        ASSERT_EQ(s.back(), 0xAB) << "accumulate wrote past the end";

        // reduce for every fan-in 1..k.
        for (std::size_t k = 1; k <= kK; ++k) {
          std::vector<unsigned char> rr(n * 4 + 1, 0xAB), rs(n * 4 + 1, 0xAB);
          ref.reduce_fn(d, op)(rr.data(), ptrs.data(), k, n);
          simd->reduce_fn(d, op)(rs.data(), ptrs.data(), k, n);
          ASSERT_TRUE(same_acc(lanes_of(rr, n), lanes_of(rs, n), nan_equal)) << "reduce k=" << k;
          ASSERT_EQ(rs.back(), 0xAB) << "reduce wrote past the end";
        }

        // emit: exact bytes, including canonical NaNs. Emit the scalar accumulator through both
        // paths so that a NaN payload difference above cannot hide here.
        std::vector<unsigned char> er(n * es + 1, 0xCD), esimd(n * es + 1, 0xCD);
        ref.emit_fn(d)(er.data(), r.data(), n);
        simd->emit_fn(d)(esimd.data(), r.data(), n);
        ASSERT_TRUE(same_bytes(er, esimd)) << "emit";
      }
      // emit of arbitrary accumulator bits (every float pattern class), not just sums.
      auto raw = random_payload(d == DType::i32 ? DType::i32 : DType::f32, n, rng);
      std::vector<unsigned char> er(n * es + 1, 0xCD), esimd(n * es + 1, 0xCD);
      ref.emit_fn(d)(er.data(), raw.data(), n);
      simd->emit_fn(d)(esimd.data(), raw.data(), n);
      ASSERT_TRUE(same_bytes(er, esimd)) << "emit of raw accumulator";
    }
  }
}

TEST_P(KernelPath, EmitInPlaceFor32BitTypes) {
  const KernelTable* t = kernels_for(GetParam());
  ASSERT_NE(t, nullptr);
  std::vector<float> v = {1.0f, -0.0f, std::bit_cast<float>(0xFFC12345u), INFINITY, 3.5f};
  t->emit_fn(DType::f32)(v.data(), v.data(), v.size());
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[2]), kCanonicalNanF32);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(v[1]), 0x80000000u);
  EXPECT_EQ(v[4], 3.5f);
}

std::string isa_name(const ::testing::TestParamInfo<Isa>& info) {
  return std::string(name(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllSupported, KernelPath, ::testing::ValuesIn(supported_isas()), isa_name);

// Semantics pinned down on the active path with hand-picked values (docs/numerics.md).
TEST(Semantics, MinMaxZeroNanAndInfinity) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(name(isa));
    const KernelTable& t = *kernels_for(isa);
    const float a[] = {0.0f, -0.0f, NAN, 1.0f, -INFINITY, INFINITY, 2.0f};
    const float b[] = {-0.0f, 0.0f, 1.0f, NAN, 5.0f, 5.0f, 2.0f};
    constexpr std::size_t n = std::size(a);
    float mn[n], mx[n];
    std::memcpy(mn, a, sizeof a);
    std::memcpy(mx, a, sizeof a);
    t.accumulate_fn(DType::f32, ReduceOp::min)(mn, b, n);
    t.accumulate_fn(DType::f32, ReduceOp::max)(mx, b, n);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mn[0]), 0x80000000u);  // min(+0,-0) = -0
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mn[1]), 0x80000000u);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mx[0]), 0u);  // max(+0,-0) = +0
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mx[1]), 0u);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mn[2]), kCanonicalNanF32);  // NaN wins, either side
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mn[3]), kCanonicalNanF32);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mx[2]), kCanonicalNanF32);
    EXPECT_EQ(std::bit_cast<std::uint32_t>(mx[3]), kCanonicalNanF32);
    EXPECT_EQ(mn[4], -INFINITY);
    EXPECT_EQ(mx[4], 5.0f);
    EXPECT_EQ(mn[5], 5.0f);
    EXPECT_EQ(mx[5], INFINITY);
    EXPECT_EQ(mn[6], 2.0f);
  }
}

TEST(Semantics, Int32SumWrapsAndMinMaxAreExact) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(name(isa));
    const KernelTable& t = *kernels_for(isa);
    std::int32_t acc[20], in[20];
    for (int i = 0; i < 20; ++i) {
      acc[i] = INT32_MAX - i;
      in[i] = 1 + i * 2;
    }
    t.accumulate_fn(DType::i32, ReduceOp::sum)(acc, in, 20);
    for (int i = 0; i < 20; ++i) {
      const auto want = static_cast<std::int32_t>(static_cast<std::uint32_t>(INT32_MAX - i) +
                                                  static_cast<std::uint32_t>(1 + i * 2));
      EXPECT_EQ(acc[i], want) << i;
    }
    std::int32_t lo[1] = {INT32_MIN}, hi[1] = {INT32_MAX}, v[1] = {-7};
    t.accumulate_fn(DType::i32, ReduceOp::max)(lo, v, 1);
    t.accumulate_fn(DType::i32, ReduceOp::min)(hi, v, 1);
    EXPECT_EQ(lo[0], -7);
    EXPECT_EQ(hi[0], -7);
  }
}

TEST(Semantics, NarrowSumRoundsOnceFromBinary32) {
  // 1 + 2^-11 + 2^-11 in f16: rounding after each add would give 1 twice (ties to even); widening
  // to binary32 and narrowing once gives 1 + 2^-10 exactly.
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(name(isa));
    const KernelTable& t = *kernels_for(isa);
    const std::uint16_t one = f32_to_f16(1.0f), tiny = f32_to_f16(0x1p-11f);
    const std::uint16_t p0[] = {one}, p1[] = {tiny}, p2[] = {tiny};
    const void* ps[] = {p0, p1, p2};
    float acc[1];
    std::uint16_t out[1];
    t.reduce_fn(DType::f16, ReduceOp::sum)(acc, ps, 3, 1);
    t.emit_fn(DType::f16)(out, acc, 1);
    EXPECT_EQ(f16_to_f32(out[0]), 1.0f + 0x1p-10f);
  }
}

TEST(Semantics, ReduceWithNoPayloadsLeavesAccumulator) {
  float acc[3] = {1, 2, 3};
  for (Isa isa : supported_isas()) {
    kernels_for(isa)->reduce_fn(DType::f32, ReduceOp::sum)(acc, nullptr, 0, 3);
    EXPECT_EQ(acc[2], 3.0f);
  }
}

}  // namespace
}  // namespace treeduce::agg
