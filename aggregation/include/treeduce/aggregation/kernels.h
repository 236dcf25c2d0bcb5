/// @file
/// The arithmetic a switch runs on every packet, dispatched at run time to the best ISA.
///
/// An *accumulator* is an array of n elements of acc_size(d) bytes: binary32 for f32 and every
/// narrow float type (widened on the way in, narrowed once on the way out), and the wire type
/// itself for every other type (integers in their own width, f64 in binary64, pairs in their
/// (value, index) layout). A *payload* is n elements of the wire type, packed (dtype_size(d) bytes
/// each, little-endian). No function here allocates, throws, locks or logs; pointers need no
/// particular alignment; buffers must not overlap, except that emit() may write in place over its
/// own accumulator when acc_size(d) == dtype_size(d).
///
/// A table has a kernel for every (dtype, op) with op_defined(dtype, op) and nullptr for the
/// others. Every path gives the same bits as the scalar reference (Isa::scalar) for every emitted
/// payload and every accumulator, except that the payload of a NaN inside a sum or product
/// accumulator is unspecified (emitted NaNs are canonical, see convert.h). docs/numerics.md states
/// the semantics.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::agg {

/// Instruction-set paths, from least to most capable.
enum class Isa : unsigned char {
  scalar = 0,       ///< portable C++; the reference
  avx2 = 1,         ///< AVX2 + F16C
  avx512 = 2,       ///< AVX-512 F/BW/VL/DQ + F16C
  avx512_bf16 = 3,  ///< avx512 plus AVX512-BF16 (vcvtneps2bf16 for bf16 narrowing)
};
inline constexpr std::size_t kNumIsas = 4;

std::string_view name(Isa isa) noexcept;
/// Inverse of name() ("scalar", "avx2", "avx512", "avx512_bf16").
std::optional<Isa> parse_isa(std::string_view s) noexcept;

/// acc[i] = widen(payload[i]): start an accumulator from the first contribution (for the logical
/// operations, 1 where payload[i] != 0, else 0).
using LoadFn = void (*)(void* acc, const void* payload, std::size_t n);
/// acc[i] = acc[i] OP widen(payload[i]).
using AccumulateFn = void (*)(void* acc, const void* payload, std::size_t n);
/// acc[i] = widen(p[0][i]) OP widen(p[1][i]) OP ... OP widen(p[k-1][i]), folded left in exactly
/// this order whatever order the payloads arrived in: the basis of deterministic mode. k == 0
/// leaves acc unchanged.
using ReduceFn = void (*)(void* acc, const void* const* payloads, std::size_t k, std::size_t n);
/// payload[i] = narrow(acc[i]): round to nearest even once, canonical NaN.
using EmitFn = void (*)(void* payload, const void* acc, std::size_t n);

/// One ISA's kernels, indexed by static_cast<size_t>(DType) and static_cast<size_t>(ReduceOp);
/// nullptr where !op_defined(dtype, op).
/// Callers on a hot path look the pointer up once (per tree) and call it per packet.
struct KernelTable {
  Isa isa;
  LoadFn load[kNumDTypes][kNumReduceOps];
  AccumulateFn accumulate[kNumDTypes][kNumReduceOps];
  ReduceFn reduce[kNumDTypes][kNumReduceOps];
  EmitFn emit[kNumDTypes];

  LoadFn load_fn(DType d, ReduceOp op) const noexcept {
    return load[static_cast<std::size_t>(d)][static_cast<std::size_t>(op)];
  }
  AccumulateFn accumulate_fn(DType d, ReduceOp op) const noexcept {
    return accumulate[static_cast<std::size_t>(d)][static_cast<std::size_t>(op)];
  }
  ReduceFn reduce_fn(DType d, ReduceOp op) const noexcept {
    return reduce[static_cast<std::size_t>(d)][static_cast<std::size_t>(op)];
  }
  EmitFn emit_fn(DType d) const noexcept { return emit[static_cast<std::size_t>(d)]; }
};

/// True when this build contains the path and this CPU (and OS) can run it.
bool isa_supported(Isa isa) noexcept;
/// Every supported path, scalar first.
std::vector<Isa> supported_isas();
/// The fastest supported path: avx512, else avx2, else scalar. avx512_bf16 is never chosen
/// automatically (measured slower here, see dispatch.cpp) but can be forced.
Isa best_isa() noexcept;
/// The table of a given path, or nullptr when it is not supported.
const KernelTable* kernels_for(Isa isa) noexcept;

/// The table in use. Chosen on first use: the path named by the environment variable
/// TREEDUCE_KERNEL_ISA when set and supported (an unknown or unsupported name is reported on stderr
/// and ignored), otherwise best_isa(). Thread-safe.
const KernelTable& kernels() noexcept;
/// Make `isa` the table in use. Returns false, changing nothing, when it is not supported.
/// Tables already looked up by callers stay valid (all tables live for the whole process).
bool force_isa(Isa isa) noexcept;

}  // namespace treeduce::agg
