// Random payloads and accumulators with special values mixed in, shared by the kernel tests.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::testing {

namespace detail {

// One integer of type T: full-range bits (sums and products wrap), the extremes, 0, -1 (all ones),
// 1, or a small value (frequent zeros and ties, products that do not vanish at once).
template <class T>
T random_int(int p, std::uint64_t raw) {
  switch (p) {
    case 0:
    case 1:
    case 2:
    case 3:
      return static_cast<T>(raw);
    case 4:
      return std::numeric_limits<T>::max();
    case 5:
      return std::numeric_limits<T>::min();
    case 6:
      return T{0};
    case 7:
      return static_cast<T>(~T{0});  // -1, or the unsigned maximum
    case 8:
      return T{1};
    case 9:
      return static_cast<T>(std::numeric_limits<T>::min() + 1);
    default:
      return static_cast<T>(static_cast<std::int64_t>(raw % 7) - 3);
  }
}

// One binary64: +-0, NaNs of any payload and sign, infinities, subnormals, huge values whose
// products overflow, random bits, or an ordinary value.
inline double random_f64(int p, std::uint64_t raw, float ordinary) {
  switch (p) {
    case 0:
      return 0.0;
    case 1:
      return -0.0;
    case 2:  // NaN, any payload (quiet or signalling), either sign
      return std::bit_cast<double>((raw & 0x800FFFFFFFFFFFFFull) | 0x7FF0000000000000ull | 1u);
    case 3:
      return (raw & 1) ? INFINITY : -INFINITY;
    case 4:  // subnormal or tiny
      return std::ldexp(static_cast<double>(ordinary), -1000 - static_cast<int>(raw % 80));
    case 5:  // huge: sums and products overflow
      return std::ldexp(static_cast<double>(ordinary), 900 + static_cast<int>(raw % 130));
    case 6:
      return std::bit_cast<double>(raw);
    case 7:
      return static_cast<double>(ordinary) + std::ldexp(static_cast<double>(raw % 1024), -60);
    default:
      return static_cast<double>(ordinary);
  }
}

}  // namespace detail

/// Raw bytes of n wire elements of type d: mostly ordinary values, about half special ones (+-0,
/// infinities, NaNs with assorted payloads and signs, subnormals, extremes, random bits). Pair
/// types get values with many ties and indices that include INT32_MIN and INT32_MAX; f64_i32's
/// padding is random.
inline std::vector<unsigned char> random_payload(DType d, std::size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> out(n * dtype_size(d));
  std::uniform_real_distribution<float> ordinary(-8.0f, 8.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  for (std::size_t i = 0; i < n; ++i) {
    const int p = pick(rng);
    const std::uint64_t raw64 = rng();
    const auto raw = static_cast<std::uint32_t>(raw64);
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
    auto put = [dst](auto v) { std::memcpy(dst, &v, sizeof v); };
    // Pair indices: few distinct values (ties), the extremes now and then.
    const auto index = [&] {
      const int q = static_cast<int>((raw64 >> 40) % 8);
      return q == 0 ? INT32_MIN : q == 1 ? INT32_MAX : static_cast<std::int32_t>(q) - 4;
    };
    switch (d) {
      case DType::f32: {
        if (p == 6) f = std::bit_cast<float>(raw);
        put(f);
        break;
      }
      case DType::i32: {
        std::int32_t v = p < 4 ? static_cast<std::int32_t>(raw)  // full range: wraps on sums
                               : static_cast<std::int32_t>(raw % 2001) - 1000;
        if (p == 4) v = INT32_MAX;
        if (p == 5) v = INT32_MIN;
        if (p == 6) v = 0;
        put(v);
        break;
      }
      case DType::i8:
        put(detail::random_int<std::int8_t>(p, raw64));
        break;
      case DType::u8:
        put(detail::random_int<std::uint8_t>(p, raw64));
        break;
      case DType::i16:
        put(detail::random_int<std::int16_t>(p, raw64));
        break;
      case DType::u16:
        put(detail::random_int<std::uint16_t>(p, raw64));
        break;
      case DType::u32:
        put(detail::random_int<std::uint32_t>(p, raw64));
        break;
      case DType::i64:
        put(detail::random_int<std::int64_t>(p, raw64));
        break;
      case DType::u64:
        put(detail::random_int<std::uint64_t>(p, raw64));
        break;
      case DType::f64:
        put(detail::random_f64(p, raw64, f));
        break;
      case DType::f16:
      case DType::bf16: {
        std::uint16_t h = d == DType::f16 ? agg::f32_to_f16(f) : agg::f32_to_bf16(f);
        if (p == 6) h = static_cast<std::uint16_t>(raw);  // any encoding
        if (p == 2)
          h = static_cast<std::uint16_t>(h | (raw & 0x8000u) | (raw & 0x3Fu) | 1u);  // NaN payloads
        put(h);
        break;
      }
      case DType::e4m3:
        *dst = p == 6 ? static_cast<unsigned char>(raw) : agg::f32_to_e4m3(f);
        break;
      case DType::e5m2:
        *dst = p == 6 ? static_cast<unsigned char>(raw) : agg::f32_to_e5m2(f);
        if (p == 2) *dst = static_cast<unsigned char>(0x7D | (raw & 0x80u) | (raw & 2u));  // NaNs
        break;
      case DType::f32_i32: {
        const float v = p >= 8 ? static_cast<float>(static_cast<int>(raw % 3)) : f;  // ties
        put(v);
        const std::int32_t ix = index();
        std::memcpy(dst + 4, &ix, 4);
        break;
      }
      case DType::f64_i32: {
        const double v = p >= 8 ? static_cast<double>(raw % 3) : detail::random_f64(p, raw64, f);
        put(v);
        const std::int32_t ix = index();
        std::memcpy(dst + 8, &ix, 4);
        const auto pad = static_cast<std::uint32_t>(rng());  // ignored on input
        std::memcpy(dst + 12, &pad, 4);
        break;
      }
      case DType::i32_i32: {
        const auto v = p >= 8 ? static_cast<std::int32_t>(raw % 3)
                              : detail::random_int<std::int32_t>(p, raw64);
        put(v);
        const std::int32_t ix = index();
        std::memcpy(dst + 4, &ix, 4);
        break;
      }
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

/// The same for an accumulator element of acc_size(d) bytes: a binary32 lane for f32 and the
/// narrow floats, a binary64 one for f64, exact bytes for every other type.
inline bool same_acc_element(DType d, const unsigned char* a, const unsigned char* b,
                             bool nan_equal) {
  const std::size_t size = acc_size(d);
  if (std::memcmp(a, b, size) == 0) return true;
  if (!nan_equal) return false;
  if (d == DType::f64) {
    double x, y;
    std::memcpy(&x, a, 8);
    std::memcpy(&y, b, 8);
    return std::isnan(x) && std::isnan(y);
  }
  if (size == 4 && is_float(d)) {
    float x, y;
    std::memcpy(&x, a, 4);
    std::memcpy(&y, b, 4);
    return std::isnan(x) && std::isnan(y);
  }
  return false;
}

}  // namespace treeduce::testing
