// Switch core cost per received packet, without I/O: frames are prebuilt in memory, the core
// parses, validates, aggregates and produces the output frames (multicast headers included).
//
// Each benchmark is one root switch with `fanin` children (hosts), f32 sum, 16 slots. One
// iteration feeds one chunk's `fanin` contributions in bursts of 32; the chunk numbers advance
// so that slots are reused as in a real stream. Counters:
//   ns_per_pkt     core time per received CONTRIB (wall time of the loop / packets)
//   kernel_ns      the raw accumulate kernel on one payload of the same size (L1, same run)
//   vs_kernel      ns_per_pkt / kernel_ns: the protocol's overhead as a multiple of the arithmetic
// Run: build-core/bench/treeduce-bench-switch-core --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "treeduce/aggregation/kernels.h"
#include "treeduce/dataplane/core.h"

namespace {

using namespace treeduce;
using namespace treeduce::dp;

constexpr std::uint32_t kSlots = 16;
constexpr std::size_t kChunkOffset = kFrameHeaderBytes - sizeof(TdHdr) + 16;  // TdHdr::chunk

Endpoint ep(std::uint32_t n, std::uint16_t port) {
  Endpoint e;
  e.mac[0] = 0x02;
  e.mac[5] = static_cast<std::uint8_t>(n);
  e.ip = 0x0A000000 + n;
  e.port = port;
  return e;
}

double kernel_ns(std::size_t payload_bytes) {
  const auto acc_fn = agg::kernels().accumulate_fn(DType::f32, ReduceOp::sum);
  std::vector<float> acc(payload_bytes / 4, 1.0f), in(payload_bytes / 4, 0.5f);
  constexpr int kReps = 200000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kReps; ++i) {
    acc_fn(acc.data(), in.data(), in.size());
    benchmark::DoNotOptimize(acc.data());
    benchmark::ClobberMemory();
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / kReps;
}

void BM_SwitchCore(benchmark::State& state) {
  const auto payload = static_cast<std::uint32_t>(state.range(0));
  const auto fanin = static_cast<std::uint16_t>(state.range(1));
  const bool det = state.range(2) != 0;
  const Endpoint self = ep(1, kDefaultUdpPort);
  Core core(CoreConfig{self});
  TreeConfig tc;
  tc.tree_id = 1;
  tc.key = 42;
  tc.slots = kSlots;
  tc.payload_bytes = payload;
  tc.deterministic = det;
  for (std::uint16_t c = 0; c < fanin; ++c) tc.children.push_back({ep(100 + c, 5000), 1});
  if (!core.install_tree(tc).ok()) {
    state.SkipWithError("install_tree failed");
    return;
  }
  // Frames for two rounds of the slots (both versions), chunk-major.
  const std::size_t rounds = 2 * kSlots;
  const std::size_t flen = kFrameHeaderBytes + payload;
  std::vector<std::uint8_t> frames(rounds * fanin * flen);
  std::vector<float> values(payload / 4);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97);
  for (std::uint32_t chunk = 0; chunk < rounds; ++chunk) {
    for (std::uint16_t c = 0; c < fanin; ++c) {
      TdHdr h{};
      h.version = kProtocolVersion;
      h.opcode = static_cast<std::uint8_t>(Opcode::contrib);
      h.dtype = static_cast<std::uint8_t>(DType::f32);
      h.tree_id.set(std::uint16_t{1});
      h.child.set(c);
      h.slot.set(static_cast<std::uint16_t>(chunk % kSlots));
      h.slot_ver = static_cast<std::uint8_t>((chunk / kSlots) % 2);
      h.count.set(static_cast<std::uint16_t>(payload / 4));
      h.ncontrib.set(std::uint16_t{1});
      h.chunk.set(chunk);
      h.key.set(std::uint64_t{42});
      build_frame(&frames[(chunk * fanin + c) * flen], tc.children[c].addr, self, h, values.data(),
                  payload);
    }
  }
  std::vector<RxFrame> rx(rounds * fanin);
  for (std::size_t i = 0; i < rx.size(); ++i) rx[i] = {&frames[i * flen], flen};
  std::vector<TxFrame> tx(32 * kMaxChildren);

  std::uint32_t chunk = 0;
  std::uint64_t pkts = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const std::size_t r = chunk % rounds;
    if (r == 0 && chunk != 0) {
      // Next cycle: the same frames carry chunk numbers one cycle later.
      for (std::size_t i = 0; i < rx.size(); ++i) {
        std::uint8_t* p = &frames[i * flen + kChunkOffset];
        std::uint32_t v;
        std::memcpy(&v, p, 4);
        v = bswap_be(bswap_be(v) + static_cast<std::uint32_t>(rounds));
        std::memcpy(p, &v, 4);
      }
    }
    const RxFrame* in = &rx[r * fanin];
    std::size_t left = fanin;
    while (left != 0) {
      std::size_t ntx = 0;
      const std::size_t burst = left < 32 ? left : 32;
      const std::size_t done = core.process_burst(in, burst, tx.data(), tx.size(), &ntx);
      benchmark::DoNotOptimize(tx.data());
      in += done;
      left -= done;
    }
    pkts += fanin;
    ++chunk;
  }
  const auto t1 = std::chrono::steady_clock::now();
  const Counters& c = core.counters();
  if (c.event(Event::contrib_accepted) != pkts || c.total_drops() != 0) {
    state.SkipWithError("the core refused benchmark packets");
    return;
  }
  const double ns =
      std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(pkts);
  const double k = kernel_ns(payload);
  state.counters["ns_per_pkt"] = ns;
  state.counters["kernel_ns"] = k;
  state.counters["vs_kernel"] = ns / k;
  state.counters["Mpps"] = 1e3 / ns;
  state.SetItemsProcessed(static_cast<std::int64_t>(pkts));
  state.SetBytesProcessed(static_cast<std::int64_t>(pkts * payload));
}

void Args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"payload", "fanin", "det"});
  for (int det : {0, 1}) {
    for (int payload : {256, 1024, 4096}) {
      for (int fanin : {2, 8, 32}) b->Args({payload, fanin, det});
    }
  }
}
BENCHMARK(BM_SwitchCore)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
