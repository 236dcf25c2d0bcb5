// Whether the AVX-512 paths widen FP8 with AVX512-VBMI byte permutes (fp8_vbmi_avx512.inl,
// docs/kernels.md "FP8 widening by table"). Internal to aggregation/.
//
// It is not an Isa of its own: it changes two conversions, not the table, and every CPU with
// AVX-512 VBMI also runs the rest of the avx512 path. On by default where the CPU has VBMI; tests
// switch it off to check the arithmetic widening as well, on the same machine.
#pragma once

#include <atomic>

namespace treeduce::agg::detail {

inline bool cpu_has_avx512_vbmi() noexcept {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vbmi");
#else
  return false;
#endif
}

/// -1 not decided yet, 0 off, 1 on. Constant-initialised, so usable from any static initialiser.
inline std::atomic<int> fp8_vbmi_state{-1};

/// True when the AVX-512 kernels use the VBMI widening for e4m3 and e5m2.
inline bool fp8_vbmi() noexcept {
  int s = fp8_vbmi_state.load(std::memory_order_relaxed);
  if (s < 0) {
    s = cpu_has_avx512_vbmi() ? 1 : 0;
    fp8_vbmi_state.store(s, std::memory_order_relaxed);
  }
  return s != 0;
}

/// Switches the VBMI widening off, or back on where the CPU has it; returns the state now in
/// force. Not for use while another thread runs kernels.
inline bool set_fp8_vbmi(bool on) noexcept {
  const int s = on && cpu_has_avx512_vbmi() ? 1 : 0;
  fp8_vbmi_state.store(s, std::memory_order_relaxed);
  return s != 0;
}

}  // namespace treeduce::agg::detail
