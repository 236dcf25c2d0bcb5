// Whether this test binary is built with sanitizers (meson's b_sanitize, the second build of
// scripts/test.sh): there every operation runs several times slower, so the longest randomized
// tests check fewer random cases (each says which) while still reaching every code path. The
// release build runs them in full.
#pragma once

#include <cstddef>

namespace treeduce::testing {

inline constexpr bool kSanitized = TREEDUCE_TEST_SANITIZED != 0;

/// Whether a kernel test checks length `n` of 0..max: every length in a release build; under the
/// sanitizers every length up to 130 and every third above it, and max. The kernels step through
/// at most two vectors of 64 lanes at a time, so above 130 every remainder modulo 128 (every tail
/// and loop exit) is still met, at least twice.
inline constexpr bool length_checked(std::size_t n, std::size_t max) {
  return !kSanitized || n <= 130 || n % 3 == 0 || n == max;
}

}  // namespace treeduce::testing
