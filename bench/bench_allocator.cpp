// Tree allocation time against fabric size (3-level fat-trees of about 1k, 16k and 64k hosts)
// and against the number of jobs already placed; sequential against oneTBB candidate evaluation.
// Each iteration allocates one job and releases it, so the fabric state stays fixed.
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>

#include "treeduce/control/allocator.h"

using namespace treeduce::ctl;

namespace {

const Topology& fat_tree(std::uint32_t k) {
  static std::map<std::uint32_t, std::unique_ptr<Topology>> cache;
  auto& t = cache[k];
  if (!t) t = std::make_unique<Topology>(*make_fat_tree3(k));
  return *t;
}

JobRequest spread_job(const Topology& t, std::uint32_t world, std::uint32_t seed) {
  std::mt19937 rng(seed);
  JobRequest r;
  r.job = "bench";
  r.slots = 8;
  for (std::uint32_t i = 0; i < world; ++i)
    r.rank_host.push_back(std::uint32_t(rng() % t.hosts.size()));
  return r;
}

// Args: k, world size, parallel (0/1), candidate roots per round (16 = default; 4096 = all).
void BM_AllocateBySize(benchmark::State& state) {
  const Topology& t = fat_tree(std::uint32_t(state.range(0)));
  Allocator al(
      t, {.round = std::uint32_t(state.range(3)), .parallel_threshold = state.range(2) ? 2u : 0u});
  JobRequest r = spread_job(t, std::uint32_t(state.range(1)), 1);
  for (auto _ : state) {
    auto a = al.allocate(r);
    if (!a.ok()) state.SkipWithError(a.status().message().c_str());
    benchmark::DoNotOptimize(a);
    (void)al.release(r.job);
  }
  state.counters["hosts"] = double(t.hosts.size());
  state.counters["switches"] = double(t.switches.size());
}
BENCHMARK(BM_AllocateBySize)
    ->ArgNames({"k", "world", "tbb", "round"})
    ->ArgsProduct({{16, 40, 64}, {8, 256}, {0, 1}, {16, 4096}})
    ->Unit(benchmark::kMicrosecond);

// Args: jobs already placed, parallel. k=40 (16000 hosts), pod-local 8-rank background jobs.
void BM_AllocateByJobs(benchmark::State& state) {
  const Topology& t = fat_tree(40);
  Allocator al(t, {.round = 16, .parallel_threshold = state.range(1) ? 2u : 0u});
  std::mt19937 rng(5);
  std::int64_t placed = 0;
  for (std::int64_t j = 0; placed < state.range(0) && j < 4 * state.range(0); ++j) {
    JobRequest r;
    r.job = "bg" + std::to_string(j);
    r.slots = 4;
    std::uint32_t pod = std::uint32_t(rng() % 40);
    for (int i = 0; i < 8; ++i) r.rank_host.push_back(pod * 400 + std::uint32_t(rng() % 400));
    placed += al.allocate(r).ok();
  }
  JobRequest r = spread_job(t, 256, 2);
  for (auto _ : state) {
    auto a = al.allocate(r);
    if (!a.ok()) state.SkipWithError(a.status().message().c_str());
    benchmark::DoNotOptimize(a);
    (void)al.release(r.job);
  }
  state.counters["placed"] = double(placed);
}
BENCHMARK(BM_AllocateByJobs)
    ->ArgNames({"jobs", "tbb"})
    ->ArgsProduct({{0, 1000, 5000}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
