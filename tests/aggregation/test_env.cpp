// Run with TREEDUCE_KERNEL_ISA set (see meson.build): the first table in use is the named path when
// this CPU supports it, and the best path otherwise (an unknown name included).
#include <gtest/gtest.h>

#include <cstdlib>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

TEST(Env, FirstTableFollowsTreeduceKernelIsa) {
  const char* env = std::getenv("TREEDUCE_KERNEL_ISA");
  ASSERT_NE(env, nullptr) << "run this test through meson, which sets TREEDUCE_KERNEL_ISA";
  const std::optional<Isa> want = parse_isa(env);
  const Isa expected = want && isa_supported(*want) ? *want : best_isa();
  EXPECT_EQ(kernels().isa, expected) << "TREEDUCE_KERNEL_ISA=" << env;
}

}  // namespace
}  // namespace treeduce::agg
