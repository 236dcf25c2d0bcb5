// Every SIMD path against the scalar reference, bit for bit, for every (dtype, op) that
// op_defined() accepts, every length from 0 to 1025 (a third of them above 130 in a sanitized
// build: sanitized.h), on random data with special values mixed in; then semantics pinned down
// with hand-picked values (docs/numerics.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "sanitized.h"
#include "testdata.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

using treeduce::testing::random_payload;
using treeduce::testing::same_acc_element;

constexpr std::size_t kMaxLen = 1025;
// Bytes past the end of every output buffer that no kernel may touch (a whole AVX-512 vector).
constexpr std::size_t kGuard = 64;
constexpr unsigned char kGuardByte = 0xAB;

std::vector<unsigned char> guarded(std::size_t bytes) {
  return std::vector<unsigned char>(bytes + kGuard, kGuardByte);
}

::testing::AssertionResult guard_intact(const std::vector<unsigned char>& b) {
  for (std::size_t i = b.size() - kGuard; i < b.size(); ++i) {
    if (b[i] != kGuardByte) {
      return ::testing::AssertionFailure()
             << "wrote " << (i - (b.size() - kGuard) + 1) << " byte(s) or more past the end";
    }
  }
  return ::testing::AssertionSuccess();
}

std::string hex(const unsigned char* p, std::size_t size) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (std::size_t i = size; i-- > 0;) {  // little-endian: most significant byte last
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// Compares n accumulator elements of type d; on the first mismatch, says where.
::testing::AssertionResult same_acc(DType d, const std::vector<unsigned char>& want,
                                    const std::vector<unsigned char>& got, std::size_t n,
                                    bool nan_equal) {
  const std::size_t size = acc_size(d);
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_acc_element(d, &want[i * size], &got[i * size], nan_equal)) {
      return ::testing::AssertionFailure()
             << "element " << i << ": scalar " << hex(&want[i * size], size) << ", simd "
             << hex(&got[i * size], size);
    }
  }
  return guard_intact(got);
}

::testing::AssertionResult same_bytes(const std::vector<unsigned char>& want,
                                      const std::vector<unsigned char>& got) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      return ::testing::AssertionFailure() << "byte " << i << ": scalar 0x" << std::hex
                                           << int{want[i]} << ", simd 0x" << int{got[i]};
    }
  }
  return guard_intact(got);
}

// Random accumulator bits of type d: the binary32 generator for f32 and the narrow floats (every
// float pattern class), the wire generator for the others (the accumulator is the wire layout).
std::vector<unsigned char> random_acc(DType d, std::size_t n, std::mt19937_64& rng) {
  auto raw = random_payload(is_narrow_float(d) ? DType::f32 : d, n, rng);
  raw.resize(n * acc_size(d) + kGuard, kGuardByte);
  return raw;
}

class KernelPath : public ::testing::TestWithParam<Isa> {};

TEST_P(KernelPath, MatchesScalarForEveryDefinedPairAndLength) {
  const KernelTable& ref = *kernels_for(Isa::scalar);
  const KernelTable* simd = kernels_for(GetParam());
  ASSERT_NE(simd, nullptr);
  std::mt19937_64 rng(1234 + static_cast<int>(GetParam()));
  for (DType d : kAllDTypes) {
    const std::size_t es = dtype_size(d), as = acc_size(d);
    for (std::size_t n = 0; n <= kMaxLen; ++n) {
      if (!treeduce::testing::length_checked(n, kMaxLen)) continue;
      SCOPED_TRACE(::testing::Message() << name(d) << " n=" << n);
      constexpr std::size_t kK = 5;
      std::vector<std::vector<unsigned char>> in;
      std::vector<const void*> ptrs;
      for (std::size_t j = 0; j < kK; ++j) in.push_back(random_payload(d, n, rng));
      for (auto& p : in) ptrs.push_back(p.data());

      for (ReduceOp op : kAllReduceOps) {
        if (!op_defined(d, op)) continue;
        SCOPED_TRACE(name(op));
        // The payload of a NaN produced by a float sum or product is unspecified.
        const bool nan_equal = (op == ReduceOp::sum || op == ReduceOp::prod) && is_float(d);

        // load: exact, including NaN payloads (nothing is computed).
        auto a_ref = guarded(n * as), a_simd = guarded(n * as);
        ref.load_fn(d, op)(a_ref.data(), in[0].data(), n);
        simd->load_fn(d, op)(a_simd.data(), in[0].data(), n);
        ASSERT_TRUE(same_acc(d, a_ref, a_simd, n, false)) << "load";

        // accumulate: start both from the same accumulator, add the other payloads one by one.
        std::vector<unsigned char> r = a_ref, s = a_ref;
        for (std::size_t j = 1; j < kK; ++j) {
          ref.accumulate_fn(d, op)(r.data(), in[j].data(), n);
          simd->accumulate_fn(d, op)(s.data(), in[j].data(), n);
          ASSERT_TRUE(same_acc(d, r, s, n, nan_equal)) << "accumulate " << j;
        }

        // accumulate into arbitrary accumulator bits (for the logical operations, values that a
        // load would never leave: the result must still be the reference's).
        std::vector<unsigned char> rr = random_acc(d, n, rng), rs = rr;
        ref.accumulate_fn(d, op)(rr.data(), in[1].data(), n);
        simd->accumulate_fn(d, op)(rs.data(), in[1].data(), n);
        ASSERT_TRUE(same_acc(d, rr, rs, n, nan_equal)) << "accumulate into raw bits";

        // reduce for every fan-in 1..k.
        for (std::size_t k = 1; k <= kK; ++k) {
          auto dr = guarded(n * as), ds = guarded(n * as);
          ref.reduce_fn(d, op)(dr.data(), ptrs.data(), k, n);
          simd->reduce_fn(d, op)(ds.data(), ptrs.data(), k, n);
          ASSERT_TRUE(same_acc(d, dr, ds, n, nan_equal)) << "reduce k=" << k;
        }

        // emit: exact bytes, including canonical NaNs. Emit the scalar accumulator through both
        // paths so that a NaN payload difference above cannot hide here.
        auto er = guarded(n * es), esimd = guarded(n * es);
        ref.emit_fn(d)(er.data(), r.data(), n);
        simd->emit_fn(d)(esimd.data(), r.data(), n);
        ASSERT_TRUE(same_bytes(er, esimd)) << "emit";
      }
      // emit of arbitrary accumulator bits (every pattern class), not just results.
      const auto raw = random_acc(d, n, rng);
      auto er = guarded(n * es), esimd = guarded(n * es);
      ref.emit_fn(d)(er.data(), raw.data(), n);
      simd->emit_fn(d)(esimd.data(), raw.data(), n);
      ASSERT_TRUE(same_bytes(er, esimd)) << "emit of raw accumulator";
      // emit in place, where the accumulator has the wire size.
      if (as == es) {
        auto inplace = raw;
        simd->emit_fn(d)(inplace.data(), inplace.data(), n);
        ASSERT_TRUE(same_bytes(er, inplace)) << "emit in place";
      }
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

// Semantics pinned down on every path with hand-picked values (docs/numerics.md).
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

TEST(Semantics, NarrowProdKeepsABinary32Accumulator) {
  // (1 + 2^-7)^3 = 1 + 3 * 2^-7 + 3 * 2^-14 + 2^-21: exact in binary32, 21 bits more than bf16
  // has. The accumulator keeps it exactly; the emitted bf16 is its one rounding, 1 + 3 * 2^-7.
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(name(isa));
    const KernelTable& t = *kernels_for(isa);
    const float x = 1.0f + 0x1p-7f;
    std::vector<std::uint16_t> p(40, f32_to_bf16(x));
    const void* ps[] = {p.data(), p.data(), p.data()};
    std::vector<float> acc(40);
    std::vector<std::uint16_t> out(40);
    t.reduce_fn(DType::bf16, ReduceOp::prod)(acc.data(), ps, 3, 40);
    t.emit_fn(DType::bf16)(out.data(), acc.data(), 40);
    for (std::size_t i = 0; i < 40; ++i) {
      EXPECT_EQ(acc[i], 1.0f + 3 * 0x1p-7f + 3 * 0x1p-14f + 0x1p-21f) << i;
      EXPECT_EQ(bf16_to_f32(out[i]), 1.0f + 3 * 0x1p-7f) << i;
    }
  }
}

TEST(Semantics, ReduceWithNoPayloadsLeavesAccumulator) {
  for (Isa isa : supported_isas()) {
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (!op_defined(d, op)) continue;
        std::vector<unsigned char> acc(100 * acc_size(d), 0x5A);
        kernels_for(isa)->reduce_fn(d, op)(acc.data(), nullptr, 0, 100);
        EXPECT_TRUE(std::all_of(acc.begin(), acc.end(), [](unsigned char c) { return c == 0x5A; }))
            << name(isa) << " " << name(d) << " " << name(op);
      }
    }
  }
}

// The logical operations keep 0 or 1 from the first load on, whatever the payload's bits, and their
// results are 0 or 1 on every path and every type.
template <class T>
void check_logical(DType d) {
  const T nonzero[] = {T{1},
                       T{2},
                       static_cast<T>(~T{0}),
                       std::numeric_limits<T>::min(),
                       std::numeric_limits<T>::max(),
                       static_cast<T>(T{1} << (sizeof(T) * 8 - 1))};
  constexpr std::size_t n = 300;  // several vectors and a tail
  std::vector<T> a(n), b(n);
  for (std::size_t i = 0; i < n; ++i) {
    a[i] = (i % 3 == 0) ? T{0} : nonzero[i % std::size(nonzero)];
    b[i] = (i % 5 < 2) ? T{0} : nonzero[(i / 7) % std::size(nonzero)];
  }
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(::testing::Message() << name(isa) << " " << name(d));
    const KernelTable& t = *kernels_for(isa);
    for (ReduceOp op : {ReduceOp::land, ReduceOp::lor, ReduceOp::lxor}) {
      SCOPED_TRACE(name(op));
      std::vector<T> acc(n), red(n);
      t.load_fn(d, op)(acc.data(), a.data(), n);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], T(a[i] != 0)) << "load " << i;
      const void* one[] = {a.data()};
      t.reduce_fn(d, op)(red.data(), one, 1, n);
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(red[i], T(a[i] != 0)) << "reduce k=1 " << i;
      t.accumulate_fn(d, op)(acc.data(), b.data(), n);
      const void* two[] = {a.data(), b.data()};
      t.reduce_fn(d, op)(red.data(), two, 2, n);
      for (std::size_t i = 0; i < n; ++i) {
        const bool x = a[i] != 0, y = b[i] != 0;
        const bool want = op == ReduceOp::land ? (x && y) : op == ReduceOp::lor ? (x || y) : x != y;
        ASSERT_EQ(acc[i], T(want)) << "accumulate " << i;
        ASSERT_EQ(red[i], T(want)) << "reduce k=2 " << i;
      }
    }
  }
}

TEST(Semantics, LogicalOperationsGiveZeroOrOne) {
  check_logical<std::int8_t>(DType::i8);
  check_logical<std::uint8_t>(DType::u8);
  check_logical<std::int16_t>(DType::i16);
  check_logical<std::uint16_t>(DType::u16);
  check_logical<std::int32_t>(DType::i32);
  check_logical<std::uint32_t>(DType::u32);
  check_logical<std::int64_t>(DType::i64);
  check_logical<std::uint64_t>(DType::u64);
}

}  // namespace
}  // namespace treeduce::agg
