// treeduce-perf's Gloo baseline: gloo::allreduce with the ring algorithm asked for explicitly,
// over Gloo's TCP transport, in a gloo::Context of its own.
//
// What is Gloo's and what is ours: the algorithm (ring reduce-scatter then allgather), its
// chunking and pipelining, and the transport are Gloo's, untouched. The element reduction Gloo
// calls is ours, the aggregation library's SIMD kernels (perf_baselines.h): it gives the switch's
// numerics, so every result is exactly checkable, and if anything it is faster than a scalar loop,
// which favours Gloo.
//
// Rendezvous: libtreeduce's own (host/src/gloo_connect.cpp), in the same directory as its
// host-side reduction, behind a prefix of its own so the two contexts never read each other's
// keys.
#include <gloo/allreduce.h>
#include <gloo/context.h>

#include <exception>
#include <vector>

#include "gloo_connect.h"
#include "perf_baselines.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::perf {
namespace {

using ReduceFunc = gloo::AllreduceOptions::Func;

// c = emit(load(a) OP b) through an accumulator scratch buffer of acc_size(d)-byte elements (so
// c may be a or b): binary32 for the narrow floats, 0/1 for the logical operations, canonical
// NaNs out of MINLOC/MAXLOC, zero padding in f64_i32 (kernels.h).
ReduceFunc reduce_generic(DType d, ReduceOp op, std::vector<std::uint8_t>* scratch) {
  const agg::KernelTable& k = agg::kernels();
  return [load = k.load_fn(d, op), acc = k.accumulate_fn(d, op), emit = k.emit_fn(d),
          size = acc_size(d), scratch](void* c, const void* a, const void* b, std::size_t n) {
    if (scratch->size() < n * size) scratch->resize(n * size);
    load(scratch->data(), a, n);
    acc(scratch->data(), b, n);
    emit(c, scratch->data(), n);
  };
}

// Gloo only needs the element size; the reduce function knows the real type.
struct Bytes8 {
  std::uint8_t b[8];
};
struct Bytes16 {
  std::uint8_t b[16];
};

class GlooBaseline final : public Baseline {
 public:
  GlooBaseline(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  std::string_view name() const override { return "gloo"; }

  std::string allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                        ReduceOp op) override {
    const agg::AccumulateFn acc = agg::kernels().accumulate_fn(dtype, op);
    // f32 and i32 sum/min/max reduce in place, as libtreeduce's own host path does; the others
    // (narrow floats, logical operations, pairs, ...) through the generic scratch path.
    const bool in_place = (dtype == DType::f32 || dtype == DType::i32) &&
                          (op == ReduceOp::sum || op == ReduceOp::min || op == ReduceOp::max);
    try {
      switch (dtype_size(dtype)) {
        case 4:
          run<std::uint32_t>(
              send, recv, count,
              in_place ? host::gloo_reduce_32(acc) : reduce_generic(dtype, op, &scratch_));
          break;
        case 2:
          run<std::uint16_t>(send, recv, count, reduce_generic(dtype, op, &scratch_));
          break;
        case 8:
          run<Bytes8>(send, recv, count, reduce_generic(dtype, op, &scratch_));
          break;
        case 16:
          run<Bytes16>(send, recv, count, reduce_generic(dtype, op, &scratch_));
          break;
        default:
          run<std::uint8_t>(send, recv, count, reduce_generic(dtype, op, &scratch_));
      }
    } catch (const std::exception& e) {
      return "Gloo's ring allreduce of " + std::to_string(count) + " " +
             std::string(treeduce::name(dtype)) + " elements failed: " + e.what();
    }
    return "";
  }

 private:
  // T only gives Gloo the element size: the reduce function knows the real type.
  template <typename T>
  void run(const void* send, void* recv, std::size_t count, ReduceFunc f) {
    gloo::AllreduceOptions o(ctx_);
    o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    o.setInput(static_cast<T*>(const_cast<void*>(send)), count);
    o.setOutput(static_cast<T*>(recv), count);
    o.setReduceFunction(std::move(f));
    o.setTimeout(timeout_);
    gloo::allreduce(o);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::vector<std::uint8_t> scratch_;  // accumulator scratch of reduce_generic()
};

}  // namespace

std::unique_ptr<Baseline> make_gloo_baseline(const GlooBaselineOptions& opt, std::string* error) {
  std::string reason;
  auto ctx = host::connect_gloo(
      {opt.store_dir, opt.prefix, opt.bind_address, opt.rank, opt.world_size, opt.timeout},
      &reason);
  if (!ctx) {
    *error = "The Gloo baseline could not connect rank " + std::to_string(opt.rank) + " to its " +
             std::to_string(opt.world_size - 1) + " peers on " + opt.bind_address + " through " +
             opt.store_dir + " (prefix " + opt.prefix + ") within " +
             std::to_string(opt.timeout.count()) + " ms: " + reason +
             "; if an earlier run was killed during its rendezvous, delete the directory's files "
             "and retry.";
    return nullptr;
  }
  return std::make_unique<GlooBaseline>(std::move(ctx), opt.timeout);
}

}  // namespace treeduce::perf
