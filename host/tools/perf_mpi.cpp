// treeduce-perf's MPI baseline: MPI_Allreduce on MPI_COMM_WORLD, with whatever algorithm the MPI
// library chooses for the size (Open MPI's tuned component: recursive doubling, ring, ...).
//
// Operations. Native ones where they give exactly the switch's results on every input:
// MPI_SUM and MPI_PROD on MPI_FLOAT and MPI_DOUBLE (the exact inputs' partial sums and products
// are all representable, so any order gives the same bits); every operation on the integer types
// (MPI_INT8_T ... MPI_UINT64_T: sums and products wrap, as the switch's; MPI_LAND/LOR/LXOR give
// 0 or 1, as the switch's) except sums of 8- and 16-bit integers (see native()); MPI_MINLOC/MAXLOC
// on MPI_2INT for i32_i32. Everything else is a
// commutative MPI_Op_create user op on the aggregation kernels: f32/f64 min/max, because
// MPI_MIN/MAX are C comparisons that return either of -0 and +0 where IEEE minimum/maximum (the
// switch's) order -0 below +0; MINLOC/MAXLOC on MPI_FLOAT_INT and MPI_DOUBLE_INT, for the same
// reason and because a NaN value compares unordered in C (the switch's MINLOC puts it below
// everything and emits the canonical NaN); and every op on f16, bf16, e4m3 and e5m2, which MPI
// has no type for (they travel as MPI_UINT16_T or MPI_UINT8_T, 2 and 1 bytes each).
// The C API is all this needs; Open MPI's deprecated C++ bindings do not build with -Werror.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <array>
#include <cstring>
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
  if constexpr (D == DType::f32 && (O == ReduceOp::min || O == ReduceOp::max)) {
    k.accumulate_fn(D, O)(inout, in, n);  // binary32 lanes: the elements are the accumulator
  } else {
    // Through an accumulator of acc_size(D)-byte elements: binary32 for the narrow types,
    // canonical NaNs and zero padding for the pairs (kernels.h).
    thread_local std::vector<std::uint8_t> acc;  // MPI may call this from a progress thread
    if (acc.size() < n * acc_size(D)) acc.resize(n * acc_size(D));
    if (const auto load = k.load_fn(D, O)) {  // nullptr for pairs with no meaning: never called
      load(acc.data(), inout, n);
      k.accumulate_fn(D, O)(acc.data(), in, n);
      k.emit_fn(D)(inout, acc.data(), n);
    }
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
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::min:
      return MPI_MIN;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::prod:
      return MPI_PROD;
    case ReduceOp::band:
      return MPI_BAND;
    case ReduceOp::bor:
      return MPI_BOR;
    case ReduceOp::bxor:
      return MPI_BXOR;
    case ReduceOp::land:
      return MPI_LAND;
    case ReduceOp::lor:
      return MPI_LOR;
    case ReduceOp::lxor:
      return MPI_LXOR;
    case ReduceOp::minloc:
      return MPI_MINLOC;
    case ReduceOp::maxloc:
      return MPI_MAXLOC;
  }
  return MPI_OP_NULL;
}

// The MPI datatype each wire type travels as.
MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i8:
      return MPI_INT8_T;
    case DType::u8:
      return MPI_UINT8_T;
    case DType::i16:
      return MPI_INT16_T;
    case DType::u16:
      return MPI_UINT16_T;
    case DType::i32:
      return MPI_INT32_T;
    case DType::u32:
      return MPI_UINT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::u64:
      return MPI_UINT64_T;
    case DType::f32_i32:
      return MPI_FLOAT_INT;
    case DType::f64_i32:
      return MPI_DOUBLE_INT;
    case DType::i32_i32:
      return MPI_2INT;
    case DType::f16:
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::e4m3:
    case DType::e5m2:
      return MPI_UINT8_T;
  }
  return MPI_DATATYPE_NULL;
}

// True where MPI's own operation gives the switch's bits (see the top of the file).
bool native(DType d, ReduceOp op) {
  // Open MPI 4.1's AVX op component adds 8- and 16-bit integers with saturating instructions
  // (measured on Debian 12: i8 sums stuck at 127, u8 at 255, i16 at -32768): those sums take the
  // kernels, which wrap. Known upstream: open-mpi/ompi#8045, closed as "wontfix".
  if (is_integer(d)) return !(op == ReduceOp::sum && dtype_size(d) < 4);
  if (d == DType::i32_i32) return true;
  if (d == DType::f32 || d == DType::f64) return op == ReduceOp::sum || op == ReduceOp::prod;
  return false;
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
    const MPI_Datatype type = mpi_type(dtype);
    const MPI_Op mop = native(dtype, op)
                           ? native_op(op)
                           : user_[static_cast<std::size_t>(dtype)][static_cast<std::size_t>(op)];
    if (count > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      return "MPI_Allreduce counts elements in an int: " + std::to_string(count) +
             " elements are too many.";
    }
    const int rc = MPI_Allreduce(send, recv, static_cast<int>(count), type, mop, MPI_COMM_WORLD);
    if (rc == MPI_SUCCESS) {
      // MPI_DOUBLE_INT's 4 bytes after the int are padding MPI need not move; the protocol
      // defines them as zero in a result (docs/protocol.md), so they are set here, not checked.
      if (dtype == DType::f64_i32) {
        auto* p = static_cast<std::uint8_t*>(recv);
        for (std::size_t i = 0; i < count; ++i) std::memset(p + 16 * i + 12, 0, 4);
      }
      return "";
    }
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
