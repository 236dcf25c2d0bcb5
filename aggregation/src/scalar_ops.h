// Element-wise scalar semantics: the reference every SIMD path must match, and the tail loop of
// the paths that have no masked loads. Internal to aggregation/. docs/numerics.md states the rules.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::agg::scalar {

/// Accumulator elements of the pair types: the wire layout itself (MPI's FLOAT_INT, DOUBLE_INT,
/// 2INT). f64_i32's four padding bytes are zero in every accumulator and every emitted payload.
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
static_assert(sizeof(PairF32) == 8 && sizeof(PairF64) == 16 && sizeof(PairI32) == 8);

template <DType D>
struct LaneOf {
  using type = float;  // f32 and the narrow floats: a binary32 accumulator
};
template <>
struct LaneOf<DType::i8> {
  using type = std::int8_t;
};
template <>
struct LaneOf<DType::u8> {
  using type = std::uint8_t;
};
template <>
struct LaneOf<DType::i16> {
  using type = std::int16_t;
};
template <>
struct LaneOf<DType::u16> {
  using type = std::uint16_t;
};
template <>
struct LaneOf<DType::i32> {
  using type = std::int32_t;
};
template <>
struct LaneOf<DType::u32> {
  using type = std::uint32_t;
};
template <>
struct LaneOf<DType::i64> {
  using type = std::int64_t;
};
template <>
struct LaneOf<DType::u64> {
  using type = std::uint64_t;
};
template <>
struct LaneOf<DType::f64> {
  using type = double;
};
template <>
struct LaneOf<DType::f32_i32> {
  using type = PairF32;
};
template <>
struct LaneOf<DType::f64_i32> {
  using type = PairF64;
};
template <>
struct LaneOf<DType::i32_i32> {
  using type = PairI32;
};

/// The accumulator element type of a wire type (acc_size(D) bytes).
template <DType D>
using Lane = typename LaneOf<D>::type;
static_assert(sizeof(Lane<DType::e4m3>) == acc_size(DType::e4m3));
static_assert(sizeof(Lane<DType::f64_i32>) == acc_size(DType::f64_i32));
static_assert(sizeof(Lane<DType::u16>) == acc_size(DType::u16));

template <DType D>
inline Lane<D> widen(const void* payload, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(payload) + i * dtype_size(D);
  if constexpr (D == DType::f16 || D == DType::bf16) {
    std::uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return D == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  } else if constexpr (D == DType::e4m3) {
    return e4m3_to_f32(*p);
  } else if constexpr (D == DType::e5m2) {
    return e5m2_to_f32(*p);
  } else if constexpr (D == DType::f64_i32) {
    PairF64 v;
    std::memcpy(&v, p, 12);  // the padding on the wire is ignored
    v.pad = 0;
    return v;
  } else {
    Lane<D> v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
}

/// A value as the accumulator keeps it for `O`: the logical operations keep 0 or 1.
template <DType D, ReduceOp O>
inline Lane<D> take(const void* payload, std::size_t i) {
  const Lane<D> v = widen<D>(payload, i);
  if constexpr (is_logical(O)) {
    return static_cast<Lane<D>>(v != 0);
  } else {
    return v;
  }
}

template <DType D>
inline void narrow(void* payload, std::size_t i, Lane<D> v) {
  auto* p = static_cast<unsigned char*>(payload) + i * dtype_size(D);
  if constexpr (D == DType::f32) {
    const float c = canonicalize_f32(v);
    std::memcpy(p, &c, sizeof c);
  } else if constexpr (D == DType::f64) {
    const double c = canonicalize_f64(v);
    std::memcpy(p, &c, sizeof c);
  } else if constexpr (D == DType::f16 || D == DType::bf16) {
    const std::uint16_t h = D == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(p, &h, sizeof h);
  } else if constexpr (D == DType::e4m3) {
    *p = f32_to_e4m3(v);
  } else if constexpr (D == DType::e5m2) {
    *p = f32_to_e5m2(v);
  } else if constexpr (D == DType::f32_i32) {
    const PairF32 c{canonicalize_f32(v.v), v.i};
    std::memcpy(p, &c, sizeof c);
  } else if constexpr (D == DType::f64_i32) {
    const PairF64 c{canonicalize_f64(v.v), v.i, 0};
    std::memcpy(p, &c, sizeof c);
  } else {
    std::memcpy(p, &v, sizeof v);
  }
}

template <class F>
inline F canonical_nan() {
  if constexpr (sizeof(F) == 4) {
    return std::bit_cast<F>(kCanonicalNanF32);
  } else {
    return std::bit_cast<F>(kCanonicalNanF64);
  }
}

template <class F>
using FloatBits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;

/// IEEE 754-2019 minimum/maximum on binary32 or binary64: any NaN gives the canonical NaN; -0 is
/// below +0; infinities order as usual. Commutative and associative, so arrival order never
/// changes a result.
template <ReduceOp O, class F>
inline F float_minmax(F a, F b) {
  if (std::isnan(a) || std::isnan(b)) return canonical_nan<F>();
  if (a < b) return O == ReduceOp::min ? a : b;
  if (b < a) return O == ReduceOp::min ? b : a;
  // Equal: differs only for +0/-0. OR picks -0 (min), AND picks +0 (max).
  const auto ab = std::bit_cast<FloatBits<F>>(a), bb = std::bit_cast<FloatBits<F>>(b);
  return std::bit_cast<F>(static_cast<FloatBits<F>>(O == ReduceOp::min ? (ab | bb) : (ab & bb)));
}

/// Floats (binary32 accumulators of every float type but f64, binary64 for f64).
template <ReduceOp O, class F>
requires std::is_floating_point_v<F>
inline F combine(F a, F b) {
  static_assert(O == ReduceOp::sum || O == ReduceOp::prod || O == ReduceOp::min ||
                O == ReduceOp::max);
  if constexpr (O == ReduceOp::sum) {
    return a + b;
  } else if constexpr (O == ReduceOp::prod) {
    return a * b;
  } else {
    return float_minmax<O>(a, b);
  }
}

/// Integers: sums and products wrap in the type's own width (modular arithmetic is associative
/// and commutative, so order never matters), min/max exact, bitwise as is, logical on 0/1.
template <ReduceOp O, class I>
requires std::is_integral_v<I>
inline I combine(I a, I b) {
  // Arithmetic in an unsigned type at least as wide as int: no promotion to signed int, so no
  // signed overflow (uint16 * uint16 would overflow int).
  using U = std::conditional_t<(sizeof(I) < sizeof(unsigned)), unsigned, std::make_unsigned_t<I>>;
  if constexpr (O == ReduceOp::sum) {
    return static_cast<I>(static_cast<U>(a) + static_cast<U>(b));
  } else if constexpr (O == ReduceOp::prod) {
    return static_cast<I>(static_cast<U>(a) * static_cast<U>(b));
  } else if constexpr (O == ReduceOp::min) {
    return a < b ? a : b;
  } else if constexpr (O == ReduceOp::max) {
    return a < b ? b : a;
  } else if constexpr (O == ReduceOp::band) {
    return static_cast<I>(a & b);
  } else if constexpr (O == ReduceOp::bor) {
    return static_cast<I>(a | b);
  } else if constexpr (O == ReduceOp::bxor) {
    return static_cast<I>(a ^ b);
  } else if constexpr (O == ReduceOp::land) {
    return static_cast<I>(a != 0 && b != 0);
  } else if constexpr (O == ReduceOp::lor) {
    return static_cast<I>(a != 0 || b != 0);
  } else {
    static_assert(O == ReduceOp::lxor);
    return static_cast<I>((a != 0) != (b != 0));
  }
}

/// MINLOC/MAXLOC: the order of the values is min/max's (a NaN is below everything for MINLOC and
/// above everything for MAXLOC, all NaNs equal, -0 below +0); equal values keep the lower index.
/// A NaN value is kept as the canonical NaN, and f64_i32's padding is zero whatever the operands'
/// was. Commutative and associative.
template <ReduceOp O, class P>
requires requires(P p) { p.i; }
inline P pick(P a, P b) {
  static_assert(is_loc(O));
  using V = decltype(a.v);
  if constexpr (std::is_floating_point_v<V>) {
    const bool an = std::isnan(a.v), bn = std::isnan(b.v);
    if (an || bn) {
      P r = an && bn ? (a.i <= b.i ? a : b) : (an ? a : b);
      r.v = canonical_nan<V>();
      return r;
    }
    const V m = float_minmax < O == ReduceOp::minloc ? ReduceOp::min : ReduceOp::max > (a.v, b.v);
    const auto mb = std::bit_cast<FloatBits<V>>(m);
    const bool a_is = std::bit_cast<FloatBits<V>>(a.v) == mb;
    const bool b_is = std::bit_cast<FloatBits<V>>(b.v) == mb;
    if (a_is && b_is) return a.i <= b.i ? a : b;
    return a_is ? a : b;
  } else {
    if (a.v == b.v) return a.i <= b.i ? a : b;
    const bool a_wins = O == ReduceOp::minloc ? a.v < b.v : a.v > b.v;
    return a_wins ? a : b;
  }
}
template <ReduceOp O, class P>
requires requires(P p) { p.i; }
inline P combine(P a, P b) {
  P r = pick<O>(a, b);
  if constexpr (requires { r.pad; }) r.pad = 0;
  return r;
}

// Loops over [begin, n), used whole by the scalar path and for tails by the SIMD ones.

template <DType D, ReduceOp O>
inline void load(void* acc, const void* payload, std::size_t begin, std::size_t n) {
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) a[i] = take<D, O>(payload, i);
}

template <DType D, ReduceOp O>
inline void accumulate(void* acc, const void* payload, std::size_t begin, std::size_t n) {
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) a[i] = combine<O>(a[i], take<D, O>(payload, i));
}

template <DType D, ReduceOp O>
inline void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t begin,
                   std::size_t n) {
  if (k == 0) return;
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) {
    Lane<D> v = take<D, O>(payloads[0], i);
    for (std::size_t j = 1; j < k; ++j) v = combine<O>(v, take<D, O>(payloads[j], i));
    a[i] = v;
  }
}

template <DType D>
inline void emit(void* payload, const void* acc, std::size_t begin, std::size_t n) {
  const auto* a = static_cast<const Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) narrow<D>(payload, i, a[i]);
}

}  // namespace treeduce::agg::scalar
