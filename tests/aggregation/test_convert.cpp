// The scalar conversions against independent oracles, exhaustively over every encoding, and every
// SIMD path's widening of every encoding.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

struct Codec {
  DType dtype;
  MinifloatFormat fmt;
  int bits;  // 8 or 16
  float (*widen)(std::uint32_t);
  std::uint32_t (*narrow)(float);
};

template <MinifloatFormat F>
float widen_t(std::uint32_t b) {
  return F.exp_bits == 8 ? bf16_to_f32(static_cast<std::uint16_t>(b)) : widen_minifloat<F>(b);
}
template <MinifloatFormat F>
std::uint32_t narrow_t(float x) {
  return narrow_minifloat<F>(x);
}

const Codec kCodecs[] = {
    {DType::f16, kFormatF16, 16, widen_t<kFormatF16>, narrow_t<kFormatF16>},
    {DType::bf16, kFormatBF16, 16, widen_t<kFormatBF16>, narrow_t<kFormatBF16>},
    {DType::e4m3, kFormatE4M3, 8, widen_t<kFormatE4M3>, narrow_t<kFormatE4M3>},
    {DType::e5m2, kFormatE5M2, 8, widen_t<kFormatE5M2>, narrow_t<kFormatE5M2>},
};

// Value of an encoding computed from the format definition in double, independently of convert.h.
// NaN for NaN encodings.
double oracle_value(const MinifloatFormat& f, std::uint32_t b) {
  const int man_bits = f.man_bits, exp_bits = f.exp_bits;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = (b >> (exp_bits + man_bits)) & 1;
  const int e = static_cast<int>((b >> man_bits) & ((1u << exp_bits) - 1));
  const double m = static_cast<double>(b & ((1u << man_bits) - 1)) / std::pow(2.0, man_bits);
  double v;
  if (f.ieee && e == (1 << exp_bits) - 1) {
    v = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee && e == (1 << exp_bits) - 1 && m == 1.0 - std::pow(2.0, -man_bits)) {
    v = NAN;
  } else if (e == 0) {
    v = m * std::pow(2.0, 1 - bias);
  } else {
    v = (1 + m) * std::pow(2.0, e - bias);
  }
  return neg ? -v : v;
}

// Round-to-nearest-even by brute force over the sorted non-negative encodings.
class NarrowOracle {
 public:
  explicit NarrowOracle(const MinifloatFormat& f) : f_(f) {
    const std::uint32_t sign = 1u << (f.exp_bits + f.man_bits);
    for (std::uint32_t b = 0; b < sign; ++b) {
      const double v = oracle_value(f, b);
      if (std::isnan(v)) continue;
      grid_.push_back({v, b});
    }
    std::sort(grid_.begin(), grid_.end());
    sign_ = sign;
  }
  std::uint32_t operator()(float x) const {
    if (std::isnan(x)) return canonical_nan();
    const std::uint32_t s = std::signbit(x) ? sign_ : 0;
    const double a = std::fabs(static_cast<double>(x));
    const auto& top = grid_.back();  // +inf for IEEE formats, max finite otherwise
    if (!f_.ieee && a >= top.first) return s | top.second;  // saturation (E4M3)
    if (std::isinf(a)) return s | top.second;
    // Infinity competes as the next grid value after the largest finite one (IEEE overflow).
    const double inf_value = std::ldexp(1.0, (1 << (f_.exp_bits - 1)));  // 2^(emax+1)
    auto hi = std::lower_bound(grid_.begin(), grid_.end(), std::pair<double, std::uint32_t>{a, 0});
    if (hi != grid_.end() && hi->first == a) return s | hi->second;
    auto lo = hi - 1;
    double hv = hi == grid_.end() ? inf_value : hi->first;
    if (f_.ieee && hi != grid_.end() && std::isinf(hi->first)) hv = inf_value;
    if (hi == grid_.end()) return s | top.second;
    const double dl = a - lo->first, dh = hv - a;
    if (dl < dh) return s | lo->second;
    if (dh < dl) return s | hi->second;
    return s | ((lo->second & 1) == 0 ? lo->second : hi->second);
  }
  std::uint32_t canonical_nan() const {
    return f_.ieee ? ((1u << f_.exp_bits) - 1) << f_.man_bits | (1u << (f_.man_bits - 1))
                   : sign_ - 1;
  }
  const std::vector<std::pair<double, std::uint32_t>>& grid() const { return grid_; }

 private:
  MinifloatFormat f_;
  std::uint32_t sign_;
  std::vector<std::pair<double, std::uint32_t>> grid_;
};

TEST(Widen, EveryEncodingMatchesTheFormatDefinition) {
  for (const Codec& c : kCodecs) {
    SCOPED_TRACE(name(c.dtype));
    for (std::uint32_t b = 0; b < (1u << c.bits); ++b) {
      const double want = oracle_value(c.fmt, b);
      const float got = c.widen(b);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << b;
        ASSERT_EQ(std::signbit(got), ((b >> (c.bits - 1)) & 1) != 0) << std::hex << b;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << std::hex << b;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << b;
      }
    }
  }
}

// The compiler's own _Float16 as a second oracle where it has one (GCC 12, clang >= 15 on
// x86-64; clang 14 lacks it): the exhaustive and oracle tests above cover every compiler.
#ifdef __FLT16_MANT_DIG__
TEST(Widen, F16MatchesCompilerFloat16) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const float want = static_cast<float>(std::bit_cast<_Float16>(static_cast<std::uint16_t>(b)));
    const float got = f16_to_f32(static_cast<std::uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
    } else {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << b;
    }
  }
}
#endif

TEST(Widen, OcpAnchorValues) {
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // exponent 1111 is a normal binade in E4M3
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_f32(0xFC), -INFINITY);
  EXPECT_EQ(e5m2_to_f32(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_f32(0x04), 0x1p-14f);
  EXPECT_EQ(e5m2_to_f32(0x01), 0x1p-16f);
  for (std::uint8_t b : {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF})
    EXPECT_TRUE(std::isnan(e5m2_to_f32(b)));
}

// Every value, every midpoint between neighbours and the floats either side of it, negated too.
std::vector<float> boundary_inputs(const NarrowOracle& o) {
  std::vector<float> xs;
  const auto& g = o.grid();
  for (std::size_t i = 0; i + 1 < g.size(); ++i) {
    const double lo = g[i].first;
    if (std::isinf(lo)) break;
    double hi = g[i + 1].first;
    if (std::isinf(hi)) hi = 2 * lo - g[i - 1].first;  // the grid step continued (inf boundary)
    const auto mid = static_cast<float>((lo + hi) / 2);
    for (float x :
         {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      xs.push_back(x);
      xs.push_back(-x);
    }
  }
  for (float x :
       {INFINITY, -INFINITY, FLT_MAX, -FLT_MAX, 1e30f, 0x1p-149f, -0x1p-149f, 0.0f, -0.0f})
    xs.push_back(x);
  return xs;
}

TEST(Narrow, EveryRoundingBoundaryMatchesBruteForce) {
  for (const Codec& c : kCodecs) {
    SCOPED_TRACE(name(c.dtype));
    const NarrowOracle oracle(c.fmt);
    for (float x : boundary_inputs(oracle)) {
      ASSERT_EQ(c.narrow(x), oracle(x)) << std::hexfloat << x;
    }
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; ++i) {
      const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
      ASSERT_EQ(c.narrow(x), oracle(x)) << std::hexfloat << x;
    }
  }
}

TEST(Narrow, RoundTripOfEveryEncoding) {
  for (const Codec& c : kCodecs) {
    SCOPED_TRACE(name(c.dtype));
    const NarrowOracle oracle(c.fmt);
    for (std::uint32_t b = 0; b < (1u << c.bits); ++b) {
      const float v = c.widen(b);
      ASSERT_EQ(c.narrow(v), std::isnan(v) ? oracle.canonical_nan() : b) << std::hex << b;
    }
  }
}

#ifdef __FLT16_MANT_DIG__
TEST(Narrow, F16MatchesCompilerFloat16) {
  std::mt19937 rng(11);
  const NarrowOracle oracle(kFormatF16);
  std::vector<float> xs = boundary_inputs(oracle);
  for (int i = 0; i < 200000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng())));
  for (float x : xs) {
    const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    const std::uint16_t got = f32_to_f16(x);
    if (std::isnan(x)) {
      ASSERT_EQ(got, kCanonicalNanF16);
    } else {
      ASSERT_EQ(got, want) << std::hexfloat << x;
    }
  }
}
#endif

TEST(Narrow, DocumentedExamples) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);  // tie: to even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // tie above max: rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);  // tie between 0 and the smallest subnormal
  EXPECT_EQ(f32_to_f16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x00010000u)), 0x0001);  // subnormal kept
  EXPECT_EQ(f32_to_bf16(FLT_MAX), 0x7F80);
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), kCanonicalNanBF16);
  EXPECT_EQ(f32_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);  // saturates
  EXPECT_EQ(f32_to_e4m3(1e9f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e4m3(-NAN), kCanonicalNanE4M3);
  EXPECT_EQ(f32_to_e4m3(0x1p-10f), 0x00);  // tie between 0 and 2^-9
  EXPECT_EQ(f32_to_e4m3(3 * 0x1p-10f), 0x02);
  EXPECT_EQ(f32_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_e5m2(57344.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7C);  // tie above max: infinity
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(f32_to_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(f32_to_e5m2(3 * 0x1p-17f), 0x02);
  EXPECT_EQ(f32_to_e5m2(NAN), kCanonicalNanE5M2);
}

// Every SIMD path widens every encoding exactly like the scalar reference (NaN payloads included).
TEST(Widen, EveryPathEveryEncoding) {
  for (const Codec& c : kCodecs) {
    const std::size_t n = 1u << c.bits;
    std::vector<unsigned char> in(n * (c.bits / 8));
    for (std::size_t b = 0; b < n; ++b) std::memcpy(&in[b * (c.bits / 8)], &b, c.bits / 8);
    std::vector<std::uint32_t> want(n), got(n);
    kernels_for(Isa::scalar)->load_fn(c.dtype, ReduceOp::sum)(want.data(), in.data(), n);
    for (Isa isa : supported_isas()) {
      SCOPED_TRACE(::testing::Message() << name(c.dtype) << " " << name(isa));
      kernels_for(isa)->load_fn(c.dtype, ReduceOp::sum)(got.data(), in.data(), n);
      for (std::size_t b = 0; b < n; ++b) ASSERT_EQ(got[b], want[b]) << std::hex << b;
    }
  }
}

}  // namespace
}  // namespace treeduce::agg
