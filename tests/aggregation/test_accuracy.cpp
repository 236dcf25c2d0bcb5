// Accuracy of an in-switch sum against an exact reference, for fan-in 2 to 256, with the bound of
// docs/numerics.md:
//   |r - s| <= gamma(k-1) * S * (1 + u_w) + u_w * |s| + eta_w / 2
// where s is the exact sum, S the sum of magnitudes, gamma(m) = m*u/(1 - m*u) with u = 2^-24 (the
// binary32 accumulation, folded left), u_w the unit roundoff of the wire type and eta_w its
// smallest subnormal (the absolute error floor of the one final rounding).
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
};
constexpr WireType kTypes[] = {
    {DType::f32, 24, 3.4028234663852886e38, 0x1p-149},
    {DType::f16, 11, 65504.0, 0x1p-24},
    {DType::bf16, 8, 3.3895313892515355e38, 0x1p-133},
    {DType::e4m3, 4, 448.0, 0x1p-9},
    {DType::e5m2, 3, 57344.0, 0x1p-16},
};

template <DType D>
float widen_at(const std::vector<unsigned char>& p, std::size_t i) {
  return scalar::widen<D>(p.data(), i);
}

float widen_any(DType d, const std::vector<unsigned char>& p, std::size_t i) {
  switch (d) {
    case DType::f32:
      return widen_at<DType::f32>(p, i);
    case DType::f16:
      return widen_at<DType::f16>(p, i);
    case DType::bf16:
      return widen_at<DType::bf16>(p, i);
    case DType::e4m3:
      return widen_at<DType::e4m3>(p, i);
    default:
      return widen_at<DType::e5m2>(p, i);
  }
}

std::vector<unsigned char> payload_of(DType d, const std::vector<float>& v) {
  std::vector<unsigned char> out(v.size() * dtype_size(d));
  const KernelTable& t = *kernels_for(Isa::scalar);
  t.emit_fn(d)(out.data(), v.data(), v.size());
  return out;
}

TEST(Accuracy, SumWithinBoundForFanIn2To256) {
  constexpr std::size_t kN = 2048;
  const KernelTable& t = kernels();
  std::printf("%-5s %5s %14s %14s\n", "dtype", "k", "max|err|/bound", "max rel err");
  for (const WireType& w : kTypes) {
    const double u = std::ldexp(1.0, -24), uw = std::ldexp(1.0, -w.precision);
    for (std::size_t k : {2, 3, 4, 8, 16, 32, 64, 128, 256}) {
      SCOPED_TRACE(::testing::Message() << name(w.d) << " k=" << k);
      std::mt19937_64 rng(k * 131 + static_cast<unsigned>(w.d));
      // Magnitudes spread over several binades, scaled so that no sum overflows the wire type.
      std::uniform_real_distribution<double> mant(-1.0, 1.0);
      std::uniform_int_distribution<int> exp(-8, 0);
      const double scale = std::min(1e4, w.max / (2.0 * static_cast<double>(k)));
      std::vector<std::vector<unsigned char>> in;
      std::vector<const void*> ptrs;
      for (std::size_t j = 0; j < k; ++j) {
        std::vector<float> v(kN);
        for (float& x : v) x = static_cast<float>(mant(rng) * std::ldexp(scale, exp(rng)));
        in.push_back(payload_of(w.d, v));
      }
      for (auto& p : in) ptrs.push_back(p.data());
      std::vector<float> acc(kN);
      std::vector<unsigned char> out(kN * dtype_size(w.d));
      t.reduce_fn(w.d, ReduceOp::sum)(acc.data(), ptrs.data(), k, kN);
      t.emit_fn(w.d)(out.data(), acc.data(), kN);

      // The same sum by load + accumulate in the same order: identical bits (the fold is fixed).
      std::vector<float> seq(kN);
      t.load_fn(w.d, ReduceOp::sum)(seq.data(), in[0].data(), kN);
      for (std::size_t j = 1; j < k; ++j)
        t.accumulate_fn(w.d, ReduceOp::sum)(seq.data(), in[j].data(), kN);
      ASSERT_EQ(std::memcmp(seq.data(), acc.data(), kN * 4), 0);

      double worst = 0, worst_rel = 0;
      const double mu = static_cast<double>(k - 1) * u;
      const double gamma = mu / (1 - mu);
      for (std::size_t i = 0; i < kN; ++i) {
        long double s = 0, mag = 0, mn = INFINITY, mx = -INFINITY;
        for (std::size_t j = 0; j < k; ++j) {
          const long double x = widen_any(w.d, in[j], i);
          s += x;
          mag += std::fabs(x);
          mn = std::min(mn, x);
          mx = std::max(mx, x);
        }
        const double r = widen_any(w.d, out, i);
        const double err = std::fabs(static_cast<double>(static_cast<long double>(r) - s));
        const double bound = gamma * static_cast<double>(mag) * (1 + uw) +
                             uw * std::fabs(static_cast<double>(s)) + w.min_sub / 2;
        ASSERT_LE(err, bound) << "element " << i << " exact " << static_cast<double>(s) << " got "
                              << r;
        worst = std::max(worst, err / bound);
        if (s != 0) worst_rel = std::max(worst_rel, err / std::fabs(static_cast<double>(s)));
        (void)mn;
        (void)mx;
      }
      std::printf("%-5s %5zu %14.3f %14.3g\n", name(w.d).data(), k, worst, worst_rel);
    }
  }
}

TEST(Accuracy, MinMaxAreExact) {
  constexpr std::size_t kN = 1000, kK = 64;
  const KernelTable& t = kernels();
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  for (const WireType& w : kTypes) {
    std::vector<std::vector<unsigned char>> in;
    std::vector<const void*> ptrs;
    for (std::size_t j = 0; j < kK; ++j) {
      std::vector<float> v(kN);
      for (float& x : v) x = dist(rng);
      in.push_back(payload_of(w.d, v));
    }
    for (auto& p : in) ptrs.push_back(p.data());
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      std::vector<float> acc(kN);
      std::vector<unsigned char> out(kN * dtype_size(w.d));
      t.reduce_fn(w.d, op)(acc.data(), ptrs.data(), kK, kN);
      t.emit_fn(w.d)(out.data(), acc.data(), kN);
      for (std::size_t i = 0; i < kN; ++i) {
        float want = widen_any(w.d, in[0], i);
        for (std::size_t j = 1; j < kK; ++j) {
          const float x = widen_any(w.d, in[j], i);
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
