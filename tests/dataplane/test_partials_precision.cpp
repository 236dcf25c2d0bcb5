// Measurement behind a design decision (docs/switch-core.md, "Partials in the wire type"): the
// error of partial sums travelling up the tree in the wire type (what the core does) versus in
// FP32 (narrowed once at the root), against an FP64 reference. Prints a table and checks that
// each stays within its documented bound:
//   FP32 partials:   |err| <= u_w |s| + (n - 1) u_32 sum|x|
//   wire partials:   |err| <= u_w |s| + (d - 1) u_w (1 + u_w) sum|x| + (n - 1) u_32 sum|x|
// with u_w the unit roundoff of the wire type, n hosts, d levels of switches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce {
namespace {

double unit_roundoff(DType d) {
  switch (d) {
    case DType::f16:
      return std::ldexp(1.0, -11);
    case DType::bf16:
      return std::ldexp(1.0, -8);
    case DType::e4m3:
      return std::ldexp(1.0, -4);
    case DType::e5m2:
      return std::ldexp(1.0, -3);
    default:
      return std::ldexp(1.0, -24);
  }
}

struct Stats {
  double max_rel = 0;  // max |err| / sum|x|
  double mean_rel = 0;
  double not_rounded = 0;  // fraction of elements != the correctly rounded FP64 sum
  bool within_bound = true;
};

// fanins: per level, root first. Leaves are hosts.
void measure(DType d, const std::vector<int>& fanins, std::size_t elems, Stats* wire, Stats* fp32) {
  const agg::KernelTable* k = agg::kernels_for(agg::Isa::scalar);
  const std::size_t es = dtype_size(d);
  std::size_t hosts = 1;
  for (int f : fanins) hosts *= static_cast<std::size_t>(f);
  std::mt19937_64 rng(12345);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<std::vector<std::uint8_t>> in(hosts, std::vector<std::uint8_t>(elems * es));
  std::vector<float> tmp(elems);
  for (auto& h : in) {
    for (auto& x : tmp) x = nd(rng);
    // Round the host's FP32 values into the wire type: the inputs are wire values.
    k->emit_fn(d)(h.data(), tmp.data(), elems);
  }
  // Wire partials: reduce groups of the last fan-in, narrow, repeat up the levels.
  std::vector<std::vector<std::uint8_t>> level = in;
  std::vector<float> acc(elems);
  for (std::size_t l = fanins.size(); l-- > 0;) {
    const auto f = static_cast<std::size_t>(fanins[l]);
    std::vector<std::vector<std::uint8_t>> up(level.size() / f,
                                              std::vector<std::uint8_t>(elems * es));
    for (std::size_t g = 0; g < up.size(); ++g) {
      std::vector<const void*> p;
      for (std::size_t i = 0; i < f; ++i) p.push_back(level[g * f + i].data());
      k->reduce_fn(d, ReduceOp::sum)(acc.data(), p.data(), f, elems);
      k->emit_fn(d)(up[g].data(), acc.data(), elems);
    }
    level = std::move(up);
  }
  // FP32 partials: the same grouping, accumulators stay FP32 until the root narrows once.
  std::vector<std::vector<float>> lv(hosts, std::vector<float>(elems));
  for (std::size_t h = 0; h < hosts; ++h)
    k->load_fn(d, ReduceOp::sum)(lv[h].data(), in[h].data(), elems);
  for (std::size_t l = fanins.size(); l-- > 0;) {
    const auto f = static_cast<std::size_t>(fanins[l]);
    std::vector<std::vector<float>> up(lv.size() / f, std::vector<float>(elems));
    for (std::size_t g = 0; g < up.size(); ++g) {
      std::vector<const void*> p;
      for (std::size_t i = 0; i < f; ++i) p.push_back(lv[g * f + i].data());
      k->reduce_fn(DType::f32, ReduceOp::sum)(up[g].data(), p.data(), f, elems);
    }
    lv = std::move(up);
  }
  std::vector<std::uint8_t> fp32_out(elems * es);
  k->emit_fn(d)(fp32_out.data(), lv[0].data(), elems);

  const double uw = unit_roundoff(d), u32 = std::ldexp(1.0, -24);
  const double n = static_cast<double>(hosts), depth = static_cast<double>(fanins.size());
  std::vector<float> wv(elems), fv(elems), one(1);
  k->load_fn(d, ReduceOp::sum)(wv.data(), level[0].data(), elems);
  k->load_fn(d, ReduceOp::sum)(fv.data(), fp32_out.data(), elems);
  std::vector<std::uint8_t> rounded(es);
  std::vector<float> rv(1);
  for (std::size_t e = 0; e < elems; ++e) {
    double s = 0, sa = 0;
    for (std::size_t h = 0; h < hosts; ++h) {
      float x;
      k->load_fn(d, ReduceOp::sum)(&x, in[h].data() + e * es, 1);
      s += x;
      sa += std::fabs(x);
    }
    one[0] = static_cast<float>(s);  // FP64 -> FP32 -> wire: double rounding is harmless here
    k->emit_fn(d)(rounded.data(), one.data(), 1);
    k->load_fn(d, ReduceOp::sum)(rv.data(), rounded.data(), 1);
    const auto account = [&](Stats* st, float got, double bound) {
      const double err = std::fabs(got - s);
      const double rel = sa == 0 ? 0 : err / sa;
      st->max_rel = std::max(st->max_rel, rel);
      st->mean_rel += rel / static_cast<double>(elems);
      if (got != rv[0]) st->not_rounded += 1.0 / static_cast<double>(elems);
      if (err > bound * 1.0000001 + 1e-30) st->within_bound = false;
    };
    account(fp32, fv[e], uw * std::fabs(s) + (n - 1) * u32 * sa);
    account(wire, wv[e], uw * std::fabs(s) + (depth - 1) * uw * (1 + uw) * sa + (n - 1) * u32 * sa);
  }
}

TEST(PartialsPrecision, WireTypeVersusFp32) {
  std::printf("%-5s %-8s | %-28s | %-28s\n", "dtype", "tree", "wire partials max/mean rel, !RN",
              "FP32 partials max/mean rel, !RN");
  for (DType d : {DType::f16, DType::bf16, DType::e4m3, DType::e5m2}) {
    for (const std::vector<int>& shape :
         {std::vector<int>{64}, std::vector<int>{8, 8}, std::vector<int>{4, 4, 4}}) {
      Stats w, f;
      measure(d, shape, 4096, &w, &f);
      std::string s;
      for (int x : shape) s += std::to_string(x) + "x";
      s.pop_back();
      std::printf("%-5s %-8s | %.2e %.2e %5.1f%% | %.2e %.2e %5.1f%%\n",
                  std::string(name(d)).c_str(), s.c_str(), w.max_rel, w.mean_rel,
                  100 * w.not_rounded, f.max_rel, f.mean_rel, 100 * f.not_rounded);
      EXPECT_TRUE(w.within_bound) << name(d) << " " << s;
      EXPECT_TRUE(f.within_bound) << name(d) << " " << s;
      if (shape.size() == 1) {
        // One switch: both are the same computation.
        EXPECT_EQ(w.max_rel, f.max_rel);
      }
    }
  }
}

}  // namespace
}  // namespace treeduce
