// FP8 widening on every path, with the AVX-512 VBMI table widening (fp8_vbmi_avx512.inl) both on
// and off, so that both codes are checked on a machine that has VBMI: every E4M3 and E5M2
// encoding at every position of a vector and every tail length, through load, accumulate and
// reduce, against the scalar reference bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fp8_vbmi.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg {
namespace {

struct Mode {
  Isa isa;
  bool vbmi;
};

std::vector<Mode> modes() {
  std::vector<Mode> out;
  for (Isa isa : supported_isas()) {
    out.push_back({isa, false});
    if ((isa == Isa::avx512 || isa == Isa::avx512_bf16) && detail::cpu_has_avx512_vbmi()) {
      out.push_back({isa, true});
    }
  }
  return out;
}

class Fp8Widen : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override { ASSERT_EQ(detail::set_fp8_vbmi(GetParam().vbmi), GetParam().vbmi); }
  void TearDown() override { detail::set_fp8_vbmi(true); }
  const KernelTable& t() const { return *kernels_for(GetParam().isa); }
};

// Lanes equal, NaN payloads aside when `nan_equal` (a sum's NaN payload is unspecified).
::testing::AssertionResult same_lanes(const std::vector<std::uint32_t>& want,
                                      const std::vector<std::uint32_t>& got, bool nan_equal) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool both_nan =
        std::isnan(std::bit_cast<float>(want[i])) && std::isnan(std::bit_cast<float>(got[i]));
    if (want[i] != got[i] && !(nan_equal && both_nan)) {
      return ::testing::AssertionFailure()
             << "lane " << i << ": scalar 0x" << std::hex << want[i] << ", path 0x" << got[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Payload j of length n: every encoding, starting at a different one per (j, n), so each
// encoding meets every lane of a vector across lengths.
std::vector<std::uint8_t> encodings(std::size_t n, std::size_t start) {
  std::vector<std::uint8_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(start + i * 7);
  return p;
}

TEST_P(Fp8Widen, EveryEncodingEveryLaneEveryLength) {
  const KernelTable& ref = *kernels_for(Isa::scalar);
  for (DType d : {DType::e4m3, DType::e5m2}) {
    for (std::size_t n = 0; n <= 300; ++n) {
      SCOPED_TRACE(::testing::Message() << name(d) << " n=" << n);
      std::vector<std::vector<std::uint8_t>> in;
      std::vector<const void*> ptrs;
      for (std::size_t j = 0; j < 3; ++j) in.push_back(encodings(n, n * 3 + j * 101));
      for (const auto& p : in) ptrs.push_back(p.data());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::min, ReduceOp::max}) {
        SCOPED_TRACE(name(op));
        // One canary lane past the end.
        std::vector<std::uint32_t> r(n + 1, 0xDEADBEEF), s(n + 1, 0xDEADBEEF);
        ref.load_fn(d, op)(r.data(), in[0].data(), n);
        t().load_fn(d, op)(s.data(), in[0].data(), n);
        ASSERT_TRUE(same_lanes(r, s, false)) << "load";
        for (std::size_t j = 1; j < in.size(); ++j) {
          ref.accumulate_fn(d, op)(r.data(), in[j].data(), n);
          t().accumulate_fn(d, op)(s.data(), in[j].data(), n);
          ASSERT_TRUE(same_lanes(r, s, op == ReduceOp::sum)) << "accumulate " << j;
        }
        for (std::size_t k = 1; k <= in.size(); ++k) {
          std::vector<std::uint32_t> rk(n + 1, 0xDEADBEEF), sk(n + 1, 0xDEADBEEF);
          ref.reduce_fn(d, op)(rk.data(), ptrs.data(), k, n);
          t().reduce_fn(d, op)(sk.data(), ptrs.data(), k, n);
          ASSERT_TRUE(same_lanes(rk, sk, op == ReduceOp::sum && k > 1)) << "reduce k=" << k;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Fp8Widen, ::testing::ValuesIn(modes()), [](const auto& i) {
  return std::string(name(i.param.isa)) + (i.param.vbmi ? "_vbmi" : "");
});

}  // namespace
}  // namespace treeduce::agg
