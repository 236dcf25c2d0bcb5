// Builds a KernelTable from an ISA's implementation. Internal to aggregation/.
//
// An Impl provides, for every DType D and ReduceOp O with op_defined(D, O), static functions
//   template <DType D, ReduceOp O> load(void*, const void*, size_t)
//   template <DType D, ReduceOp O> accumulate(void*, const void*, size_t)
//   template <DType D, ReduceOp O> reduce(void*, const void* const*, size_t, size_t)
//   template <DType D> emit(void*, const void*, size_t)
// Each ISA's Impl lives in its own translation unit inside an unnamed namespace, so code compiled
// for one ISA can never be picked by the linker for another (the multi-target ODR trap).
#pragma once

#include <utility>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::agg::detail {

template <class Impl, std::size_t... Ds, std::size_t... Os>
constexpr KernelTable make_table(Isa isa, std::index_sequence<Ds...>, std::index_sequence<Os...>) {
  KernelTable t{};
  t.isa = isa;
  ((t.emit[Ds] = &Impl::template emit<static_cast<DType>(Ds)>), ...);
  auto fill_op = [&t]<std::size_t D, std::size_t O>(std::integral_constant<std::size_t, D>,
                                                    std::integral_constant<std::size_t, O>) {
    constexpr auto d = static_cast<DType>(D);
    constexpr auto o = static_cast<ReduceOp>(O);
    if constexpr (op_defined(d, o)) {
      t.load[D][O] = &Impl::template load<d, o>;
      t.accumulate[D][O] = &Impl::template accumulate<d, o>;
      t.reduce[D][O] = &Impl::template reduce<d, o>;
    }
  };
  auto fill_ops = [&]<std::size_t D>(std::integral_constant<std::size_t, D> d) {
    (fill_op(d, std::integral_constant<std::size_t, Os>{}), ...);
  };
  (fill_ops(std::integral_constant<std::size_t, Ds>{}), ...);
  return t;
}

template <class Impl>
constexpr KernelTable make_table(Isa isa) {
  return make_table<Impl>(isa, std::make_index_sequence<kNumDTypes>{},
                          std::make_index_sequence<kNumReduceOps>{});
}

// One accessor per ISA translation unit; nullptr-free: only declared for the paths this build has.
const KernelTable& scalar_table() noexcept;
#if TREEDUCE_HAVE_X86_SIMD
const KernelTable& avx2_table() noexcept;
#endif
#if TREEDUCE_HAVE_AVX512
const KernelTable& avx512_table() noexcept;
const KernelTable& avx512_bf16_table() noexcept;
#endif

}  // namespace treeduce::agg::detail
