/// @file
/// Scalar reference conversions between the wire types and binary32.
///
/// These are the definitions every SIMD path is tested against bit for bit. They are written to be
/// obviously right rather than fast: one generic minifloat codec, parameterised by the format.
/// Semantics (docs/numerics.md):
/// - Widening is exact. A NaN keeps its sign and payload and becomes quiet (as F16C does); bf16 is
///   widened by extending the bits (it is the top half of a binary32), so nothing changes at all.
/// - Narrowing rounds to nearest, ties to even, once. Subnormals are produced, never flushed.
/// - Overflow: f16, bf16 and e5m2 round to infinity as IEEE 754 does; e4m3 saturates to +-448
///   (infinities included), following the OCP 8-bit floating point spec's saturating mode.
/// - Every NaN narrows to the type's canonical NaN (positive, quiet): a result never depends on
///   which of several NaN payloads won inside the switch.
/// The rounding relies on the default floating-point environment (round-to-nearest); treeduce never
/// changes it.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace treeduce::agg {

/// A binary floating-point format narrower than binary32.
struct MinifloatFormat {
  int exp_bits;
  int man_bits;
  /// IEEE-like: the top exponent holds infinities and NaNs. Otherwise ("FN" formats, E4M3):
  /// only the all-ones pattern is NaN, there is no infinity and overflow saturates.
  bool ieee;
};

inline constexpr MinifloatFormat kFormatF16{5, 10, true};
inline constexpr MinifloatFormat kFormatBF16{8, 7, true};
inline constexpr MinifloatFormat kFormatE5M2{5, 2, true};
inline constexpr MinifloatFormat kFormatE4M3{4, 3, false};

/// Canonical NaN encodings: positive and quiet.
inline constexpr std::uint32_t kCanonicalNanF32 = 0x7FC00000u;
inline constexpr std::uint64_t kCanonicalNanF64 = 0x7FF8000000000000u;
inline constexpr std::uint16_t kCanonicalNanF16 = 0x7E00u;
inline constexpr std::uint16_t kCanonicalNanBF16 = 0x7FC0u;
inline constexpr std::uint8_t kCanonicalNanE5M2 = 0x7Eu;
inline constexpr std::uint8_t kCanonicalNanE4M3 = 0x7Fu;

template <MinifloatFormat F>
struct MinifloatTraits {
  static constexpr std::uint32_t kManMask = (1u << F.man_bits) - 1;
  static constexpr std::uint32_t kExpAllOnes = (1u << F.exp_bits) - 1;
  static constexpr int kBias = (1 << (F.exp_bits - 1)) - 1;
  static constexpr int kEmin = 1 - kBias;
  static constexpr std::uint32_t kSignBit = 1u << (F.exp_bits + F.man_bits);
  static constexpr std::uint32_t kInfBits = kExpAllOnes << F.man_bits;  // IEEE formats only
  /// Largest finite magnitude's encoding.
  static constexpr std::uint32_t kMaxBits = F.ieee ? kInfBits - 1 : kSignBit - 2;
  static constexpr std::uint32_t kCanonicalNan =
      F.ieee ? kInfBits | (1u << (F.man_bits - 1)) : kSignBit - 1;

  static constexpr bool is_nan(std::uint32_t bits) {
    const std::uint32_t mag = bits & (kSignBit - 1);
    return F.ieee ? mag > kInfBits : mag == kSignBit - 1;
  }
};

/// Exact value of a minifloat encoding as binary32.
template <MinifloatFormat F>
inline float widen_minifloat(std::uint32_t bits) {
  using T = MinifloatTraits<F>;
  const std::uint32_t sign = bits & T::kSignBit;
  const std::uint32_t exp = (bits >> F.man_bits) & T::kExpAllOnes;
  const std::uint32_t man = bits & T::kManMask;
  if (T::is_nan(bits)) {
    return std::bit_cast<float>((sign != 0 ? 0x80000000u : 0u) | 0x7FC00000u |
                                (man << (23 - F.man_bits)));
  }
  float mag;
  if (F.ieee && exp == T::kExpAllOnes) {
    mag = INFINITY;
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(man), T::kEmin - F.man_bits);
  } else {
    mag = std::ldexp(static_cast<float>(man | (1u << F.man_bits)),
                     static_cast<int>(exp) - T::kBias - F.man_bits);
  }
  return sign != 0 ? -mag : mag;
}

/// binary32 to minifloat: round to nearest even, overflow per format, canonical NaN.
template <MinifloatFormat F>
inline std::uint32_t narrow_minifloat(float x) {
  using T = MinifloatTraits<F>;
  if (std::isnan(x)) return T::kCanonicalNan;
  const std::uint32_t sign = std::signbit(x) ? T::kSignBit : 0u;
  const float a = std::fabs(x);
  if (a == 0.0f) return sign;
  if (std::isinf(a)) return sign | (F.ieee ? T::kInfBits : T::kMaxBits);
  // Scale so that the significand is an integer with man_bits fraction bits moved above the point;
  // below the normal range the exponent is pinned to emin, which yields subnormals.
  int e = std::ilogb(a);
  if (e < T::kEmin) e = T::kEmin;
  auto q = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, F.man_bits - e)));
  if (q == (2u << F.man_bits)) {  // rounding carried into the next binade
    q >>= 1;
    ++e;
  }
  std::uint32_t bits;
  if (q < (1u << F.man_bits)) {
    bits = q;  // subnormal (e == emin); q == 2^man_bits falls through as the smallest normal
  } else {
    bits = (static_cast<std::uint32_t>(e + T::kBias) << F.man_bits) | (q - (1u << F.man_bits));
  }
  if (F.ieee) {
    if (e + T::kBias >= static_cast<int>(T::kExpAllOnes)) bits = T::kInfBits;
  } else if (e + T::kBias > static_cast<int>(T::kExpAllOnes) || bits > T::kMaxBits) {
    bits = T::kMaxBits;
  }
  return sign | bits;
}

inline float f16_to_f32(std::uint16_t h) { return widen_minifloat<kFormatF16>(h); }
inline std::uint16_t f32_to_f16(float x) {
  return static_cast<std::uint16_t>(narrow_minifloat<kFormatF16>(x));
}
inline float bf16_to_f32(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}
inline std::uint16_t f32_to_bf16(float x) {
  return static_cast<std::uint16_t>(narrow_minifloat<kFormatBF16>(x));
}
inline float e4m3_to_f32(std::uint8_t v) { return widen_minifloat<kFormatE4M3>(v); }
inline std::uint8_t f32_to_e4m3(float x) {
  return static_cast<std::uint8_t>(narrow_minifloat<kFormatE4M3>(x));
}
inline float e5m2_to_f32(std::uint8_t v) { return widen_minifloat<kFormatE5M2>(v); }
inline std::uint8_t f32_to_e5m2(float x) {
  return static_cast<std::uint8_t>(narrow_minifloat<kFormatE5M2>(x));
}
/// binary32 as emitted on the wire: only NaNs change (to the canonical one).
inline float canonicalize_f32(float x) {
  return std::isnan(x) ? std::bit_cast<float>(kCanonicalNanF32) : x;
}
/// binary64 as emitted on the wire: only NaNs change (to the canonical one).
inline double canonicalize_f64(double x) {
  return std::isnan(x) ? std::bit_cast<double>(kCanonicalNanF64) : x;
}

}  // namespace treeduce::agg
