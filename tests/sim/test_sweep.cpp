// The big property sweep over the simulated fabric (integration suite): dtype x op x shape
// (fan-in 1..64, depth 1..3) x loss 0..10 % with duplication and reordering. A sanitized build
// (sanitized.h) runs one seed per case instead of two, and 5 seeds instead of 20 where the order
// of operands matters.
#include <gtest/gtest.h>

#include "sanitized.h"
#include "scenario.h"

namespace treeduce::sim {
namespace {

struct Shape {
  std::vector<int> fanins;
  std::size_t bytes;
};

TEST(Sweep, DtypeOpShapeLoss) {
  const std::vector<Shape> shapes = {
      {{1}, 16384},      {{2}, 16384},      {{7}, 16384},      {{16}, 8192},     {{64}, 4096},
      {{1, 5}, 8192},    {{4, 4}, 8192},    {{8, 8}, 4096},    {{2, 32}, 4096},  {{64, 2}, 2048},
      {{2, 2, 2}, 8192}, {{3, 1, 4}, 8192}, {{4, 4, 4}, 4096}, {{1, 1, 1}, 8192}};
  const double losses[] = {0.0, 0.01, 0.05, 0.10};
  std::uint64_t seed = 1000;
  for (DType d : kAllDTypes) {
    for (ReduceOp o : kAllReduceOps) {
      if (!op_defined(d, o)) continue;
      // The six original types' sum/min/max see every shape; the other 92 pairs every third
      // shape (rotating), which keeps this suite's run time within a few minutes.
      const bool original = static_cast<unsigned>(d) <= 5 && static_cast<unsigned>(o) <= 2;
      for (std::size_t si = 0; si < shapes.size(); ++si) {
        if (!original && (si + static_cast<std::size_t>(d) + static_cast<std::size_t>(o)) % 3 != 0)
          continue;
        // Every shape for every dtype x op, loss rotating so that each pair sees every loss.
        const double loss =
            losses[(si + static_cast<std::size_t>(d) + static_cast<std::size_t>(o)) % 4];
        for (int rep = 0; rep < (treeduce::testing::kSanitized ? 1 : 2); ++rep) {
          Scenario s;
          s.dtype = d;
          s.op = o;
          s.fanins = shapes[si].fanins;
          s.bytes = shapes[si].bytes;
          s.link.loss = loss;
          s.link.dup = loss / 2;
          s.link.jitter_ns = 5000;
          s.slots = (seed % 3 == 0) ? 1 : 4;  // one slot: the strictest reuse
          s.payload_bytes = (seed % 2 == 0) ? 256 : 512;
          s.deterministic = seed % 5 == 0;
          s.seed = seed++;
          s.data_seed = seed;
          s.collectives = 3;
          run_scenario(s);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST(Sweep, DeterministicAllDtypesOpsOver20Seeds) {
  for (DType d : kAllDTypes) {
    for (ReduceOp o : kAllReduceOps) {
      if (!op_defined(d, o)) continue;
      // Only float sums and products depend on the order of the operands; every other pair is
      // order-independent by construction (exact integer arithmetic, min/max, MINLOC/MAXLOC), so
      // 3 seeds are enough there.
      const bool order_matters = is_float(d) && (o == ReduceOp::sum || o == ReduceOp::prod);
      const std::uint64_t seeds = order_matters ? (treeduce::testing::kSanitized ? 5u : 20u) : 3u;
      std::vector<std::vector<std::uint8_t>> first;
      for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
        Scenario s;
        s.dtype = d;
        s.op = o;
        s.fanins = {2, 3, 2};
        s.deterministic = true;
        s.exact = false;
        s.link.loss = 0.05;
        s.link.dup = 0.05;
        s.link.jitter_ns = 8000;
        s.seed = seed;
        s.bytes = 1024;
        const auto out = run_scenario(s);
        if (seed == 1) first = out;
        EXPECT_EQ(out, first) << describe(s);
      }
    }
  }
}

TEST(Sweep, LargePayloads) {
  for (std::uint32_t pb : {1024u, 4096u, 8192u}) {
    Scenario s;
    s.dtype = DType::bf16;
    s.fanins = {3, 5};
    s.payload_bytes = pb;
    s.bytes = 4 * pb + 100;
    s.link.loss = 0.05;
    s.link.dup = 0.02;
    s.link.jitter_ns = 4000;
    s.seed = pb;
    run_scenario(s);
  }
}

}  // namespace
}  // namespace treeduce::sim
