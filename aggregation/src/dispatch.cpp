#include <atomic>
#include <cstdio>
#include <cstdlib>

#if TREEDUCE_HAVE_X86_SIMD
#include <cpuid.h>
#endif

#include "table.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {

std::string_view name(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
    case Isa::avx512_bf16:
      return "avx512_bf16";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view s) noexcept {
  for (std::size_t i = 0; i < kNumIsas; ++i) {
    const auto isa = static_cast<Isa>(i);
    if (name(isa) == s) return isa;
  }
  return std::nullopt;
}

namespace {

#if TREEDUCE_HAVE_X86_SIMD
// CPUID leaf 1, ECX bit 29. Asked directly because clang 14 does not know
// __builtin_cpu_supports("f16c"); OS support for the YMM state comes with the AVX2 check.
bool cpu_has_f16c() noexcept {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}
#endif

// __builtin_cpu_supports also checks that the OS saves the wider register state (XGETBV).
bool cpu_has(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return true;
#if TREEDUCE_HAVE_X86_SIMD
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && cpu_has_f16c();
#endif
#if TREEDUCE_HAVE_AVX512
    case Isa::avx512:
      return cpu_has(Isa::avx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    case Isa::avx512_bf16:
      return cpu_has(Isa::avx512) && __builtin_cpu_supports("avx512bf16");
#endif
    default:
      return false;  // not built into this binary
  }
}

const KernelTable* table_of(Isa isa) noexcept {
  switch (isa) {
    case Isa::scalar:
      return &detail::scalar_table();
#if TREEDUCE_HAVE_X86_SIMD
    case Isa::avx2:
      return &detail::avx2_table();
#endif
#if TREEDUCE_HAVE_AVX512
    case Isa::avx512:
      return &detail::avx512_table();
    case Isa::avx512_bf16:
      return &detail::avx512_bf16_table();
#endif
    default:
      return nullptr;
  }
}

const KernelTable* initial_table() noexcept {
  const Isa best = best_isa();
  const char* env = std::getenv("TREEDUCE_KERNEL_ISA");
  if (env == nullptr || *env == '\0') return table_of(best);
  const std::optional<Isa> want = parse_isa(env);
  if (!want) {
    std::fprintf(stderr,
                 "treeduce: TREEDUCE_KERNEL_ISA=%s names no kernel path (scalar, avx2, avx512, "
                 "avx512_bf16); using %s\n",
                 env, name(best).data());
    return table_of(best);
  }
  if (!isa_supported(*want)) {
    std::fprintf(
        stderr,
        "treeduce: TREEDUCE_KERNEL_ISA=%s is not supported by this CPU or build; using %s\n", env,
        name(best).data());
    return table_of(best);
  }
  return table_of(*want);
}

std::atomic<const KernelTable*>& active() noexcept {
  static std::atomic<const KernelTable*> table{initial_table()};
  return table;
}

}  // namespace

bool isa_supported(Isa isa) noexcept { return table_of(isa) != nullptr && cpu_has(isa); }

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (std::size_t i = 0; i < kNumIsas; ++i) {
    if (isa_supported(static_cast<Isa>(i))) out.push_back(static_cast<Isa>(i));
  }
  return out;
}

// The avx512_bf16 path is not chosen automatically: with the fix-ups that keep it bit-identical to
// the reference (vcvtneps2bf16 flushes subnormal inputs), its bf16 emit measured 0.85x the integer
// rounding of the avx512 path (AMD EPYC, AVX512-BF16; interleaved A/B, docs/performance.md).
// TREEDUCE_KERNEL_ISA=avx512_bf16 or force_isa() still select it.
Isa best_isa() noexcept {
  for (Isa isa : {Isa::avx512, Isa::avx2}) {
    if (isa_supported(isa)) return isa;
  }
  return Isa::scalar;
}

const KernelTable* kernels_for(Isa isa) noexcept {
  return isa_supported(isa) ? table_of(isa) : nullptr;
}

const KernelTable& kernels() noexcept { return *active().load(std::memory_order_acquire); }

bool force_isa(Isa isa) noexcept {
  const KernelTable* t = kernels_for(isa);
  if (t == nullptr) return false;
  active().store(t, std::memory_order_release);
  return true;
}

}  // namespace treeduce::agg
