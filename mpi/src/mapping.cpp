#include "mapping.h"

#include <climits>
#include <cstdint>
#include <iterator>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::mpi {
namespace {

struct TypeEntry {
  MPI_Datatype mpi;
  tdr_dtype_t tdr;
};

template <typename T>
constexpr tdr_dtype_t int_type() {
  if constexpr (sizeof(T) == 1)
    return std::is_signed_v<T> ? tdr_i8 : tdr_u8;
  else if constexpr (sizeof(T) == 2)
    return std::is_signed_v<T> ? tdr_i16 : tdr_u16;
  else if constexpr (sizeof(T) == 4)
    return std::is_signed_v<T> ? tdr_i32 : tdr_u32;
  else
    return std::is_signed_v<T> ? tdr_i64 : tdr_u64;
}

// MPI's C integer types by their C types' widths (LP64 on Debian amd64: long is 64 bits), the
// fixed-width ones, the floats, MPI_BYTE (bitwise operations only: op_defined refuses the rest,
// and the caller asks tdr_offloads, which is 0 for an undefined pair) and the MINLOC/MAXLOC
// pairs, whose C struct layouts are treeduce's pair types.
const TypeEntry* types(std::size_t* n) {
  static const TypeEntry t[] = {
      {MPI_FLOAT, tdr_f32},
      {MPI_DOUBLE, tdr_f64},
      {MPI_SIGNED_CHAR, int_type<signed char>()},
      {MPI_UNSIGNED_CHAR, int_type<unsigned char>()},
      {MPI_SHORT, int_type<short>()},
      {MPI_UNSIGNED_SHORT, int_type<unsigned short>()},
      {MPI_INT, int_type<int>()},
      {MPI_UNSIGNED, int_type<unsigned>()},
      {MPI_LONG, int_type<long>()},
      {MPI_UNSIGNED_LONG, int_type<unsigned long>()},
      {MPI_LONG_LONG_INT, int_type<long long>()},  // MPI_LONG_LONG is the same handle
      {MPI_UNSIGNED_LONG_LONG, int_type<unsigned long long>()},
      {MPI_INT8_T, tdr_i8},
      {MPI_UINT8_T, tdr_u8},
      {MPI_INT16_T, tdr_i16},
      {MPI_UINT16_T, tdr_u16},
      {MPI_INT32_T, tdr_i32},
      {MPI_UINT32_T, tdr_u32},
      {MPI_INT64_T, tdr_i64},
      {MPI_UINT64_T, tdr_u64},
      {MPI_BYTE, tdr_u8},
      {MPI_FLOAT_INT, tdr_f32_i32},
      {MPI_DOUBLE_INT, tdr_f64_i32},
      {MPI_2INT, tdr_i32_i32},
  };
  *n = std::size(t);
  return t;
}

}  // namespace

std::optional<tdr_dtype_t> map_dtype(MPI_Datatype t) {
  std::size_t n = 0;
  const TypeEntry* e = types(&n);
  for (std::size_t i = 0; i < n; ++i) {
    if (e[i].mpi == t) return e[i].tdr;
  }
  return std::nullopt;
}

std::optional<tdr_op_t> map_op(MPI_Op op) {
  if (op == MPI_SUM) return tdr_sum;
  if (op == MPI_MIN) return tdr_min;
  if (op == MPI_MAX) return tdr_max;
  if (op == MPI_PROD) return tdr_prod;
  if (op == MPI_BAND) return tdr_band;
  if (op == MPI_BOR) return tdr_bor;
  if (op == MPI_BXOR) return tdr_bxor;
  if (op == MPI_LAND) return tdr_land;
  if (op == MPI_LOR) return tdr_lor;
  if (op == MPI_LXOR) return tdr_lxor;
  if (op == MPI_MINLOC) return tdr_minloc;
  if (op == MPI_MAXLOC) return tdr_maxloc;
  return std::nullopt;
}

std::optional<std::string> undefined_pair(tdr_dtype_t d, tdr_op_t o) {
  const auto dt = static_cast<DType>(d);
  const auto op = static_cast<ReduceOp>(o);
  if (op_defined(dt, op)) return std::nullopt;
  return std::string(op_refusal(dt, op));
}

std::size_t bcast_element_bytes(MPI_Datatype t) {
  static const MPI_Datatype plain[] = {MPI_CHAR,
                                       MPI_BYTE,
                                       MPI_C_BOOL,
                                       MPI_WCHAR,
                                       MPI_LONG_DOUBLE,
                                       MPI_C_FLOAT_COMPLEX,
                                       MPI_C_DOUBLE_COMPLEX,
                                       MPI_AINT,
                                       MPI_OFFSET,
                                       MPI_COUNT};
  bool predefined = map_dtype(t).has_value();
  for (MPI_Datatype p : plain) predefined = predefined || p == t;
  if (!predefined) return 0;
  int size = 0;
  PMPI_Type_size(t, &size);
  // The pair types with padding (MPI_DOUBLE_INT: 12 bytes of data in 16) are not contiguous.
  MPI_Aint lb = 0, extent = 0;
  PMPI_Type_get_extent(t, &lb, &extent);
  if (size <= 0 || lb != 0 || extent != size) return 0;
  return static_cast<std::size_t>(size);
}

std::string dtype_name(MPI_Datatype t) {
  char name[MPI_MAX_OBJECT_NAME] = {};
  int len = 0;
  if (PMPI_Type_get_name(t, name, &len) != MPI_SUCCESS || len == 0) return "a derived datatype";
  return std::string(name, static_cast<std::size_t>(len));
}

std::string op_name(MPI_Op op) {
  static const struct {
    MPI_Op op;
    const char* name;
  } names[] = {{MPI_SUM, "MPI_SUM"},         {MPI_MIN, "MPI_MIN"},       {MPI_MAX, "MPI_MAX"},
               {MPI_PROD, "MPI_PROD"},       {MPI_BAND, "MPI_BAND"},     {MPI_BOR, "MPI_BOR"},
               {MPI_BXOR, "MPI_BXOR"},       {MPI_LAND, "MPI_LAND"},     {MPI_LOR, "MPI_LOR"},
               {MPI_LXOR, "MPI_LXOR"},       {MPI_MINLOC, "MPI_MINLOC"}, {MPI_MAXLOC, "MPI_MAXLOC"},
               {MPI_REPLACE, "MPI_REPLACE"}, {MPI_NO_OP, "MPI_NO_OP"}};
  for (const auto& n : names) {
    if (n.op == op) return n.name;
  }
  return "a user-defined operation";
}

const char* tdr_dtype_name(tdr_dtype_t d) {
  static const char* const n[] = {"f32", "f16", "bf16",    "e4m3",    "e5m2",   "i32",
                                  "i8",  "u8",  "i16",     "u16",     "u32",    "i64",
                                  "u64", "f64", "f32_i32", "f64_i32", "i32_i32"};
  const auto i = static_cast<std::size_t>(d);
  return i < std::size(n) ? n[i] : "?";
}

const char* tdr_op_name(tdr_op_t o) {
  static const char* const n[] = {"sum",  "min",  "max", "prod", "band",   "bor",
                                  "bxor", "land", "lor", "lxor", "minloc", "maxloc"};
  const auto i = static_cast<std::size_t>(o);
  return i < std::size(n) ? n[i] : "?";
}

}  // namespace treeduce::mpi
