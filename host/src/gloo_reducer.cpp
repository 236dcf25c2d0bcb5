// Host-side reduction with Gloo: what a Communicator runs when the network path is not there.
//
// Numerics are the switch's (docs/numerics.md), computed with aggregation's own kernels so the
// two paths cannot drift apart: every float type is widened to binary32 with the kernels' load,
// reduced in binary32 by Gloo calling the kernels' f32 accumulate, and narrowed once with the
// kernels' emit (round to nearest even, E4M3 saturation, canonical NaN). That is exactly what a
// one-level switch does; only the order of a float sum may differ, within the bound of
// docs/numerics.md. i32 uses the kernels' i32 accumulate (sums wrap, min/max signed).
//
// Rendezvous and stale keys. Gloo's connectFullMesh has every rank write one key (its addresses)
// and read every other rank's. The store is a gloo::rendezvous::FileStore in store_dir behind a
// PrefixStore keyed by the job name, so concurrent jobs sharing a directory never read each
// other's keys. A key left from an earlier run of the same job would be read as if it were fresh
// (its address is dead) and make the new run fail, so no run leaves keys behind: once every rank
// has connected, a barrier proves every rank has read every key, and then each rank deletes the
// files it wrote itself (FileStore::getAllKeyFilePaths lists exactly those). A rank whose
// rendezvous fails deletes its own files too. Only a rank killed during rendezvous can leave a
// key; the next run of that job then fails with a sentence that names the directory to clear.
// Deleting only one's own files, never the directory, keeps one rank from erasing a key that a
// slower rank of the same run has not read yet.
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <system_error>
#include <vector>

#include "host_reducer.h"
#include "treeduce/aggregation/kernels.h"

namespace treeduce::host {
namespace {

// Gloo's reduction function: c = a OP b, where c may be a (or b). The kernels accumulate in
// place (acc = acc OP payload); SUM, MIN and MAX are commutative bit for bit (docs/numerics.md),
// so c == b is accumulate(c, a).
gloo::AllreduceOptions::Func reduce_with(agg::AccumulateFn acc) {
  return [acc](void* c, const void* a, const void* b, std::size_t n) {
    if (c == a) {
      acc(c, b, n);
    } else if (c == b) {
      acc(c, a, n);
    } else {
      std::memcpy(c, a, n * sizeof(float));  // every accumulator lane is 32 bits
      acc(c, b, n);
    }
  };
}

class GlooReducer final : public HostReducer {
 public:
  GlooReducer(std::shared_ptr<gloo::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}

  // Not thread-safe: the communicator runs one collective at a time.
  std::string allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                        ReduceOp op) override {
    if (count == 0) return "";  // every rank passes 0: nothing to exchange
    if (send == nullptr || recv == nullptr) return "The send and receive buffers must be given.";
    if (std::size_t(dtype) >= kNumDTypes || std::size_t(op) >= kNumReduceOps)
      return "Host-side allreduce got an element type or operation that does not exist.";
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
        k.load_fn(dtype)(wide_.data(), send, count);
        run<float>(wide_.data(), wide_.data(), count, k.accumulate_fn(DType::f32, op));
        k.emit_fn(dtype)(recv, wide_.data(), count);
      }
    } catch (const std::exception& e) {
      return "Host-side allreduce of " + std::to_string(count) + " " + std::string(name(dtype)) +
             " elements failed: " + e.what();
    }
    return "";
  }

 private:
  template <typename T>
  void run(const void* send, void* recv, std::size_t count, agg::AccumulateFn acc) {
    gloo::AllreduceOptions o(ctx_);
    // Gloo reads `send` and writes `recv`; in place it only needs the output.
    if (send != recv) o.setInput(static_cast<T*>(const_cast<void*>(send)), count);
    o.setOutput(static_cast<T*>(recv), count);
    o.setReduceFunction(reduce_with(acc));
    o.setTimeout(timeout_);
    gloo::allreduce(o);
  }

  std::shared_ptr<gloo::Context> ctx_;
  std::chrono::milliseconds timeout_;
  std::vector<float> wide_;  // binary32 accumulator for the narrow types, reused across calls
};

void remove_own_keys(gloo::rendezvous::FileStore& store) {
  for (const std::string& p : store.getAllKeyFilePaths()) {
    std::error_code ec;  // best effort: a key that is already gone is fine
    std::filesystem::remove(p, ec);
  }
}

}  // namespace

std::unique_ptr<HostReducer> make_gloo_reducer(const HostReducerOptions& opt, std::string* error) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<HostReducer> {
    if (error) *error = why;
    return nullptr;
  };
  if (opt.job.empty()) return fail("Host-side reduction needs a job name.");
  if (opt.world_size == 0 || opt.rank >= opt.world_size)
    return fail("Rank " + std::to_string(opt.rank) + " does not exist in a world of " +
                std::to_string(opt.world_size) + ".");
  if (opt.store_dir.empty())
    return fail("Host-side reduction needs a rendezvous directory shared by all ranks.");
  if (opt.bind_address.empty())
    return fail("Host-side reduction needs an IPv4 address for Gloo's TCP transport.");
  std::error_code ec;
  std::filesystem::create_directories(opt.store_dir, ec);
  if (ec)
    return fail("Cannot create the rendezvous directory " + opt.store_dir + ": " + ec.message() +
                ".");
  const auto timeout = std::chrono::milliseconds(opt.timeout_ms);
  std::unique_ptr<gloo::rendezvous::FileStore> files;
  try {
    files = std::make_unique<gloo::rendezvous::FileStore>(opt.store_dir);
    gloo::rendezvous::PrefixStore store(opt.job, *files);
    gloo::transport::tcp::attr attr;
    attr.hostname = opt.bind_address;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(int(opt.rank), int(opt.world_size));
    ctx->setTimeout(timeout);
    ctx->connectFullMesh(store, device);
    gloo::BarrierOptions b(ctx);
    b.setTimeout(timeout);
    gloo::barrier(b);
    remove_own_keys(*files);
    return std::make_unique<GlooReducer>(std::move(ctx), timeout);
  } catch (const std::exception& e) {
    if (files) remove_own_keys(*files);
    return fail("Host-side reduction could not connect rank " + std::to_string(opt.rank) +
                " of job '" + opt.job + "' to its " + std::to_string(opt.world_size - 1) +
                " peers within " + std::to_string(opt.timeout_ms) + " ms through " + opt.store_dir +
                " (" + e.what() +
                "); if an earlier run of the job was killed during its rendezvous, delete the "
                "directory's files and retry.");
  }
}

}  // namespace treeduce::host
