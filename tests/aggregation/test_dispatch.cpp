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

TEST(Dispatch, TablesAreCompleteAndNamedForTheirIsa) {
  for (Isa isa : supported_isas()) {
    const KernelTable* t = kernels_for(isa);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->isa, isa);
    for (DType d : kAllDTypes) {
      EXPECT_NE(t->load_fn(d, ReduceOp::sum), nullptr);
      EXPECT_NE(t->emit_fn(d), nullptr);
      for (ReduceOp op : kAllReduceOps) {
        EXPECT_NE(t->accumulate_fn(d, op), nullptr);
        EXPECT_NE(t->reduce_fn(d, op), nullptr);
      }
    }
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
  EXPECT_FALSE(parse_dtype("f64").has_value());
  EXPECT_FALSE(parse_op("avg").has_value());
  EXPECT_EQ(dtype_from_wire(5), DType::i32);
  EXPECT_FALSE(dtype_from_wire(6).has_value());
  EXPECT_FALSE(op_from_wire(3).has_value());
}

}  // namespace
}  // namespace treeduce::agg
