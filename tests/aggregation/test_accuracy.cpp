// Accuracy of an in-switch sum and product against an exact reference, with the bounds of
// docs/numerics.md:
//   SUM:  |r - s| <= gamma(k-1) * S * (1 + u_w) + u_w * |s| + eta_w / 2
//   PROD: |r - p| <= gamma(k-1) * |p| * (1 + u_w) + u_w * |p| + eta_w / 2
// where s is the exact sum, S the sum of magnitudes, p the exact product, gamma(m) = m*u/(1 - m*u)
// with u the accumulator's unit roundoff (2^-24 for binary32, 2^-53 for f64's binary64), u_w the
// unit roundoff of the final rounding to the wire type (0 for f32 and f64, which have none) and
// eta_w the wire type's smallest subnormal (the absolute error floor of that rounding).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "scalar_ops.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

struct WireType {
  DType d;
  int precision;   // significand bits including the implicit one
  double max;      // largest finite value
  double min_sub;  // smallest subnormal
  int acc_precision() const { return d == DType::f64 ? 53 : 24; }
  // The unit roundoff of the one final rounding: none for f32 and f64, whose accumulator is
  // already the wire type.
  double final_u() const {
    return d == DType::f32 || d == DType::f64 ? 0.0 : std::ldexp(1.0, -precision);
  }
};
constexpr WireType kTypes[] = {
    {DType::f32, 24, 3.4028234663852886e38, 0x1p-149},
    {DType::f16, 11, 65504.0, 0x1p-24},
    {DType::bf16, 8, 3.3895313892515355e38, 0x1p-133},
    {DType::e4m3, 4, 448.0, 0x1p-9},
    {DType::e5m2, 3, 57344.0, 0x1p-16},
    {DType::f64, 53, 1.7976931348623157e308, 0x1p-1074},
};

template <DType D>
double widen_at(const std::vector<unsigned char>& p, std::size_t i) {
  return static_cast<double>(scalar::widen<D>(p.data(), i));
}

double widen_any(DType d, const std::vector<unsigned char>& p, std::size_t i) {
  switch (d) {
    case DType::f32:
      return widen_at<DType::f32>(p, i);
    case DType::f16:
      return widen_at<DType::f16>(p, i);
    case DType::bf16:
      return widen_at<DType::bf16>(p, i);
    case DType::e4m3:
      return widen_at<DType::e4m3>(p, i);
    case DType::e5m2:
      return widen_at<DType::e5m2>(p, i);
    default:
      return widen_at<DType::f64>(p, i);
  }
}

// Wire payload of the values v, rounded to the wire type once by the reference path.
std::vector<unsigned char> payload_of(DType d, const std::vector<double>& v) {
  std::vector<unsigned char> out(v.size() * dtype_size(d));
  const KernelTable& t = *kernels_for(Isa::scalar);
  if (d == DType::f64) {
    std::memcpy(out.data(), v.data(), out.size());
  } else {
    std::vector<float> f(v.begin(), v.end());
    t.emit_fn(d)(out.data(), f.data(), f.size());
  }
  return out;
}

// Folds the k payloads with `op` on the active path (reduce), checks that load + accumulate in the
// same order gives the same accumulator bits, and returns the emitted payload.
std::vector<unsigned char> fold(DType d, ReduceOp op,
                                const std::vector<std::vector<unsigned char>>& in, std::size_t n) {
  const KernelTable& t = kernels();
  std::vector<const void*> ptrs;
  for (auto& p : in) ptrs.push_back(p.data());
  std::vector<unsigned char> acc(n * acc_size(d)), seq(n * acc_size(d)), out(n * dtype_size(d));
  t.reduce_fn(d, op)(acc.data(), ptrs.data(), in.size(), n);
  t.emit_fn(d)(out.data(), acc.data(), n);
  t.load_fn(d, op)(seq.data(), in[0].data(), n);
  for (std::size_t j = 1; j < in.size(); ++j) t.accumulate_fn(d, op)(seq.data(), in[j].data(), n);
  EXPECT_EQ(std::memcmp(seq.data(), acc.data(), acc.size()), 0) << "reduce vs load+accumulate";
  return out;
}

TEST(Accuracy, SumWithinBoundForFanIn2To256) {
  constexpr std::size_t kN = 2048;
  std::printf("%-5s %5s %14s %14s\n", "dtype", "k", "max|err|/bound", "max rel err");
  for (const WireType& w : kTypes) {
    const double u = std::ldexp(1.0, -w.acc_precision()), uw = w.final_u();
    for (std::size_t k : {2, 3, 4, 8, 16, 32, 64, 128, 256}) {
      SCOPED_TRACE(::testing::Message() << name(w.d) << " k=" << k);
      std::mt19937_64 rng(k * 131 + static_cast<unsigned>(w.d));
      // Magnitudes spread over several binades, scaled so that no sum overflows the wire type.
      // f64 inputs keep 40 significant bits, so that the long double reference (64 bits) is exact.
      std::uniform_real_distribution<double> mant(-1.0, 1.0);
      std::uniform_int_distribution<int> exp(-8, 0);
      const double scale = std::min(1e4, w.max / (2.0 * static_cast<double>(k)));
      std::vector<std::vector<unsigned char>> in;
      for (std::size_t j = 0; j < k; ++j) {
        std::vector<double> v(kN);
        for (double& x : v) {
          x = mant(rng);
          if (w.d == DType::f64) x = std::ldexp(std::round(std::ldexp(x, 40)), -40);
          x *= std::ldexp(scale, exp(rng));
        }
        in.push_back(payload_of(w.d, v));
      }
      const std::vector<unsigned char> out = fold(w.d, ReduceOp::sum, in, kN);

      double worst = 0, worst_rel = 0;
      const double mu = static_cast<double>(k - 1) * u;
      const double gamma = mu / (1 - mu);
      for (std::size_t i = 0; i < kN; ++i) {
        long double s = 0, mag = 0;
        for (std::size_t j = 0; j < k; ++j) {
          const long double x = widen_any(w.d, in[j], i);
          s += x;
          mag += std::fabs(x);
        }
        const double r = widen_any(w.d, out, i);
        const double err = std::fabs(static_cast<double>(static_cast<long double>(r) - s));
        const double bound = gamma * static_cast<double>(mag) * (1 + uw) +
                             uw * std::fabs(static_cast<double>(s)) + w.min_sub / 2;
        ASSERT_LE(err, bound) << "element " << i << " exact " << static_cast<double>(s) << " got "
                              << r;
        worst = std::max(worst, err / bound);
        if (s != 0) worst_rel = std::max(worst_rel, err / std::fabs(static_cast<double>(s)));
      }
      std::printf("%-5s %5zu %14.3f %14.3g\n", name(w.d).data(), k, worst, worst_rel);
    }
  }
}

// PROD of k factors near 1 (magnitudes 7/8 to 9/8, random signs): no intermediate product leaves
// the normal range of the accumulator, so every multiplication errs by at most u relative, and
//   |r - p| <= gamma(k-1) * |p| * (1 + u_w) + u_w * |p| + eta_w / 2.
TEST(Accuracy, ProdWithinBoundForFanIn2To32) {
  constexpr std::size_t kN = 2048;
  std::printf("%-5s %5s %14s %14s\n", "dtype", "k", "max|err|/bound", "max rel err");
  for (const WireType& w : kTypes) {
    const double u = std::ldexp(1.0, -w.acc_precision()), uw = w.final_u();
    for (std::size_t k : {2, 3, 4, 8, 16, 32}) {
      SCOPED_TRACE(::testing::Message() << name(w.d) << " k=" << k);
      std::mt19937_64 rng(k * 977 + static_cast<unsigned>(w.d));
      std::uniform_real_distribution<double> mag(0.875, 1.125);
      std::vector<std::vector<unsigned char>> in;
      for (std::size_t j = 0; j < k; ++j) {
        std::vector<double> v(kN);
        for (double& x : v) x = (rng() & 1 ? -1 : 1) * mag(rng);
        in.push_back(payload_of(w.d, v));
      }
      const std::vector<unsigned char> out = fold(w.d, ReduceOp::prod, in, kN);
      double worst = 0, worst_rel = 0;
      const double mu = static_cast<double>(k - 1) * u;
      const double gamma = mu / (1 - mu);
      for (std::size_t i = 0; i < kN; ++i) {
        // The reference in long double: its rounding (k * 2^-64 relative) is far below the bound.
        long double p = 1;
        for (std::size_t j = 0; j < k; ++j) p *= widen_any(w.d, in[j], i);
        const double r = widen_any(w.d, out, i);
        const double err = std::fabs(static_cast<double>(static_cast<long double>(r) - p));
        const double ap = std::fabs(static_cast<double>(p));
        const double bound = gamma * ap * (1 + uw) + uw * ap + w.min_sub / 2;
        ASSERT_LE(err, bound) << "element " << i << " exact " << static_cast<double>(p) << " got "
                              << r;
        worst = std::max(worst, err / bound);
        if (p != 0) worst_rel = std::max(worst_rel, err / ap);
      }
      std::printf("%-5s %5zu %14.3f %14.3g\n", name(w.d).data(), k, worst, worst_rel);
    }
  }
}

TEST(Accuracy, MinMaxAreExact) {
  constexpr std::size_t kN = 1000, kK = 64;
  std::mt19937_64 rng(5);
  std::normal_distribution<double> dist(0.0, 100.0);
  for (const WireType& w : kTypes) {
    std::vector<std::vector<unsigned char>> in;
    for (std::size_t j = 0; j < kK; ++j) {
      std::vector<double> v(kN);
      for (double& x : v) x = dist(rng);
      in.push_back(payload_of(w.d, v));
    }
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      const std::vector<unsigned char> out = fold(w.d, op, in, kN);
      for (std::size_t i = 0; i < kN; ++i) {
        double want = widen_any(w.d, in[0], i);
        for (std::size_t j = 1; j < kK; ++j) {
          const double x = widen_any(w.d, in[j], i);
          want = op == ReduceOp::min ? std::min(want, x) : std::max(want, x);
        }
        ASSERT_EQ(widen_any(w.d, out, i), want) << name(w.d) << " " << name(op) << " " << i;
      }
    }
  }
}

TEST(Accuracy, Int32SumIsExactModulo2To32) {
  constexpr std::size_t kN = 777, kK = 256;
  std::mt19937 rng(3);
  std::vector<std::vector<std::int32_t>> in(kK, std::vector<std::int32_t>(kN));
  std::vector<const void*> ptrs;
  for (auto& v : in) {
    for (auto& x : v) x = static_cast<std::int32_t>(rng());
    ptrs.push_back(v.data());
  }
  std::vector<std::int32_t> acc(kN);
  kernels().reduce_fn(DType::i32, ReduceOp::sum)(acc.data(), ptrs.data(), kK, kN);
  for (std::size_t i = 0; i < kN; ++i) {
    std::int64_t s = 0;
    for (auto& v : in) s += v[i];
    ASSERT_EQ(acc[i], static_cast<std::int32_t>(static_cast<std::uint32_t>(s)));
  }
}

}  // namespace
}  // namespace treeduce::agg
