/// @file
/// Element types and reduction operations shared by every treeduce component.
///
/// The numeric values of both enums travel in the treeduce header (docs/protocol.md): never
/// renumber.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace treeduce {

/// Element type of a reduction payload.
enum class DType : std::uint8_t {
  f32 = 0,   ///< IEEE binary32
  f16 = 1,   ///< IEEE binary16
  bf16 = 2,  ///< bfloat16: the top half of a binary32
  e4m3 = 3,  ///< OCP FP8 E4M3: no infinity, NaN is S.1111.111, saturates to +-448
  e5m2 = 4,  ///< OCP FP8 E5M2: IEEE-like, overflows to infinity
  i32 = 5,   ///< two's complement int32, sums wrap modulo 2^32
};
inline constexpr std::size_t kNumDTypes = 6;
inline constexpr std::array<DType, kNumDTypes> kAllDTypes = {DType::f32,  DType::f16,  DType::bf16,
                                                             DType::e4m3, DType::e5m2, DType::i32};

/// Reduction operation.
enum class ReduceOp : std::uint8_t { sum = 0, min = 1, max = 2 };
inline constexpr std::size_t kNumReduceOps = 3;
inline constexpr std::array<ReduceOp, kNumReduceOps> kAllReduceOps = {ReduceOp::sum, ReduceOp::min,
                                                                      ReduceOp::max};

/// Bytes of one element on the wire.
constexpr std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::e4m3:
    case DType::e5m2:
      return 1;
  }
  return 0;
}

/// True for the floating-point types (all but i32).
constexpr bool is_float(DType d) noexcept { return d != DType::i32; }

/// The enum for a wire byte, or nullopt when the byte names no type.
constexpr std::optional<DType> dtype_from_wire(std::uint8_t v) noexcept {
  return v < kNumDTypes ? std::optional<DType>(static_cast<DType>(v)) : std::nullopt;
}
constexpr std::optional<ReduceOp> op_from_wire(std::uint8_t v) noexcept {
  return v < kNumReduceOps ? std::optional<ReduceOp>(static_cast<ReduceOp>(v)) : std::nullopt;
}

/// Lower-case names as used on command lines and in reports: "f32", "bf16", "e4m3", "sum", ...
std::string_view name(DType d) noexcept;
std::string_view name(ReduceOp op) noexcept;
/// Inverse of name(); also accepts common spellings ("fp32", "float16", "fp8_e4m3", "int32").
std::optional<DType> parse_dtype(std::string_view s) noexcept;
std::optional<ReduceOp> parse_op(std::string_view s) noexcept;

}  // namespace treeduce
