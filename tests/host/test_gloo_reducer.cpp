// Host-side reduction across forked ranks on 127.0.0.1: every defined dtype x op against an
// independent reference (pair_reference.h: integers wrapping in their width, f64 in binary64,
// narrow floats folded in binary32 and narrowed once, MINLOC/MAXLOC ties), special values, in
// place and not, one rank (logical results still 0 or 1), undefined pairs refused, sizes 0 to
// 1M, a rank that never comes, and rendezvous directories that are reused or shared by two jobs
// at once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "host_reducer.h"
#include "pair_reference.h"
#include "treeduce/aggregation/convert.h"

using namespace treeduce;
using namespace treeduce::host;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

// The reference (pair_reference.h): independent of the kernels, exact in any order.
using ref::expected;
using ref::input;

// --- Ranks as processes. ---------------------------------------------------------------------

struct Rendezvous {
  std::string job;
  std::string dir;
  std::uint32_t world = 2;
  std::uint32_t timeout_ms = 20000;
};

using Body = std::function<int(HostReducer&, std::uint32_t rank)>;  // returns failures

// Forks one process per rank in `ranks`; each makes the reducer and runs `body`. Returns the
// children's pids.
std::vector<pid_t> spawn(const Rendezvous& rv, const std::vector<std::uint32_t>& ranks,
                         const Body& body) {
  std::vector<pid_t> pids;
  for (std::uint32_t rank : ranks) {
    pid_t pid = fork();
    if (pid == 0) {
      HostReducerOptions o;
      o.job = rv.job;
      o.rank = rank;
      o.world_size = rv.world;
      o.store_dir = rv.dir;
      o.bind_address = "127.0.0.1";
      o.timeout_ms = rv.timeout_ms;
      auto made = make_gloo_reducer(o);
      if (!made.ok()) {
        std::fprintf(stderr, "rank %u: %s\n", rank, made.status().to_string().c_str());
        _exit(100);
      }
      std::unique_ptr<HostReducer> red = std::move(made).value();
      const int failures = body(*red, rank);
      red.reset();
      _exit(failures > 99 ? 99 : failures);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Exit codes of `pids`; a child still running after `limit` is killed and reported as -1.
std::vector<int> reap(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  std::vector<int> codes(pids.size(), -2);
  std::size_t left = pids.size();
  while (left > 0) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -2) continue;
      int st = 0;
      if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > end) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -2) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          codes[i] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

std::vector<std::uint32_t> all_ranks(std::uint32_t world) {
  std::vector<std::uint32_t> r(world);
  for (std::uint32_t i = 0; i < world; ++i) r[i] = i;
  return r;
}

std::vector<int> run(const Rendezvous& rv, const Body& body) {
  return reap(spawn(rv, all_ranks(rv.world), body), std::chrono::seconds(100));
}

// One allreduce checked against the reference; prints a mismatch and returns 1.
int check(HostReducer& red, std::uint32_t rank, std::uint32_t world, DType d, ReduceOp op,
          std::size_t count, bool in_place, std::uint64_t seed) {
  Bytes in = input(d, op, rank, count, seed);
  Bytes out(in.size(), 0xAB);
  const treeduce::Status err = in_place ? red.allreduce(in.data(), in.data(), count, d, op)
                                        : red.allreduce(in.data(), out.data(), count, d, op);
  const Bytes& got = in_place ? in : out;
  if (!err.ok()) {
    std::fprintf(stderr, "rank %u %s %s: %s\n", rank, name(d).data(), name(op).data(),
                 err.to_string().c_str());
    return 1;
  }
  const Bytes want = expected(d, op, world, count, seed);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t s = dtype_size(d);
    if (std::memcmp(got.data() + i * s, want.data() + i * s, s) != 0) {
      std::fprintf(stderr, "rank %u world %u %s %s count %zu%s: element %zu is %s, expected %s\n",
                   rank, world, name(d).data(), name(op).data(), count, in_place ? " in place" : "",
                   i, ref::show(d, got.data() + i * s).c_str(),
                   ref::show(d, want.data() + i * s).c_str());
      return 1;
    }
  }
  return 0;
}

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() /
             ("treeduce-gloo-" + tag + "-" + std::to_string(getpid()))) {
    fs::remove_all(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::size_t files() const {
    if (!fs::exists(path)) return 0;
    return std::size_t(std::distance(fs::directory_iterator(path), fs::directory_iterator()));
  }
};

void every_dtype_and_op(std::uint32_t world) {
  TempDir dir("all" + std::to_string(world));
  auto codes = run({"all", dir.path, world, 20000}, [world](HostReducer& red, std::uint32_t r) {
    int failures = 0;
    std::uint64_t seed = 1;
    for (const auto& [d, op] : ref::defined_pairs())
      for (std::size_t count : {std::size_t(1), std::size_t(3), std::size_t(1000)})
        for (bool in_place : {false, true})
          failures += check(red, r, world, d, op, count, in_place, ++seed);
    return failures;
  });
  for (std::uint32_t r = 0; r < world; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
  EXPECT_EQ(dir.files(), 0u) << "the rendezvous left keys behind";
}

}  // namespace

TEST(GlooReducer, EveryDTypeAndOpMatchesTheSwitchOnTwoRanks) { every_dtype_and_op(2); }

TEST(GlooReducer, EveryDTypeAndOpMatchesTheSwitchOnFourRanks) { every_dtype_and_op(4); }

// docs/numerics.md: f16 1 + 2^-11 + 2^-11 is 1 + 2^-10 when rounded once from binary32; a
// reduction in f16 would give 1.
TEST(GlooReducer, NarrowSumRoundsOnce) {
  TempDir dir("once");
  auto codes = run({"once", dir.path, 4, 20000}, [](HostReducer& red, std::uint32_t r) {
    const float v[4] = {1.0f, std::ldexp(1.0f, -11), std::ldexp(1.0f, -11), 0.0f};
    std::uint16_t x = agg::f32_to_f16(v[r]);
    if (!red.allreduce(&x, &x, 1, DType::f16, ReduceOp::sum).ok()) return 1;
    return agg::f16_to_f32(x) == 1.0f + std::ldexp(1.0f, -10) ? 0 : 1;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

TEST(GlooReducer, ZeroElementsIsANoOpAndOneMillionFloatsWork) {
  TempDir dir("large");
  auto codes = run({"large", dir.path, 2, 30000}, [](HostReducer& red, std::uint32_t r) {
    int failures = 0;
    float untouched = 7.0f;
    failures += red.allreduce(&untouched, &untouched, 0, DType::f32, ReduceOp::sum).ok() ? 0 : 1;
    failures += untouched == 7.0f ? 0 : 1;
    failures += check(red, r, 2, DType::f32, ReduceOp::sum, 1 << 20, false, 99);
    failures += check(red, r, 2, DType::bf16, ReduceOp::max, 1 << 20, true, 100);
    return failures;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// One rank exchanges nothing, but its result is still what a switch emits: logical results 0 or
// 1, f64_i32 padding zero, NaNs canonical.
TEST(GlooReducer, OneRankNeedsNoPeersAndStillNormalises) {
  TempDir dir("one");
  auto codes = run({"one", dir.path, 1, 5000}, [](HostReducer& red, std::uint32_t r) {
    int failures = 0;
    std::uint64_t seed = 5;
    for (const auto& [d, op] : ref::defined_pairs())
      for (bool in_place : {false, true})
        failures += check(red, r, 1, d, op, 100, in_place, ++seed);
    // A value other than 0 and 1 comes back as 1.
    std::int16_t x[3] = {0, -7, 300};
    failures += red.allreduce(x, x, 3, DType::i16, ReduceOp::lor).ok() ? 0 : 1;
    failures += (x[0] == 0 && x[1] == 1 && x[2] == 1) ? 0 : 1;
    return failures;
  });
  EXPECT_EQ(codes[0], 0);
}

// A pair that means nothing is refused by name before anything is exchanged.
TEST(GlooReducer, UndefinedPairsAreRefusedByName) {
  TempDir dir("undef");
  auto codes = run({"undef", dir.path, 2, 10000}, [](HostReducer& red, std::uint32_t r) {
    int failures = 0;
    for (DType d : kAllDTypes) {
      for (ReduceOp op : kAllReduceOps) {
        if (op_defined(d, op)) continue;
        Bytes buf(4 * dtype_size(d), 0);
        const treeduce::Status s = red.allreduce(buf.data(), buf.data(), 4, d, op);
        const std::string want = std::string(op_refusal(d, op));
        if (s.code() != treeduce::Code::invalid_argument ||
            s.message().find(want) == std::string::npos ||
            s.message().find(std::string(name(d))) == std::string::npos) {
          std::fprintf(stderr, "%s %s: %s\n", name(d).data(), name(op).data(),
                       s.to_string().c_str());
          ++failures;
        }
      }
    }
    // Both ranks are still in step: a defined pair after the refusals works.
    failures += check(red, r, 2, DType::u16, ReduceOp::bxor, 10, false, 77);
    return failures;
  });
  for (int c : codes) EXPECT_EQ(c, 0);
}

// The rendezvous gives up (its own timeout, not a test's clock): every rank that came fails with
// a sentence rather than waiting forever, and leaves no keys behind.
TEST(GlooReducer, MissingRankFailsWithASentence) {
  TempDir dir("missing");
  // Ranks 0 and 1 of 3; rank 2 never comes.
  auto pids =
      spawn({"missing", dir.path, 3, 1500}, {0, 1}, [](HostReducer&, std::uint32_t) { return 0; });
  auto codes = reap(pids, std::chrono::seconds(100));
  for (int c : codes) EXPECT_EQ(c, 100) << "make_gloo_reducer should have failed";
  EXPECT_EQ(dir.files(), 0u) << "a failed rendezvous left keys behind";
  // The sentence itself, in this process.
  HostReducerOptions o;
  o.job = "missing";
  o.rank = 0;
  o.world_size = 2;
  o.store_dir = dir.path;
  o.bind_address = "127.0.0.1";
  o.timeout_ms = 300;
  const auto made = make_gloo_reducer(o);
  ASSERT_FALSE(made.ok());
  const std::string err = made.status().message();
  EXPECT_EQ(made.status().code(), treeduce::Code::unavailable);
  EXPECT_NE(err.find("could not connect rank 0 of job 'missing'"), std::string::npos) << err;
  EXPECT_EQ(err.back(), '.');
}

TEST(GlooReducer, BadOptionsAreRefusedWithASentence) {
  HostReducerOptions o;
  o.job = "bad";
  o.rank = 2;
  o.world_size = 2;
  o.store_dir = "/tmp";
  o.bind_address = "127.0.0.1";
  auto made = make_gloo_reducer(o);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), treeduce::Code::invalid_argument);
  EXPECT_EQ(made.status().message(), "Rank 2 does not exist in a world of 2.");
  o.rank = 0;
  o.store_dir = "";
  made = make_gloo_reducer(o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("rendezvous directory"), std::string::npos);
}

TEST(GlooReducer, SameJobDirectoryReusedTwiceInARow) {
  TempDir dir("reuse");
  for (int round = 0; round < 2; ++round) {
    auto codes = run({"reuse", dir.path, 2, 10000}, [](HostReducer& red, std::uint32_t r) {
      return check(red, r, 2, DType::i32, ReduceOp::sum, 64, false, 3);
    });
    for (int c : codes) EXPECT_EQ(c, 0) << "round " << round;
    EXPECT_EQ(dir.files(), 0u);
  }
}

TEST(GlooReducer, TwoJobsShareADirectoryAtOnce) {
  TempDir dir("shared");
  auto body = [](HostReducer& red, std::uint32_t r) {
    return check(red, r, 2, DType::f16, ReduceOp::min, 500, false, 4);
  };
  auto a = spawn({"job-a", dir.path, 2, 10000}, {0, 1}, body);
  auto b = spawn({"job-b", dir.path, 2, 10000}, {0, 1}, body);
  a.insert(a.end(), b.begin(), b.end());
  for (int c : reap(a, std::chrono::seconds(60))) EXPECT_EQ(c, 0);
}
