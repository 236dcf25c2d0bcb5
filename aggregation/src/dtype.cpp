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
  }
  return "?";
}

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

std::optional<DType> parse_dtype(std::string_view s) noexcept {
  struct Alias {
    std::string_view text;
    DType type;
  };
  static constexpr Alias kAliases[] = {
      {"f32", DType::f32},       {"fp32", DType::f32},      {"float", DType::f32},
      {"float32", DType::f32},   {"f16", DType::f16},       {"fp16", DType::f16},
      {"half", DType::f16},      {"float16", DType::f16},   {"bf16", DType::bf16},
      {"bfloat16", DType::bf16}, {"e4m3", DType::e4m3},     {"fp8_e4m3", DType::e4m3},
      {"e5m2", DType::e5m2},     {"fp8_e5m2", DType::e5m2}, {"i32", DType::i32},
      {"int32", DType::i32},     {"int", DType::i32},
  };
  try {
    const std::string l = lower(s);
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
  } catch (...) {
  }
  return std::nullopt;
}

}  // namespace treeduce
