// treeduce-bench-kernels: throughput of the aggregation kernels, as ratios against plain loops
// measured in the same iterations (the machine is shared and noisy; absolute figures drift, ratios
// hold). Rows, for every (dtype, op) that op_defined() accepts (the pair types have rows of their
// own below):
//   accumulate/<dtype>/<op>/<L1|L2|DRAM>  acc[i] = acc[i] OP widen(in[i]); accumulator 16 KiB,
//                                         256 KiB or 256 MiB (acc_size(dtype) bytes an element)
//   reduce8/<dtype>/sum/L2                8 payloads folded in order into a fresh accumulator
//   emit/<dtype>/L2                       accumulator narrowed to the wire type
// Counters:
//   input_GBps   wire bytes consumed per second (emit: accumulator bytes)
//   vs_baseline  baseline time / kernel time for the same elements. Baselines, compiled for the
//                best ISA of this CPU (target_clones) and auto-vectorised at -O3:
//                f32: `acc[i] += in[i]` on float; f16: the same with F16C (vcvtph2ps, 8
//                lanes); bf16: `acc[i] += bits(in[i] << 16)`; e4m3/e5m2: `acc[i] += table[in[i]]`
//                (the naive widening) -- for every operation of these five types; the integer
//                types and f64: the plain `acc[i] OP= in[i]` loop in that type for each operation
//                (wrapping + and * in the unsigned type, `b < a ? b : a` for min, `(a != 0) &&
//                (b != 0)` for land, ...); reduce8: 7 baseline passes after a load; emit: none.
//   vs_f32_elements  FP8 only: this kernel's elements per second over those of the f32 kernel of
//                the same operation (for sum rows, the f32 sum), timed in the same iterations on
//                the same element count and the same accumulator. The FP8 target
//                (docs/performance.md) is >= 1.0 for the sums at L1 and L2.
// The kernel path is the active one (best for this CPU, or TREEDUCE_KERNEL_ISA).
#include <benchmark/benchmark.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

using Clock = std::chrono::steady_clock;

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TD_BASELINE \
  __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4"), noinline))
#else
#define TD_BASELINE __attribute__((noinline))
#endif

TD_BASELINE void base_f32(float* __restrict acc, const float* __restrict in, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += in[i];
}
TD_BASELINE void base_f16_plain(float* __restrict acc, const _Float16* __restrict in,
                                std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += static_cast<float>(in[i]);
}
#if defined(__x86_64__)
// GCC 12 does not vectorise _Float16 widening (it calls libgcc), so where F16C exists the baseline
// is the obvious F16C loop instead: 8 lanes at a time, no unrolling.
__attribute__((target("avx2,f16c"), noinline)) void base_f16_f16c(
    float* __restrict acc, const std::uint16_t* __restrict in, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), x));
  }
  for (; i < n; ++i) acc[i] += f16_to_f32(in[i]);
}
#endif
void base_f16(float* acc, const void* in, std::size_t n) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("f16c")) {
    return base_f16_f16c(acc, static_cast<const std::uint16_t*>(in), n);
  }
#endif
  base_f16_plain(acc, static_cast<const _Float16*>(in), n);
}
TD_BASELINE void base_bf16(float* __restrict acc, const std::uint16_t* __restrict in,
                           std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    acc[i] += std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16);
  }
}
TD_BASELINE void base_table(float* __restrict acc, const std::uint8_t* __restrict in,
                            const float* __restrict table, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] += table[in[i]];
}

// The plain loop in the type itself, for the integer types and f64. Integer + and * wrap in the
// unsigned type (what the instructions do; signed overflow would be undefined in C++).
template <class T, ReduceOp O>
TD_BASELINE void base_plain(T* __restrict acc, const T* __restrict in, std::size_t n) {
  using U = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>,
                                        std::type_identity<T>>::type;
  for (std::size_t i = 0; i < n; ++i) {
    const T a = acc[i], b = in[i];
    if constexpr (O == ReduceOp::sum) {
      acc[i] = static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (O == ReduceOp::prod) {
      acc[i] = static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    } else if constexpr (O == ReduceOp::min) {
      acc[i] = b < a ? b : a;
    } else if constexpr (O == ReduceOp::max) {
      acc[i] = a < b ? b : a;
    } else if constexpr (O == ReduceOp::band) {
      acc[i] = static_cast<T>(a & b);
    } else if constexpr (O == ReduceOp::bor) {
      acc[i] = static_cast<T>(a | b);
    } else if constexpr (O == ReduceOp::bxor) {
      acc[i] = static_cast<T>(a ^ b);
    } else if constexpr (O == ReduceOp::land) {
      acc[i] = static_cast<T>(a != 0 && b != 0);
    } else if constexpr (O == ReduceOp::lor) {
      acc[i] = static_cast<T>(a != 0 || b != 0);
    } else {
      acc[i] = static_cast<T>((a != 0) != (b != 0));
    }
  }
}

using BaselineFn = void (*)(void* acc, const void* in, std::size_t n);

template <class T, ReduceOp O>
void base_plain_erased(void* acc, const void* in, std::size_t n) {
  base_plain<T, O>(static_cast<T*>(acc), static_cast<const T*>(in), n);
}

template <class T>
BaselineFn plain_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return &base_plain_erased<T, ReduceOp::sum>;
    case ReduceOp::prod:
      return &base_plain_erased<T, ReduceOp::prod>;
    case ReduceOp::min:
      return &base_plain_erased<T, ReduceOp::min>;
    case ReduceOp::max:
      return &base_plain_erased<T, ReduceOp::max>;
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case ReduceOp::band:
        return &base_plain_erased<T, ReduceOp::band>;
      case ReduceOp::bor:
        return &base_plain_erased<T, ReduceOp::bor>;
      case ReduceOp::bxor:
        return &base_plain_erased<T, ReduceOp::bxor>;
      case ReduceOp::land:
        return &base_plain_erased<T, ReduceOp::land>;
      case ReduceOp::lor:
        return &base_plain_erased<T, ReduceOp::lor>;
      case ReduceOp::lxor:
        return &base_plain_erased<T, ReduceOp::lxor>;
      default:
        break;
    }
  }
  return nullptr;  // not defined: never registered
}

struct Table8 {
  float e4m3[256], e5m2[256];
  Table8() {
    for (int b = 0; b < 256; ++b) {
      e4m3[b] = e4m3_to_f32(static_cast<std::uint8_t>(b));
      e5m2[b] = e5m2_to_f32(static_cast<std::uint8_t>(b));
    }
  }
};
const Table8 kTable8;

void baseline(DType d, ReduceOp op, void* acc_bytes, const void* in, std::size_t n) {
  auto* acc = static_cast<float*>(acc_bytes);
  switch (d) {
    case DType::f32:
      return base_f32(acc, static_cast<const float*>(in), n);
    case DType::f16:
      return base_f16(acc, in, n);
    case DType::bf16:
      return base_bf16(acc, static_cast<const std::uint16_t*>(in), n);
    case DType::e4m3:
      return base_table(acc, static_cast<const std::uint8_t*>(in), kTable8.e4m3, n);
    case DType::e5m2:
      return base_table(acc, static_cast<const std::uint8_t*>(in), kTable8.e5m2, n);
    case DType::i8:
      return plain_for<std::int8_t>(op)(acc_bytes, in, n);
    case DType::u8:
      return plain_for<std::uint8_t>(op)(acc_bytes, in, n);
    case DType::i16:
      return plain_for<std::int16_t>(op)(acc_bytes, in, n);
    case DType::u16:
      return plain_for<std::uint16_t>(op)(acc_bytes, in, n);
    case DType::i32:
      return plain_for<std::int32_t>(op)(acc_bytes, in, n);
    case DType::u32:
      return plain_for<std::uint32_t>(op)(acc_bytes, in, n);
    case DType::i64:
      return plain_for<std::int64_t>(op)(acc_bytes, in, n);
    case DType::u64:
      return plain_for<std::uint64_t>(op)(acc_bytes, in, n);
    case DType::f64:
      return plain_for<double>(op)(acc_bytes, in, n);
    case DType::f32_i32:
    case DType::f64_i32:
    case DType::i32_i32:
      break;  // pair rows: bm_pairs
  }
}

struct Free {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char, Free>;

Buffer alloc(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, bytes);  // touch every page before timing
  return Buffer(static_cast<unsigned char*>(p));
}

// Payload of ordinary values: floats in (-1, 1) (no NaN, infinity or subnormal slows any path),
// or, for prod, +-(1 + a little) so that a product repeated over the iterations neither underflows
// nor overflows soon; integers of random bits.
Buffer make_payload(DType d, ReduceOp op, std::size_t n, std::uint64_t seed) {
  Buffer b = alloc(n * dtype_size(d));
  std::mt19937_64 rng(seed);
  if (is_integer(d)) {
    for (std::size_t i = 0; i < n * dtype_size(d); i += 8) {
      const std::uint64_t r = rng();
      std::memcpy(b.get() + i, &r, std::min<std::size_t>(8, n * dtype_size(d) - i));
    }
    return b;
  }
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const auto value = [&] {
    const double x = u(rng);
    return op == ReduceOp::prod ? (x < 0 ? -1.0 : 1.0) + x * 0x1p-12 : x;
  };
  if (d == DType::f64) {
    for (std::size_t i = 0; i < n; ++i) {
      const double x = value();
      std::memcpy(b.get() + i * 8, &x, 8);
    }
    return b;
  }
  std::vector<float> v(std::min<std::size_t>(n, 1u << 16));
  const KernelTable& t = *kernels_for(Isa::scalar);
  for (std::size_t i = 0; i < n; i += v.size()) {
    const std::size_t m = std::min(v.size(), n - i);
    for (std::size_t j = 0; j < m; ++j) v[j] = static_cast<float>(value());
    t.emit_fn(d)(b.get() + i * dtype_size(d), v.data(), m);
  }
  return b;
}

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void bm_accumulate(benchmark::State& st, DType d, ReduceOp op, std::size_t acc_bytes) {
  const std::size_t n = acc_bytes / acc_size(d);
  const Buffer in = make_payload(d, op, n, 1);
  const Buffer acc = alloc(n * acc_size(d)), base_acc = alloc(n * acc_size(d));
  const bool fp8 = d == DType::e4m3 || d == DType::e5m2;
  const Buffer f32_in = fp8 ? make_payload(DType::f32, op, n, 2) : Buffer();
  const KernelTable& t = kernels();
  t.load_fn(d, op)(acc.get(), in.get(), n);
  t.load_fn(d, op)(base_acc.get(), in.get(), n);  // the same start (the narrow ones: binary32)
  const AccumulateFn fn = t.accumulate_fn(d, op), f32_fn = t.accumulate_fn(DType::f32, op);
  double tk = 0, tb = 0, t32 = 0;
  for (auto _ : st) {
    const auto a = Clock::now();
    fn(acc.get(), in.get(), n);
    const auto b = Clock::now();
    baseline(d, op, base_acc.get(), in.get(), n);
    const auto c = Clock::now();
    if (fp8) f32_fn(acc.get(), f32_in.get(), n);  // same accumulator, as warm as the kernel's
    const auto e = Clock::now();
    benchmark::ClobberMemory();
    st.SetIterationTime(seconds(a, b));
    tk += seconds(a, b);
    tb += seconds(b, c);
    t32 += seconds(c, e);
  }
  const auto iters = static_cast<double>(st.iterations());
  const double bytes = static_cast<double>(n * dtype_size(d)) * iters;
  st.counters["input_GBps"] = bytes / tk / 1e9;
  st.counters["vs_baseline"] = tb / tk;
  if (fp8) st.counters["vs_f32_elements"] = t32 / tk;  // same element count: a ratio of rates
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

void bm_reduce8(benchmark::State& st, DType d, std::size_t acc_bytes) {
  constexpr std::size_t kK = 8;
  const std::size_t n = acc_bytes / acc_size(d);
  std::vector<Buffer> in;
  std::vector<const void*> ptrs;
  for (std::size_t j = 0; j < kK; ++j) {
    in.push_back(make_payload(d, ReduceOp::sum, n, 10 + j));
    ptrs.push_back(in.back().get());
  }
  const Buffer acc = alloc(n * acc_size(d)), base_acc = alloc(n * acc_size(d));
  const ReduceFn fn = kernels().reduce_fn(d, ReduceOp::sum);
  const LoadFn load = kernels().load_fn(d, ReduceOp::sum);
  double tk = 0, tb = 0;
  for (auto _ : st) {
    const auto a = Clock::now();
    fn(acc.get(), ptrs.data(), kK, n);
    const auto b = Clock::now();
    load(base_acc.get(), ptrs[0], n);  // the naive way: first payload, then k-1 baseline passes
    for (std::size_t j = 1; j < kK; ++j) {
      baseline(d, ReduceOp::sum, base_acc.get(), ptrs[j], n);
    }
    const auto c = Clock::now();
    benchmark::ClobberMemory();
    st.SetIterationTime(seconds(a, b));
    tk += seconds(a, b);
    tb += seconds(b, c);
  }
  const double bytes =
      static_cast<double>(kK * n * dtype_size(d)) * static_cast<double>(st.iterations());
  st.counters["input_GBps"] = bytes / tk / 1e9;
  st.counters["vs_baseline"] = tb / tk;
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

void bm_emit(benchmark::State& st, DType d, std::size_t acc_bytes) {
  const std::size_t n = acc_bytes / acc_size(d);
  const Buffer in = make_payload(d, ReduceOp::sum, n, 3);
  const Buffer acc = alloc(n * acc_size(d)), out = alloc(n * dtype_size(d));
  kernels().load_fn(d, ReduceOp::sum)(acc.get(), in.get(), n);
  const EmitFn fn = kernels().emit_fn(d);
  double tk = 0;
  for (auto _ : st) {
    const auto a = Clock::now();
    fn(out.get(), acc.get(), n);
    const auto b = Clock::now();
    benchmark::ClobberMemory();
    st.SetIterationTime(seconds(a, b));
    tk += seconds(a, b);
  }
  const double bytes = static_cast<double>(n * acc_size(d)) * static_cast<double>(st.iterations());
  st.counters["input_GBps"] = bytes / tk / 1e9;
  st.SetBytesProcessed(static_cast<std::int64_t>(bytes));
}

// L1: a switch's per-packet working set (one slot's accumulator is 1-8 KiB, hot in L1), where the
// kernels are compute-bound. L2 and DRAM: streaming, bound by the accumulator's read and write.
constexpr std::size_t kL1 = 16u << 10, kL2 = 256u << 10, kDram = 256u << 20;

void register_all() {
  for (DType d : kAllDTypes) {
    if (is_pair(d)) continue;  // register_pairs()
    for (ReduceOp op : kAllReduceOps) {
      if (!op_defined(d, op)) continue;
      for (auto [size, label] :
           {std::pair{kL1, "L1"}, std::pair{kL2, "L2"}, std::pair{kDram, "DRAM"}}) {
        const std::string nm =
            "accumulate/" + std::string(name(d)) + "/" + std::string(name(op)) + "/" + label;
        benchmark::RegisterBenchmark(nm.c_str(), bm_accumulate, d, op, size)
            ->UseManualTime()
            ->MinTime(size == kDram ? 0.5 : 0.2)
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  for (DType d : kAllDTypes) {
    if (is_pair(d)) continue;  // register_pairs()
    const std::string nm = "reduce8/" + std::string(name(d)) + "/sum/L2";
    benchmark::RegisterBenchmark(nm.c_str(), bm_reduce8, d, kL2)
        ->UseManualTime()
        ->MinTime(0.2)
        ->Unit(benchmark::kMicrosecond);
  }
  for (DType d : kAllDTypes) {
    if (is_pair(d)) continue;  // register_pairs()
    const std::string nm = "emit/" + std::string(name(d)) + "/L2";
    benchmark::RegisterBenchmark(nm.c_str(), bm_emit, d, kL2)
        ->UseManualTime()
        ->MinTime(0.2)
        ->Unit(benchmark::kMicrosecond);
  }
}

// ---- MINLOC/MAXLOC on the pair types -----------------------------------------------------------
// Rows accumulate/<pair>/<minloc|maxloc>/<L1|L2> and reduce8/<pair>/<minloc|maxloc>/L2. Every
// iteration starts each accumulator again from the same copy (untimed), so the kernels and the
// baseline do the same work each time (a MINLOC accumulator left alone converges and its
// comparisons become predictable). Counters:
//   input_GBps   wire bytes of the payload(s) consumed per second
//   vs_scalar    the scalar reference's time over this kernel's, same iterations
//   vs_baseline  a plain loop's time over this kernel's: `if (in.v < acc.v || (in.v == acc.v &&
//                in.i < acc.i)) acc = in` (MPI's rule without NaN or -0 handling), compiled for
//                the best ISA of this CPU; reduce8: 7 such passes after a copy

struct PairF32 {
  float v;
  std::int32_t i;
};
struct PairF64 {
  double v;
  std::int32_t i;
  std::uint32_t pad;
};
struct PairI32 {
  std::int32_t v;
  std::int32_t i;
};

#define TD_PAIR_BASELINE(fn, P, cmp)                                                           \
  TD_BASELINE void fn(P* __restrict acc, const P* __restrict in, std::size_t n) {              \
    for (std::size_t k = 0; k < n; ++k) {                                                      \
      if (in[k].v cmp acc[k].v || (in[k].v == acc[k].v && in[k].i < acc[k].i)) acc[k] = in[k]; \
    }                                                                                          \
  }
TD_PAIR_BASELINE(base_minloc_f32, PairF32, <)
TD_PAIR_BASELINE(base_maxloc_f32, PairF32, >)
TD_PAIR_BASELINE(base_minloc_f64, PairF64, <)
TD_PAIR_BASELINE(base_maxloc_f64, PairF64, >)
TD_PAIR_BASELINE(base_minloc_i32, PairI32, <)
TD_PAIR_BASELINE(base_maxloc_i32, PairI32, >)
#undef TD_PAIR_BASELINE

void pair_baseline(DType d, ReduceOp op, void* acc, const void* in, std::size_t n) {
  const bool min = op == ReduceOp::minloc;
  switch (d) {
    case DType::f32_i32:
      return (min ? base_minloc_f32 : base_maxloc_f32)(static_cast<PairF32*>(acc),
                                                       static_cast<const PairF32*>(in), n);
    case DType::f64_i32:
      return (min ? base_minloc_f64 : base_maxloc_f64)(static_cast<PairF64*>(acc),
                                                       static_cast<const PairF64*>(in), n);
    default:
      return (min ? base_minloc_i32 : base_maxloc_i32)(static_cast<PairI32*>(acc),
                                                       static_cast<const PairI32*>(in), n);
  }
}

// Ordinary values with many ties (integers -8..8, as floats for the float pairs), random
// indices; no NaN, so the baseline's answer is the kernels' too.
Buffer make_pairs(DType d, std::size_t n, std::uint64_t seed) {
  Buffer b = alloc(n * dtype_size(d));
  std::mt19937_64 rng(seed);
  for (std::size_t k = 0; k < n; ++k) {
    const int v = static_cast<int>(rng() % 17) - 8;
    const auto i = static_cast<std::int32_t>(rng() % 1000);
    unsigned char* at = b.get() + k * dtype_size(d);
    if (d == DType::f32_i32) {
      const PairF32 p{static_cast<float>(v), i};
      std::memcpy(at, &p, sizeof p);
    } else if (d == DType::f64_i32) {
      const PairF64 p{static_cast<double>(v), i, 0};
      std::memcpy(at, &p, sizeof p);
    } else {
      const PairI32 p{v, i};
      std::memcpy(at, &p, sizeof p);
    }
  }
  return b;
}

void bm_pairs(benchmark::State& st, DType d, ReduceOp op, std::size_t k, std::size_t acc_bytes) {
  const std::size_t n = acc_bytes / dtype_size(d), bytes = n * dtype_size(d);
  std::vector<Buffer> in;
  std::vector<const void*> ptrs;
  for (std::size_t j = 0; j < std::max<std::size_t>(k, 2); ++j) {
    in.push_back(make_pairs(d, n, 20 + j));
    ptrs.push_back(in.back().get());
  }
  const Buffer start = make_pairs(d, n, 19);
  const Buffer acc = alloc(bytes), ref_acc = alloc(bytes), base_acc = alloc(bytes);
  const KernelTable& t = kernels();
  const KernelTable& ref = *kernels_for(Isa::scalar);
  // One timed call: accumulate one payload into a fresh copy of `start` (k == 1), or reduce k.
  auto run = [&](const KernelTable& tab, void* a) {
    if (k == 1) {
      std::memcpy(a, start.get(), bytes);
      const auto t0 = Clock::now();
      tab.accumulate_fn(d, op)(a, ptrs[0], n);
      return seconds(t0, Clock::now());
    }
    const auto t0 = Clock::now();
    tab.reduce_fn(d, op)(a, ptrs.data(), k, n);
    return seconds(t0, Clock::now());
  };
  double tk = 0, ts = 0, tb = 0;
  for (auto _ : st) {
    const double kt = run(t, acc.get());
    ts += run(ref, ref_acc.get());
    if (k == 1) std::memcpy(base_acc.get(), start.get(), bytes);
    const auto b0 = Clock::now();
    if (k > 1) std::memcpy(base_acc.get(), ptrs[0], bytes);
    for (std::size_t j = k == 1 ? 0 : 1; j < k; ++j)
      pair_baseline(d, op, base_acc.get(), ptrs[j], n);
    tb += seconds(b0, Clock::now());
    benchmark::ClobberMemory();
    st.SetIterationTime(kt);
    tk += kt;
  }
  const double consumed = static_cast<double>(k * bytes) * static_cast<double>(st.iterations());
  st.counters["input_GBps"] = consumed / tk / 1e9;
  st.counters["vs_scalar"] = ts / tk;
  st.counters["vs_baseline"] = tb / tk;
  st.SetBytesProcessed(static_cast<std::int64_t>(consumed));
}

void register_pairs() {
  for (DType d : {DType::f32_i32, DType::f64_i32, DType::i32_i32}) {
    for (ReduceOp op : {ReduceOp::minloc, ReduceOp::maxloc}) {
      const std::string stem = std::string(name(d)) + "/" + std::string(name(op));
      for (auto [size, label] : {std::pair{kL1, "L1"}, std::pair{kL2, "L2"}}) {
        benchmark::RegisterBenchmark(("accumulate/" + stem + "/" + label).c_str(), bm_pairs, d, op,
                                     std::size_t{1}, size)
            ->UseManualTime()
            ->MinTime(0.2)
            ->Unit(benchmark::kMicrosecond);
      }
      benchmark::RegisterBenchmark(("reduce8/" + stem + "/L2").c_str(), bm_pairs, d, op,
                                   std::size_t{8}, kL2)
          ->UseManualTime()
          ->MinTime(0.2)
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace treeduce::agg

int main(int argc, char** argv) {
  using namespace treeduce::agg;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("kernel_isa", std::string(name(kernels().isa)));
  register_all();
  register_pairs();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
