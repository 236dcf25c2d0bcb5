// HostPath (host_path.h): the rendezvous, the operation-index check, the reduction.
#include "host_path.h"

#include <arpa/inet.h>

#include <algorithm>

namespace treeduce::host {

namespace {
bool is_ipv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}
}  // namespace

treeduce::Status HostPath::connect() {
  if (reducer_) return treeduce::Status::Ok();
  if (!error_.ok()) return error_;
  HostReducerOptions h;
  h.job = opt_.job;
  h.rank = opt_.rank;
  h.world_size = opt_.world_size;
  h.store_dir =
      !opt_.fallback_store.empty() ? opt_.fallback_store : "/tmp/treeduce-gloo-" + opt_.job;
  h.bind_address = !opt_.fallback_address.empty() ? opt_.fallback_address
                   : !opt_.bind_address.empty()   ? opt_.bind_address
                   : is_ipv4(opt_.host)           ? opt_.host
                                                  : "127.0.0.1";
  h.timeout_ms = std::max(opt_.join_timeout_ms, opt_.op_timeout_ms);
  auto r = make_gloo_reducer(h);
  if (!r.ok()) {
    error_ = treeduce::Status(Code::aborted, "Host-side reduction could not connect the ranks: " +
                                                 as_phrase(r.status().message()) + ".");
    return error_;
  }
  reducer_ = std::move(r).value();
  return treeduce::Status::Ok();
}

treeduce::Status HostPath::run(const Operation& o, const void* send, std::uint64_t op_index) {
  if (auto s = connect(); !s.ok()) return s;
  // Every rank runs the same sequence of operations, but a switch that dies mid-collective can
  // leave one rank with the result of operation k and another without: the first falls back at
  // k+1, the second at k, and their host-side operations would pair k+1 with k. So each host
  // operation first checks, with a 2-element allreduce, that all ranks are at the same one; a
  // mismatch is an error on every rank, never a wrong result. Costs one small Gloo collective
  // per host-side operation (docs/host.md, "Failures").
  const auto idx = static_cast<std::int32_t>(op_index & 0x3FFFFFFF);
  std::int32_t at[2] = {idx, -idx};
  if (auto e = reducer_->allreduce(at, at, 2, DType::i32, ReduceOp::max); !e.ok()) {
    return treeduce::Status(Code::aborted,
                            "Host-side reduction failed: " + as_phrase(e.message()) + ".");
  }
  if (at[0] != -at[1]) {
    return treeduce::Status(
        Code::aborted,
        "The ranks disagree on which collective the network path failed at (this rank is at "
        "operation " +
            std::to_string(idx) + ", another at " + std::to_string(at[0] == idx ? -at[1] : at[0]) +
            "): the job cannot go on safely; restart it.");
  }
  if (auto e = reducer_->allreduce(send, o.recv, o.count, o.dtype, o.op); !e.ok()) {
    return treeduce::Status(Code::aborted,
                            "Host-side reduction failed: " + as_phrase(e.message()) + ".");
  }
  return treeduce::Status::Ok();
}

}  // namespace treeduce::host
