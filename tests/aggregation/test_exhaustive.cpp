// Suite "slow":
// - every one of the 2^32 binary32 bit patterns narrowed to every wire type by every SIMD path, all
//   paths compared with each other, and every 61st pattern also with the scalar reference (which
//   is itself checked against brute force in test_convert.cpp);
// - every one of the 2^32 operand pairs of i16 and u16 through accumulate, for every operation, on
//   every path (the scalar one included), against the semantics stated in intsem.h.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "intsem.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

TEST(Exhaustive, EveryBinary32PatternNarrowsIdenticallyOnEveryPath) {
  constexpr std::size_t kChunk = 1u << 20;
  constexpr std::size_t kStride = 61;
  const std::vector<Isa> isas = supported_isas();
  if (isas.size() < 2)
    GTEST_SKIP() << "this CPU runs only the scalar path: no SIMD path to compare";
  std::vector<std::uint32_t> acc(kChunk), sampled(kChunk / kStride + 1);
  std::vector<std::vector<unsigned char>> out(isas.size(), std::vector<unsigned char>(kChunk * 4));
  std::vector<unsigned char> ref(kChunk * 4);
  for (DType d : {DType::f32, DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    const std::size_t es = dtype_size(d);
    for (std::uint64_t base = 0; base < (1ull << 32); base += kChunk) {
      std::iota(acc.begin(), acc.end(), static_cast<std::uint32_t>(base));
      for (std::size_t p = 0; p < isas.size(); ++p) {
        if (isas[p] == Isa::scalar) continue;
        kernels_for(isas[p])->emit_fn(d)(out[p].data(), acc.data(), kChunk);
      }
      for (std::size_t p = 1; p < isas.size(); ++p) {
        if (isas[p] == Isa::scalar || isas[p - 1] == Isa::scalar) continue;
        ASSERT_EQ(std::memcmp(out[p].data(), out[p - 1].data(), kChunk * es), 0)
            << name(d) << " " << name(isas[p]) << " vs " << name(isas[p - 1]) << " near 0x"
            << std::hex << base;
      }
      const std::size_t simd = isas.size() - 1;
      std::size_t m = 0;
      for (std::size_t i = 0; i < kChunk; i += kStride) sampled[m++] = acc[i];
      kernels_for(Isa::scalar)->emit_fn(d)(ref.data(), sampled.data(), m);
      for (std::size_t j = 0; j < m; ++j) {
        ASSERT_EQ(std::memcmp(&ref[j * es], &out[simd][j * kStride * es], es), 0)
            << name(d) << " scalar vs " << name(isas[simd]) << " at 0x" << std::hex
            << acc[j * kStride];
      }
    }
  }
}

// acc = every 16-bit value, payload = a: one row of the 2^16 x 2^16 table per call.
template <class T, ReduceOp O>
void all_pairs_16(DType d) {
  constexpr std::size_t n = 1u << 16;
  std::vector<T> iota(n), want(n), payload(n), acc(n);
  for (std::size_t v = 0; v < n; ++v) iota[v] = static_cast<T>(v);
  const std::vector<Isa> isas = supported_isas();
  for (std::size_t a = 0; a < n; ++a) {
    const auto x = static_cast<T>(a);
    for (std::size_t v = 0; v < n; ++v) want[v] = treeduce::testing::expected<T>(O, iota[v], x);
    std::fill(payload.begin(), payload.end(), x);
    for (Isa isa : isas) {
      acc = iota;
      kernels_for(isa)->accumulate_fn(d, O)(acc.data(), payload.data(), n);
      if (std::memcmp(acc.data(), want.data(), n * sizeof(T)) != 0) {
        std::size_t v = 0;
        while (acc[v] == want[v]) ++v;
        FAIL() << name(isa) << " " << name(d) << " " << name(O) << "(" << +iota[v] << ", " << +x
               << "): want " << +want[v] << ", got " << +acc[v];
      }
    }
  }
}

template <class T>
void all_pairs_16_every_op(DType d) {
  all_pairs_16<T, ReduceOp::sum>(d);
  all_pairs_16<T, ReduceOp::prod>(d);
  all_pairs_16<T, ReduceOp::min>(d);
  all_pairs_16<T, ReduceOp::max>(d);
  all_pairs_16<T, ReduceOp::band>(d);
  all_pairs_16<T, ReduceOp::bor>(d);
  all_pairs_16<T, ReduceOp::bxor>(d);
  all_pairs_16<T, ReduceOp::land>(d);
  all_pairs_16<T, ReduceOp::lor>(d);
  all_pairs_16<T, ReduceOp::lxor>(d);
}

TEST(Exhaustive16, EveryOperandPairOfI16OnEveryPath) {
  all_pairs_16_every_op<std::int16_t>(DType::i16);
}
TEST(Exhaustive16, EveryOperandPairOfU16OnEveryPath) {
  all_pairs_16_every_op<std::uint16_t>(DType::u16);
}

}  // namespace
}  // namespace treeduce::agg
