// Exactly checkable allreduce inputs, shared by treeduce-refhost and treeduce-perf: every rank's
// input is a pure function of (seed, case, rank, element), so any rank computes the expected
// result itself, and the inputs are chosen so that the result is exact whatever the arrival
// order, tree shape and rounding of partials (lab/README.md, "Inputs and why the expected
// results are exact").
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::exact {

// ---------------------------------------------------------------------------------------------
// Element codec: wire bits (in the low bits of a uint32) <-> buffer, and <-> binary32 through the
// aggregation library's reference conversions.

inline constexpr agg::MinifloatFormat kFormatF32{8, 23, true};

inline float widen(DType d, std::uint32_t bits) {
  switch (d) {
    default:  // TODO(issue 14): the types added by issue 14
      break;
    case DType::f16:
      return agg::f16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::bf16:
      return agg::bf16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::e4m3:
      return agg::e4m3_to_f32(static_cast<std::uint8_t>(bits));
    case DType::e5m2:
      return agg::e5m2_to_f32(static_cast<std::uint8_t>(bits));
    case DType::f32:
    case DType::i32:  // never asked: i32 is compared and printed as an integer
      break;
  }
  return std::bit_cast<float>(bits);
}

inline std::uint32_t narrow(DType d, float x) {
  switch (d) {
    default:  // TODO(issue 14): the types added by issue 14
      break;
    case DType::f16:
      return agg::f32_to_f16(x);
    case DType::bf16:
      return agg::f32_to_bf16(x);
    case DType::e4m3:
      return agg::f32_to_e4m3(x);
    case DType::e5m2:
      return agg::f32_to_e5m2(x);
    case DType::f32:
    case DType::i32:  // never asked: i32 inputs are integers from the start
      break;
  }
  return std::bit_cast<std::uint32_t>(x);
}

inline void store(DType d, std::uint8_t* buf, std::size_t i, std::uint32_t bits) {
  switch (dtype_size(d)) {
    case 4:
      std::memcpy(buf + 4 * i, &bits, 4);
      break;
    case 2: {
      const auto v = static_cast<std::uint16_t>(bits);
      std::memcpy(buf + 2 * i, &v, 2);
      break;
    }
    default:
      buf[i] = static_cast<std::uint8_t>(bits);
  }
}

inline std::uint32_t load(DType d, const std::uint8_t* buf, std::size_t i) {
  switch (dtype_size(d)) {
    case 4: {
      std::uint32_t v;
      std::memcpy(&v, buf + 4 * i, 4);
      return v;
    }
    case 2: {
      std::uint16_t v;
      std::memcpy(&v, buf + 2 * i, 2);
      return v;
    }
    default:
      return buf[i];
  }
}

// "1.5(0x3e00)": the value and the exact bits, so that -0/+0 and NaN payloads are visible.
inline std::string show(DType d, std::uint32_t bits) {
  char s[64];
  const int digits = static_cast<int>(2 * dtype_size(d));
  if (d == DType::i32) {
    std::snprintf(s, sizeof s, "%d(0x%08x)", std::bit_cast<std::int32_t>(bits), bits);
  } else {
    std::snprintf(s, sizeof s, "%.9g(0x%0*x)", static_cast<double>(widen(d, bits)), digits, bits);
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Deterministic inputs (README.md, "Inputs and why the expected results are exact").

// What the input generator needs to know about a float wire type.
struct FloatInfo {
  int sig_bits;  // significand bits, the implicit one included: integers up to 2^sig_bits are exact
  int min_exp;   // exponent of the smallest subnormal
  int max_exp;   // exponent of the largest finite value's leading bit
  std::uint32_t sign_bit, man_mask, max_bits;
  std::uint32_t inf_bits;  // 0 for E4M3, which has no infinity
};

template <agg::MinifloatFormat F>
constexpr FloatInfo info_of() {
  using T = agg::MinifloatTraits<F>;
  return {F.man_bits + 1,
          T::kEmin - F.man_bits,
          static_cast<int>(T::kExpAllOnes) - T::kBias - (F.ieee ? 1 : 0),
          T::kSignBit,
          T::kManMask,
          T::kMaxBits,
          F.ieee ? T::kInfBits : 0u};
}

inline FloatInfo float_info(DType d) {
  switch (d) {
    default:  // TODO(issue 14): the types added by issue 14
      break;
    case DType::f16:
      return info_of<agg::kFormatF16>();
    case DType::bf16:
      return info_of<agg::kFormatBF16>();
    case DType::e4m3:
      return info_of<agg::kFormatE4M3>();
    case DType::e5m2:
      return info_of<agg::kFormatE5M2>();
    case DType::f32:
    case DType::i32:  // i32 inputs never use it
      break;
  }
  return info_of<kFormatF32>();
}

// Largest |integer| each rank may contribute to a float sum so that every partial sum of any
// subset of `world` ranks is an integer of at most 2^sig_bits; 0 when even +-1 is too much.
inline std::int64_t sum_bound(DType d, std::uint32_t world) {
  return (std::int64_t{1} << float_info(d).sig_bits) / world;
}

// splitmix64's finaliser: consecutive inputs give independent-looking 64-bit outputs.
constexpr std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr std::uint64_t combine(std::uint64_t h, std::uint64_t v) {
  return mix(h ^ mix(v + kGolden));
}

struct Case {
  DType dtype;
  ReduceOp op;
  std::size_t count;
  std::uint32_t iter;
};

// Every rank's input of one case as a pure function of (seed, case, rank, element): any rank can
// compute every other rank's input, hence the expected result, without talking to them.
class Inputs {
 public:
  Inputs(std::uint64_t seed, const Case& c, std::uint32_t world)
      : c_(c),
        world_(world),
        stream_(combine(combine(combine(combine(seed, static_cast<std::uint64_t>(c.dtype)),
                                        static_cast<std::uint64_t>(c.op)),
                                c.count),
                        c.iter)),
        fi_(float_info(c.dtype)),
        bound_(sum_bound(c.dtype, world)) {}

  // Wire bits of element i of `rank`'s input.
  std::uint32_t element(std::uint32_t rank, std::size_t i) const {
    if (c_.dtype == DType::i32) {
      return c_.op == ReduceOp::sum ? static_cast<std::uint32_t>(draw(rank, i))
                                    : int_minmax(rank, i);
    }
    if (c_.op == ReduceOp::sum) return narrow(c_.dtype, sum_value(quanta(rank, i), i));
    return float_minmax(rank, i);
  }

  // Wire bits of element i of the allreduce over all ranks.
  std::uint32_t expected(std::size_t i) const {
    if (c_.op == ReduceOp::sum) {
      if (c_.dtype == DType::i32) {
        std::uint32_t s = 0;  // wraps modulo 2^32, as the switch's int32 sum
        for (std::uint32_t r = 0; r < world_; ++r) s += element(r, i);
        return s;
      }
      std::int64_t k = 0;
      for (std::uint32_t r = 0; r < world_; ++r) k += quanta(r, i);
      return narrow(c_.dtype, sum_value(k, i));
    }
    std::uint32_t best = element(0, i);
    for (std::uint32_t r = 1; r < world_; ++r) {
      const std::uint32_t e = element(r, i);
      if (c_.op == ReduceOp::min ? below(e, best) : below(best, e)) best = e;
    }
    return best;
  }

 private:
  // A per-element draw of one rank's own, or shared by all ranks (kShared, never a rank).
  static constexpr std::uint32_t kShared = std::numeric_limits<std::uint32_t>::max();
  std::uint64_t draw(std::uint32_t rank, std::size_t i) const {
    return mix(combine(stream_, rank) + (i + 1) * kGolden);
  }

  // Float SUM: rank r contributes k(r, i) * 2^e(i), with |k| <= bound_ and e(i) shared by all
  // ranks.
  std::int64_t quanta(std::uint32_t rank, std::size_t i) const {
    const auto span = static_cast<std::uint64_t>(2 * bound_ + 1);
    return static_cast<std::int64_t>(draw(rank, i) % span) - bound_;
  }
  float sum_value(std::int64_t k, std::size_t i) const {
    // e ranges from the smallest subnormal's exponent to where 2^sig_bits quanta reach the largest
    // finite binade, so sums cover subnormals, normals and the top of the range.
    const auto span = static_cast<std::uint64_t>(fi_.max_exp - fi_.sig_bits - fi_.min_exp + 1);
    const int e = fi_.min_exp + static_cast<int>(draw(kShared, i) % span);
    return std::ldexp(static_cast<float>(k), e);
  }

  // IEEE 754-2019 minimum/maximum order for non-NaN values: numeric, with -0 below +0.
  bool below(std::uint32_t a, std::uint32_t b) const {
    if (c_.dtype == DType::i32)
      return std::bit_cast<std::int32_t>(a) < std::bit_cast<std::int32_t>(b);
    const float fa = widen(c_.dtype, a), fb = widen(c_.dtype, b);
    return fa < fb || (fa == fb && std::signbit(fa) && !std::signbit(fb));
  }

  // MIN/MAX: a shared class per element decides what the ranks draw from, so that ties between
  // -0 and +0 and the extremes of the range are common rather than a 2^-32 accident.
  std::uint32_t float_minmax(std::uint32_t rank, std::size_t i) const {
    const std::uint64_t r = draw(rank, i);
    const std::uint32_t sign = (r >> 63) != 0 ? fi_.sign_bit : 0u;
    switch (draw(kShared, i) % 8) {
      case 0:  // +-0 only
        return sign;
      case 1: {  // the edges: zero, smallest and largest subnormal, smallest normal, largest
                 // finite, infinity where the type has one
        const std::array<std::uint32_t, 6> edge = {
            0u,           1u,
            fi_.man_mask, fi_.man_mask + 1,
            fi_.max_bits, fi_.inf_bits != 0 ? fi_.inf_bits : fi_.max_bits};
        return sign | edge[r % edge.size()];
      }
      case 2:  // subnormals (and zeros)
        return sign | (static_cast<std::uint32_t>(r) & fi_.man_mask);
      default: {                                             // any non-NaN encoding
        const std::uint32_t mask = (fi_.sign_bit << 1) - 1;  // wraps to all ones for f32
        std::uint64_t x = r;
        while (std::isnan(widen(c_.dtype, static_cast<std::uint32_t>(x) & mask))) x = mix(x);
        return static_cast<std::uint32_t>(x) & mask;
      }
    }
  }
  std::uint32_t int_minmax(std::uint32_t rank, std::size_t i) const {
    const std::uint64_t r = draw(rank, i);
    if (draw(kShared, i) % 8 != 0) return static_cast<std::uint32_t>(r);
    constexpr std::array<std::int32_t, 5> edge = {std::numeric_limits<std::int32_t>::min(),
                                                  std::numeric_limits<std::int32_t>::max(), 0, -1,
                                                  1};
    return static_cast<std::uint32_t>(edge[r % edge.size()]);
  }

  Case c_;
  std::uint32_t world_;
  std::uint64_t stream_;
  FloatInfo fi_;
  std::int64_t bound_;
};

}  // namespace treeduce::exact
