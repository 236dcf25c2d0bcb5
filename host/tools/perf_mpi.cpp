// treeduce-perf's MPI baseline: MPI_Allreduce on MPI_COMM_WORLD, with whatever algorithm the MPI
// library chooses for the size (Open MPI's tuned component: recursive doubling, ring, ...).
//
// Operations. Native ones where they give exactly the switch's results on every input:
// MPI_SUM on MPI_FLOAT for f32 sum (the exact inputs' partial sums are all representable, so any
// order gives the same bits), and MPI_SUM/MPI_MIN/MAX on MPI_INT32_T for i32 (sums wrap, as the
// switch's). Everything else is a commutative MPI_Op_create user op on the aggregation kernels:
// f32 min/max, because MPI_MIN/MAX are C comparisons that return either of -0 and +0 where IEEE
// minimum/maximum (the switch's) order -0 below +0, and every op on f16, bf16, e4m3 and e5m2,
// which MPI has no type for (they travel as MPI_UINT16_T or MPI_UINT8_T, 2 and 1 bytes each).
// The C API is all this needs; Open MPI's deprecated C++ bindings do not build with -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <array>
#include <limits>
#include <utility>
#include <vector>

#include "perf_baselines.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::perf {
namespace {

bool g_we_initialised = false;

// inout = in OP inout with the switch's numerics; D and O are template parameters because an MPI
// user function has no closure.
template <DType D, ReduceOp O>
void kernel_op(void* in, void* inout, int* len, MPI_Datatype*) {
  const agg::KernelTable& k = agg::kernels();
  const auto n = static_cast<std::size_t>(*len);
  if constexpr (dtype_size(D) == 4) {
    k.accumulate_fn(D, O)(inout, in, n);  // 32-bit lanes: the elements are the accumulator
  } else {
    thread_local std::vector<float> wide;  // MPI may call this from a progress thread
    if (wide.size() < n) wide.resize(n);
    k.load_fn(D, O)(wide.data(), inout, n);
    k.accumulate_fn(D, O)(wide.data(), in, n);
    k.emit_fn(D)(inout, wide.data(), n);
  }
}

// kKernelOps[d][o]: the user function of DType d and ReduceOp o (their wire values).
template <DType D, std::size_t... O>
constexpr std::array<MPI_User_function*, kNumReduceOps> ops_of(std::index_sequence<O...>) {
  return {&kernel_op<D, static_cast<ReduceOp>(O)>...};
}
template <std::size_t... D>
constexpr std::array<std::array<MPI_User_function*, kNumReduceOps>, kNumDTypes> table_of(
    std::index_sequence<D...>) {
  return {ops_of<static_cast<DType>(D)>(std::make_index_sequence<kNumReduceOps>())...};
}
constexpr auto kKernelOps = table_of(std::make_index_sequence<kNumDTypes>());

MPI_Op native_op(ReduceOp op) {
  return op == ReduceOp::sum ? MPI_SUM : op == ReduceOp::min ? MPI_MIN : MPI_MAX;
}

std::string mpi_error(int code) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, s, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(s, static_cast<std::size_t>(len));
}

class MpiBaseline final : public Baseline {
 public:
  MpiBaseline() {
    for (std::size_t d = 0; d < kNumDTypes; ++d)
      for (std::size_t o = 0; o < kNumReduceOps; ++o)
        MPI_Op_create(kKernelOps[d][o], /*commute=*/1, &user_[d][o]);
  }
  ~MpiBaseline() override {
    for (auto& row : user_)
      for (MPI_Op& op : row) MPI_Op_free(&op);
  }

  std::string_view name() const override { return "mpi"; }

  std::string allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                        ReduceOp op) override {
    MPI_Datatype type = dtype == DType::i32      ? MPI_INT32_T
                        : dtype == DType::f32    ? MPI_FLOAT
                        : dtype_size(dtype) == 2 ? MPI_UINT16_T
                                                 : MPI_UINT8_T;
    const bool native = dtype == DType::i32 || (dtype == DType::f32 && op == ReduceOp::sum);
    const MPI_Op mop = native
                           ? native_op(op)
                           : user_[static_cast<std::size_t>(dtype)][static_cast<std::size_t>(op)];
    if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      return "MPI_Allreduce counts elements in an int: " + std::to_string(count) +
             " elements are too many.";
    }
    const int rc = MPI_Allreduce(send, recv, static_cast<int>(count), type, mop, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS) return "";
    return "MPI_Allreduce of " + std::to_string(count) + " " + std::string(treeduce::name(dtype)) +
           " elements failed: " + mpi_error(rc) + ".";
  }

 private:
  std::array<std::array<MPI_Op, kNumReduceOps>, kNumDTypes> user_;
};

}  // namespace

std::unique_ptr<Baseline> make_mpi_baseline(std::uint32_t rank, std::uint32_t world_size,
                                            std::string* error) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    // Only the main thread calls MPI, but the process has others (libtreeduce's progress
    // thread, Gloo's): say so.
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      *error = "MPI_Init_thread failed.";
      return nullptr;
    }
    if (provided < MPI_THREAD_FUNNELED) {
      *error =
          "This MPI provides no MPI_THREAD_FUNNELED, which a process with other threads needs.";
      MPI_Finalize();
      return nullptr;
    }
    g_we_initialised = true;
  }
  // An error is a sentence naming the baseline, not an abort of the whole job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int r = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (static_cast<std::uint32_t>(r) != rank || static_cast<std::uint32_t>(n) != world_size) {
    *error = "MPI_COMM_WORLD makes this process rank " + std::to_string(r) + " of " +
             std::to_string(n) + " but libtreeduce's environment says rank " +
             std::to_string(rank) + " of " + std::to_string(world_size) +
             "; run under mpirun without TREEDUCE_RANK/TREEDUCE_WORLD_SIZE, or make them agree.";
    return nullptr;
  }
  return std::make_unique<MpiBaseline>();
}

void finalize_mpi() {
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (g_we_initialised && !finalised) MPI_Finalize();
}

}  // namespace treeduce::perf
