// libtreeduce-mpi's pure parts without MPI processes: its variables (every value and every
// refusal) and the mapping of MPI's predefined datatypes and operations (MPI handles are
// addresses in libmpi: comparing them needs no MPI_Init).
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "config.h"
#include "mapping.h"

namespace treeduce::mpi {
namespace {

Config parse(const std::map<std::string, std::string>& vars, std::string* error) {
  return parse_config(
      [&](const char* name) -> std::optional<std::string> {
        auto it = vars.find(name);
        return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
      },
      error);
}

TEST(MpiConfig, DefaultsWhenNothingIsSet) {
  std::string error;
  const Config c = parse({}, &error);
  EXPECT_EQ(error, "");
  EXPECT_EQ(c, Config{});
  EXPECT_EQ(c.mode, Mode::on);
  EXPECT_EQ(c.min_ranks, 2u);
}

TEST(MpiConfig, EveryVariable) {
  std::string error;
  const Config c = parse({{"TREEDUCE_MPI", "force"},
                          {"TREEDUCE_MPI_MIN_RANKS", "4"},
                          {"TREEDUCE_MPI_MIN_BYTES", "64K"},
                          {"TREEDUCE_MPI_MAX_BYTES", "2M"},
                          {"TREEDUCE_MPI_STATS", "1"}},
                         &error);
  EXPECT_EQ(error, "");
  EXPECT_EQ(c.mode, Mode::force);
  EXPECT_EQ(c.min_ranks, 4u);
  EXPECT_EQ(c.min_bytes, 65536u);
  EXPECT_EQ(c.max_bytes, 2u << 20);
  EXPECT_TRUE(c.stats);
  EXPECT_EQ(parse({{"TREEDUCE_MPI", "off"}}, &error).mode, Mode::off);
  EXPECT_EQ(parse({{"TREEDUCE_MPI_MIN_BYTES", "1000"}}, &error).min_bytes, 1000u);
  EXPECT_EQ(parse({{"TREEDUCE_MPI_MAX_BYTES", "1G"}}, &error).max_bytes, 1u << 30);
}

// docs/mpi.md, "Variables": an empty value is the default; suffixes in either case.
TEST(MpiConfig, EmptyValuesAreDefaultsAndSuffixesTakeEitherCase) {
  std::string error;
  const Config c = parse({{"TREEDUCE_MPI", ""},
                          {"TREEDUCE_MPI_MIN_RANKS", ""},
                          {"TREEDUCE_MPI_MIN_BYTES", ""},
                          {"TREEDUCE_MPI_MAX_BYTES", ""},
                          {"TREEDUCE_MPI_STATS", ""}},
                         &error);
  EXPECT_EQ(error, "");
  EXPECT_EQ(c, Config{});
  EXPECT_EQ(parse({{"TREEDUCE_MPI_MIN_BYTES", "64k"}}, &error).min_bytes, 65536u);
  EXPECT_EQ(parse({{"TREEDUCE_MPI_MAX_BYTES", "2m"}}, &error).max_bytes, 2u << 20);
  EXPECT_EQ(parse({{"TREEDUCE_MPI_MAX_BYTES", "1g"}}, &error).max_bytes, 1u << 30);
  for (const char* bad : {" 64K", "+64", "64 K", "64KB", "64Ki"}) {
    parse({{"TREEDUCE_MPI_MIN_BYTES", bad}}, &error);
    EXPECT_FALSE(error.empty()) << bad;
  }
}

TEST(MpiConfig, BadValuesAreOneSentenceAndTurnOffloadingOff) {
  const std::map<std::string, std::string> bad[] = {
      {{"TREEDUCE_MPI", "yes"}},
      {{"TREEDUCE_MPI_MIN_RANKS", "0"}},
      {{"TREEDUCE_MPI_MIN_RANKS", "two"}},
      {{"TREEDUCE_MPI_MIN_BYTES", "-1"}},
      {{"TREEDUCE_MPI_MIN_BYTES", "4X"}},
      {{"TREEDUCE_MPI_MAX_BYTES", "99999999999999999999"}},
      {{"TREEDUCE_MPI_MAX_BYTES", "1K"}, {"TREEDUCE_MPI_MIN_BYTES", "2K"}},
      {{"TREEDUCE_MPI_STATS", "yes"}},
  };
  for (const auto& vars : bad) {
    std::string error;
    const Config c = parse(vars, &error);
    EXPECT_EQ(c.mode, Mode::off) << error;
    ASSERT_FALSE(error.empty());
    EXPECT_NE(error.find(vars.begin()->first), std::string::npos) << error;
    EXPECT_EQ(error.back(), '.') << error;
  }
  std::string error;
  parse({{"TREEDUCE_MPI", "yes"}}, &error);
  EXPECT_EQ(error, "TREEDUCE_MPI is 'yes'; it must be off, on or force.");
}

TEST(MpiMapping, PredefinedDatatypesAndOperations) {
  EXPECT_EQ(map_dtype(MPI_FLOAT), tdr_f32);
  EXPECT_EQ(map_dtype(MPI_DOUBLE), tdr_f64);
  EXPECT_EQ(map_dtype(MPI_INT), tdr_i32);
  EXPECT_EQ(map_dtype(MPI_UNSIGNED), tdr_u32);
  EXPECT_EQ(map_dtype(MPI_LONG), tdr_i64);  // LP64
  EXPECT_EQ(map_dtype(MPI_UNSIGNED_LONG_LONG), tdr_u64);
  EXPECT_EQ(map_dtype(MPI_SHORT), tdr_i16);
  EXPECT_EQ(map_dtype(MPI_SIGNED_CHAR), tdr_i8);
  EXPECT_EQ(map_dtype(MPI_UINT8_T), tdr_u8);
  EXPECT_EQ(map_dtype(MPI_INT16_T), tdr_i16);
  EXPECT_EQ(map_dtype(MPI_UINT64_T), tdr_u64);
  EXPECT_EQ(map_dtype(MPI_BYTE), tdr_u8);
  EXPECT_EQ(map_dtype(MPI_FLOAT_INT), tdr_f32_i32);
  EXPECT_EQ(map_dtype(MPI_DOUBLE_INT), tdr_f64_i32);
  EXPECT_EQ(map_dtype(MPI_2INT), tdr_i32_i32);
  EXPECT_EQ(map_dtype(MPI_LONG_DOUBLE), std::nullopt);
  EXPECT_EQ(map_dtype(MPI_CHAR), std::nullopt);  // not a reduction type in MPI
  EXPECT_EQ(map_dtype(MPI_C_DOUBLE_COMPLEX), std::nullopt);
  EXPECT_EQ(map_dtype(MPI_SHORT_INT), std::nullopt);  // a pair treeduce has not
  EXPECT_EQ(map_op(MPI_SUM), tdr_sum);
  EXPECT_EQ(map_op(MPI_PROD), tdr_prod);
  EXPECT_EQ(map_op(MPI_MIN), tdr_min);
  EXPECT_EQ(map_op(MPI_MAX), tdr_max);
  EXPECT_EQ(map_op(MPI_BAND), tdr_band);
  EXPECT_EQ(map_op(MPI_BOR), tdr_bor);
  EXPECT_EQ(map_op(MPI_BXOR), tdr_bxor);
  EXPECT_EQ(map_op(MPI_LAND), tdr_land);
  EXPECT_EQ(map_op(MPI_LOR), tdr_lor);
  EXPECT_EQ(map_op(MPI_LXOR), tdr_lxor);
  EXPECT_EQ(map_op(MPI_MINLOC), tdr_minloc);
  EXPECT_EQ(map_op(MPI_MAXLOC), tdr_maxloc);
  EXPECT_EQ(map_op(MPI_REPLACE), std::nullopt);
  EXPECT_EQ(map_op(MPI_NO_OP), std::nullopt);
  EXPECT_STREQ(tdr_dtype_name(tdr_f64_i32), "f64_i32");
  EXPECT_STREQ(tdr_op_name(tdr_maxloc), "maxloc");
}

// A pair MPI does not define passes through with MPI's rule as its reason, not "the tree does
// not reduce it".
TEST(MpiMapping, UndefinedPairsSayWhy) {
  EXPECT_EQ(undefined_pair(tdr_f32, tdr_sum), std::nullopt);
  EXPECT_EQ(undefined_pair(tdr_f32_i32, tdr_minloc), std::nullopt);
  const auto band = undefined_pair(tdr_f32, tdr_band);
  ASSERT_TRUE(band.has_value());
  EXPECT_NE(band->find("band (bitwise and) is defined on integer types only"), std::string::npos)
      << *band;
  const auto minloc = undefined_pair(tdr_i32, tdr_minloc);
  ASSERT_TRUE(minloc.has_value());
  EXPECT_NE(minloc->find("pair types only"), std::string::npos) << *minloc;
}

}  // namespace
}  // namespace treeduce::mpi
