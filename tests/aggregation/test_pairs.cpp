// MINLOC and MAXLOC on the pair types (f32_i32, f64_i32, i32_i32): every path against the scalar
// reference bit for bit, then the properties MPI asks for, checked on every path against
// expectations written here (an oracle that does not use scalar_ops.h): the lowest index on ties,
// a NaN wins (and is emitted as the canonical NaN), -0 is below +0, the result does not depend on
// the order or grouping of the contributions, and f64_i32's padding is zero on output whatever it
// was on input.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "sanitized.h"
#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

constexpr std::array<DType, 3> kPairTypes = {DType::f32_i32, DType::f64_i32, DType::i32_i32};
constexpr std::array<ReduceOp, 2> kLocOps = {ReduceOp::minloc, ReduceOp::maxloc};
constexpr std::size_t kMaxLen = 1025;
constexpr std::size_t kCanary = 16;  // bytes after every output buffer that must stay untouched
constexpr unsigned char kCanaryByte = 0xAB;

using Bytes = std::vector<unsigned char>;

/// One pair as the tests see it: the value's bits (binary32, binary64 or int32 in the low bits),
/// the index, and f64_i32's padding word.
struct Pair {
  std::uint64_t v = 0;
  std::int32_t i = 0;
  std::uint32_t pad = 0;
};

std::size_t value_bytes(DType d) { return d == DType::f64_i32 ? 8 : 4; }

void put_pair(Bytes& b, DType d, std::size_t lane, const Pair& p) {
  unsigned char* at = b.data() + lane * dtype_size(d);
  std::memcpy(at, &p.v, value_bytes(d));  // little-endian: the low bytes of v
  std::memcpy(at + value_bytes(d), &p.i, 4);
  if (d == DType::f64_i32) std::memcpy(at + 12, &p.pad, 4);
}

Pair get_pair(const Bytes& b, DType d, std::size_t lane) {
  Pair p;
  const unsigned char* at = b.data() + lane * dtype_size(d);
  std::memcpy(&p.v, at, value_bytes(d));
  std::memcpy(&p.i, at + value_bytes(d), 4);
  if (d == DType::f64_i32) std::memcpy(&p.pad, at + 12, 4);
  return p;
}

/// A buffer of n pairs followed by the canary.
Bytes buffer(DType d, std::size_t n, unsigned char fill = 0) {
  Bytes b(n * dtype_size(d) + kCanary, fill);
  std::fill(b.end() - kCanary, b.end(), kCanaryByte);
  return b;
}

bool canary_intact(const Bytes& b) {
  return std::all_of(b.end() - kCanary, b.end(), [](unsigned char c) { return c == kCanaryByte; });
}

// ---- random pairs full of ties and special values --------------------------------------------

std::uint64_t random_value(DType d, std::mt19937_64& rng) {
  const std::uint64_t raw = rng();
  const int pick = static_cast<int>(rng() % 16);
  if (d == DType::i32_i32) {
    constexpr std::array<std::int32_t, 8> kPool = {
        0, -1, 1, INT32_MIN, INT32_MAX, INT32_MIN + 1, INT32_MAX - 1, 7};
    std::int32_t v;
    if (pick < 8) {
      v = kPool[static_cast<std::size_t>(pick)];
    } else if (pick < 14) {
      v = static_cast<std::int32_t>(raw % 7) - 3;  // small: many ties
    } else {
      v = static_cast<std::int32_t>(raw);
    }
    return static_cast<std::uint32_t>(v);
  }
  if (d == DType::f32_i32) {
    constexpr float kInf = std::numeric_limits<float>::infinity();
    constexpr std::array<float, 9> kPool = {0.0f,
                                            -0.0f,
                                            1.0f,
                                            -1.0f,
                                            kInf,
                                            -kInf,
                                            std::numeric_limits<float>::max(),
                                            std::numeric_limits<float>::denorm_min(),
                                            -std::numeric_limits<float>::denorm_min()};
    std::uint32_t bits;
    if (pick < 9) {
      bits = std::bit_cast<std::uint32_t>(kPool[static_cast<std::size_t>(pick)]);
    } else if (pick < 12) {
      bits = (static_cast<std::uint32_t>(raw) & 0x807FFFFFu) | 0x7F800001u;  // NaN, any payload
    } else if (pick < 15) {
      bits = std::bit_cast<std::uint32_t>(static_cast<float>(static_cast<int>(raw % 5) - 2));
    } else {
      bits = static_cast<std::uint32_t>(raw);  // anything, NaNs included
    }
    return bits;
  }
  constexpr double kInf = std::numeric_limits<double>::infinity();
  constexpr std::array<double, 9> kPool = {0.0,
                                           -0.0,
                                           1.0,
                                           -1.0,
                                           kInf,
                                           -kInf,
                                           std::numeric_limits<double>::max(),
                                           std::numeric_limits<double>::denorm_min(),
                                           -std::numeric_limits<double>::denorm_min()};
  if (pick < 9) return std::bit_cast<std::uint64_t>(kPool[static_cast<std::size_t>(pick)]);
  if (pick < 12) return (raw & 0x800FFFFFFFFFFFFFull) | 0x7FF0000000000001ull;  // NaN
  if (pick < 15) return std::bit_cast<std::uint64_t>(static_cast<double>(raw % 5) - 2.0);
  return raw;
}

std::int32_t random_index(std::mt19937_64& rng) {
  constexpr std::array<std::int32_t, 7> kPool = {0, 1, 2, -1, INT32_MIN, INT32_MAX, INT32_MIN + 1};
  const auto pick = static_cast<std::size_t>(rng() % 10);
  if (pick < kPool.size()) return kPool[pick];
  return static_cast<std::int32_t>(rng());
}

Bytes random_pairs(DType d, std::size_t n, std::mt19937_64& rng) {
  Bytes b = buffer(d, n);
  for (std::size_t l = 0; l < n; ++l) {
    put_pair(b, d, l,
             Pair{random_value(d, rng), random_index(rng), static_cast<std::uint32_t>(rng())});
  }
  return b;
}

::testing::AssertionResult same_bytes(const Bytes& want, const Bytes& got, DType d) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t k = 0; k < want.size(); ++k) {
    if (want[k] != got[k]) {
      return ::testing::AssertionFailure()
             << "byte " << k << " (pair " << k / dtype_size(d) << "): scalar 0x" << std::hex
             << int{want[k]} << ", simd 0x" << int{got[k]};
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<Isa> simd_paths() {
  std::vector<Isa> out;
  for (Isa isa : supported_isas()) {
    if (isa != Isa::scalar) out.push_back(isa);
  }
  return out;
}

// ---- every path against the scalar reference ---------------------------------------------------

class PairPath : public ::testing::TestWithParam<Isa> {};

TEST_P(PairPath, MatchesScalarForEveryLengthAndK) {
  const KernelTable& ref = *kernels_for(Isa::scalar);
  const KernelTable& simd = *kernels_for(GetParam());
  std::mt19937_64 rng(77 + static_cast<unsigned>(GetParam()));
  constexpr std::size_t kK = 5;
  for (DType d : kPairTypes) {
    for (ReduceOp op : kLocOps) {
      const LoadFn rl = ref.load_fn(d, op), sl = simd.load_fn(d, op);
      const AccumulateFn ra = ref.accumulate_fn(d, op), sa = simd.accumulate_fn(d, op);
      const ReduceFn rr = ref.reduce_fn(d, op), sr = simd.reduce_fn(d, op);
      const EmitFn re = ref.emit_fn(d), se = simd.emit_fn(d);
      ASSERT_NE(sl, nullptr);
      ASSERT_NE(sa, nullptr);
      ASSERT_NE(sr, nullptr);
      ASSERT_NE(se, nullptr);
      for (std::size_t n = 0; n <= kMaxLen; ++n) {
        if (!treeduce::testing::length_checked(n, kMaxLen)) continue;
        SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op) << " n=" << n);
        std::vector<Bytes> in;
        std::vector<const void*> ptrs;
        for (std::size_t j = 0; j < kK; ++j) in.push_back(random_pairs(d, n, rng));
        for (const Bytes& p : in) ptrs.push_back(p.data());

        // load: a copy (NaN payloads kept), padding cleared.
        Bytes r = buffer(d, n, 0x5A), s = buffer(d, n, 0xA5);
        rl(r.data(), in[0].data(), n);
        sl(s.data(), in[0].data(), n);
        ASSERT_TRUE(same_bytes(r, s, d)) << "load";
        ASSERT_TRUE(canary_intact(s)) << "load wrote past the end";

        // emit of a loaded accumulator (raw NaNs in it), also in place.
        Bytes er = buffer(d, n), es = buffer(d, n, 0x33);
        re(er.data(), r.data(), n);
        se(es.data(), s.data(), n);
        ASSERT_TRUE(same_bytes(er, es, d)) << "emit after load";
        Bytes in_place = s;
        se(in_place.data(), in_place.data(), n);
        ASSERT_TRUE(same_bytes(er, in_place, d)) << "emit in place";

        // accumulate the other payloads one by one.
        for (std::size_t j = 1; j < kK; ++j) {
          ra(r.data(), in[j].data(), n);
          sa(s.data(), in[j].data(), n);
          ASSERT_TRUE(same_bytes(r, s, d)) << "accumulate " << j;
        }
        ASSERT_TRUE(canary_intact(s)) << "accumulate wrote past the end";
        re(er.data(), r.data(), n);
        se(es.data(), s.data(), n);
        ASSERT_TRUE(same_bytes(er, es, d)) << "emit after accumulate";
        ASSERT_TRUE(canary_intact(es)) << "emit wrote past the end";

        // reduce with k = 1..5 payloads.
        for (std::size_t k = 1; k <= kK; ++k) {
          Bytes rk = buffer(d, n, 0x11), sk = buffer(d, n, 0x22);
          rr(rk.data(), ptrs.data(), k, n);
          sr(sk.data(), ptrs.data(), k, n);
          ASSERT_TRUE(same_bytes(rk, sk, d)) << "reduce k=" << k;
          ASSERT_TRUE(canary_intact(sk)) << "reduce wrote past the end";
        }
        Bytes untouched = buffer(d, n, 0x44), copy = untouched;
        sr(untouched.data(), ptrs.data(), 0, n);
        ASSERT_EQ(untouched, copy) << "reduce with k=0 changed the accumulator";
      }
    }
  }
}

// Accumulators that were not made by load() (random bits, non-canonical NaNs, padding zero as the
// contract requires) fold the same way on every path.
TEST_P(PairPath, MatchesScalarFromAnyAccumulator) {
  const KernelTable& ref = *kernels_for(Isa::scalar);
  const KernelTable& simd = *kernels_for(GetParam());
  std::mt19937_64 rng(99);
  for (DType d : kPairTypes) {
    for (ReduceOp op : kLocOps) {
      for (std::size_t n : {1u, 15u, 16u, 17u, 33u, 100u, 257u}) {
        SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op) << " n=" << n);
        Bytes acc = random_pairs(d, n, rng);
        for (std::size_t l = 0; l < n; ++l) {
          Pair p = get_pair(acc, d, l);
          p.pad = 0;
          put_pair(acc, d, l, p);
        }
        const Bytes in = random_pairs(d, n, rng);
        Bytes r = acc, s = acc;
        ref.accumulate_fn(d, op)(r.data(), in.data(), n);
        simd.accumulate_fn(d, op)(s.data(), in.data(), n);
        ASSERT_TRUE(same_bytes(r, s, d));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PairPath, ::testing::ValuesIn(simd_paths()),
                         [](const auto& i) { return std::string(name(i.param)); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(PairPath);

// ---- properties, on every path (scalar included) -----------------------------------------------

bool is_nan(DType d, std::uint64_t v) {
  if (d == DType::f32_i32) return std::isnan(std::bit_cast<float>(static_cast<std::uint32_t>(v)));
  if (d == DType::f64_i32) return std::isnan(std::bit_cast<double>(v));
  return false;
}

/// -1, 0 or 1 as a's value is below, equal to or above b's in the order of `op`, stated as MPI
/// and docs/numerics.md do: for MINLOC a NaN is below every number, for MAXLOC above; all NaNs
/// are equal; -0 is below +0.
int value_order(DType d, ReduceOp op, std::uint64_t a, std::uint64_t b) {
  const bool an = is_nan(d, a), bn = is_nan(d, b);
  if (an || bn) {
    if (an && bn) return 0;
    const int nan_side = op == ReduceOp::minloc ? -1 : 1;
    return an ? nan_side : -nan_side;
  }
  auto cmp = [](auto x, auto y) { return x < y ? -1 : (y < x ? 1 : 0); };
  if (d == DType::i32_i32) {
    return cmp(static_cast<std::int32_t>(static_cast<std::uint32_t>(a)),
               static_cast<std::int32_t>(static_cast<std::uint32_t>(b)));
  }
  const double x = d == DType::f32_i32 ? std::bit_cast<float>(static_cast<std::uint32_t>(a))
                                       : std::bit_cast<double>(a);
  const double y = d == DType::f32_i32 ? std::bit_cast<float>(static_cast<std::uint32_t>(b))
                                       : std::bit_cast<double>(b);
  if (const int c = cmp(x, y); c != 0) return c;
  return cmp(!std::signbit(x), !std::signbit(y));  // equal: only +-0 differ, -0 first
}

/// The expected MINLOC/MAXLOC of a set: the best value (lowest for MINLOC, highest for MAXLOC),
/// the lowest index among the pairs holding it, a NaN emitted as the canonical NaN, padding zero.
Pair oracle(DType d, ReduceOp op, const std::vector<Pair>& set) {
  const int better = op == ReduceOp::minloc ? -1 : 1;
  Pair best = set[0];
  for (const Pair& p : set) {
    const int c = value_order(d, op, p.v, best.v);
    if (c == better || (c == 0 && p.i < best.i)) best = p;
  }
  best.pad = 0;
  if (is_nan(d, best.v)) {
    best.v = d == DType::f32_i32 ? kCanonicalNanF32 : kCanonicalNanF64;
  }
  return best;
}

std::string describe(const Pair& p) {
  std::ostringstream o;
  o << "(0x" << std::hex << p.v << ", " << std::dec << p.i << ", pad " << p.pad << ")";
  return o.str();
}

::testing::AssertionResult same_pair(DType d, const Pair& want, const Pair& got) {
  if (want.v == got.v && want.i == got.i && want.pad == got.pad) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << name(d) << ": want " << describe(want) << ", got " << describe(got);
}

/// sets[l] is lane l's set; every set has the same size. Payload j holds sets[l][order[j]] in
/// lane l.
std::vector<Bytes> payloads_of(DType d, const std::vector<std::vector<Pair>>& sets,
                               const std::vector<std::size_t>& order) {
  std::vector<Bytes> out;
  for (std::size_t j : order) {
    Bytes b = buffer(d, sets.size());
    for (std::size_t l = 0; l < sets.size(); ++l) put_pair(b, d, l, sets[l][j]);
    out.push_back(std::move(b));
  }
  return out;
}

/// load + accumulate in payload order, then emit.
Bytes fold_accumulate(const KernelTable& t, DType d, ReduceOp op, const std::vector<Bytes>& ps,
                      std::size_t n) {
  Bytes acc = buffer(d, n, 0xEE), out = buffer(d, n, 0xEE);
  t.load_fn(d, op)(acc.data(), ps[0].data(), n);
  for (std::size_t j = 1; j < ps.size(); ++j) t.accumulate_fn(d, op)(acc.data(), ps[j].data(), n);
  t.emit_fn(d)(out.data(), acc.data(), n);
  return out;
}

/// reduce of every payload in order, then emit.
Bytes fold_reduce(const KernelTable& t, DType d, ReduceOp op, const std::vector<Bytes>& ps,
                  std::size_t n) {
  std::vector<const void*> ptrs;
  for (const Bytes& p : ps) ptrs.push_back(p.data());
  Bytes acc = buffer(d, n, 0xEE), out = buffer(d, n, 0xEE);
  t.reduce_fn(d, op)(acc.data(), ptrs.data(), ptrs.size(), n);
  t.emit_fn(d)(out.data(), acc.data(), n);
  return out;
}

/// Checks every lane of an emitted buffer against the oracle of its set.
::testing::AssertionResult lanes_match_oracle(DType d, ReduceOp op,
                                              const std::vector<std::vector<Pair>>& sets,
                                              const Bytes& out) {
  if (!canary_intact(out)) return ::testing::AssertionFailure() << "wrote past the end";
  for (std::size_t l = 0; l < sets.size(); ++l) {
    auto r = same_pair(d, oracle(d, op, sets[l]), get_pair(out, d, l));
    if (!r) return r << " in lane " << l;
  }
  return ::testing::AssertionSuccess();
}

class PairProperty : public ::testing::TestWithParam<Isa> {
 protected:
  const KernelTable& t() const { return *kernels_for(GetParam()); }
  // Runs both folds over the sets (one set per lane) and checks them against the oracle and
  // against explicit expectations `want` (one per lane), when given.
  void check(DType d, ReduceOp op, const std::vector<std::vector<Pair>>& sets,
             const std::vector<Pair>& want) {
    std::vector<std::size_t> order(sets[0].size());
    for (std::size_t j = 0; j < order.size(); ++j) order[j] = j;
    const auto ps = payloads_of(d, sets, order);
    for (const Bytes& out :
         {fold_accumulate(t(), d, op, ps, sets.size()), fold_reduce(t(), d, op, ps, sets.size())}) {
      EXPECT_TRUE(lanes_match_oracle(d, op, sets, out));
      for (std::size_t l = 0; l < want.size(); ++l) {
        EXPECT_TRUE(same_pair(d, want[l], get_pair(out, d, l))) << "lane " << l;
      }
    }
  }
};

// Replicates one set over n lanes (so the vector loops, not only tails, see it), with the
// pairs rotated differently in each lane.
std::vector<std::vector<Pair>> spread(const std::vector<Pair>& set, std::size_t n) {
  std::vector<std::vector<Pair>> sets(n, set);
  for (std::size_t l = 0; l < n; ++l) {
    std::rotate(sets[l].begin(), sets[l].begin() + static_cast<std::ptrdiff_t>(l % set.size()),
                sets[l].end());
  }
  return sets;
}

std::uint64_t bits_of(DType d, double x) {
  if (d == DType::f32_i32) return std::bit_cast<std::uint32_t>(static_cast<float>(x));
  if (d == DType::f64_i32) return std::bit_cast<std::uint64_t>(x);
  return static_cast<std::uint32_t>(static_cast<std::int32_t>(x));
}

TEST_P(PairProperty, EqualValuesKeepTheLowestIndex) {
  for (DType d : kPairTypes) {
    for (ReduceOp op : kLocOps) {
      SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op));
      const std::uint64_t v = bits_of(d, -3.0);
      const std::vector<Pair> set = {{v, 7}, {v, INT32_MAX}, {v, -2}, {v, INT32_MIN + 5}, {v, 3}};
      check(d, op, spread(set, 37), std::vector<Pair>(37, Pair{v, INT32_MIN + 5}));
      // A better value elsewhere wins whatever its index.
      const std::uint64_t best = bits_of(d, op == ReduceOp::minloc ? -4.0 : 5.0);
      std::vector<Pair> with_best = set;
      with_best.push_back({best, INT32_MAX});
      check(d, op, spread(with_best, 37), std::vector<Pair>(37, Pair{best, INT32_MAX}));
    }
  }
}

TEST_P(PairProperty, ANanWinsAndIsCanonical) {
  for (DType d : {DType::f32_i32, DType::f64_i32}) {
    const std::uint64_t canon = d == DType::f32_i32 ? kCanonicalNanF32 : kCanonicalNanF64;
    const std::uint64_t nan1 = d == DType::f32_i32 ? 0xFFC00123u : 0xFFF0000000000042ull;  // -NaN
    const std::uint64_t nan2 = d == DType::f32_i32 ? 0x7F800001u : 0x7FF4000000000000ull;  // sNaN
    for (ReduceOp op : kLocOps) {
      SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op));
      const std::uint64_t inf = bits_of(d, INFINITY), ninf = bits_of(d, -INFINITY);
      // One NaN among numbers that would otherwise win: the NaN and its index.
      check(d, op, spread({{inf, 0}, {ninf, 1}, {nan1, 9}, {bits_of(d, 0.0), -5}}, 41),
            std::vector<Pair>(41, Pair{canon, 9}));
      // Several NaNs with different payloads are equal: the lowest index among them.
      check(d, op, spread({{nan2, 4}, {ninf, -100}, {nan1, 2}, {inf, -200}, {nan2, 3}}, 41),
            std::vector<Pair>(41, Pair{canon, 2}));
    }
  }
}

TEST_P(PairProperty, NegativeZeroIsBelowPositiveZero) {
  for (DType d : {DType::f32_i32, DType::f64_i32}) {
    const std::uint64_t pz = bits_of(d, 0.0), nz = bits_of(d, -0.0);
    ASSERT_NE(pz, nz);
    const std::vector<Pair> set = {{pz, 0}, {nz, 5}, {pz, 8}, {nz, 6}};
    check(d, ReduceOp::minloc, spread(set, 33), std::vector<Pair>(33, Pair{nz, 5}));
    check(d, ReduceOp::maxloc, spread(set, 33), std::vector<Pair>(33, Pair{pz, 0}));
  }
}

// Commutativity and associativity: every permutation of small random sets, folded left by
// accumulate and by reduce, and grouped as (p0 p1) (p2 p3) (two reduces, then one accumulate of
// the second partial into the first, as a parent switch does), gives the oracle's pair.
TEST_P(PairProperty, AnyOrderAndGroupingGivesTheSamePair) {
  std::mt19937_64 rng(5);
  constexpr std::size_t kLanes = 45, kSet = 4;
  for (DType d : kPairTypes) {
    for (ReduceOp op : kLocOps) {
      SCOPED_TRACE(::testing::Message() << name(d) << " " << name(op));
      std::vector<std::vector<Pair>> sets(kLanes);
      for (auto& s : sets) {
        for (std::size_t j = 0; j < kSet; ++j) {
          // Few distinct values and indices, so ties and NaN ties are common.
          s.push_back(
              {random_value(d, rng), static_cast<std::int32_t>(rng() % 3) - 1, 0xDEADBEEFu});
        }
      }
      std::vector<std::size_t> order(kSet);
      for (std::size_t j = 0; j < kSet; ++j) order[j] = j;
      do {
        const auto ps = payloads_of(d, sets, order);
        ASSERT_TRUE(lanes_match_oracle(d, op, sets, fold_accumulate(t(), d, op, ps, kLanes)));
        ASSERT_TRUE(lanes_match_oracle(d, op, sets, fold_reduce(t(), d, op, ps, kLanes)));
        // (p0 p1) (p2 p3): partials are accumulators, which have the wire layout for pairs.
        const auto left = fold_reduce(t(), d, op, {ps[0], ps[1]}, kLanes);
        const auto right = fold_reduce(t(), d, op, {ps[2], ps[3]}, kLanes);
        Bytes acc = buffer(d, kLanes), out = buffer(d, kLanes);
        t().load_fn(d, op)(acc.data(), left.data(), kLanes);
        t().accumulate_fn(d, op)(acc.data(), right.data(), kLanes);
        t().emit_fn(d)(out.data(), acc.data(), kLanes);
        ASSERT_TRUE(lanes_match_oracle(d, op, sets, out)) << "grouped";
      } while (std::next_permutation(order.begin(), order.end()));
    }
  }
}

// f64_i32's four padding bytes: ignored on input, zero in every accumulator and every payload
// that comes out, whatever they held (including an accumulator with garbage in them).
TEST_P(PairProperty, PaddingIsZeroOnOutput) {
  constexpr DType d = DType::f64_i32;
  constexpr std::size_t n = 29;
  std::mt19937_64 rng(11);
  Bytes a = random_pairs(d, n, rng), b = random_pairs(d, n, rng);
  for (std::size_t l = 0; l < n; ++l) {
    for (Bytes* x : {&a, &b}) {
      Pair p = get_pair(*x, d, l);
      p.pad = 0xFFFFFFFFu - static_cast<std::uint32_t>(l);
      put_pair(*x, d, l, p);
    }
  }
  auto pads_zero = [&](const Bytes& x, const char* what) {
    for (std::size_t l = 0; l < n; ++l) EXPECT_EQ(get_pair(x, d, l).pad, 0u) << what << l;
  };
  for (ReduceOp op : kLocOps) {
    SCOPED_TRACE(name(op));
    Bytes acc = buffer(d, n, 0xFF);
    t().load_fn(d, op)(acc.data(), a.data(), n);
    pads_zero(acc, "load, pair ");
    t().accumulate_fn(d, op)(acc.data(), b.data(), n);
    pads_zero(acc, "accumulate, pair ");
    const void* ptrs[] = {a.data(), b.data()};
    for (std::size_t k = 1; k <= 2; ++k) {
      Bytes r = buffer(d, n, 0xFF);
      t().reduce_fn(d, op)(r.data(), ptrs, k, n);
      pads_zero(r, "reduce, pair ");
    }
    Bytes out = buffer(d, n, 0xFF);
    t().emit_fn(d)(out.data(), a.data(), n);  // an "accumulator" with garbage padding
    pads_zero(out, "emit, pair ");
    // The values and indices themselves come through.
    for (std::size_t l = 0; l < n; ++l) {
      const Pair in = get_pair(a, d, l), got = get_pair(out, d, l);
      EXPECT_EQ(got.i, in.i);
      EXPECT_EQ(got.v, is_nan(d, in.v) ? kCanonicalNanF64 : in.v);
    }
  }
}

// The table has MINLOC/MAXLOC for the pair types and nothing else; the pair types have nothing
// but MINLOC/MAXLOC.
TEST_P(PairProperty, OnlyLocOperationsOnPairs) {
  for (DType d : kAllDTypes) {
    for (ReduceOp op : kAllReduceOps) {
      if (!is_pair(d) && !is_loc(op)) continue;  // other pairs: not this test's business
      const bool want = is_pair(d) && is_loc(op);
      EXPECT_EQ(t().accumulate_fn(d, op) != nullptr, want) << name(d) << " " << name(op);
      EXPECT_EQ(t().reduce_fn(d, op) != nullptr, want) << name(d) << " " << name(op);
      EXPECT_EQ(t().load_fn(d, op) != nullptr, want) << name(d) << " " << name(op);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, PairProperty, ::testing::ValuesIn(supported_isas()),
                         [](const auto& i) { return std::string(name(i.param)); });

}  // namespace
}  // namespace treeduce::agg
