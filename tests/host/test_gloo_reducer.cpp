// Host-side reduction across forked ranks on 127.0.0.1: every dtype x op against a reference
// computed here from convert.h (widen, fold in binary32, narrow once), special values, in place
// and not, sizes 0 to 1M, a rank that never comes, and rendezvous directories that are reused or
// shared by two jobs at once.
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
#include "treeduce/aggregation/convert.h"

using namespace treeduce;
using namespace treeduce::host;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

// --- The reference: what a one-level switch computes. ---------------------------------------

float widen(DType d, const unsigned char* p) {
  std::uint16_t h;
  float f;
  switch (d) {
    default:  // TODO(issue 14): the types added by issue 14
      break;
    case DType::f32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::f16:
      std::memcpy(&h, p, 2);
      return agg::f16_to_f32(h);
    case DType::bf16:
      std::memcpy(&h, p, 2);
      return agg::bf16_to_f32(h);
    case DType::e4m3:
      return agg::e4m3_to_f32(*p);
    case DType::e5m2:
      return agg::e5m2_to_f32(*p);
    case DType::i32:
      break;
  }
  return 0;
}

void narrow(DType d, float v, unsigned char* p) {
  std::uint16_t h;
  switch (d) {
    default:  // TODO(issue 14): the types added by issue 14
      break;
    case DType::f32:
      v = agg::canonicalize_f32(v);
      std::memcpy(p, &v, 4);
      return;
    case DType::f16:
      h = agg::f32_to_f16(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::bf16:
      h = agg::f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      return;
    case DType::e4m3:
      *p = agg::f32_to_e4m3(v);
      return;
    case DType::e5m2:
      *p = agg::f32_to_e5m2(v);
      return;
    case DType::i32:
      return;
  }
}

// IEEE 754-2019 minimum/maximum: NaN wins, -0 < +0.
float combine(ReduceOp op, float a, float b) {
  if (op == ReduceOp::sum) return a + b;
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  if (a == b) {
    const bool neg = op == ReduceOp::min ? (std::signbit(a) || std::signbit(b))
                                         : (std::signbit(a) && std::signbit(b));
    return neg ? -std::fabs(a) : std::fabs(a);
  }
  return (op == ReduceOp::min) == (a < b) ? a : b;
}

std::int32_t combine(ReduceOp op, std::int32_t a, std::int32_t b) {
  if (op == ReduceOp::sum) return std::int32_t(std::uint32_t(a) + std::uint32_t(b));
  return op == ReduceOp::min ? std::min(a, b) : std::max(a, b);
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Rank r's input. Finite values lie on a grid coarse enough that every sum of up to four ranks
// is exact in binary32 in any order, so the expected bits do not depend on Gloo's summation
// order; narrowing the sum still rounds (and ties) in the narrow types. Special lanes: a NaN on
// one rank, +0/-0 mixed, all -0, +inf, -inf, and the largest finite value on every rank (sums
// overflow: infinity, or 448 for E4M3).
Bytes input(DType d, std::uint32_t rank, std::size_t count, std::uint64_t seed) {
  Bytes b(count * dtype_size(d));
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t r = mix(seed ^ (std::uint64_t(rank) << 40) ^ i);
    unsigned char* p = b.data() + i * dtype_size(d);
    if (d == DType::i32) {
      std::int32_t v = std::int32_t(std::uint32_t(r));
      if (i % 17 == 3) v = std::numeric_limits<std::int32_t>::max();  // sums wrap
      if (i % 17 == 4) v = std::numeric_limits<std::int32_t>::min();
      std::memcpy(p, &v, 4);
      continue;
    }
    const bool wide = d == DType::f32;
    float v = std::ldexp(float(std::int32_t(r % (wide ? 8193 : 129)) - (wide ? 4096 : 64)),
                         -int((r >> 20) % (wide ? 9 : 5)));
    switch (i % 37) {
      case 5:
        if (rank == 1) v = std::numeric_limits<float>::quiet_NaN();
        break;
      case 7:
        v = rank % 2 ? -0.0f : 0.0f;
        break;
      case 9:
        v = -0.0f;
        break;
      case 11:
        if (rank == 0) v = INFINITY;
        break;
      case 13:
        if (rank == 0) v = -INFINITY;
        break;
      case 15:
        v = std::numeric_limits<float>::max();  // narrowed to the type's largest finite
        break;
    }
    narrow(d, v, p);
  }
  return b;
}

Bytes expected(DType d, ReduceOp op, std::uint32_t world, std::size_t count, std::uint64_t seed) {
  std::vector<Bytes> in;
  for (std::uint32_t r = 0; r < world; ++r) in.push_back(input(d, r, count, seed));
  Bytes out(count * dtype_size(d));
  const std::size_t s = dtype_size(d);
  for (std::size_t i = 0; i < count; ++i) {
    if (d == DType::i32) {
      std::int32_t acc, v;
      std::memcpy(&acc, in[0].data() + i * s, 4);
      for (std::uint32_t r = 1; r < world; ++r) {
        std::memcpy(&v, in[r].data() + i * s, 4);
        acc = combine(op, acc, v);
      }
      std::memcpy(out.data() + i * s, &acc, 4);
      continue;
    }
    float acc = widen(d, in[0].data() + i * s);
    for (std::uint32_t r = 1; r < world; ++r)
      acc = combine(op, acc, widen(d, in[r].data() + i * s));
    narrow(d, acc, out.data() + i * s);
  }
  return out;
}

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
  Bytes in = input(d, rank, count, seed);
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
      std::uint32_t g = 0, w = 0;
      std::memcpy(&g, got.data() + i * s, s);
      std::memcpy(&w, want.data() + i * s, s);
      std::fprintf(
          stderr, "rank %u world %u %s %s count %zu%s: element %zu is 0x%x, expected 0x%x\n", rank,
          world, name(d).data(), name(op).data(), count, in_place ? " in place" : "", i, g, w);
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
    for (DType d : kAllDTypes)
      for (ReduceOp op : kAllReduceOps)
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

TEST(GlooReducer, OneRankNeedsNoPeers) {
  TempDir dir("one");
  auto codes = run({"one", dir.path, 1, 5000}, [](HostReducer& red, std::uint32_t r) {
    return check(red, r, 1, DType::e4m3, ReduceOp::sum, 100, false, 5);
  });
  EXPECT_EQ(codes[0], 0);
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
