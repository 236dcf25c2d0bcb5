// Property-test scenarios over the simulated fabric: build a uniform tree, feed it data, run, and
// check every host's result against the reference and every switch's counters for exactness.
#pragma once

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "sim_fabric.h"
#include "treeduce/aggregation/convert.h"
#include "treeduce/lab/exact_inputs.h"

namespace treeduce::sim {

struct Scenario {
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  std::vector<int> fanins = {4};  ///< per level, root first; the last level's children are hosts
  LinkModel link;
  bool deterministic = false;
  /// Order-independent data whose result is known without the kernels (exact::Inputs), where the
  /// world allows (see uses_exact_inputs()); else integer-valued data whose sums are exact in
  /// FP32 whatever the order. false: spread-out float values (integer and pair types are always
  /// exact).
  bool exact = true;
  std::uint32_t slots = 4;
  std::uint32_t payload_bytes = 256;
  std::size_t bytes = 2048;  ///< per collective per host (rounded down to whole elements)
  int collectives = 2;
  std::uint64_t seed = 1;        ///< loss, duplication and delay pattern
  std::uint64_t data_seed = 42;  ///< inputs
  std::uint16_t tree_id = 7;
  std::uint64_t key = 0xC0FFEE;
  std::uint32_t pipeline = 0;  ///< JobSpec::pipeline: collectives queued ahead per host
};

inline std::string describe(const Scenario& s) {
  std::string f;
  for (int x : s.fanins) f += std::to_string(x) + "x";
  return std::string(name(s.dtype)) + "/" + std::string(name(s.op)) + " tree " + f + " loss " +
         std::to_string(s.link.loss) + " dup " + std::to_string(s.link.dup) + " jitter " +
         std::to_string(s.link.jitter_ns) + (s.deterministic ? " det" : "") + " seed " +
         std::to_string(s.seed);
}

/// True when the scenario's inputs come from exact::Inputs, whose expected results are computed
/// independently of the kernels: always for integer and pair types and the new float operations,
/// for float types when exact and the world is small enough for exact sums in the wire type.
inline bool uses_exact_inputs(const Scenario& s, std::size_t world) {
  if (!is_float(s.dtype)) return true;
  if (!s.exact) return false;
  return s.op != ReduceOp::sum || exact::sum_bound(s.dtype, static_cast<std::uint32_t>(world)) > 0;
}

/// Wire bytes of `count` float elements: small integers (sums exact in FP32 in any order; the
/// reference follows the tree) or spread-out values (not exact).
inline std::vector<std::uint8_t> make_float_input(DType d, std::size_t count, bool exact,
                                                  std::mt19937_64& rng) {
  std::vector<std::uint8_t> v(count * dtype_size(d));
  std::uniform_int_distribution<int> small(-100, 100);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (std::size_t i = 0; i < count; ++i) {
    const float x = exact ? static_cast<float>(small(rng)) : normal(rng) * (1.0f + (i % 7));
    std::uint8_t* p = v.data() + i * dtype_size(d);
    switch (d) {
      case DType::f32:
        std::memcpy(p, &x, 4);
        break;
      case DType::f64: {
        const double y = x;
        std::memcpy(p, &y, 8);
        break;
      }
      case DType::f16: {
        const std::uint16_t h = agg::f32_to_f16(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::bf16: {
        const std::uint16_t h = agg::f32_to_bf16(x);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::e4m3:
        *p = agg::f32_to_e4m3(x);
        break;
      case DType::e5m2:
        *p = agg::f32_to_e5m2(x);
        break;
      default:
        ADD_FAILURE() << name(d) << " is not a float type: its inputs come from exact::Inputs";
        return v;
    }
  }
  return v;
}

/// A uniform tree over new switches of `fab`: fanins[level] children per node.
inline TopoNode build_tree(Fabric& fab, const std::vector<int>& fanins, std::size_t level = 0) {
  TopoNode n;
  n.sw = fab.add_switch();
  for (int i = 0; i < fanins[level]; ++i) {
    n.kids.push_back(level + 1 < fanins.size() ? build_tree(fab, fanins, level + 1) : TopoNode{});
  }
  return n;
}

inline std::size_t count_hosts(const TopoNode& n) {
  if (n.sw < 0) return 1;
  std::size_t s = 0;
  for (const auto& k : n.kids) s += count_hosts(k);
  return s;
}

inline JobSpec make_job(const Scenario& s, TopoNode root, std::mt19937_64& rng) {
  JobSpec j;
  j.tree_id = s.tree_id;
  j.key = s.key;
  j.dtype = s.dtype;
  j.op = s.op;
  j.deterministic = s.deterministic;
  j.slots = s.slots;
  j.payload_bytes = s.payload_bytes;
  j.pipeline = s.pipeline;
  j.root = std::move(root);
  const std::size_t hosts = count_hosts(j.root);
  const bool from_exact = uses_exact_inputs(s, hosts);
  for (int c = 0; c < s.collectives; ++c) {
    // Vary the size so that collectives end on partial chunks and on slot boundaries.
    const std::size_t count = s.bytes / dtype_size(s.dtype) - static_cast<std::size_t>(c) * 3;
    j.inputs.emplace_back();
    if (!from_exact) {
      for (std::size_t h = 0; h < hosts; ++h)
        j.inputs.back().push_back(make_float_input(s.dtype, count, s.exact, rng));
      continue;
    }
    // Host h is rank h; the expected result is computed without the kernels.
    const exact::Inputs in(rng(), exact::Case{s.dtype, s.op, count, static_cast<std::uint32_t>(c)},
                           static_cast<std::uint32_t>(hosts));
    std::vector<std::uint8_t> want(count * dtype_size(s.dtype));
    for (std::size_t h = 0; h < hosts; ++h) {
      std::vector<std::uint8_t> v(count * dtype_size(s.dtype));
      for (std::size_t i = 0; i < count; ++i)
        exact::store(s.dtype, v.data(), i, in.element(static_cast<std::uint32_t>(h), i));
      j.inputs.back().push_back(std::move(v));
    }
    for (std::size_t i = 0; i < count; ++i) exact::store(s.dtype, want.data(), i, in.expected(i));
    j.expected.push_back(std::move(want));
  }
  return j;
}

inline std::size_t total_chunks(const JobSpec& j) {
  const std::size_t per = j.payload_bytes / dtype_size(j.dtype);
  std::size_t n = 0;
  for (const auto& c : j.inputs) n += (c[0].size() / dtype_size(j.dtype) + per - 1) / per;
  return n;
}

/// Every host's every result equals the reference (the scalar kernels along the tree), byte for
/// byte, and the independently computed expected result where the inputs have one.
inline void expect_results(const Fabric& fab, int job, const std::string& what) {
  const JobSpec& spec = fab.job(job);
  const auto hosts = fab.hosts(job);
  const std::size_t es = dtype_size(spec.dtype);
  for (std::size_t c = 0; c < spec.inputs.size(); ++c) {
    const auto ref = reference(spec, c);
    if (c < spec.expected.size()) {
      const auto& want = spec.expected[c];
      ASSERT_EQ(want.size(), ref.size()) << what;
      for (std::size_t i = 0; i < want.size() / es; ++i) {
        ASSERT_EQ(exact::load(spec.dtype, ref.data(), i), exact::load(spec.dtype, want.data(), i))
            << what << ": the kernels' reference, collective " << c << " element " << i << ": "
            << exact::show(spec.dtype, exact::load(spec.dtype, ref.data(), i)) << ", expected "
            << exact::show(spec.dtype, exact::load(spec.dtype, want.data(), i));
      }
    }
    for (const HostNode* h : hosts) {
      ASSERT_EQ(h->outputs[c].size(), ref.size()) << what;
      if (h->outputs[c] != ref) {
        std::size_t i = 0;
        while (h->outputs[c][i] == ref[i]) ++i;
        FAIL() << what << ": host " << h->index << " collective " << c << " element " << i / es
               << " is "
               << exact::show(spec.dtype, exact::load(spec.dtype, h->outputs[c].data(), i / es))
               << ", not " << exact::show(spec.dtype, exact::load(spec.dtype, ref.data(), i / es));
      }
    }
  }
}

/// Walk the tree: every switch accepted exactly one contribution per child per chunk, sent each
/// partial up once, multicast each result once, and refused nothing from its members.
inline void expect_exact_counts(Fabric& fab, const JobSpec& spec, const TopoNode& n, bool root,
                                const std::string& what, bool check_refusals = true) {
  if (n.sw < 0) return;
  const std::size_t chunks = total_chunks(spec);
  const dp::Counters* c = fab.core(n.sw).tree_counters(spec.tree_id);
  ASSERT_NE(c, nullptr) << what;
  EXPECT_EQ(c->event(dp::Event::contrib_accepted), chunks * n.kids.size()) << what;
  EXPECT_EQ(c->event(dp::Event::result_multicast), chunks) << what;
  EXPECT_EQ(c->event(dp::Event::partial_sent), root ? 0 : chunks) << what;
  for (auto r :
       {check_refusals ? dp::DropReason::bad_key : dp::DropReason::none, dp::DropReason::bad_child,
        dp::DropReason::bad_source, dp::DropReason::bad_dtype_op, dp::DropReason::bad_count,
        dp::DropReason::bad_slot, dp::DropReason::bad_ncontrib, dp::DropReason::chunk_mismatch,
        dp::DropReason::bad_length, dp::DropReason::unexpected_result}) {
    if (r != dp::DropReason::none) {
      EXPECT_EQ(c->drop(r), 0u) << what << " " << dp::name(r);
    }
  }
  // The last use of every slot version is complete with every child's bit and host count.
  const std::size_t hosts = count_hosts(n);
  const std::size_t world = count_hosts(spec.root);
  const std::size_t used = std::min<std::size_t>(chunks, 2 * spec.slots);
  for (std::size_t u = 0; u < used; ++u) {
    const std::uint32_t chunk = static_cast<std::uint32_t>(chunks - 1 - u);
    dp::SlotView v;
    ASSERT_EQ(
        fab.core(n.sw).slot_view(spec.tree_id, chunk % spec.slots, (chunk / spec.slots) % 2, &v),
        0);
    EXPECT_EQ(v.chunk, chunk) << what;
    EXPECT_EQ(v.state, dp::SlotState::done) << what;
    EXPECT_EQ(v.arrived, n.kids.size()) << what;
    EXPECT_EQ(v.bitmap, n.kids.size() == 64 ? ~0ull : (1ull << n.kids.size()) - 1) << what;
    // A non-root switch holds the RESULT's count (the world); the root its own sum of hosts.
    EXPECT_EQ(v.ncontrib, root ? hosts : world) << what;
  }
  for (const auto& k : n.kids) expect_exact_counts(fab, spec, k, false, what, check_refusals);
}

/// Build, run and check one scenario. Returns the results of the first host (for cross-seed
/// comparisons).
inline std::vector<std::vector<std::uint8_t>> run_scenario(const Scenario& s,
                                                           FabricStats* stats = nullptr,
                                                           std::uint64_t* end_ns = nullptr) {
  const std::string what = describe(s);
  Fabric fab(s.seed, s.link);
  std::mt19937_64 rng(s.data_seed);
  TopoNode root = build_tree(fab, s.fanins);
  const JobSpec spec = make_job(s, std::move(root), rng);
  const int job = fab.add_job(spec);
  EXPECT_EQ(job, 0) << what;
  if (job != 0) return {};
  fab.check_results_in_flight(true);
  EXPECT_TRUE(fab.run()) << what;
  EXPECT_GT(fab.stats().results_checked, 0u) << what;
  EXPECT_EQ(fab.stats().wrong_results, 0u) << what << ": a RESULT carried another chunk's data";
  expect_results(fab, job, what);
  expect_exact_counts(fab, fab.job(job), fab.job(job).root, true, what);
  if (stats != nullptr) *stats = fab.stats();
  if (end_ns != nullptr) *end_ns = fab.now();
  return fab.hosts(job)[0]->outputs;
}

}  // namespace treeduce::sim
