// treeduce._C: a torch.distributed process group over libtreeduce (docs/pytorch.md).
//
// allreduce, allreduce_coalesced, reduce, broadcast and barrier are libtreeduce iallreduce calls,
// started on the caller's thread in program order (so every rank starts them in the same order,
// which libtreeduce requires) and completed in that order by one completion thread per group,
// which waits on each request, finishes the post-processing (copy back, AVG's division, FP8
// dequantisation) and completes the Work and its c10 Future (DDP communication hooks chain on
// it). Everything else (allgather, reduce_scatter, alltoall, gather, scatter, send/recv) goes to a
// ProcessGroupGloo made from the same store, said once per operation on stderr.
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "treeduce/aggregation/convert.h"
#include "treeduce/host/communicator.h"

namespace py = pybind11;

namespace treeduce::torchpg {
namespace {

using host::Result;

std::optional<DType> to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return DType::f32;
    case at::kHalf:
      return DType::f16;
    case at::kBFloat16:
      return DType::bf16;
    case at::kDouble:
      return DType::f64;
    case at::kInt:
      return DType::i32;
    case at::kLong:
      return DType::i64;
    case at::kShort:
      return DType::i16;
    case at::kChar:
      return DType::i8;
    case at::kByte:
      return DType::u8;
    default:
      return std::nullopt;
  }
}

bool is_float(at::ScalarType t) { return at::isFloatingType(t); }

/// The libtreeduce operation for a torch one; AVG is SUM (divided afterwards).
std::optional<ReduceOp> to_op(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      return ReduceOp::sum;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::prod;
    case c10d::ReduceOp::MIN:
      return ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return ReduceOp::max;
    case c10d::ReduceOp::BAND:
      return ReduceOp::band;
    case c10d::ReduceOp::BOR:
      return ReduceOp::bor;
    case c10d::ReduceOp::BXOR:
      return ReduceOp::bxor;
    default:
      return std::nullopt;
  }
}

const char* op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "an unknown operation";
  }
}

/// A Work finished by the completion thread; its future carries the output tensors.
class TreeduceWork : public c10d::Work {
 public:
  TreeduceWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  void complete(std::exception_ptr e) {
    finish(e);
    if (e) {
      future_->setError(e);
    } else {
      future_->markCompleted(c10::IValue(outputs_));
    }
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Started requests of one Work and what to do once they all succeeded.
struct Pending {
  c10::intrusive_ptr<TreeduceWork> work;
  std::vector<host::Request> requests;
  std::string what;  // "allreduce of 1024 f32 SUM", for error sentences
  std::function<void()> after;
  std::exception_ptr error;      // a failure before anything was started
  std::vector<at::Tensor> keep;  // buffers the library writes, alive until completion
};

/// Whether a group of this process holds libtreeduce's communicator (one per process: one UDP
/// port, one manager job); the group that holds it gives it back when it is destroyed.
std::atomic<bool> communicator_taken{false};

class ProcessGroupTreeduce;
/// The groups alive in this process, for quiesce_all() at interpreter exit.
/// Weak: _quiesce_all() takes strong references under the lock and waits without it, so a group
/// destroyed meanwhile (by a completion callback, say) never waits for the lock.
std::mutex live_mu;
std::vector<c10::weak_intrusive_ptr<ProcessGroupTreeduce>> live_groups;

void forget_expired_groups();  // below the class: the weak pointers need it complete

class ProcessGroupTreeduce : public c10d::ProcessGroup {
 public:
  ProcessGroupTreeduce(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout,
                       c10::intrusive_ptr<c10d::ProcessGroup> gloo)
      : ProcessGroup(rank, size), gloo_(std::move(gloo)) {
    bool expected = false;
    if (!communicator_taken.compare_exchange_strong(expected, true)) {
      // libtreeduce is one communicator per job and rank: a second group alive at the same time
      // in this process reduces through Gloo.
      reason_ =
          "another treeduce group of this process is alive: treeduce offloads one process group "
          "per process at a time";
      std::fprintf(stderr,
                   "treeduce: warning: rank %d: every operation of this group goes to Gloo: %s\n",
                   rank, reason_.c_str());
      return;
    }
    try {
      join(store, timeout);
    } catch (...) {
      communicator_taken = false;
      throw;
    }
    thread_ = std::thread([this] { complete_loop(); });
  }

  /// Waits (without the GIL) until every operation started so far has completed and its
  /// future's callbacks have run. At interpreter exit (atexit, treeduce/torch/__init__.py): a
  /// callback into Python on the completion thread after finalization has begun would have that
  /// thread ended by Python inside C++ frames, which aborts the process ("terminate called
  /// without an active exception").
  void quiesce() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return stop_ || (queue_.empty() && !busy_); });
  }

  ~ProcessGroupTreeduce() override { shut_down(); }

  /// Runs when the last strong reference goes: the communicator is given back and the group's
  /// weak reference in live_groups dropped, so that the group is deleted now (not at static
  /// destruction, after Python and Gloo's statics are gone). The base's release_resources()
  /// does nothing (and is private).
  void release_resources() override {
    shut_down();
    forget_expired_groups();
  }

  /// Stops the completion thread and leaves the job; a second call does nothing.
  void shut_down() {
    if (thread_.joinable()) {
      {
        std::lock_guard<std::mutex> l(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      // The last reference may go from Python (destroy_process_group): a future's Python
      // callback on the completion thread needs the GIL to finish.
      if (Py_IsInitialized() && PyGILState_Check()) {
        py::gil_scoped_release unlocked;
        thread_.join();
      } else {
        thread_.join();
      }
    }
    if (comm_) {
      comm_.reset();  // leaves the job: a later group of this process may join another
      communicator_taken = false;
    }
  }

  const std::string getBackendName() const override { return "treeduce"; }

  // ---- offloaded operations ----

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return reduce_impl(tensors, opts.reduceOp, -1, c10d::OpType::ALLREDUCE, "allreduce",
                       [&] { return gloo_->allreduce(tensors, opts); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    return reduce_impl(tensors, opts.reduceOp, -1, c10d::OpType::ALLREDUCE_COALESCED,
                       "allreduce_coalesced",
                       [&] { return gloo_->allreduce_coalesced(tensors, opts); });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "treeduce: reduce's root ",
                opts.rootRank, " is not a rank of this group of ", getSize());
    TORCH_CHECK(tensors.size() == 1, "treeduce: reduce takes one tensor per rank, not ",
                tensors.size());
    return reduce_impl(tensors, opts.reduceOp, static_cast<int>(opts.rootRank),
                       c10d::OpType::REDUCE, "reduce",
                       [&] { return gloo_->reduce(tensors, opts); });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < getSize(), "treeduce: broadcast's root ",
                opts.rootRank, " is not a rank of this group of ", getSize());
    TORCH_CHECK(tensors.size() == 1, "treeduce: broadcast takes one tensor per rank, not ",
                tensors.size());
    check_cpu(tensors, "broadcast");
    if (!comm_) return gloo_->broadcast(tensors, opts);
    at::Tensor t = tensors[0];
    // Non-roots reduce zeros in scratch memory and copy the result out only on success: a
    // failed broadcast leaves their tensor as it was.
    at::Tensor buf = getRank() != opts.rootRank ? at::zeros(t.sizes(), t.options())
                     : t.is_contiguous()        ? t
                                                : t.contiguous();
    // Any bytes arrive exactly as a wrapping integer sum with zeros: i32 when the size allows
    // (the type every switch model reduces), bytes otherwise.
    const std::size_t nbytes = buf.nbytes();
    const bool words = nbytes % 4 == 0;
    Pending p;
    p.work = c10::make_intrusive<TreeduceWork>(getRank(), c10d::OpType::BROADCAST,
                                               std::vector<at::Tensor>{t});
    p.what = "broadcast of " + std::to_string(nbytes) + " bytes";
    host::Request req = 0;
    const Result r = comm_->iallreduce(buf.data_ptr(), buf.data_ptr(), words ? nbytes / 4 : nbytes,
                                       words ? DType::i32 : DType::u8, ReduceOp::sum, &req);
    if (!started(r, p, req)) return submit(std::move(p));
    p.keep = {buf};
    if (!buf.is_same(t)) p.after = [t, buf]() mutable { t.copy_(buf); };
    return submit(std::move(p));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    if (!comm_) return gloo_->barrier(opts);
    at::Tensor one = at::ones({1}, at::kInt);
    Pending p;
    p.work = c10::make_intrusive<TreeduceWork>(getRank(), c10d::OpType::BARRIER,
                                               std::vector<at::Tensor>{one});
    p.what = "barrier";
    host::Request req = 0;
    const Result r =
        comm_->iallreduce(one.data_ptr(), one.data_ptr(), 1, DType::i32, ReduceOp::sum, &req);
    if (started(r, p, req)) p.keep = {one};
    return submit(std::move(p));
  }

  // ---- through Gloo ----

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& out,
                                           std::vector<at::Tensor>& in,
                                           const c10d::AllgatherOptions& opts) override {
    say_gloo("allgather");
    return gloo_->allgather(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override {
    say_gloo("_allgather_base");
    return gloo_->_allgather_base(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& out,
                                                     std::vector<at::Tensor>& in,
                                                     const c10d::AllgatherOptions& opts) override {
    say_gloo("allgather_coalesced");
    return gloo_->allgather_coalesced(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& out,
                                        std::vector<at::Tensor>& in,
                                        const c10d::GatherOptions& opts) override {
    say_gloo("gather");
    return gloo_->gather(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& out,
                                         std::vector<std::vector<at::Tensor>>& in,
                                         const c10d::ScatterOptions& opts) override {
    say_gloo("scatter");
    return gloo_->scatter(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& out,
                                                std::vector<std::vector<at::Tensor>>& in,
                                                const c10d::ReduceScatterOptions& opts) override {
    say_gloo("reduce_scatter");
    return gloo_->reduce_scatter(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    say_gloo("_reduce_scatter_base");
    return gloo_->_reduce_scatter_base(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    say_gloo("alltoall_base");
    return gloo_->alltoall_base(out, in, out_splits, in_splits, opts);
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& out, std::vector<at::Tensor>& in,
                                          const c10d::AllToAllOptions& opts) override {
    say_gloo("alltoall");
    return gloo_->alltoall(out, in, opts);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& t, int dst, int tag) override {
    say_gloo("send");
    return gloo_->send(t, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& t, int src, int tag) override {
    say_gloo("recv");
    return gloo_->recv(t, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& t, int tag) override {
    say_gloo("recvAnysource");
    return gloo_->recvAnysource(t, tag);
  }
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override {
    say_gloo("monitoredBarrier");
    gloo_->monitoredBarrier(opts, wait_all_ranks);
  }
  void setSequenceNumberForGroup() override { gloo_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return gloo_->getSequenceNumberForGroup(); }

  // ---- FP8 allreduce (the DDP hook's) ----

  /// Sums `t` (float32, contiguous) over the ranks as FP8 bytes reduced in the network: a MAX
  /// allreduce of |t|'s maximum first gives every rank the same scale, chosen so that
  /// world_size x max lands on the format's largest finite value; then each element is scaled and
  /// rounded (nearest even, saturating) to `format`, summed as that type, widened, unscaled and,
  /// with `average`, divided by the world size. The scale's allreduce blocks the caller.
  c10::intrusive_ptr<c10d::Work> fp8_allreduce(at::Tensor t, DType format, bool average) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
                "treeduce: fp8_allreduce takes a contiguous float32 CPU tensor, not ",
                t.toString());
    TORCH_CHECK(comm_,
                "treeduce: fp8_allreduce needs the group's in-network communicator: ", reason_);
    const float fmax = format == DType::e4m3 ? 448.0f : 57344.0f;
    const std::int64_t n = t.numel();
    float* x = t.data_ptr<float>();
    float amax = 0.0f;
    for (std::int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    if (std::isnan(amax) || std::any_of(x, x + n, [](float v) { return std::isnan(v); }))
      amax = NAN;
    host::Request req = 0;
    Result r = comm_->iallreduce(&amax, &amax, 1, DType::f32, ReduceOp::max, &req);
    if (r == Result::ok) r = comm_->wait(req);
    Pending p;
    p.work = c10::make_intrusive<TreeduceWork>(getRank(), c10d::OpType::ALLREDUCE,
                                               std::vector<at::Tensor>{t});
    p.what = "FP8 allreduce of " + std::to_string(n) + (format == DType::e4m3 ? " e4m3" : " e5m2");
    if (r != Result::ok) {
      p.error = error_of(r, "the FP8 scale's MAX allreduce before " + p.what);
      return submit(std::move(p));
    }
    if (!std::isfinite(amax)) {
      // Every rank sees the same non-finite maximum, so every rank skips the sum alike; the
      // result says it was not finite, as an unscaled sum would.
      t.fill_(NAN);
      return submit(std::move(p));
    }
    const float scale = amax > 0 ? fmax / (static_cast<float>(getSize()) * amax) : 1.0f;
    at::Tensor q = at::empty({n}, at::kByte);
    std::uint8_t* qb = q.data_ptr<std::uint8_t>();
    quantize(x, qb, n, scale, format);
    r = comm_->iallreduce(qb, qb, static_cast<std::size_t>(n), format, ReduceOp::sum, &req);
    if (!started(r, p, req)) return submit(std::move(p));
    p.keep = {q};
    const float back = 1.0f / scale / (average ? static_cast<float>(getSize()) : 1.0f);
    p.after = [t, q, format, back]() mutable {
      float* y = t.data_ptr<float>();
      const std::uint8_t* b = q.data_ptr<std::uint8_t>();
      const std::int64_t m = t.numel();
      for (std::int64_t i = 0; i < m; ++i)
        y[i] = (format == DType::e4m3 ? agg::e4m3_to_f32(b[i]) : agg::e5m2_to_f32(b[i])) * back;
    };
    return submit(std::move(p));
  }

  static void quantize(const float* x, std::uint8_t* q, std::int64_t n, float scale, DType f) {
    if (f == DType::e4m3) {
      for (std::int64_t i = 0; i < n; ++i) q[i] = agg::f32_to_e4m3(x[i] * scale);
    } else {
      for (std::int64_t i = 0; i < n; ++i) q[i] = agg::f32_to_e5m2(x[i] * scale);
    }
  }

  /// libtreeduce's own blocking allreduce (SUM) of `t` in place, bypassing the Work and the
  /// completion thread: the benchmark's measure of what the binding adds.
  void raw_allreduce(at::Tensor t) {
    TORCH_CHECK(comm_, "treeduce: raw_allreduce needs the group's communicator: ", reason_);
    const auto d = to_dtype(t.scalar_type());
    TORCH_CHECK(d && t.is_contiguous() && t.device().is_cpu(),
                "treeduce: raw_allreduce takes a contiguous CPU tensor of a treeduce type");
    const Result r = comm_->allreduce(t.data_ptr(), t.data_ptr(),
                                      static_cast<std::size_t>(t.numel()), *d, ReduceOp::sum);
    if (r != Result::ok) std::rethrow_exception(error_of(r, "raw allreduce"));
  }

  py::dict info() const {
    py::dict d;
    d["offloaded"] = static_cast<bool>(comm_);
    if (!comm_) {
      d["path"] = "gloo";
      d["reason"] = reason_;
      return d;
    }
    const host::Path path = comm_->path();
    d["path"] = path == host::Path::network ? "network" : "host";
    d["reason"] = comm_->path_reason();
    const host::Stats s = comm_->stats();
    d["network_ops"] = s.network_ops;
    d["fallback_ops"] = s.fallback_ops;
    d["retransmits"] = s.retransmits;
    d["bytes"] = s.bytes;
    d["fallback_reason"] = s.fallback_reason;
    std::lock_guard<std::mutex> l(mu_);
    d["gloo_ops"] = std::vector<std::string>(gloo_said_.begin(), gloo_said_.end());
    return d;
  }

  bool offloads(at::ScalarType t, c10d::ReduceOp::RedOpType op) const {
    const auto d = to_dtype(t);
    const auto o = to_op(op);
    return comm_ && d && o && comm_->offloads(*d, *o);
  }

 private:
  void join(const c10::intrusive_ptr<c10d::Store>& store, std::chrono::milliseconds timeout) {
    // The launcher's variables name the job, rank and world (docs/host.md section 3); the group
    // itself is the authority for rank and size, and a job name is made when none is given.
    const std::string r = std::to_string(getRank()), n = std::to_string(getSize());
    // Set to "", a variable is unset, as everywhere in libtreeduce (docs/host.md section 3).
    const char* er = std::getenv("TREEDUCE_RANK");
    const char* ew = std::getenv("TREEDUCE_WORLD_SIZE");
    if (er != nullptr && *er == '\0') er = nullptr;
    if (ew != nullptr && *ew == '\0') ew = nullptr;
    TORCH_CHECK(!er || r == er, "treeduce: TREEDUCE_RANK is ", er, " but this process is rank ", r,
                " of its process group; unset it or make them agree.");
    TORCH_CHECK(!ew || n == ew, "treeduce: TREEDUCE_WORLD_SIZE is ", ew,
                " but the process group has ", n, " ranks; unset it or make them agree.");
    // The group's rank, size and job name go to libtreeduce as overrides, not through
    // setenv(): a later group of this process (another size, another job) reads its own.
    std::map<std::string, std::string> vars = {{"TREEDUCE_RANK", r}, {"TREEDUCE_WORLD_SIZE", n}};
    // torchrun without --rdzv_id sets TORCHELASTIC_RUN_ID to "none" (libtreeduce ignores it).
    const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
    const bool has_run_id = run_id && *run_id && std::string(run_id) != "none";
    const char* env_job = std::getenv("TREEDUCE_JOB");
    if (!(env_job && *env_job) && !has_run_id) {
      if (getRank() == 0) {
        const std::string job =
            "torch-" + std::to_string(getpid()) + "-" +
            std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
        store->set("treeduce/job", std::vector<uint8_t>(job.begin(), job.end()));
      }
      const std::vector<uint8_t> job = store->get("treeduce/job");
      vars["TREEDUCE_JOB"] = std::string(job.begin(), job.end());
    }
    host::Options opt;
    std::string error;
    Result res = host::options_from_environment(&opt, &error, vars);
    TORCH_CHECK(res == Result::ok, "treeduce: ", error);
    // torch's timeout bounds everything when it is shorter than libtreeduce's own bounds
    // (init_process_group(timeout=...); torch's default of 30 minutes is not).
    const auto ms = static_cast<std::uint64_t>(timeout.count());
    if (ms > 0 && ms < opt.join_timeout_ms) opt.join_timeout_ms = static_cast<std::uint32_t>(ms);
    if (ms > 0 && ms < opt.op_timeout_ms) opt.op_timeout_ms = static_cast<std::uint32_t>(ms);
    // Every rank has come this far before any joins: Join's and the host rendezvous's bounds
    // then measure the network, not how long each rank took to import torch.
    if (store->add("treeduce/arrived", 1) == getSize()) store->set("treeduce/all", {'1'});
    store->wait({"treeduce/all"});
    comm_ = host::Communicator::create(opt, &res, &error);
    TORCH_CHECK(comm_, "treeduce: rank ", getRank(), " cannot join job '", opt.job, "': ", error,
                " (", host::to_string(res), ")");
    if (comm_->path() != host::Path::network) reason_ = comm_->path_reason();
  }

  static void check_cpu(const std::vector<at::Tensor>& tensors, const char* what) {
    for (const auto& t : tensors) {
      TORCH_CHECK(t.device().is_cpu(), "treeduce: ", what, " of a ", t.device().str(),
                  " tensor: the treeduce backend takes CPU tensors only");
    }
  }

  void say_gloo(const std::string& what) {
    std::lock_guard<std::mutex> l(mu_);
    if (gloo_said_.insert(what).second && getRank() == 0) {
      std::fprintf(stderr,
                   "treeduce: info: %s goes through Gloo: the network reduces allreduce, reduce, "
                   "broadcast and barrier only\n",
                   what.c_str());
    }
  }

  /// allreduce, allreduce_coalesced (root < 0) and reduce (root >= 0).
  template <typename GlooCall>
  c10::intrusive_ptr<c10d::Work> reduce_impl(std::vector<at::Tensor>& tensors,
                                             const c10d::ReduceOp& rop, int root, c10d::OpType type,
                                             const char* what, GlooCall&& gloo_call) {
    check_cpu(tensors, what);
    const auto op = rop.op_;
    TORCH_CHECK(op != c10d::ReduceOp::PREMUL_SUM,
                "treeduce: PREMUL_SUM is an NCCL operation; the treeduce backend does not take it");
    if (!comm_) return gloo_call();
    std::optional<ReduceOp> top = to_op(op);
    TORCH_CHECK(top, "treeduce: ", what, " with ", op_name(op),
                " is not an operation treeduce knows");
    for (const auto& t : tensors) {
      TORCH_CHECK(!(op == c10d::ReduceOp::AVG && !is_float(t.scalar_type())), "treeduce: ", what,
                  " with AVG of ", c10::toString(t.scalar_type()),
                  ": AVG is defined on floating-point tensors only (an integer average would "
                  "have to round; Gloo refuses AVG altogether)");
    }
    bool any_unknown = false;
    for (const auto& t : tensors) any_unknown |= !to_dtype(t.scalar_type()).has_value();
    if (any_unknown) {
      // Types libtreeduce has no code for (complex, bool): the host path, loudly, per call.
      std::fprintf(stderr,
                   "treeduce: warning: rank %d: %s of %s %s through Gloo: libtreeduce has no "
                   "such element type\n",
                   getRank(), what, c10::toString(tensors[0].scalar_type()), op_name(op));
      TORCH_CHECK(op != c10d::ReduceOp::AVG, "treeduce: ", what,
                  " with AVG of this type is not defined (Gloo refuses AVG)");
      return gloo_call();
    }
    Pending p;
    p.work = c10::make_intrusive<TreeduceWork>(getRank(), type, tensors);
    p.what = std::string(what) + " of " + std::to_string(tensors.size()) + " tensor(s) with " +
             op_name(op);
    std::vector<std::function<void()>> afters;
    for (const at::Tensor& t : tensors) {
      const DType d = *to_dtype(t.scalar_type());
      at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
      const bool keep_result = root < 0 || root == getRank();
      at::Tensor out = keep_result ? buf : at::empty_like(buf);
      host::Request req = 0;
      const Result r = comm_->iallreduce(buf.data_ptr(), out.data_ptr(),
                                         static_cast<std::size_t>(buf.numel()), d, *top, &req);
      if (!started(r, p, req)) break;
      p.keep.push_back(buf);
      p.keep.push_back(out);
      if (!keep_result) continue;
      const bool avg = op == c10d::ReduceOp::AVG;
      const bool copy = !buf.is_same(t);
      const double n = static_cast<double>(getSize());
      if (avg || copy) {
        afters.push_back([t, buf, avg, copy, n]() mutable {
          if (avg) buf.div_(n);
          if (copy) t.copy_(buf);
        });
      }
    }
    if (!afters.empty()) {
      p.after = [afters = std::move(afters)] {
        for (const auto& f : afters) f();
      };
    }
    return submit(std::move(p));
  }

  /// Records a started request, or the error of one that could not start (true: started).
  bool started(Result r, Pending& p, host::Request req) {
    if (r == Result::ok) {
      p.requests.push_back(req);
      return true;
    }
    if (!p.error) p.error = error_of(r, p.what);
    return false;
  }

  std::exception_ptr error_of(Result r, const std::string& what) const {
    // last_error() is per communicator, not per request: with operations of several threads in
    // flight it may be another one's sentence (docs/pytorch.md).
    std::string why = comm_ ? comm_->last_error() : reason_;
    return std::make_exception_ptr(std::runtime_error(
        "treeduce: rank " + std::to_string(getRank()) + ": " + what + " failed (" +
        host::to_string(r) + ")" + (why.empty() ? "" : ": " + why)));
  }

  c10::intrusive_ptr<c10d::Work> submit(Pending p) {
    auto work = p.work;
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_all();
    return work;
  }

  void complete_loop() {
    for (;;) {
      Pending p;
      {
        std::unique_lock<std::mutex> l(mu_);
        busy_ = false;
        cv_.notify_all();  // quiesce() waits for this
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        p = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      std::exception_ptr e = p.error;
      for (host::Request req : p.requests) {
        const Result r = comm_->wait(req);  // every request is consumed, even after an error
        if (r != Result::ok && !e) e = error_of(r, p.what);
      }
      if (!e && p.after) {
        try {
          p.after();
        } catch (...) {
          e = std::current_exception();
        }
      }
      p.keep.clear();
      try {
        p.work->complete(e);
      } catch (const std::exception& x) {
        // A callback of the future threw; the future holds it. Nothing else to do here.
        std::fprintf(stderr, "treeduce: rank %d: a completion callback failed: %s\n", getRank(),
                     x.what());
      }
    }
  }

  std::unique_ptr<host::Communicator> comm_;
  c10::intrusive_ptr<c10d::ProcessGroup> gloo_;
  std::string reason_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> queue_;
  bool stop_ = false;
  bool busy_ = false;  ///< the completion thread is completing an operation (under mu_)
  std::set<std::string> gloo_said_;
  std::thread thread_;
};

void forget_expired_groups() {
  std::lock_guard<std::mutex> l(live_mu);
  std::erase_if(live_groups, [](const auto& w) { return w.expired(); });
}

ProcessGroupTreeduce* as_treeduce(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  auto* p = dynamic_cast<ProcessGroupTreeduce*>(pg.get());
  TORCH_CHECK(p, "treeduce: this process group is a '", pg->getBackendName(),
              "' group, not a treeduce one");
  return p;
}

DType fp8_format(const std::string& f) {
  if (f == "e4m3") return DType::e4m3;
  if (f == "e5m2") return DType::e5m2;
  TORCH_CHECK(false, "treeduce: FP8 format '", f, "' is neither e4m3 nor e5m2");
}

}  // namespace
}  // namespace treeduce::torchpg

PYBIND11_MODULE(_C, m) {
  using namespace treeduce::torchpg;
  m.doc() = "treeduce's torch.distributed process group (docs/pytorch.md)";
  m.def(
      "_quiesce_all",
      [] {
        py::gil_scoped_release unlocked;  // the completion threads' callbacks need it
        std::vector<c10::intrusive_ptr<ProcessGroupTreeduce>> groups;
        {
          std::lock_guard<std::mutex> l(live_mu);
          for (const auto& w : live_groups) {
            if (auto g = w.lock()) groups.push_back(std::move(g));
          }
        }
        for (const auto& g : groups) g->quiesce();
      },
      "Waits until every live treeduce group has completed what it started (atexit).");
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, const c10::intrusive_ptr<c10d::ProcessGroup>& gloo) {
        auto pg = c10::make_intrusive<ProcessGroupTreeduce>(store, rank, size, timeout, gloo);
        {
          std::lock_guard<std::mutex> l(live_mu);
          live_groups.emplace_back(pg);
        }
        return c10::intrusive_ptr<c10d::ProcessGroup>(pg);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("gloo"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "info",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg) { return as_treeduce(pg)->info(); },
      "Path, reason and counters of a treeduce group");
  m.def(
      "offloads",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::ScalarType t, int op) {
        return as_treeduce(pg)->offloads(t, static_cast<c10d::ReduceOp::RedOpType>(op));
      },
      "Whether (dtype, ReduceOp) is reduced in the network now");
  m.def(
      "fp8_allreduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor t, const std::string& f,
         bool average) {
        return c10::intrusive_ptr<c10d::Work>(
            as_treeduce(pg)->fp8_allreduce(std::move(t), fp8_format(f), average));
      },
      py::arg("group"), py::arg("tensor"), py::arg("format"), py::arg("average") = true,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "raw_allreduce",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor t) {
        as_treeduce(pg)->raw_allreduce(std::move(t));
      },
      "libtreeduce's blocking allreduce (SUM) in place, without the backend's Work (benchmarks)",
      py::arg("group"), py::arg("tensor"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "fp8_round",
      [](at::Tensor t, const std::string& f) {
        TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous(),
                    "treeduce: fp8_round takes a contiguous float32 tensor");
        const treeduce::DType d = fp8_format(f);
        float* x = t.data_ptr<float>();
        for (std::int64_t i = 0; i < t.numel(); ++i) {
          x[i] = d == treeduce::DType::e4m3
                     ? treeduce::agg::e4m3_to_f32(treeduce::agg::f32_to_e4m3(x[i]))
                     : treeduce::agg::e5m2_to_f32(treeduce::agg::f32_to_e5m2(x[i]));
        }
        return t;
      },
      "Rounds a float32 tensor in place to the nearest FP8 value (ties to even, e4m3 saturating)",
      py::arg("tensor"), py::arg("format"), py::call_guard<py::gil_scoped_release>());
}
