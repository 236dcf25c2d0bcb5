// options_from_environment: treeduce's variables, torchrun's and Open MPI's, in that order, and a
// sentence naming the variable for every bad value.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <climits>
#include <string>

#include "treeduce/host/communicator.h"

using treeduce::host::Options;
using treeduce::host::options_from_environment;
using treeduce::host::Path;
using treeduce::host::Result;

namespace {

struct Environment : ::testing::Test {
  void SetUp() override {
    for (const char* v :
         {"TREEDUCE_MANAGER", "TREEDUCE_JOB", "TREEDUCE_RANK", "TREEDUCE_WORLD_SIZE",
          "TREEDUCE_HOST", "TREEDUCE_BIND", "TREEDUCE_PORT", "TREEDUCE_PATH", "TREEDUCE_SLOTS",
          "TREEDUCE_PAYLOAD_BYTES", "TREEDUCE_RTO_US", "TREEDUCE_FALLBACK_STORE",
          "TREEDUCE_FALLBACK_ADDRESS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID",
          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"})
      unsetenv(v);
  }
  static void set(const char* k, const char* v) { setenv(k, v, 1); }
  // Parses and expects a failure whose sentence contains `needle`.
  static void expect_error(const std::string& needle) {
    Options o;
    std::string err;
    EXPECT_EQ(options_from_environment(&o, &err), Result::invalid_argument);
    EXPECT_NE(err.find(needle), std::string::npos) << err;
    EXPECT_EQ(err.back(), '.') << err;
  }
};

}  // namespace

TEST_F(Environment, TreeduceVariablesFillEveryField) {
  set("TREEDUCE_MANAGER", "10.0.0.9:9300");
  set("TREEDUCE_JOB", "train-7");
  set("TREEDUCE_RANK", "3");
  set("TREEDUCE_WORLD_SIZE", "8");
  set("TREEDUCE_HOST", "h3");
  set("TREEDUCE_BIND", "10.1.0.4");
  set("TREEDUCE_PORT", "50123");
  set("TREEDUCE_PATH", "network");
  set("TREEDUCE_FALLBACK_STORE", "/shared/rdv");
  set("TREEDUCE_FALLBACK_ADDRESS", "10.2.0.4");
  set("TREEDUCE_SLOTS", "64");
  set("TREEDUCE_PAYLOAD_BYTES", "8192");
  set("TREEDUCE_RTO_US", "10000");
  Options o;
  std::string err = "stale";
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(err, "");
  EXPECT_EQ(o.manager, "10.0.0.9:9300");
  EXPECT_EQ(o.job, "train-7");
  EXPECT_EQ(o.rank, 3u);
  EXPECT_EQ(o.world_size, 8u);
  EXPECT_EQ(o.host, "h3");
  EXPECT_EQ(o.bind_address, "10.1.0.4");
  EXPECT_EQ(o.port, 50123);
  EXPECT_EQ(o.path, Path::network);
  EXPECT_EQ(o.fallback_store, "/shared/rdv");
  EXPECT_EQ(o.fallback_address, "10.2.0.4");
  EXPECT_EQ(o.slots, 64u);
  EXPECT_EQ(o.payload_bytes, 8192u);
  EXPECT_EQ(o.rto_us, 10000u);
}

TEST_F(Environment, TorchrunGivesRankWorldAndJobAndTreeduceOverrides) {
  set("RANK", "1");
  set("WORLD_SIZE", "4");
  set("LOCAL_RANK", "1");
  set("TORCHELASTIC_RUN_ID", "abc123");
  Options o;
  std::string err;
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.rank, 1u);
  EXPECT_EQ(o.world_size, 4u);
  EXPECT_EQ(o.job, "abc123");
  set("TREEDUCE_RANK", "2");
  set("TREEDUCE_JOB", "mine");
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.rank, 2u);
  EXPECT_EQ(o.world_size, 4u);
  EXPECT_EQ(o.job, "mine");
}

TEST_F(Environment, OpenMpiGivesRankAndWorld) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "6");
  set("TREEDUCE_JOB", "mpi");
  Options o;
  std::string err;
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.rank, 5u);
  EXPECT_EQ(o.world_size, 6u);
  set("WORLD_SIZE", "7");  // torchrun's comes before Open MPI's
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.world_size, 7u);
}

TEST_F(Environment, DefaultsHostNameAndKeepsTheCallersOtherFields) {
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "1");
  set("TREEDUCE_JOB", "j");
  char name[HOST_NAME_MAX + 1] = {};
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  Options o;
  o.slots = 64;
  o.manager = "preset:1";
  std::string err;
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.host, name);
  EXPECT_EQ(o.slots, 64u);
  EXPECT_EQ(o.manager, "preset:1");
  EXPECT_EQ(o.path, Path::auto_select);
  EXPECT_EQ(o.port, 0);
}

TEST_F(Environment, MissingRankWorldOrJobIsAnError) {
  expect_error("No rank or world size");
  set("RANK", "0");
  expect_error("No rank or world size");
  set("WORLD_SIZE", "2");
  expect_error("TREEDUCE_JOB");
  set("TORCHELASTIC_RUN_ID", "none");  // torchrun's placeholder names no job
  expect_error("TREEDUCE_JOB");
  set("TREEDUCE_JOB", "");  // empty counts as unset
  expect_error("TREEDUCE_JOB");
}

TEST_F(Environment, BadValuesNameTheirVariable) {
  set("TREEDUCE_JOB", "j");
  set("TREEDUCE_WORLD_SIZE", "4");
  set("TREEDUCE_RANK", "-1");
  expect_error("TREEDUCE_RANK is '-1', not a whole number from 0 to 4294967295.");
  set("TREEDUCE_RANK", "1x");
  expect_error("TREEDUCE_RANK is '1x'");
  set("TREEDUCE_RANK", "4294967296");
  expect_error("TREEDUCE_RANK is '4294967296'");
  set("TREEDUCE_RANK", "4");
  expect_error(
      "TREEDUCE_RANK is 4, but ranks of a world of 4 (TREEDUCE_WORLD_SIZE) go from 0 to 3.");
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "0");
  expect_error("TREEDUCE_WORLD_SIZE is 0");
  set("TREEDUCE_WORLD_SIZE", "4");
  set("TREEDUCE_PORT", "65536");
  expect_error("TREEDUCE_PORT is '65536', not a whole number from 0 to 65535.");
  set("TREEDUCE_PORT", "50000");
  set("TREEDUCE_PATH", "fast");
  expect_error("TREEDUCE_PATH is 'fast'; it must be auto, network or host.");
  set("TREEDUCE_PATH", "host");
  set("TREEDUCE_SLOTS", "48");
  expect_error("TREEDUCE_SLOTS is 48; it must be a power of two from 1 to 4096.");
  set("TREEDUCE_SLOTS", "8192");
  expect_error("TREEDUCE_SLOTS is '8192', not a whole number from 0 to 4096.");
  set("TREEDUCE_SLOTS", "32");
  set("TREEDUCE_PAYLOAD_BYTES", "128");
  expect_error("TREEDUCE_PAYLOAD_BYTES is 128; it must be a power of two from 256 to 8192.");
  set("TREEDUCE_PAYLOAD_BYTES", "9000");
  expect_error("TREEDUCE_PAYLOAD_BYTES is '9000', not a whole number from 0 to 8192.");
  set("TREEDUCE_PAYLOAD_BYTES", "4096");
  set("TREEDUCE_RTO_US", "5ms");
  expect_error("TREEDUCE_RTO_US is '5ms', not a whole number from 0 to 128000.");
  set("TREEDUCE_RTO_US", "5000");
  Options o;
  std::string err;
  ASSERT_EQ(options_from_environment(&o, &err), Result::ok) << err;
  EXPECT_EQ(o.path, Path::host);
  EXPECT_EQ(o.port, 50000);
  EXPECT_EQ(o.slots, 32u);
  EXPECT_EQ(o.payload_bytes, 4096u);
  EXPECT_EQ(o.rto_us, 5000u);
}

TEST_F(Environment, AFailureLeavesTheOptionsUntouched) {
  set("TREEDUCE_RANK", "0");
  set("TREEDUCE_WORLD_SIZE", "2");
  set("TREEDUCE_JOB", "j");
  set("TREEDUCE_PATH", "nope");
  Options o;
  o.job = "before";
  std::string err;
  EXPECT_EQ(options_from_environment(&o, &err), Result::invalid_argument);
  EXPECT_EQ(o.job, "before");
  EXPECT_EQ(o.world_size, 1u);
}
