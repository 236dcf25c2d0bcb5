// Random payloads and accumulators with special values mixed in, shared by the kernel tests.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::testing {

/// Raw bytes of n wire elements of type d: mostly ordinary values, about a quarter special ones
/// (+-0, infinities, NaNs with assorted payloads and signs, subnormals, extremes, random bits).
inline std::vector<unsigned char> random_payload(DType d, std::size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> out(n * dtype_size(d));
  std::uniform_real_distribution<float> ordinary(-8.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  for (std::size_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    const auto raw = static_cast<std::uint32_t>(rng());
    float f = ordinary(rng);
    switch (p) {
      case 0:
        f = 0.0f;
        break;
      case 1:
        f = -0.0f;
        break;
      case 2:
        f = std::bit_cast<float>((raw & 0x807FFFFFu) | 0x7F800000u | 1u);  // NaN, any payload
        break;
      case 3:
        f = (raw & 1) ? INFINITY : -INFINITY;
        break;
      case 4:
        f = std::ldexp(ordinary(rng), -20 - static_cast<int>(raw % 120));  // tiny, subnormal in any
        break;
      case 5:
        f = std::ldexp(ordinary(rng), static_cast<int>(raw % 20));  // large, overflows narrow types
        break;
      default:
        break;
    }
    unsigned char* dst = out.data() + i * dtype_size(d);
    switch (d) {
      default:  // TODO(issue 14): the types added by issue 14
        break;
      case DType::f32: {
        if (p == 6) f = std::bit_cast<float>(raw);
        std::memcpy(dst, &f, 4);
        break;
      }
      case DType::i32: {
        std::int32_t v = p < 4 ? static_cast<std::int32_t>(raw)  // full range: wraps on sums
                               : static_cast<std::int32_t>(raw % 2001) - 1000;
        if (p == 4) v = INT32_MAX;
        if (p == 5) v = INT32_MIN;
        std::memcpy(dst, &v, 4);
        break;
      }
      case DType::f16:
      case DType::bf16: {
        std::uint16_t h = d == DType::f16 ? agg::f32_to_f16(f) : agg::f32_to_bf16(f);
        if (p == 6) h = static_cast<std::uint16_t>(raw);  // any encoding
        if (p == 2)
          h = static_cast<std::uint16_t>(h | (raw & 0x8000u) | (raw & 0x3Fu) | 1u);  // NaN payloads
        std::memcpy(dst, &h, 2);
        break;
      }
      case DType::e4m3:
        *dst = p == 6 ? static_cast<unsigned char>(raw) : agg::f32_to_e4m3(f);
        break;
      case DType::e5m2:
        *dst = p == 6 ? static_cast<unsigned char>(raw) : agg::f32_to_e5m2(f);
        if (p == 2) *dst = static_cast<unsigned char>(0x7D | (raw & 0x80u) | (raw & 2u));  // NaNs
        break;
    }
  }
  return out;
}

/// Bit equality, except that any NaN equals any NaN (sum accumulators: NaN payload unspecified).
inline bool same_lane(std::uint32_t a, std::uint32_t b, bool nan_equal) {
  if (a == b) return true;
  if (!nan_equal) return false;
  return std::isnan(std::bit_cast<float>(a)) && std::isnan(std::bit_cast<float>(b));
}

}  // namespace treeduce::testing
