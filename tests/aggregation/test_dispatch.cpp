#include <gtest/gtest.h>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

TEST(Dispatch, ScalarAlwaysSupportedAndBestIsSupported) {
  EXPECT_TRUE(isa_supported(Isa::scalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  const auto all = supported_isas();
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front(), Isa::scalar);
  EXPECT_NE(best_isa(), Isa::avx512_bf16);
  if (isa_supported(Isa::avx512)) {
    EXPECT_EQ(best_isa(), Isa::avx512);
  } else if (isa_supported(Isa::avx2)) {
    EXPECT_EQ(best_isa(), Isa::avx2);
  }
}

TEST(Dispatch, TablesHoldEveryDefinedPairAndNothingElse) {
  for (Isa isa : supported_isas()) {
    SCOPED_TRACE(name(isa));
    const KernelTable* t = kernels_for(isa);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->isa, isa);
    for (DType d : kAllDTypes) {
      EXPECT_NE(t->emit_fn(d), nullptr) << name(d);
      for (ReduceOp op : kAllReduceOps) {
        SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op));
        if (op_defined(d, op)) {
          EXPECT_NE(t->load_fn(d, op), nullptr);
          EXPECT_NE(t->accumulate_fn(d, op), nullptr);
          EXPECT_NE(t->reduce_fn(d, op), nullptr);
        } else {
          // The switch core refuses a pair through this null entry (bad_dtype_op).
          EXPECT_EQ(t->load_fn(d, op), nullptr);
          EXPECT_EQ(t->accumulate_fn(d, op), nullptr);
          EXPECT_EQ(t->reduce_fn(d, op), nullptr);
          EXPECT_FALSE(op_refusal(d, op).empty());
        }
      }
    }
  }
}

// MPI's rules, stated here independently of dtype.h: which pairs a table must hold.
TEST(Dispatch, DefinedPairsAreMpisSet) {
  const DType ints[] = {DType::i8,  DType::u8,  DType::i16, DType::u16,
                        DType::i32, DType::u32, DType::i64, DType::u64};
  const DType floats[] = {DType::f32,  DType::f16,  DType::bf16,
                          DType::e4m3, DType::e5m2, DType::f64};
  const DType pairs[] = {DType::f32_i32, DType::f64_i32, DType::i32_i32};
  std::size_t defined = 0;
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) defined += op_defined(d, op) ? 1 : 0;
  }
  // 8 integer types x 10 operations, 6 float types x 4, 3 pair types x 2.
  EXPECT_EQ(defined, 8u * 10 + 6 * 4 + 3 * 2);
  for (DType d : ints) {
    for (ReduceOp op : kAllReduceOps) EXPECT_EQ(op_defined(d, op), !is_loc(op)) << name(d);
  }
  for (DType d : floats) {
    for (ReduceOp op : kAllReduceOps) {
      const bool want =
          op == ReduceOp::sum || op == ReduceOp::prod || op == ReduceOp::min || op == ReduceOp::max;
      EXPECT_EQ(op_defined(d, op), want) << name(d) << " " << name(op);
    }
  }
  for (DType d : pairs) {
    for (ReduceOp op : kAllReduceOps) EXPECT_EQ(op_defined(d, op), is_loc(op)) << name(d);
  }
}

TEST(Dispatch, ForceSwitchesTheActiveTableAndRefusesUnsupported) {
  for (Isa isa : supported_isas()) {
    ASSERT_TRUE(force_isa(isa));
    EXPECT_EQ(kernels().isa, isa);
  }
  for (std::size_t i = 0; i < kNumIsas; ++i) {
    const auto isa = static_cast<Isa>(i);
    if (isa_supported(isa)) continue;
    const Isa before = kernels().isa;
    EXPECT_FALSE(force_isa(isa));
    EXPECT_EQ(kernels().isa, before);
    EXPECT_EQ(kernels_for(isa), nullptr);
  }
  EXPECT_TRUE(force_isa(best_isa()));
}

TEST(Dispatch, NamesRoundTrip) {
  for (std::size_t i = 0; i < kNumIsas; ++i) {
    const auto isa = static_cast<Isa>(i);
    EXPECT_EQ(parse_isa(name(isa)), isa);
  }
  EXPECT_FALSE(parse_isa("avx1024").has_value());
  EXPECT_FALSE(parse_isa("").has_value());
  for (DType d : kAllDTypes) EXPECT_EQ(parse_dtype(name(d)), d);
  for (ReduceOp op : kAllReduceOps) EXPECT_EQ(parse_op(name(op)), op);
  EXPECT_EQ(parse_dtype("FP8_E4M3"), DType::e4m3);
  EXPECT_EQ(parse_dtype("BFloat16"), DType::bf16);
  EXPECT_EQ(parse_dtype("f64"), DType::f64);
  EXPECT_FALSE(parse_dtype("f128").has_value());
  EXPECT_FALSE(parse_op("avg").has_value());
  // Codes are appended, never renumbered (docs/protocol.md).
  EXPECT_EQ(dtype_from_wire(5), DType::i32);
  EXPECT_EQ(dtype_from_wire(6), DType::i8);
  EXPECT_EQ(dtype_from_wire(13), DType::f64);
  EXPECT_EQ(dtype_from_wire(16), DType::i32_i32);
  EXPECT_FALSE(dtype_from_wire(17).has_value());
  EXPECT_EQ(op_from_wire(3), ReduceOp::prod);
  EXPECT_EQ(op_from_wire(11), ReduceOp::maxloc);
  EXPECT_FALSE(op_from_wire(12).has_value());
}

}  // namespace
}  // namespace treeduce::agg
