/// @file
/// Element types and reduction operations shared by every treeduce component.
///
/// The numeric values of both enums travel in the treeduce header (docs/protocol.md) and are bit
/// positions in every dtype/op mask: codes are only ever appended, never renumbered.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace treeduce {

/// Element type of a reduction payload. Elements travel in little-endian byte order.
enum class DType : std::uint8_t {
  f32 = 0,       ///< IEEE binary32
  f16 = 1,       ///< IEEE binary16
  bf16 = 2,      ///< bfloat16: the top half of a binary32
  e4m3 = 3,      ///< OCP FP8 E4M3: no infinity, NaN is S.1111.111, saturates to +-448
  e5m2 = 4,      ///< OCP FP8 E5M2: IEEE-like, overflows to infinity
  i32 = 5,       ///< two's complement int32, sums and products wrap modulo 2^32
  i8 = 6,        ///< two's complement int8, wraps modulo 2^8
  u8 = 7,        ///< uint8, wraps modulo 2^8
  i16 = 8,       ///< two's complement int16, wraps modulo 2^16
  u16 = 9,       ///< uint16, wraps modulo 2^16
  u32 = 10,      ///< uint32, wraps modulo 2^32
  i64 = 11,      ///< two's complement int64, wraps modulo 2^64
  u64 = 12,      ///< uint64, wraps modulo 2^64
  f64 = 13,      ///< IEEE binary64, reduced in binary64
  f32_i32 = 14,  ///< (binary32 value, int32 index), 8 bytes: MPI_FLOAT_INT; MINLOC/MAXLOC only
  f64_i32 = 15,  ///< (binary64 value, int32 index, 4 zero bytes), 16 bytes: MPI_DOUBLE_INT
  i32_i32 = 16,  ///< (int32 value, int32 index), 8 bytes: MPI_2INT; MINLOC/MAXLOC only
};
inline constexpr std::size_t kNumDTypes = 17;
inline constexpr std::array<DType, kNumDTypes> kAllDTypes = {
    DType::f32, DType::f16, DType::bf16,    DType::e4m3,    DType::e5m2,   DType::i32,
    DType::i8,  DType::u8,  DType::i16,     DType::u16,     DType::u32,    DType::i64,
    DType::u64, DType::f64, DType::f32_i32, DType::f64_i32, DType::i32_i32};

/// Reduction operation (MPI's predefined operations).
enum class ReduceOp : std::uint8_t {
  sum = 0,
  min = 1,
  max = 2,
  prod = 3,
  band = 4,     ///< bitwise and: integer types only
  bor = 5,      ///< bitwise or: integer types only
  bxor = 6,     ///< bitwise exclusive or: integer types only
  land = 7,     ///< logical and: integer types only, results are 0 or 1
  lor = 8,      ///< logical or: integer types only, results are 0 or 1
  lxor = 9,     ///< logical exclusive or: integer types only, results are 0 or 1
  minloc = 10,  ///< the lowest value and its index, the lowest index on ties: pair types only
  maxloc = 11,  ///< the highest value and its index, the lowest index on ties: pair types only
};
inline constexpr std::size_t kNumReduceOps = 12;
inline constexpr std::array<ReduceOp, kNumReduceOps> kAllReduceOps = {
    ReduceOp::sum,  ReduceOp::min,  ReduceOp::max,    ReduceOp::prod,
    ReduceOp::band, ReduceOp::bor,  ReduceOp::bxor,   ReduceOp::land,
    ReduceOp::lor,  ReduceOp::lxor, ReduceOp::minloc, ReduceOp::maxloc};

/// Bytes of one element on the wire.
constexpr std::size_t dtype_size(DType d) noexcept {
  switch (d) {
    case DType::e4m3:
    case DType::e5m2:
    case DType::i8:
    case DType::u8:
      return 1;
    case DType::f16:
    case DType::bf16:
    case DType::i16:
    case DType::u16:
      return 2;
    case DType::f32:
    case DType::i32:
    case DType::u32:
      return 4;
    case DType::i64:
    case DType::u64:
    case DType::f64:
    case DType::f32_i32:
    case DType::i32_i32:
      return 8;
    case DType::f64_i32:
      return 16;
  }
  return 0;
}

/// (value, index) pairs: reduced by MINLOC and MAXLOC only.
constexpr bool is_pair(DType d) noexcept {
  return d == DType::f32_i32 || d == DType::f64_i32 || d == DType::i32_i32;
}
/// The floating-point types, pairs excluded.
constexpr bool is_float(DType d) noexcept {
  return d == DType::f32 || d == DType::f16 || d == DType::bf16 || d == DType::e4m3 ||
         d == DType::e5m2 || d == DType::f64;
}
/// The integer types, pairs excluded.
constexpr bool is_integer(DType d) noexcept { return !is_float(d) && !is_pair(d); }
/// Signed integer types.
constexpr bool is_signed_integer(DType d) noexcept {
  return d == DType::i8 || d == DType::i16 || d == DType::i32 || d == DType::i64;
}
/// Float types narrower than binary32: widened to a binary32 accumulator, narrowed once.
constexpr bool is_narrow_float(DType d) noexcept {
  return d == DType::f16 || d == DType::bf16 || d == DType::e4m3 || d == DType::e5m2;
}

/// Bytes of one accumulator element (kernels.h): 4 (binary32) for f32 and the narrow floats,
/// the wire size for everything else (integers accumulate in their own width).
constexpr std::size_t acc_size(DType d) noexcept { return is_narrow_float(d) ? 4 : dtype_size(d); }

constexpr bool is_bitwise(ReduceOp op) noexcept {
  return op == ReduceOp::band || op == ReduceOp::bor || op == ReduceOp::bxor;
}
constexpr bool is_logical(ReduceOp op) noexcept {
  return op == ReduceOp::land || op == ReduceOp::lor || op == ReduceOp::lxor;
}
constexpr bool is_loc(ReduceOp op) noexcept {
  return op == ReduceOp::minloc || op == ReduceOp::maxloc;
}

/// True when `op` means something on `d`, as in MPI: SUM, PROD, MIN and MAX on every integer and
/// float type; the bitwise and logical operations on integer types; MINLOC and MAXLOC on the pair
/// types, and nothing else on them. Every other pair is refused (op_refusal() says why).
constexpr bool op_defined(DType d, ReduceOp op) noexcept {
  if (is_pair(d)) return is_loc(op);
  if (is_loc(op)) return false;
  if (is_bitwise(op) || is_logical(op)) return is_integer(d);
  return true;
}

/// Why (d, op) is refused, as a sentence naming both ("band is defined on integer types only, not
/// on f32"), or an empty view when op_defined(d, op).
std::string_view op_refusal(DType d, ReduceOp op) noexcept;

/// Bit masks over the codes above (bit d = DType d, bit o = ReduceOp o).
constexpr std::uint32_t bit(DType d) noexcept { return 1u << static_cast<unsigned>(d); }
constexpr std::uint32_t bit(ReduceOp op) noexcept { return 1u << static_cast<unsigned>(op); }
inline constexpr std::uint32_t kAllDTypesMask = (1u << kNumDTypes) - 1;
inline constexpr std::uint32_t kAllOpsMask = (1u << kNumReduceOps) - 1;

/// The enum for a wire byte, or nullopt when the byte names no type.
constexpr std::optional<DType> dtype_from_wire(std::uint8_t v) noexcept {
  return v < kNumDTypes ? std::optional<DType>(static_cast<DType>(v)) : std::nullopt;
}
constexpr std::optional<ReduceOp> op_from_wire(std::uint8_t v) noexcept {
  return v < kNumReduceOps ? std::optional<ReduceOp>(static_cast<ReduceOp>(v)) : std::nullopt;
}

/// Lower-case names as used on command lines and in reports: "f32", "bf16", "u64", "f64_i32",
/// "sum", "bxor", "minloc", ...
std::string_view name(DType d) noexcept;
std::string_view name(ReduceOp op) noexcept;
/// Inverse of name(); also accepts common spellings ("fp32", "float16", "fp8_e4m3", "int32",
/// "double", "uint8", "float_int", "double_int", "2int", "prod", "lxor", MPI's "MPI_SUM", ...).
std::optional<DType> parse_dtype(std::string_view s) noexcept;
std::optional<ReduceOp> parse_op(std::string_view s) noexcept;

}  // namespace treeduce
