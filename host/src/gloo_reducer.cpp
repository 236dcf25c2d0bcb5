// Host-side reduction with Gloo: what a Communicator runs when the network path is not there.
//
// Numerics are the switch's (docs/numerics.md), computed with aggregation's own kernels so the
// two paths cannot drift apart. The narrow float types (f16, bf16, e4m3, e5m2) are widened to
// binary32 with the kernels' load, reduced in binary32 by Gloo calling the kernels' f32
// accumulate, and narrowed once with the kernels' emit (round to nearest even, E4M3 saturation,
// canonical NaN), for sum, prod, min and max alike. Every other type is its own accumulator
// (acc_size == dtype_size): the kernels' load starts it (the logical operations keep 0 or 1,
// even for one rank; f64_i32's padding becomes zero), Gloo reduces it with the kernels'
// accumulate of that very type (integers wrap in their width, f64 in binary64, pairs by
// MINLOC/MAXLOC), and emit writes it out (canonical NaN). That is exactly what a one-level switch
// does; only the order of a float sum or product may differ, within docs/numerics.md's bound.
// Gloo is given elements of the type's size (1, 2, 4, 8 or 16 bytes), so it never splits one.
//
// Rendezvous: connect_gloo (gloo_connect.cpp), keyed by the job name.
#include <gloo/allreduce.h>
#include <gloo/context.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <vector>

#include "gloo_connect.h"
#include "host_reducer.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::host {
namespace {

class GlooReducer final : public HostReducer {
 public:
  GlooReducer(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  // Not thread-safe: the communicator runs one collective at a time.
  treeduce::Status allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                             ReduceOp op) override {
    if (count == 0) return treeduce::Status::Ok();  // every rank passes 0: nothing to exchange
    if (send == nullptr || recv == nullptr)
      return invalid_argument("The send and receive buffers must be given.");
    if (std::size_t(dtype) >= kNumDTypes || std::size_t(op) >= kNumReduceOps) {
      return invalid_argument(
          "Host-side allreduce got an element type or operation that does not exist.");
    }
    if (!op_defined(dtype, op)) {
      return invalid_argument("Host-side allreduce cannot reduce " + std::string(name(dtype)) +
                              " with " + std::string(name(op)) + ": " +
                              std::string(op_refusal(dtype, op)) + ".");
    }
    const agg::KernelTable& k = agg::kernels();
    try {
      if (is_narrow_float(dtype)) {
        wide_.resize(count);
        k.load_fn(dtype, op)(wide_.data(), send, count);
        run<float>(wide_.data(), wide_.data(), count,
                   gloo_reduce(k.accumulate_fn(DType::f32, op), sizeof(float)));
        k.emit_fn(dtype)(recv, wide_.data(), count);
      } else {
        // The accumulator is the wire layout: load into recv, reduce in place, emit in place.
        // Load copies every type but f64_i32 (padding zeroed) under every operation but the
        // logical ones (0/1): in place, those need no pass at all; the others go through
        // scratch, as the kernels' buffers must not overlap.
        const std::size_t size = dtype_size(dtype);
        const bool load_copies = !is_logical(op) && dtype != DType::f64_i32;
        if (send != recv) {
          k.load_fn(dtype, op)(recv, send, count);
        } else if (!load_copies) {
          scratch_.assign(static_cast<const unsigned char*>(send),
                          static_cast<const unsigned char*>(send) + count * size);
          k.load_fn(dtype, op)(recv, scratch_.data(), count);
        }
        const auto f = gloo_reduce(k.accumulate_fn(dtype, op), size);
        switch (size) {
          case 1:
            run<std::uint8_t>(recv, recv, count, f);
            break;
          case 2:
            run<std::uint16_t>(recv, recv, count, f);
            break;
          case 4:
            run<std::uint32_t>(recv, recv, count, f);
            break;
          case 8:
            run<std::uint64_t>(recv, recv, count, f);
            break;
          default:
            static_assert(sizeof(Elem16) == 16);
            run<Elem16>(recv, recv, count, f);
        }
        k.emit_fn(dtype)(recv, recv, count);
      }
    } catch (const std::exception& e) {
      return treeduce::Status(Code::aborted, "Host-side allreduce of " + std::to_string(count) +
                                                 " " + std::string(name(dtype)) +
                                                 " elements failed: " + e.what());
    }
    return treeduce::Status::Ok();
  }

 private:
  // The 16-byte element (f64_i32): T only gives Gloo the element size.
  struct Elem16 {
    std::uint64_t lo, hi;
  };

  template <typename T>
  void run(const void* send, void* recv, std::size_t count, gloo::AllreduceOptions::Func f) {
    gloo::AllreduceOptions o(ctx_);
    // Gloo reads `send` and writes `recv`; in place it only needs the output.
    if (send != recv) o.setInput(static_cast<T*>(const_cast<void*>(send)), count);
    o.setOutput(static_cast<T*>(recv), count);
    o.setReduceFunction(std::move(f));
    o.setTimeout(timeout_);
    gloo::allreduce(o);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::vector<float> wide_;  // binary32 accumulator for the narrow types, reused across calls
  std::vector<unsigned char> scratch_;  // an in-place call's input, reused across calls
};

}  // namespace

treeduce::Result<std::unique_ptr<HostReducer>> make_gloo_reducer(const HostReducerOptions& opt) {
  const auto fail = [](std::string why) { return invalid_argument(std::move(why)); };
  if (opt.job.empty()) return fail("Host-side reduction needs a job name.");
  if (opt.world_size == 0 || opt.rank >= opt.world_size)
    return fail("Rank " + std::to_string(opt.rank) + " does not exist in a world of " +
                std::to_string(opt.world_size) + ".");
  if (opt.store_dir.empty())
    return fail("Host-side reduction needs a rendezvous directory shared by all ranks.");
  if (opt.bind_address.empty())
    return fail("Host-side reduction needs an IPv4 address for Gloo's TCP transport.");
  const auto timeout = std::chrono::milliseconds(opt.timeout_ms);
  std::string reason;
  auto ctx = connect_gloo(
      {opt.store_dir, opt.job, opt.bind_address, opt.rank, opt.world_size, timeout}, &reason);
  if (!ctx) {
    return unavailable(
        "Host-side reduction could not connect rank " + std::to_string(opt.rank) + " of job '" +
        opt.job + "' to its " + std::to_string(opt.world_size - 1) + " peers within " +
        std::to_string(opt.timeout_ms) + " ms through " + opt.store_dir + " (" + reason +
        "); if an earlier run of the job was killed during its rendezvous, delete the "
        "directory's files and retry.");
  }
  return std::unique_ptr<HostReducer>(std::make_unique<GlooReducer>(std::move(ctx), timeout));
}

}  // namespace treeduce::host
