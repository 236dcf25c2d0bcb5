// Exactly checkable allreduce inputs, shared by treeduce-refhost and treeduce-perf: every rank's
// input is a pure function of (seed, case, rank, element), so any rank computes the expected
// result itself, and the inputs are chosen so that the result is exact whatever the arrival
// order, tree shape and rounding of partials (lab/README.md, "Inputs and why the expected
// results are exact").
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::exact {

// ---------------------------------------------------------------------------------------------
// Element codec: one element's wire bytes <-> buffer, and float types <-> binary64 through the
// aggregation library's reference conversions (used on exactly representable values only).

/// The widest element (f64_i32).
inline constexpr std::size_t kMaxElemBytes = 16;

/// One element's wire bytes, little-endian: dtype_size(d) of them used, the rest zero. Large
/// enough for every type (f64_i32 is 16 bytes); compared byte for byte.
struct Elem {
  std::array<std::uint8_t, kMaxElemBytes> b{};
  friend bool operator==(const Elem&, const Elem&) = default;
};

/// The low 8 bytes as an integer, and back: the wire bits of every type but f64_i32.
inline std::uint64_t bits_of(const Elem& e) {
  std::uint64_t v;
  std::memcpy(&v, e.b.data(), 8);
  return v;
}
inline Elem elem_of(std::uint64_t bits) {
  Elem e;
  std::memcpy(e.b.data(), &bits, 8);
  return e;
}

inline void store(DType d, std::uint8_t* buf, std::size_t i, const Elem& e) {
  std::memcpy(buf + i * dtype_size(d), e.b.data(), dtype_size(d));
}

inline Elem load(DType d, const std::uint8_t* buf, std::size_t i) {
  Elem e;
  std::memcpy(e.b.data(), buf + i * dtype_size(d), dtype_size(d));
  return e;
}

inline constexpr agg::MinifloatFormat kFormatF32{8, 23, true};

/// The value type of a (value, index) pair type; the type itself otherwise.
constexpr DType value_type(DType d) {
  switch (d) {
    case DType::f32_i32:
      return DType::f32;
    case DType::f64_i32:
      return DType::f64;
    case DType::i32_i32:
      return DType::i32;
    default:
      return d;
  }
}

/// Exact value of a float type's encoding (`bits` in the low bits).
inline double widen(DType d, std::uint64_t bits) {
  switch (d) {
    case DType::f16:
      return agg::f16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::bf16:
      return agg::bf16_to_f32(static_cast<std::uint16_t>(bits));
    case DType::e4m3:
      return agg::e4m3_to_f32(static_cast<std::uint8_t>(bits));
    case DType::e5m2:
      return agg::e5m2_to_f32(static_cast<std::uint8_t>(bits));
    case DType::f64:
      return std::bit_cast<double>(bits);
    default:  // f32; never asked for integer or pair types
      return std::bit_cast<float>(static_cast<std::uint32_t>(bits));
  }
}

/// The encoding of `x`, which the callers only ever pass exactly representable values.
inline std::uint64_t narrow(DType d, double x) {
  const auto f = static_cast<float>(x);
  switch (d) {
    case DType::f16:
      return agg::f32_to_f16(f);
    case DType::bf16:
      return agg::f32_to_bf16(f);
    case DType::e4m3:
      return agg::f32_to_e4m3(f);
    case DType::e5m2:
      return agg::f32_to_e5m2(f);
    case DType::f64:
      return std::bit_cast<std::uint64_t>(x);
    default:  // f32
      return std::bit_cast<std::uint32_t>(f);
  }
}

/// Bits of an integer type (8 x its size).
constexpr int int_width(DType d) { return static_cast<int>(8 * dtype_size(d)); }
constexpr std::uint64_t int_mask(DType d) {
  return int_width(d) == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << int_width(d)) - 1;
}
/// A signed integer type's bits, sign-extended.
constexpr std::int64_t sign_extend(DType d, std::uint64_t bits) {
  const int shift = 64 - int_width(d);
  return static_cast<std::int64_t>(bits << shift) >> shift;
}

// "1.5(0x3e00)", "-3(0xfd)", "(2.5, 7)(0x...)": the value and the exact bytes, so that -0/+0,
// NaN payloads and padding are visible.
inline std::string show(DType d, const Elem& e) {
  std::string hex;
  for (std::size_t k = dtype_size(d); k-- > 0;) {
    char h[3];
    std::snprintf(h, sizeof h, "%02x", e.b[k]);
    hex += h;
  }
  char s[96];
  const std::uint64_t bits = bits_of(e);
  if (is_pair(d)) {
    const DType v = value_type(d);
    std::int32_t idx;
    std::memcpy(&idx, e.b.data() + dtype_size(v), 4);
    if (v == DType::i32) {
      std::snprintf(s, sizeof s, "(%d, %d)", static_cast<int>(sign_extend(v, bits & int_mask(v))),
                    static_cast<int>(idx));
    } else {
      std::snprintf(s, sizeof s, "(%.17g, %d)", widen(v, bits & int_mask(v)),
                    static_cast<int>(idx));
    }
  } else if (is_signed_integer(d)) {
    std::snprintf(s, sizeof s, "%lld", static_cast<long long>(sign_extend(d, bits)));
  } else if (is_integer(d)) {
    std::snprintf(s, sizeof s, "%llu", static_cast<unsigned long long>(bits));
  } else {
    std::snprintf(s, sizeof s, "%.17g", widen(d, bits));
  }
  return std::string(s) + "(0x" + hex + ")";
}

// ---------------------------------------------------------------------------------------------
// Deterministic inputs (README.md, "Inputs and why the expected results are exact").

// What the input generator needs to know about a float wire type.
struct FloatInfo {
  int sig_bits;  // significand bits, the implicit one included: integers up to 2^sig_bits are exact
  int min_exp;   // exponent of the smallest subnormal
  int max_exp;   // exponent of the largest finite value's leading bit
  std::uint64_t sign_bit, man_mask, max_bits;
  std::uint64_t inf_bits;  // 0 for E4M3, which has no infinity
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

// binary64 has more exponent bits than MinifloatTraits' 32-bit encodings hold: spelled out.
inline constexpr FloatInfo kInfoF64{53,
                                    -1074,
                                    1023,
                                    std::uint64_t{1} << 63,
                                    (std::uint64_t{1} << 52) - 1,
                                    0x7FEFFFFFFFFFFFFFull,
                                    0x7FF0000000000000ull};

inline FloatInfo float_info(DType d) {
  switch (value_type(d)) {
    case DType::f16:
      return info_of<agg::kFormatF16>();
    case DType::bf16:
      return info_of<agg::kFormatBF16>();
    case DType::e4m3:
      return info_of<agg::kFormatE4M3>();
    case DType::e5m2:
      return info_of<agg::kFormatE5M2>();
    case DType::f64:
      return kInfoF64;
    default:  // f32; integer types never use it
      return info_of<kFormatF32>();
  }
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

/// The (dtype, op) pairs of a command line's type list and operation list, dtype-major in list
/// order, leaving out the pairs that mean nothing (op_defined()): "-d f32,i32 -o sum,band" runs
/// f32 sum, i32 sum and i32 band. A type that pairs with none of the operations, or an operation
/// with none of the types, is an error: "" or a sentence naming both ("f32 band: band (bitwise
/// and) is defined on integer types only, not on floating-point types.").
inline std::string defined_pairs(const std::vector<DType>& dtypes, const std::vector<ReduceOp>& ops,
                                 std::vector<std::pair<DType, ReduceOp>>* out) {
  out->clear();
  for (DType d : dtypes) {
    for (ReduceOp op : ops) {
      if (op_defined(d, op)) out->emplace_back(d, op);
    }
  }
  const auto refusal = [](DType d, ReduceOp op) {
    return std::string(name(d)) + " " + std::string(name(op)) + ": " +
           std::string(op_refusal(d, op)) + ".";
  };
  for (DType d : dtypes) {
    if (std::none_of(ops.begin(), ops.end(), [d](ReduceOp op) { return op_defined(d, op); }))
      return refusal(d, ops.front());
  }
  for (ReduceOp op : ops) {
    if (std::none_of(dtypes.begin(), dtypes.end(), [op](DType d) { return op_defined(d, op); }))
      return refusal(dtypes.front(), op);
  }
  return "";
}

struct Case {
  DType dtype;
  ReduceOp op;
  std::size_t count;
  std::uint32_t iter;
};

// Every rank's input of one case as a pure function of (seed, case, rank, element): any rank can
// compute every other rank's input, hence the expected result, without talking to them. The
// expected result is computed here with exact integer arithmetic and comparisons of our own, not
// with the kernels it checks. `c.op` must be defined on `c.dtype` (op_defined()).
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

  // Wire bytes of element i of `rank`'s input.
  Elem element(std::uint32_t rank, std::size_t i) const {
    if (is_pair(c_.dtype)) return loc_element(rank, i);
    if (is_integer(c_.dtype)) return elem_of(int_element(rank, i) & int_mask(c_.dtype));
    switch (c_.op) {
      case ReduceOp::sum:
        return elem_of(narrow(c_.dtype, sum_value(quanta(rank, i), i)));
      case ReduceOp::prod:
        return elem_of(narrow(c_.dtype, prod_factor(rank, i).value()));
      default:
        return elem_of(float_minmax(rank, i));
    }
  }

  // Wire bytes of element i of the allreduce over all ranks.
  Elem expected(std::size_t i) const {
    if (is_pair(c_.dtype)) return loc_expected(i);
    if (is_integer(c_.dtype)) return elem_of(int_expected(i));
    switch (c_.op) {
      case ReduceOp::sum: {
        std::int64_t k = 0;
        for (std::uint32_t r = 0; r < world_; ++r) k += quanta(r, i);
        return elem_of(narrow(c_.dtype, sum_value(k, i)));
      }
      case ReduceOp::prod: {
        Factor p{false, false, 1, 0};
        for (std::uint32_t r = 0; r < world_; ++r) {
          const Factor f = prod_factor(r, i);
          p = {p.negative != f.negative, p.zero || f.zero, p.m * f.m, p.e + f.e};
        }
        return elem_of(narrow(c_.dtype, p.value()));
      }
      default: {
        std::uint64_t best = bits_of(element(0, i));
        for (std::uint32_t r = 1; r < world_; ++r) {
          const std::uint64_t e = bits_of(element(r, i));
          if (c_.op == ReduceOp::min ? float_below(e, best) : float_below(best, e)) best = e;
        }
        return elem_of(best);
      }
    }
  }

 private:
  // A per-element draw of one rank's own, or shared by all ranks (kShared, never a rank).
  static constexpr std::uint32_t kShared = std::numeric_limits<std::uint32_t>::max();
  std::uint64_t draw(std::uint32_t rank, std::size_t i) const {
    return mix(combine(stream_, rank) + (i + 1) * kGolden);
  }
  // Further independent draws of the same (rank, element).
  std::uint64_t draw(std::uint32_t rank, std::size_t i, unsigned k) const {
    return mix(draw(rank, i) + k * kGolden);
  }

  // ---- float SUM: rank r contributes k(r, i) * 2^e(i), |k| <= bound_, e(i) shared by all ranks.
  std::int64_t quanta(std::uint32_t rank, std::size_t i) const {
    const auto span = static_cast<std::uint64_t>(2 * bound_ + 1);
    return static_cast<std::int64_t>(draw(rank, i) % span) - bound_;
  }
  double sum_value(std::int64_t k, std::size_t i) const {
    // e ranges from the smallest subnormal's exponent to where 2^sig_bits quanta reach the largest
    // finite binade, so sums cover subnormals, normals and the top of the range.
    const auto span = static_cast<std::uint64_t>(fi_.max_exp - fi_.sig_bits - fi_.min_exp + 1);
    const int e = fi_.min_exp + static_cast<int>(draw(kShared, i) % span);
    return std::ldexp(static_cast<double>(k), e);
  }

  // ---- float PROD: rank r contributes +-m * 2^a (or +-0), m odd below 2^(sig_bits / world), a
  // in a range where the product of any subset of ranks stays exactly representable.
  struct Factor {
    bool negative, zero;
    std::uint64_t m;  // odd; a product of at most `world` factors stays below 2^sig_bits
    int e;
    double value() const {
      const double mag = zero ? 0.0 : std::ldexp(static_cast<double>(m), e);
      return negative ? -mag : mag;
    }
  };
  Factor prod_factor(std::uint32_t rank, std::size_t i) const {
    const int w = static_cast<int>(world_);
    const int mbits = fi_.sig_bits / w;
    // The lowest bit of a product of k factors is at 2^(sum of a) >= k * lo >= min_exp; its top
    // bit at sum of a + k * mbits - 1 <= max_exp (mbits = 0: m = 1, top bit at sum of a).
    const int lo = -(-fi_.min_exp / w);
    const int hi = mbits == 0 ? fi_.max_exp / w : (fi_.max_exp + 1) / w - mbits;
    const std::uint64_t r = draw(rank, i);
    Factor f{};
    f.negative = (r >> 63) != 0;
    // 1/8 of the elements: each rank sends +-0 half the time (signed zero products).
    f.zero = draw(kShared, i) % 8 == 0 && (r >> 62 & 1) != 0;
    f.m = mbits == 0 ? 1 : ((draw(rank, i, 1) & ((std::uint64_t{1} << mbits) - 1)) | 1);
    f.e = lo + static_cast<int>(draw(rank, i, 2) % static_cast<std::uint64_t>(hi - lo + 1));
    return f;
  }

  // ---- float MIN/MAX: IEEE 754-2019 minimum/maximum order for non-NaN values: numeric, with -0
  // below +0.
  bool float_below(std::uint64_t a, std::uint64_t b) const {
    const double fa = widen(c_.dtype, a), fb = widen(c_.dtype, b);
    return fa < fb || (fa == fb && std::signbit(fa) && !std::signbit(fb));
  }
  // A shared class per element decides what the ranks draw from, so that ties between -0 and +0
  // and the extremes of the range are common rather than a 2^-32 accident.
  std::uint64_t float_minmax(std::uint32_t rank, std::size_t i) const {
    const std::uint64_t r = draw(rank, i);
    const std::uint64_t sign = (r >> 63) != 0 ? fi_.sign_bit : 0u;
    switch (draw(kShared, i) % 8) {
      case 0:  // +-0 only
        return sign;
      case 1: {  // the edges: zero, smallest and largest subnormal, smallest normal, largest
                 // finite, infinity where the type has one
        const std::array<std::uint64_t, 6> edge = {
            0u,           1u,
            fi_.man_mask, fi_.man_mask + 1,
            fi_.max_bits, fi_.inf_bits != 0 ? fi_.inf_bits : fi_.max_bits};
        return sign | edge[r % edge.size()];
      }
      case 2:  // subnormals (and zeros)
        return sign | (r & fi_.man_mask);
      default: {                                             // any non-NaN encoding
        const std::uint64_t mask = (fi_.sign_bit << 1) - 1;  // wraps to all ones for f64
        std::uint64_t x = r;
        while (std::isnan(widen(c_.dtype, x & mask))) x = mix(x);
        return x & mask;
      }
    }
  }

  // ---- integers: arithmetic modulo 2^width is associative and commutative, so random values
  // over the whole range are exact in any order; the draws only make the interesting cases common.
  std::uint64_t int_element(std::uint32_t rank, std::size_t i) const {
    const std::uint64_t r = draw(rank, i);
    const std::uint64_t cls = draw(kShared, i) % 8;
    switch (c_.op) {
      case ReduceOp::prod:  // mostly odd factors: a product of even ones is soon 0 mod 2^width
        return cls == 0 ? r : r | 1;
      case ReduceOp::band:  // each bit 0 with probability 1/8: the AND of a few ranks is not 0
        return ~(r & draw(rank, i, 1) & draw(rank, i, 2));
      case ReduceOp::bor:  // each bit 1 with probability 1/8: the OR of a few ranks is not ~0
        return r & draw(rank, i, 1) & draw(rank, i, 2);
      case ReduceOp::min:
      case ReduceOp::max: {
        if (cls != 0) return r;
        // 0, 1, all ones (-1 or the largest unsigned), the largest signed and the smallest signed
        // (as unsigned: 2^(width-1) - 1 and 2^(width-1)).
        const std::uint64_t m = int_mask(c_.dtype);
        const std::array<std::uint64_t, 5> edge = {0, 1, m, m >> 1, (m >> 1) + 1};
        return edge[r % edge.size()];
      }
      case ReduceOp::land:
      case ReduceOp::lor:
      case ReduceOp::lxor: {
        // Many zeros: per element, each rank sends 0 with probability 0, 1/(2W), 1/2 or
        // 1 - 1/(2W), so that AND, OR and XOR all see both results. A non-zero value is often one
        // whose low byte is 0 (a logical test must look at every byte).
        const std::uint64_t w2 = 2 * std::uint64_t{world_};
        const std::array<std::uint64_t, 4> zeros = {0, 1, world_, w2 - 1};
        if (draw(rank, i, 1) % w2 < zeros[cls % 4]) return 0;
        const std::uint64_t v = (r & 1) != 0 ? r : r & ~std::uint64_t{0xFF};
        return (v & int_mask(c_.dtype)) != 0 ? v : std::uint64_t{1} << (r % int_width(c_.dtype));
      }
      default:  // sum, bxor: uniform
        return r;
    }
  }
  bool int_below(std::uint64_t a, std::uint64_t b) const {
    return is_signed_integer(c_.dtype) ? sign_extend(c_.dtype, a) < sign_extend(c_.dtype, b)
                                       : a < b;
  }
  std::uint64_t int_expected(std::size_t i) const {
    const std::uint64_t mask = int_mask(c_.dtype);
    std::uint64_t acc = bits_of(element(0, i));
    std::uint64_t nonzero = acc != 0 ? 1 : 0;
    for (std::uint32_t r = 1; r < world_; ++r) {
      const std::uint64_t e = bits_of(element(r, i));
      nonzero += e != 0 ? 1 : 0;
      switch (c_.op) {
        case ReduceOp::sum:
          acc = (acc + e) & mask;
          break;
        case ReduceOp::prod:
          acc = (acc * e) & mask;
          break;
        case ReduceOp::min:
          if (int_below(e, acc)) acc = e;
          break;
        case ReduceOp::max:
          if (int_below(acc, e)) acc = e;
          break;
        case ReduceOp::band:
          acc &= e;
          break;
        case ReduceOp::bor:
          acc |= e;
          break;
        case ReduceOp::bxor:
          acc ^= e;
          break;
        default:  // the logical operations: counted below
          break;
      }
    }
    switch (c_.op) {
      case ReduceOp::land:
        return nonzero == world_ ? 1 : 0;
      case ReduceOp::lor:
        return nonzero != 0 ? 1 : 0;
      case ReduceOp::lxor:
        return nonzero % 2;
      default:
        return acc;
    }
  }

  // ---- MINLOC/MAXLOC on (value, int32 index) pairs.
  struct Loc {
    std::uint64_t v;  // the value's wire bits
    std::int32_t i;
  };
  Elem pack(const Loc& l, std::uint32_t pad) const {
    const DType v = value_type(c_.dtype);
    Elem e = elem_of(l.v);
    std::memcpy(e.b.data() + dtype_size(v), &l.i, 4);
    if (c_.dtype == DType::f64_i32) std::memcpy(e.b.data() + 12, &pad, 4);
    return e;
  }
  Loc loc_of(std::uint32_t rank, std::size_t i) const {
    const DType vt = value_type(c_.dtype);
    const std::uint64_t r = draw(rank, i), s = draw(kShared, i), s2 = draw(kShared, i, 1);
    Loc l{};
    // The index: the rank (as MPI programs do), a descending rank, any int32 (negative ones
    // order below positive ones) or one of -2..2 (ties of value and index together).
    switch ((s >> 8) % 4) {
      case 0:
        l.i = static_cast<std::int32_t>(rank);
        break;
      case 1:
        l.i = static_cast<std::int32_t>(world_ - rank);
        break;
      case 2:
        l.i = static_cast<std::int32_t>(static_cast<std::uint32_t>(draw(rank, i, 1)));
        break;
      default:
        l.i = static_cast<std::int32_t>(draw(rank, i, 1) % 5) - 2;
    }
    // Two values shared by all ranks at this element: ties are the common case.
    const std::array<std::uint64_t, 2> tie = {s2, mix(s2)};
    if (vt == DType::i32) {
      switch (s % 4) {
        case 0:
          l.v = tie[r % 2] & 0xFFFFFFFFu;
          break;
        case 1: {
          const std::array<std::uint64_t, 4> edge = {0x80000000u, 0x7FFFFFFFu, 0, 0xFFFFFFFFu};
          l.v = edge[r % 4];
          break;
        }
        default:
          l.v = r & 0xFFFFFFFFu;
      }
      return l;
    }
    const std::uint64_t mask = (fi_.sign_bit << 1) - 1;
    const std::uint64_t exp_all = fi_.inf_bits;  // f32 and f64 are IEEE: inf_bits != 0
    const auto not_nan = [&](std::uint64_t x) {
      while (std::isnan(widen(vt, x & mask))) x = mix(x);
      return x & mask;
    };
    const auto nan = [&](std::uint64_t x) {  // any sign, any non-zero payload
      return (x & fi_.sign_bit) | exp_all | ((x & fi_.man_mask) | 1);
    };
    const std::uint64_t sign = (r >> 63) != 0 ? fi_.sign_bit : 0u;
    switch (s % 8) {
      case 0:  // two shared values
        l.v = not_nan(tie[r % 2]);
        break;
      case 1:  // +-0
        l.v = sign;
        break;
      case 2:  // a NaN half the time, else one of the shared values
        l.v = (r >> 62 & 1) != 0 ? nan(draw(rank, i, 2)) : not_nan(tie[r % 2]);
        break;
      case 3:  // NaNs only, with different payloads and signs: all equal, the lowest index wins
        l.v = nan(draw(rank, i, 2));
        break;
      case 4: {  // infinities, the largest finite values, zeros
        const std::array<std::uint64_t, 3> edge = {exp_all, fi_.max_bits, 0};
        l.v = sign | edge[r % 3];
        break;
      }
      default:
        l.v = not_nan(r);
    }
    return l;
  }
  Elem loc_element(std::uint32_t rank, std::size_t i) const {
    // f64_i32's padding carries garbage: a switch ignores it on input and zeroes it on output.
    return pack(loc_of(rank, i), static_cast<std::uint32_t>(draw(rank, i, 3)));
  }
  // True when `a` is kept over `b`: the better value (a NaN beats every number, for MINLOC as
  // for MAXLOC: below everything, above everything; -0 is below +0), and on equal values (all
  // NaNs are equal) the lower index.
  bool loc_wins(const Loc& a, const Loc& b) const {
    const DType vt = value_type(c_.dtype);
    const bool minloc = c_.op == ReduceOp::minloc;
    if (vt == DType::i32) {
      const std::int64_t x = sign_extend(vt, a.v), y = sign_extend(vt, b.v);
      if (x != y) return minloc ? x < y : x > y;
      return a.i < b.i;
    }
    const double x = widen(vt, a.v), y = widen(vt, b.v);
    const bool xn = std::isnan(x), yn = std::isnan(y);
    if (xn || yn) return xn && yn ? a.i < b.i : xn;
    const bool x_below = x < y || (x == y && std::signbit(x) && !std::signbit(y));
    const bool y_below = y < x || (x == y && std::signbit(y) && !std::signbit(x));
    if (x_below || y_below) return minloc ? x_below : y_below;
    return a.i < b.i;
  }
  Elem loc_expected(std::size_t i) const {
    Loc best = loc_of(0, i);
    for (std::uint32_t r = 1; r < world_; ++r) {
      const Loc l = loc_of(r, i);
      if (loc_wins(l, best)) best = l;
    }
    const DType vt = value_type(c_.dtype);
    if (vt != DType::i32 && std::isnan(widen(vt, best.v)))
      best.v = vt == DType::f64 ? agg::kCanonicalNanF64 : agg::kCanonicalNanF32;
    return pack(best, 0);
  }

  Case c_;
  std::uint32_t world_;
  std::uint64_t stream_;
  FloatInfo fi_;
  std::int64_t bound_;
};

}  // namespace treeduce::exact
