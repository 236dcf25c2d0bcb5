// The long sweep (slow suite): bigger trees (up to 512 hosts), ten loss patterns per case, more
// chunks per collective. Same checks as the integration sweep.
#include <gtest/gtest.h>

#include <tuple>

#include "scenario.h"

namespace treeduce::sim {
namespace {

TEST(SlowSweep, BigTreesManySeeds) {
  const std::vector<std::vector<int>> shapes = {{64, 4}, {16, 16}, {8, 8, 8}, {4, 64}, {64}};
  std::uint64_t seed = 50000;
  for (std::size_t si = 0; si < shapes.size(); ++si) {
    const auto& shape = shapes[si];
    for (DType d : kAllDTypes) {
      for (ReduceOp o : kAllReduceOps) {
        if (!op_defined(d, o)) continue;
        // The six original types' sum/min/max on every shape, the other pairs on two of the five
        // (rotating), so the suite stays within about a minute.
        const bool original = static_cast<unsigned>(d) <= 5 && static_cast<unsigned>(o) <= 2;
        if (!original && (si + static_cast<std::size_t>(d) + static_cast<std::size_t>(o)) % 5 >= 2)
          continue;
        Scenario s;
        s.dtype = d;
        s.op = o;
        s.fanins = shape;
        s.bytes = 4096;
        s.collectives = 2;
        s.link.loss = 0.10;
        s.link.dup = 0.05;
        s.link.jitter_ns = 10000;
        s.slots = 8;
        s.seed = seed++;
        s.deterministic = (seed % 2) == 0;
        run_scenario(s);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(SlowSweep, ManySeedsSmallTrees) {
  std::vector<std::pair<DType, ReduceOp>> pairs;
  for (DType d : kAllDTypes) {
    for (ReduceOp o : kAllReduceOps) {
      if (op_defined(d, o)) pairs.emplace_back(d, o);
    }
  }
  for (std::uint64_t seed = 1; seed <= 300; ++seed) {
    Scenario s;
    // Coprime strides: consecutive seeds move through the pairs in a scrambled order.
    std::tie(s.dtype, s.op) = pairs[(seed * 37) % pairs.size()];
    s.fanins = seed % 3 == 0 ? std::vector<int>{3, 2, 3} : std::vector<int>{5, 3};
    s.link.loss = 0.01 * static_cast<double>(seed % 11);
    s.link.dup = 0.05;
    s.link.jitter_ns = 7000;
    s.slots = 1u << (seed % 4);
    s.payload_bytes = 256u << (seed % 3);
    s.bytes = 3 * s.payload_bytes * s.slots + 40;
    s.collectives = 3;
    s.deterministic = seed % 4 == 0;
    s.seed = seed;
    s.data_seed = seed;
    run_scenario(s);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace treeduce::sim
