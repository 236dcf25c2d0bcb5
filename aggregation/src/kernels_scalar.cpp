// The portable path: the scalar reference itself.
#include "scalar_ops.h"
#include "table.h"

namespace treeduce::agg::detail {
namespace {

struct ScalarImpl {
  template <DType D, ReduceOp O>
  static void load(void* acc, const void* payload, std::size_t n) {
    scalar::load<D, O>(acc, payload, 0, n);
  }
  template <DType D, ReduceOp O>
  static void accumulate(void* acc, const void* payload, std::size_t n) {
    scalar::accumulate<D, O>(acc, payload, 0, n);
  }
  template <DType D, ReduceOp O>
  static void reduce(void* acc, const void* const* payloads, std::size_t k, std::size_t n) {
    scalar::reduce<D, O>(acc, payloads, k, 0, n);
  }
  template <DType D>
  static void emit(void* payload, const void* acc, std::size_t n) {
    scalar::emit<D>(payload, acc, 0, n);
  }
};

constexpr KernelTable kTable = make_table<ScalarImpl>(Isa::scalar);

}  // namespace

const KernelTable& scalar_table() noexcept { return kTable; }

}  // namespace treeduce::agg::detail
