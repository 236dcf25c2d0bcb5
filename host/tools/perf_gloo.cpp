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

// c = narrow(widen(a) OP widen(b)) for the narrow types, through a binary32 scratch buffer (so c
// may be a or b).
ReduceFunc reduce_narrow(DType d, agg::AccumulateFn acc, std::vector<float>* wide) {
  const agg::KernelTable& k = agg::kernels();
  return [load = k.load_fn(d, ReduceOp::sum), emit = k.emit_fn(d), acc, wide](
             void* c, const void* a, const void* b, std::size_t n) {
    if (wide->size() < n) wide->resize(n);
    load(wide->data(), a, n);
    acc(wide->data(), b, n);
    emit(c, wide->data(), n);
  };
}

class GlooBaseline final : public Baseline {
 public:
  GlooBaseline(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  std::string_view name() const override { return "gloo"; }

  std::string allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                        ReduceOp op) override {
    const agg::AccumulateFn acc = agg::kernels().accumulate_fn(dtype, op);
    try {
      switch (dtype_size(dtype)) {
        case 4:
          run<std::uint32_t>(send, recv, count, host::gloo_reduce_32(acc));
          break;
        case 2:
          run<std::uint16_t>(send, recv, count, reduce_narrow(dtype, acc, &wide_));
          break;
        default:
          run<std::uint8_t>(send, recv, count, reduce_narrow(dtype, acc, &wide_));
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
  std::vector<float> wide_;  // binary32 scratch of the narrow types' reduce function
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
