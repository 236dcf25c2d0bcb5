// Host-side reduction with Gloo: what a Communicator runs when the network path is not there.
//
// Numerics are the switch's (docs/numerics.md), computed with aggregation's own kernels so the
// two paths cannot drift apart: every float type is widened to binary32 with the kernels' load,
// reduced in binary32 by Gloo calling the kernels' f32 accumulate, and narrowed once with the
// kernels' emit (round to nearest even, E4M3 saturation, canonical NaN). That is exactly what a
// one-level switch does; only the order of a float sum may differ, within the bound of
// docs/numerics.md. i32 uses the kernels' i32 accumulate (sums wrap, min/max signed).
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
    const agg::KernelTable& k = agg::kernels();
    try {
      if (dtype == DType::i32) {
        run<std::int32_t>(send, recv, count, k.accumulate_fn(DType::i32, op));
      } else if (dtype == DType::f32) {
        run<float>(send, recv, count, k.accumulate_fn(DType::f32, op));
        // What a switch puts on the wire: a NaN of any payload becomes the canonical one.
        k.emit_fn(DType::f32)(recv, recv, count);
      } else {
        wide_.resize(count);
        k.load_fn(dtype, op)(wide_.data(), send, count);
        run<float>(wide_.data(), wide_.data(), count, k.accumulate_fn(DType::f32, op));
        k.emit_fn(dtype)(recv, wide_.data(), count);
      }
    } catch (const std::exception& e) {
      return treeduce::Status(Code::aborted, "Host-side allreduce of " + std::to_string(count) +
                                                 " " + std::string(name(dtype)) +
                                                 " elements failed: " + e.what());
    }
    return treeduce::Status::Ok();
  }

 private:
  template <typename T>
  void run(const void* send, void* recv, std::size_t count, agg::AccumulateFn acc) {
    gloo::AllreduceOptions o(ctx_);
    // Gloo reads `send` and writes `recv`; in place it only needs the output.
    if (send != recv) o.setInput(static_cast<T*>(const_cast<void*>(send)), count);
    o.setOutput(static_cast<T*>(recv), count);
    o.setReduceFunction(gloo_reduce_32(acc));
    o.setTimeout(timeout_);
    gloo::allreduce(o);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::vector<float> wide_;  // binary32 accumulator for the narrow types, reused across calls
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
