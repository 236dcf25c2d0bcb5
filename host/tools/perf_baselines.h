// The baselines treeduce-perf compares libtreeduce with (--compare): Gloo's ring allreduce over
// its TCP transport (perf_gloo.cpp) and MPI_Allreduce (perf_mpi.cpp, only in builds with MPI).
//
// Both reduce the element types on the wire as they are (2 bytes for f16/bf16, 1 for e4m3/e5m2,
// 8 for f64/i64/u64 and the 4-byte-value pairs, 16 for f64_i32), as NCCL and MPI users do, so
// that the bytes moved are the same as treeduce's. Where the element reduction is ours (every
// Gloo reduction, and MPI's user-defined ops) it is the aggregation library's SIMD kernels: each
// step loads one operand into an accumulator (binary32 for the narrow floats, 0/1 for the logical
// operations), combines the other and emits the result (one rounding, canonical NaNs, zero
// padding). On the exact inputs of treeduce/lab/exact_inputs.h every partial result is
// representable, so rounding at each step gives the same bits as the switch's single rounding,
// and every result is checked element by element like treeduce's.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::perf {

/// One allreduce implementation other than libtreeduce, set up once for the whole run.
class Baseline {
 public:
  virtual ~Baseline() = default;
  /// "gloo" or "mpi": the column, the JSON key and the name in error sentences.
  virtual std::string_view name() const = 0;
  /// Blocking allreduce of `count` elements from `send` into `recv` (distinct buffers) among all
  /// ranks. "" or an error sentence; after an error the baseline is not used again.
  virtual std::string allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                                ReduceOp op) = 0;
};

struct GlooBaselineOptions {
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::string store_dir;  ///< FileStore rendezvous directory shared by all ranks
  std::string prefix;     ///< keys' prefix in it, distinct from libtreeduce's own fallback context
  std::string bind_address;  ///< IPv4 of this rank's Gloo TCP device
  std::chrono::milliseconds timeout{60000};
};

/// Connects all ranks (blocks until every rank has called it, or the timeout). nullptr and a
/// sentence in `*error` on failure.
std::unique_ptr<Baseline> make_gloo_baseline(const GlooBaselineOptions& opt, std::string* error);

#ifdef TREEDUCE_PERF_HAVE_MPI
/// MPI_Init (when not already initialised), and a check that MPI_COMM_WORLD is the same job as
/// libtreeduce's: `rank` of `world_size`. nullptr and a sentence in `*error` on failure.
std::unique_ptr<Baseline> make_mpi_baseline(std::uint32_t rank, std::uint32_t world_size,
                                            std::string* error);
/// MPI_Finalize when MPI was initialised by make_mpi_baseline(); nothing otherwise.
void finalize_mpi();
#endif

}  // namespace treeduce::perf
