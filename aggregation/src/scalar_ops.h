// Element-wise scalar semantics: the reference every SIMD path must match, and the tail loop of
// the paths that have no masked loads. Internal to aggregation/.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"

namespace treeduce::agg::scalar {

/// The accumulator lane type of a wire type.
template <DType D>
using Lane = std::conditional_t<D == DType::i32, std::int32_t, float>;

template <DType D>
inline Lane<D> widen(const void* payload, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(payload) + i * dtype_size(D);
  if constexpr (D == DType::f32 || D == DType::i32) {
    Lane<D> v;
    std::memcpy(&v, p, sizeof v);
    return v;
  } else if constexpr (D == DType::f16 || D == DType::bf16) {
    std::uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return D == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  } else if constexpr (D == DType::e4m3) {
    return e4m3_to_f32(*p);
  } else {
    return e5m2_to_f32(*p);
  }
}

template <DType D>
inline void narrow(void* payload, std::size_t i, Lane<D> v) {
  auto* p = static_cast<unsigned char*>(payload) + i * dtype_size(D);
  if constexpr (D == DType::i32) {
    std::memcpy(p, &v, sizeof v);
  } else if constexpr (D == DType::f32) {
    const float c = canonicalize_f32(v);
    std::memcpy(p, &c, sizeof c);
  } else if constexpr (D == DType::f16 || D == DType::bf16) {
    const std::uint16_t h = D == DType::f16 ? f32_to_f16(v) : f32_to_bf16(v);
    std::memcpy(p, &h, sizeof h);
  } else if constexpr (D == DType::e4m3) {
    *p = f32_to_e4m3(v);
  } else {
    *p = f32_to_e5m2(v);
  }
}

/// MIN/MAX: any NaN gives the canonical NaN; -0 is below +0; infinities order as usual. These rules
/// make both operations commutative and associative, so arrival order never changes a result.
template <ReduceOp O>
inline float combine(float a, float b) {
  if constexpr (O == ReduceOp::sum) {
    return a + b;
  } else {
    if (std::isnan(a) || std::isnan(b)) return std::bit_cast<float>(kCanonicalNanF32);
    if (a < b) return O == ReduceOp::min ? a : b;
    if (b < a) return O == ReduceOp::min ? b : a;
    // Equal: differs only for +0/-0. OR picks -0 (min), AND picks +0 (max).
    const std::uint32_t ab = std::bit_cast<std::uint32_t>(a), bb = std::bit_cast<std::uint32_t>(b);
    return std::bit_cast<float>(O == ReduceOp::min ? (ab | bb) : (ab & bb));
  }
}

/// INT32: sums wrap modulo 2^32 (associative, so order never matters), min/max are exact.
template <ReduceOp O>
inline std::int32_t combine(std::int32_t a, std::int32_t b) {
  if constexpr (O == ReduceOp::sum) {
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(a) + static_cast<std::uint32_t>(b));
  } else if constexpr (O == ReduceOp::min) {
    return a < b ? a : b;
  } else {
    return a < b ? b : a;
  }
}

// Loops over [begin, n), used whole by the scalar path and for tails by the SIMD ones.

template <DType D>
inline void load(void* acc, const void* payload, std::size_t begin, std::size_t n) {
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) a[i] = widen<D>(payload, i);
}

template <DType D, ReduceOp O>
inline void accumulate(void* acc, const void* payload, std::size_t begin, std::size_t n) {
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) a[i] = combine<O>(a[i], widen<D>(payload, i));
}

template <DType D, ReduceOp O>
inline void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t begin,
                   std::size_t n) {
  if (k == 0) return;
  auto* a = static_cast<Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) {
    Lane<D> v = widen<D>(payloads[0], i);
    for (std::size_t j = 1; j < k; ++j) v = combine<O>(v, widen<D>(payloads[j], i));
    a[i] = v;
  }
}

template <DType D>
inline void emit(void* payload, const void* acc, std::size_t begin, std::size_t n) {
  const auto* a = static_cast<const Lane<D>*>(acc);
  for (std::size_t i = begin; i < n; ++i) narrow<D>(payload, i, a[i]);
}

}  // namespace treeduce::agg::scalar
