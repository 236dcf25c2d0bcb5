#include "treeduce/aggregation/dtype.h"

#include <algorithm>
#include <cctype>
#include <string>

namespace treeduce {

std::string_view name(DType d) noexcept {
  switch (d) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::e4m3:
      return "e4m3";
    case DType::e5m2:
      return "e5m2";
    case DType::i32:
      return "i32";
    case DType::i8:
      return "i8";
    case DType::u8:
      return "u8";
    case DType::i16:
      return "i16";
    case DType::u16:
      return "u16";
    case DType::u32:
      return "u32";
    case DType::i64:
      return "i64";
    case DType::u64:
      return "u64";
    case DType::f64:
      return "f64";
    case DType::f32_i32:
      return "f32_i32";
    case DType::f64_i32:
      return "f64_i32";
    case DType::i32_i32:
      return "i32_i32";
  }
  return "?";
}

std::string_view name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::band:
      return "band";
    case ReduceOp::bor:
      return "bor";
    case ReduceOp::bxor:
      return "bxor";
    case ReduceOp::land:
      return "land";
    case ReduceOp::lor:
      return "lor";
    case ReduceOp::lxor:
      return "lxor";
    case ReduceOp::minloc:
      return "minloc";
    case ReduceOp::maxloc:
      return "maxloc";
  }
  return "?";
}

std::string_view op_refusal(DType d, ReduceOp op) noexcept {
  if (op_defined(d, op)) return {};
  if (is_pair(d)) {
    // One sentence per pair type, so the view can name the type without formatting.
    switch (d) {
      case DType::f32_i32:
        return "f32_i32 (value, index) pairs are reduced by minloc and maxloc only";
      case DType::f64_i32:
        return "f64_i32 (value, index) pairs are reduced by minloc and maxloc only";
      default:
        return "i32_i32 (value, index) pairs are reduced by minloc and maxloc only";
    }
  }
  if (is_loc(op)) {
    return op == ReduceOp::minloc
               ? "minloc is defined on (value, index) pair types only (f32_i32, f64_i32, i32_i32)"
               : "maxloc is defined on (value, index) pair types only (f32_i32, f64_i32, i32_i32)";
  }
  // Bitwise or logical on a float type.
  switch (op) {
    case ReduceOp::band:
      return "band (bitwise and) is defined on integer types only, not on floating-point types";
    case ReduceOp::bor:
      return "bor (bitwise or) is defined on integer types only, not on floating-point types";
    case ReduceOp::bxor:
      return "bxor (bitwise xor) is defined on integer types only, not on floating-point types";
    case ReduceOp::land:
      return "land (logical and) is defined on integer types only, not on floating-point types";
    case ReduceOp::lor:
      return "lor (logical or) is defined on integer types only, not on floating-point types";
    default:
      return "lxor (logical xor) is defined on integer types only, not on floating-point types";
  }
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // MPI's names: "MPI_DOUBLE", "MPI_SUM" and so on.
  if (out.rfind("mpi_", 0) == 0) out.erase(0, 4);
  return out;
}

}  // namespace

std::optional<DType> parse_dtype(std::string_view s) noexcept {
  struct Alias {
    std::string_view text;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"fp32", DType::f32},
      {"float", DType::f32},
      {"float32", DType::f32},
      {"fp16", DType::f16},
      {"half", DType::f16},
      {"float16", DType::f16},
      {"bfloat16", DType::bf16},
      {"fp8_e4m3", DType::e4m3},
      {"fp8_e5m2", DType::e5m2},
      {"int32", DType::i32},
      {"int", DType::i32},
      {"int8", DType::i8},
      {"signed_char", DType::i8},
      {"int8_t", DType::i8},
      {"uint8", DType::u8},
      {"unsigned_char", DType::u8},
      {"uint8_t", DType::u8},
      {"byte", DType::u8},
      {"int16", DType::i16},
      {"short", DType::i16},
      {"int16_t", DType::i16},
      {"uint16", DType::u16},
      {"unsigned_short", DType::u16},
      {"uint16_t", DType::u16},
      {"uint32", DType::u32},
      {"unsigned", DType::u32},
      {"uint32_t", DType::u32},
      {"int32_t", DType::i32},
      {"int64", DType::i64},
      {"int64_t", DType::i64},
      {"long", DType::i64},
      {"long_long", DType::i64},
      {"uint64", DType::u64},
      {"uint64_t", DType::u64},
      {"unsigned_long", DType::u64},
      {"fp64", DType::f64},
      {"float64", DType::f64},
      {"double", DType::f64},
      {"float_int", DType::f32_i32},
      {"double_int", DType::f64_i32},
      {"2int", DType::i32_i32},
  };
  try {
    const std::string l = lower(s);
    for (DType d : kAllDTypes) {
      if (name(d) == l) return d;
    }
    for (const Alias& a : kAliases) {
      if (a.text == l) return a.type;
    }
  } catch (...) {  // allocation failure: treat as unparsable
  }
  return std::nullopt;
}

std::optional<ReduceOp> parse_op(std::string_view s) noexcept {
  try {
    const std::string l = lower(s);
    for (ReduceOp op : kAllReduceOps) {
      if (name(op) == l) return op;
    }
    if (l == "product") return ReduceOp::prod;
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace treeduce
