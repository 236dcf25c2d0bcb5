// An independent reference for every defined (dtype, op) pair: inputs whose reduction is exact in
// any order and on any tree shape, and the expected wire bits, computed here without the
// aggregation kernels or their scalar reference (only convert.h's conversions of the narrow float
// formats, which tests/aggregation checks exhaustively). Shared by test_gloo_reducer.cpp (the host
// path) and test_communicator.cpp (the network path through a real switch core).
//
// Why the results are exact whatever the order: integer sums and products wrap (modular
// arithmetic is associative and commutative); float sums add values on a grid coarse enough that
// every partial sum is exact; float products multiply small odd integers times powers of two, so
// every partial product is exact; min, max, minloc and maxloc pick one of their inputs.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::ref {

using Bytes = std::vector<unsigned char>;

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// --- Integers: wire bits in a uint64, masked to the width. -----------------------------------

inline std::uint64_t width_mask(DType d) {
  const unsigned w = unsigned(dtype_size(d)) * 8;
  return w == 64 ? ~0ull : (1ull << w) - 1;
}

inline std::int64_t as_signed(DType d, std::uint64_t v) {
  const unsigned w = unsigned(dtype_size(d)) * 8;
  if (w == 64) return std::int64_t(v);
  const std::uint64_t sign = 1ull << (w - 1);
  return std::int64_t((v ^ sign) - sign);
}

inline std::uint64_t int_input(DType d, ReduceOp op, std::uint64_t r, std::uint32_t rank,
                               std::size_t i) {
  const std::uint64_t m = width_mask(d);
  const bool sgn = is_signed_integer(d);
  std::uint64_t v = r & m;
  switch (i % 11) {
    case 1:
      v = 0;
      break;
    case 2:
      v = m;  // -1, or the largest unsigned
      break;
    case 3:
      v = sgn ? m >> 1 : m;  // the largest value: sums and products wrap
      break;
    case 4:
      v = sgn ? (m >> 1) + 1 : 0;  // the smallest
      break;
    case 5:
      v = (r >> 13) % 3;  // 0, 1, 2
      break;
    case 6:
      if (rank % 2) v = 0;
      break;
  }
  // Logical operations: zeros often enough that and, or and xor all meet both values.
  if (is_logical(op) && (r >> 40) % 3 == 0) v = 0;
  return v;
}

inline std::uint64_t int_combine(DType d, ReduceOp op, std::uint64_t a, std::uint64_t b) {
  const std::uint64_t m = width_mask(d);
  const bool sgn = is_signed_integer(d);
  auto less = [&](std::uint64_t x, std::uint64_t y) {
    return sgn ? as_signed(d, x) < as_signed(d, y) : x < y;
  };
  switch (op) {
    case ReduceOp::sum:
      return (a + b) & m;
    case ReduceOp::prod:
      return (a * b) & m;
    case ReduceOp::min:
      return less(b, a) ? b : a;
    case ReduceOp::max:
      return less(a, b) ? b : a;
    case ReduceOp::band:
      return a & b;
    case ReduceOp::bor:
      return a | b;
    case ReduceOp::bxor:
      return a ^ b;
    case ReduceOp::land:
      return (a != 0 && b != 0) ? 1 : 0;
    case ReduceOp::lor:
      return (a != 0 || b != 0) ? 1 : 0;
    case ReduceOp::lxor:
      return ((a != 0) != (b != 0)) ? 1 : 0;
    default:
      return 0;
  }
}

// --- Floats: values as double (exact for every input here), encoded per type. ----------------

inline double float_max(DType d) {
  return d == DType::f64 ? std::numeric_limits<double>::max()
                         : double(std::numeric_limits<float>::max());
}

inline double float_input(DType d, ReduceOp op, std::uint64_t r, std::uint32_t rank,
                          std::size_t i) {
  const bool f64 = d == DType::f64, f32 = d == DType::f32;
  double v;
  if (op == ReduceOp::prod) {
    // +-(1..7) * 2^(-2..2): any product of up to 8 is exact in binary32 and binary64.
    v = std::ldexp(double(1 + r % 7), int((r >> 8) % 5) - 2) * ((r >> 16) & 1 ? -1 : 1);
  } else {
    const std::int64_t g = f64 ? (1 << 20) : f32 ? 4096 : 64;
    const int e = f64 ? 12 : f32 ? 9 : 5;
    v = std::ldexp(double(std::int64_t(r % std::uint64_t(2 * g + 1)) - g), -int((r >> 24) % e));
  }
  switch (i % 37) {
    case 5:
      if (rank == 1) v = std::numeric_limits<double>::quiet_NaN();
      break;
    case 7:
      v = rank % 2 ? -0.0 : 0.0;
      break;
    case 9:
      v = -0.0;
      break;
    case 11:
      if (rank == 0) v = INFINITY;
      break;
    case 13:
      if (rank == 0 && op != ReduceOp::prod) v = -INFINITY;
      break;
    case 15:
      // Sums of the largest value overflow in any order; a product has it on two ranks and 1
      // elsewhere, so it is rounded once whatever the order.
      if (op != ReduceOp::prod)
        v = float_max(d);
      else
        v = rank < 2 ? float_max(d) : 1.0;
      break;
  }
  return v;
}

// The wire bits of `v` in type d (the narrow types round once, NaN canonical).
inline void store_float(DType d, double v, unsigned char* p) {
  switch (d) {
    case DType::f64: {
      const std::uint64_t b =
          std::isnan(v) ? agg::kCanonicalNanF64 : std::bit_cast<std::uint64_t>(v);
      std::memcpy(p, &b, 8);
      return;
    }
    case DType::f32: {
      const float f = agg::canonicalize_f32(float(v));
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::f16:
    case DType::bf16: {
      const std::uint16_t h =
          d == DType::f16 ? agg::f32_to_f16(float(v)) : agg::f32_to_bf16(float(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::e4m3:
      *p = agg::f32_to_e4m3(float(v));
      return;
    default:
      *p = agg::f32_to_e5m2(float(v));
      return;
  }
}

inline double load_float(DType d, const unsigned char* p) {
  switch (d) {
    case DType::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f16:
    case DType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, p, 2);
      return d == DType::f16 ? agg::f16_to_f32(h) : agg::bf16_to_f32(h);
    }
    case DType::e4m3:
      return agg::e4m3_to_f32(*p);
    default:
      return agg::e5m2_to_f32(*p);
  }
}

// IEEE 754-2019 minimum/maximum: NaN wins, -0 < +0.
template <class F>
F ieee_minmax(ReduceOp op, F a, F b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<F>::quiet_NaN();
  if (a == b) {
    const bool neg = op == ReduceOp::min ? (std::signbit(a) || std::signbit(b))
                                         : (std::signbit(a) && std::signbit(b));
    return neg ? -std::fabs(a) : std::fabs(a);
  }
  return (op == ReduceOp::min) == (a < b) ? a : b;
}

// The accumulator's arithmetic: binary64 for f64, binary32 for every other float type.
template <class F>
F float_combine(ReduceOp op, F a, F b) {
  if (op == ReduceOp::sum) return a + b;
  if (op == ReduceOp::prod) return a * b;
  return ieee_minmax(op, a, b);
}

// --- (value, index) pairs. --------------------------------------------------------------------

struct PairVal {
  double v;  // f32 and i32 values are exact in a double
  std::int32_t i;
};

inline PairVal pair_input(DType d, std::uint64_t r, std::size_t i) {
  PairVal p;
  p.i = std::int32_t(std::uint32_t(r >> 32));
  if ((r >> 20) % 4 == 0) p.i = std::int32_t((r >> 24) % 5) - 2;  // small, some negative: ties
  if (d == DType::i32_i32) {
    p.v = double(std::int64_t(r % 5) - 2);
    if (i % 13 == 3) p.v = double(std::numeric_limits<std::int32_t>::max());
    if (i % 13 == 4) p.v = double(std::numeric_limits<std::int32_t>::min());
    return p;
  }
  static constexpr double kValues[] = {-2.0, -1.0, -0.0, 0.0, 1.0, 2.0};
  p.v = kValues[r % 6];
  if ((r >> 8) % 23 == 0) p.v = std::numeric_limits<double>::quiet_NaN();
  if ((r >> 8) % 29 == 1) p.v = (r >> 14) & 1 ? INFINITY : -INFINITY;
  return p;
}

// MINLOC/MAXLOC as docs/numerics.md states them: a NaN value wins (below everything for minloc,
// above everything for maxloc, all NaNs equal), -0 is below +0, equal values keep the lower index.
inline PairVal pair_combine(ReduceOp op, PairVal a, PairVal b) {
  const bool an = std::isnan(a.v), bn = std::isnan(b.v);
  if (an || bn) {
    if (an && bn) return a.i <= b.i ? a : b;
    return an ? a : b;
  }
  auto less = [](double x, double y) {
    return x < y || (x == y && std::signbit(x) && !std::signbit(y));
  };
  const bool a_first = op == ReduceOp::minloc ? less(a.v, b.v) : less(b.v, a.v);
  const bool b_first = op == ReduceOp::minloc ? less(b.v, a.v) : less(a.v, b.v);
  if (a_first) return a;
  if (b_first) return b;
  return a.i <= b.i ? a : b;
}

inline void store_pair(DType d, PairVal p, unsigned char* out, bool canonical,
                       std::uint64_t padding) {
  if (d == DType::i32_i32) {
    const std::int32_t v = std::int32_t(p.v);
    std::memcpy(out, &v, 4);
    std::memcpy(out + 4, &p.i, 4);
  } else if (d == DType::f32_i32) {
    float v = float(p.v);
    if (canonical) v = agg::canonicalize_f32(v);
    std::memcpy(out, &v, 4);
    std::memcpy(out + 4, &p.i, 4);
  } else {
    std::uint64_t v = std::bit_cast<std::uint64_t>(p.v);
    if (canonical && std::isnan(p.v)) v = agg::kCanonicalNanF64;
    std::memcpy(out, &v, 8);
    std::memcpy(out + 8, &p.i, 4);
    const auto pad = std::uint32_t(padding);
    std::memcpy(out + 12, &pad, 4);
  }
}

// --- Inputs and expected results. ---------------------------------------------------------------

inline std::uint64_t element_seed(std::uint64_t seed, DType d, ReduceOp op, std::uint32_t rank,
                                  std::size_t i) {
  return mix(seed ^ (std::uint64_t(rank) << 40) ^ (std::uint64_t(d) << 48) ^
             (std::uint64_t(op) << 56) ^ i);
}

/// Rank `rank`'s input of `count` elements for (d, op): wire bytes, little-endian.
inline Bytes input(DType d, ReduceOp op, std::uint32_t rank, std::size_t count,
                   std::uint64_t seed) {
  const std::size_t s = dtype_size(d);
  Bytes b(count * s);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t r = element_seed(seed, d, op, rank, i);
    unsigned char* p = b.data() + i * s;
    if (is_pair(d)) {
      // f64_i32's padding is garbage on input: it must be ignored.
      store_pair(d, pair_input(d, r, i), p, false, mix(r));
    } else if (is_integer(d)) {
      const std::uint64_t v = int_input(d, op, r, rank, i);
      std::memcpy(p, &v, s);  // little-endian: the low bytes
    } else {
      store_float(d, float_input(d, op, r, rank, i), p);
    }
  }
  return b;
}

/// What every rank must get: the reduction of every rank's input, folded in rank order (any
/// order gives the same bits for these inputs).
inline Bytes expected(DType d, ReduceOp op, std::uint32_t world, std::size_t count,
                      std::uint64_t seed) {
  std::vector<Bytes> in;
  for (std::uint32_t r = 0; r < world; ++r) in.push_back(input(d, op, r, count, seed));
  const std::size_t s = dtype_size(d);
  Bytes out(count * s);
  for (std::size_t i = 0; i < count; ++i) {
    unsigned char* o = out.data() + i * s;
    if (is_pair(d)) {
      auto load = [&](std::uint32_t r) {
        const unsigned char* p = in[r].data() + i * s;
        PairVal v;
        if (d == DType::i32_i32) {
          std::int32_t x;
          std::memcpy(&x, p, 4);
          v.v = x;
          std::memcpy(&v.i, p + 4, 4);
        } else if (d == DType::f32_i32) {
          float x;
          std::memcpy(&x, p, 4);
          v.v = x;
          std::memcpy(&v.i, p + 4, 4);
        } else {
          std::memcpy(&v.v, p, 8);
          std::memcpy(&v.i, p + 8, 4);
        }
        return v;
      };
      PairVal acc = load(0);
      for (std::uint32_t r = 1; r < world; ++r) acc = pair_combine(op, acc, load(r));
      store_pair(d, acc, o, true, 0);
    } else if (is_integer(d)) {
      auto load = [&](std::uint32_t r) {
        std::uint64_t v = 0;
        std::memcpy(&v, in[r].data() + i * s, s);
        return v;
      };
      std::uint64_t acc = load(0);
      if (is_logical(op)) acc = acc != 0 ? 1 : 0;  // 0 or 1 even for one rank
      for (std::uint32_t r = 1; r < world; ++r) acc = int_combine(d, op, acc, load(r));
      std::memcpy(o, &acc, s);
    } else if (d == DType::f64) {
      double acc = load_float(d, in[0].data() + i * s);
      for (std::uint32_t r = 1; r < world; ++r)
        acc = float_combine(op, acc, load_float(d, in[r].data() + i * s));
      store_float(d, acc, o);
    } else {
      float acc = float(load_float(d, in[0].data() + i * s));
      for (std::uint32_t r = 1; r < world; ++r)
        acc = float_combine(op, acc, float(load_float(d, in[r].data() + i * s)));
      store_float(d, acc, o);
    }
  }
  return out;
}

/// An element's bytes as hex, most significant first ("0x7ff8000000000000").
inline std::string show(DType d, const unsigned char* p) {
  std::string s = "0x";
  char b[3];
  for (std::size_t k = dtype_size(d); k-- > 0;) {
    std::snprintf(b, sizeof b, "%02x", p[k]);
    s += b;
  }
  return s;
}

/// Every defined (dtype, op) pair.
inline std::vector<std::pair<DType, ReduceOp>> defined_pairs() {
  std::vector<std::pair<DType, ReduceOp>> v;
  for (DType d : kAllDTypes)
    for (ReduceOp op : kAllReduceOps)
      if (op_defined(d, op)) v.emplace_back(d, op);
  return v;
}

}  // namespace treeduce::ref
