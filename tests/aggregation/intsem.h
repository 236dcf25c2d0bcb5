// The integer operations stated again for the tests, independently of scalar_ops.h: arithmetic in
// a wider type (long long, or 128 bits for the 64-bit types) where every value of T is exact, then
// the low bits kept (wrap modulo 2^bits); min and max by comparing the exact values; the logical
// operations on "is not zero".
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::testing {

__extension__ typedef __int128 Int128;
__extension__ typedef unsigned __int128 UInt128;

template <class T>
using Wide = std::conditional_t<(sizeof(T) <= 4), long long, Int128>;
template <class T>
using UWide = std::conditional_t<(sizeof(T) <= 4), unsigned long long, UInt128>;

/// The low sizeof(T) bytes of x, as a T (two's complement for the signed types).
template <class T>
T low_bits(UWide<T> x) {
  T out;
  std::memcpy(&out, &x, sizeof out);  // little-endian: the low bytes come first
  return out;
}

template <class T>
T expected(ReduceOp op, T a, T b) {
  const Wide<T> wa = a, wb = b;  // exact
  const auto ua = static_cast<UWide<T>>(wa), ub = static_cast<UWide<T>>(wb);
  switch (op) {
    case ReduceOp::sum:
      return low_bits<T>(ua + ub);
    case ReduceOp::prod:
      return low_bits<T>(ua * ub);
    case ReduceOp::min:
      return wa <= wb ? a : b;
    case ReduceOp::max:
      return wa >= wb ? a : b;
    case ReduceOp::band:
      return low_bits<T>(ua & ub);
    case ReduceOp::bor:
      return low_bits<T>(ua | ub);
    case ReduceOp::bxor:
      return low_bits<T>(ua ^ ub);
    case ReduceOp::land:
      return (wa != 0 && wb != 0) ? T{1} : T{0};
    case ReduceOp::lor:
      return (wa != 0 || wb != 0) ? T{1} : T{0};
    case ReduceOp::lxor:
      return ((wa != 0) != (wb != 0)) ? T{1} : T{0};
    default:
      return T{0};  // not an integer operation
  }
}

/// The first contribution as the accumulator keeps it (logical operations: 0 or 1).
template <class T>
T expected_load(ReduceOp op, T a) {
  return is_logical(op) ? (a != 0 ? T{1} : T{0}) : a;
}

}  // namespace treeduce::testing
