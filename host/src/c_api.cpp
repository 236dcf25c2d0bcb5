// The C API (treeduce/treeduce.h) over the C++ Communicator. Every entry point catches every
// exception: a C caller cannot unwind through C++ frames, so anything thrown becomes
// tdr_internal with the exception's text as the last error.
#include "treeduce/treeduce.h"

#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>

#include "environment.h"
#include "errors.h"
#include "treeduce/common/tls_options.h"  // tls::from_environment
#include "treeduce/host/communicator.h"

using treeduce::DType;
using treeduce::ReduceOp;
using treeduce::host::Communicator;
using treeduce::host::Options;
using treeduce::host::Path;
using treeduce::host::Result;

// The C handle: the communicator. The C++ object keeps its own last error; this layer keeps
// nothing else.
struct tdr_comm {
  std::unique_ptr<Communicator> impl;
};

// The enums' values are the C++ ones, so conversions are casts; pin that here.
static_assert(static_cast<int>(Result::internal) == tdr_internal);
static_assert(static_cast<int>(Result::in_progress) == tdr_in_progress);
// Every type and operation, one by one: a code appended on one side only fails the build.
static_assert(static_cast<int>(DType::f32) == tdr_f32 && static_cast<int>(DType::f16) == tdr_f16 &&
              static_cast<int>(DType::bf16) == tdr_bf16 &&
              static_cast<int>(DType::e4m3) == tdr_e4m3 &&
              static_cast<int>(DType::e5m2) == tdr_e5m2 &&
              static_cast<int>(DType::i32) == tdr_i32 && static_cast<int>(DType::i8) == tdr_i8 &&
              static_cast<int>(DType::u8) == tdr_u8 && static_cast<int>(DType::i16) == tdr_i16 &&
              static_cast<int>(DType::u16) == tdr_u16 && static_cast<int>(DType::u32) == tdr_u32 &&
              static_cast<int>(DType::i64) == tdr_i64 && static_cast<int>(DType::u64) == tdr_u64 &&
              static_cast<int>(DType::f64) == tdr_f64 &&
              static_cast<int>(DType::f32_i32) == tdr_f32_i32 &&
              static_cast<int>(DType::f64_i32) == tdr_f64_i32 &&
              static_cast<int>(DType::i32_i32) == tdr_i32_i32);
static_assert(treeduce::kNumDTypes == tdr_i32_i32 + 1, "a DType the C API lacks");
static_assert(
    static_cast<int>(ReduceOp::sum) == tdr_sum && static_cast<int>(ReduceOp::min) == tdr_min &&
    static_cast<int>(ReduceOp::max) == tdr_max && static_cast<int>(ReduceOp::prod) == tdr_prod &&
    static_cast<int>(ReduceOp::band) == tdr_band && static_cast<int>(ReduceOp::bor) == tdr_bor &&
    static_cast<int>(ReduceOp::bxor) == tdr_bxor && static_cast<int>(ReduceOp::land) == tdr_land &&
    static_cast<int>(ReduceOp::lor) == tdr_lor && static_cast<int>(ReduceOp::lxor) == tdr_lxor &&
    static_cast<int>(ReduceOp::minloc) == tdr_minloc &&
    static_cast<int>(ReduceOp::maxloc) == tdr_maxloc);
static_assert(treeduce::kNumReduceOps == tdr_maxloc + 1, "a ReduceOp the C API lacks");
static_assert(sizeof(tdr_options_t::static_dtype_mask) * 8 >= treeduce::kNumDTypes &&
              sizeof(tdr_options_t::static_op_mask) * 8 >= treeduce::kNumReduceOps);
static_assert(static_cast<int>(Path::host) == tdr_path_host);

namespace {

// Errors this layer finds itself (NULL pointers, enum values out of range, exceptions), per
// thread: those of calls without a communicator, and the last one of a call on a communicator
// with that communicator (tdr_last_error(comm) shows it until this thread's next call on comm,
// since the C++ object never saw the call). Plus the storage behind the strings
// tdr_last_error() and tdr_path_reason() return.
thread_local std::string t_error;
thread_local std::string t_comm_error;
thread_local const tdr_comm_t* t_comm_error_owner = nullptr;
thread_local std::string t_returned_error;
thread_local std::string t_returned_reason;
thread_local std::string t_returned_fallback;

tdr_result_t fail(const tdr_comm_t* comm, tdr_result_t r, std::string why) {
  if (comm == nullptr) {
    t_error = std::move(why);
  } else {
    t_comm_error = std::move(why);
    t_comm_error_owner = comm;
  }
  return r;
}

tdr_result_t to_c(Result r) { return static_cast<tdr_result_t>(r); }

// Runs `f` (returning Result) for a call on `comm` (nullptr: none) and turns any exception into
// tdr_internal.
template <class F>
tdr_result_t guarded(const tdr_comm_t* comm, F&& f) noexcept {
  if (comm != nullptr && t_comm_error_owner == comm) t_comm_error_owner = nullptr;
  try {
    return to_c(f());
  } catch (const std::bad_alloc&) {
    return fail(comm, tdr_internal, "Memory ran out.");
  } catch (const std::exception& e) {
    return fail(comm, tdr_internal, std::string("Internal error: ") + e.what() + ".");
  } catch (...) {
    return fail(comm, tdr_internal, "Internal error: an unknown exception.");
  }
}

tdr_result_t null_comm() {
  return fail(nullptr, tdr_invalid_argument, "The communicator is NULL.");
}

// C enums arrive as any int: check the range before a cast (DType is 8 bits wide, so 261 would
// otherwise become i32).
bool valid(tdr_dtype_t d) { return d >= tdr_f32 && d <= tdr_i32_i32; }
bool valid(tdr_op_t op) { return op >= tdr_sum && op <= tdr_maxloc; }

tdr_result_t bad_enums(const tdr_comm_t* comm, tdr_dtype_t d, tdr_op_t op) {
  return fail(
      comm, tdr_invalid_argument,
      !valid(d)
          ? "The element type " + std::to_string(static_cast<long>(d)) + " is not a tdr_dtype_t."
          : "The operation " + std::to_string(static_cast<long>(op)) + " is not a tdr_op_t.");
}

std::string str(const char* s) { return s != nullptr ? std::string(s) : std::string(); }

tdr_result_t create(const Options& opt, tdr_comm_t** comm) {
  Result r = Result::internal;
  std::string error;
  auto c = std::make_unique<tdr_comm>();
  c->impl = Communicator::create(opt, &r, &error);
  if (!c->impl) return fail(nullptr, to_c(r), error);
  *comm = c.release();
  return tdr_ok;
}

}  // namespace

extern "C" {

void tdr_options_init(tdr_options_t* opt) {
  if (opt == nullptr) return;
  const Options d;
  *opt = tdr_options_t{};
  opt->rank = d.rank;
  opt->world_size = d.world_size;
  opt->port = d.port;
  opt->slots = d.slots;
  opt->payload_bytes = d.payload_bytes;
  opt->deterministic = d.deterministic ? 1 : 0;
  opt->path = static_cast<tdr_path_t>(d.path);
  opt->join_timeout_ms = d.join_timeout_ms;
  opt->op_timeout_ms = d.op_timeout_ms;
  opt->static_tree_id = d.static_tree.tree_id;
  opt->static_key = d.static_tree.key;
  opt->static_child_index = d.static_tree.child_index;
  opt->static_slots = d.static_tree.slots;
  opt->static_payload_bytes = d.static_tree.payload_bytes;
  opt->static_dtype_mask = d.static_tree.dtype_mask;
  opt->static_op_mask = d.static_tree.op_mask;
}

tdr_result_t tdr_comm_create_from_env(tdr_comm_t** comm) {
  if (comm == nullptr)
    return fail(nullptr, tdr_invalid_argument, "The communicator pointer is NULL.");
  *comm = nullptr;
  return guarded(nullptr, [&] {
    Options opt;
    std::string error;
    const Result r = treeduce::host::options_from_environment(&opt, &error);
    if (r != Result::ok) return static_cast<Result>(fail(nullptr, to_c(r), error));
    return static_cast<Result>(create(opt, comm));
  });
}

tdr_result_t tdr_comm_create(const tdr_options_t* opt, tdr_comm_t** comm) {
  if (comm == nullptr)
    return fail(nullptr, tdr_invalid_argument, "The communicator pointer is NULL.");
  *comm = nullptr;
  if (opt == nullptr) return fail(nullptr, tdr_invalid_argument, "The options pointer is NULL.");
  if (opt->path < tdr_path_auto || opt->path > tdr_path_host) {
    return fail(
        nullptr, tdr_invalid_argument,
        "The path " + std::to_string(static_cast<long>(opt->path)) + " is not a tdr_path_t.");
  }
  return guarded(nullptr, [&] {
    Options o;
    o.job = str(opt->job);
    o.rank = opt->rank;
    o.world_size = opt->world_size;
    o.manager = str(opt->manager);
    // The C options have no TLS fields: their files come from the environment (docs/host.md).
    std::string tls_error;
    const treeduce::tls::TlsOptions te = treeduce::tls::from_environment(&tls_error);
    if (!tls_error.empty())
      return static_cast<Result>(fail(nullptr, tdr_invalid_argument, tls_error));
    o.tls_ca = te.ca;
    o.tls_cert = te.cert;
    o.tls_key = te.key;
    o.tls_server_name = te.server_name;
    o.insecure = te.insecure;
    o.host = str(opt->host);
    o.bind_address = str(opt->bind_address);
    o.port = opt->port;
    o.slots = opt->slots;
    o.payload_bytes = opt->payload_bytes;
    o.deterministic = opt->deterministic != 0;
    o.path = static_cast<Path>(opt->path);
    o.join_timeout_ms = opt->join_timeout_ms;
    o.op_timeout_ms = opt->op_timeout_ms;
    o.fallback_store = str(opt->fallback_store);
    o.fallback_address = str(opt->fallback_address);
    o.static_tree.leaf_address = str(opt->static_leaf_address);
    o.static_tree.tree_id = opt->static_tree_id;
    o.static_tree.key = opt->static_key;
    o.static_tree.child_index = opt->static_child_index;
    o.static_tree.slots = opt->static_slots;
    o.static_tree.payload_bytes = opt->static_payload_bytes;
    o.static_tree.dtype_mask = opt->static_dtype_mask;
    o.static_tree.op_mask = opt->static_op_mask;
    // tdr_options_t has no transport fields: the transport's variables choose it, as they do for
    // tdr_comm_create_from_env().
    const treeduce::Status t = treeduce::host::parse_transport_environment(
        [](const char* n) { return std::getenv(n); }, &o.transport);
    if (!t.ok()) {
      // The other ranks are told through the manager, as tdr_comm_create_from_env() does.
      const std::string told =
          treeduce::host::report_unstartable({o.manager, o.job, o.rank}, t.message());
      return static_cast<Result>(
          fail(nullptr, to_c(treeduce::host::to_result(t)), t.message() + " " + told));
    }
    return static_cast<Result>(create(o, comm));
  });
}

void tdr_comm_destroy(tdr_comm_t* comm) {
  if (comm != nullptr && t_comm_error_owner == comm) t_comm_error_owner = nullptr;
  delete comm;
}

tdr_result_t tdr_allreduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                           tdr_dtype_t dtype, tdr_op_t op) {
  if (comm == nullptr) return null_comm();
  if (!valid(dtype) || !valid(op)) return bad_enums(comm, dtype, op);
  return guarded(comm, [&] {
    return comm->impl->allreduce(send, recv, count, static_cast<DType>(dtype),
                                 static_cast<ReduceOp>(op));
  });
}

tdr_result_t tdr_iallreduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                            tdr_dtype_t dtype, tdr_op_t op, tdr_request_t* req) {
  if (comm == nullptr) return null_comm();
  if (!valid(dtype) || !valid(op)) return bad_enums(comm, dtype, op);
  return guarded(comm, [&] {
    return comm->impl->iallreduce(send, recv, count, static_cast<DType>(dtype),
                                  static_cast<ReduceOp>(op), req);
  });
}

tdr_result_t tdr_test(tdr_comm_t* comm, tdr_request_t req) {
  if (comm == nullptr) return null_comm();
  return guarded(comm, [&] { return comm->impl->test(req); });
}

tdr_result_t tdr_wait(tdr_comm_t* comm, tdr_request_t req) {
  if (comm == nullptr) return null_comm();
  return guarded(comm, [&] { return comm->impl->wait(req); });
}

tdr_result_t tdr_reduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                        tdr_dtype_t dtype, tdr_op_t op, uint32_t root) {
  if (comm == nullptr) return null_comm();
  if (!valid(dtype) || !valid(op)) return bad_enums(comm, dtype, op);
  return guarded(comm, [&] {
    return comm->impl->reduce(send, recv, count, static_cast<DType>(dtype),
                              static_cast<ReduceOp>(op), root);
  });
}

tdr_result_t tdr_broadcast(tdr_comm_t* comm, void* buf, size_t count, tdr_dtype_t dtype,
                           uint32_t root) {
  if (comm == nullptr) return null_comm();
  if (!valid(dtype)) return bad_enums(comm, dtype, tdr_sum);
  return guarded(
      comm, [&] { return comm->impl->broadcast(buf, count, static_cast<DType>(dtype), root); });
}

tdr_result_t tdr_barrier(tdr_comm_t* comm) {
  if (comm == nullptr) return null_comm();
  return guarded(comm, [&] { return comm->impl->barrier(); });
}

tdr_result_t tdr_comm_rank(const tdr_comm_t* comm, uint32_t* rank) {
  if (comm == nullptr) return null_comm();
  if (rank == nullptr) return fail(comm, tdr_invalid_argument, "The rank pointer is NULL.");
  *rank = comm->impl->rank();
  return tdr_ok;
}

tdr_result_t tdr_comm_size(const tdr_comm_t* comm, uint32_t* size) {
  if (comm == nullptr) return null_comm();
  if (size == nullptr) return fail(comm, tdr_invalid_argument, "The size pointer is NULL.");
  *size = comm->impl->world_size();
  return tdr_ok;
}

int tdr_offloads(const tdr_comm_t* comm, tdr_dtype_t dtype, tdr_op_t op) {
  if (comm == nullptr || !valid(dtype) || !valid(op)) return 0;
  try {
    return comm->impl->offloads(static_cast<DType>(dtype), static_cast<ReduceOp>(op)) ? 1 : 0;
  } catch (...) {
    return 0;
  }
}

const char* tdr_fallback_reason(const tdr_comm_t* comm) {
  try {
    t_returned_fallback =
        comm != nullptr ? comm->impl->stats().fallback_reason : "The communicator is NULL.";
  } catch (...) {
    t_returned_fallback.clear();
  }
  return t_returned_fallback.c_str();
}

tdr_path_t tdr_path(const tdr_comm_t* comm) {
  if (comm == nullptr) return tdr_path_host;
  try {
    return static_cast<tdr_path_t>(comm->impl->path());
  } catch (...) {
    return tdr_path_host;
  }
}

const char* tdr_path_reason(const tdr_comm_t* comm) {
  try {
    t_returned_reason = comm != nullptr ? comm->impl->path_reason() : "The communicator is NULL.";
  } catch (...) {
    t_returned_reason.clear();
  }
  return t_returned_reason.c_str();
}

tdr_result_t tdr_get_stats(const tdr_comm_t* comm, tdr_stats_t* out) {
  if (comm == nullptr) return null_comm();
  if (out == nullptr) return fail(comm, tdr_invalid_argument, "The stats pointer is NULL.");
  return guarded(comm, [&] {
    const treeduce::host::Stats s = comm->impl->stats();
    out->network_ops = s.network_ops;
    out->fallback_ops = s.fallback_ops;
    out->retransmits = s.retransmits;
    out->bytes = s.bytes;
    return Result::ok;
  });
}

const char* tdr_last_error(const tdr_comm_t* comm) {
  try {
    t_returned_error = comm == nullptr              ? t_error
                       : comm == t_comm_error_owner ? t_comm_error
                                                    : comm->impl->last_error();
  } catch (...) {
    t_returned_error.clear();
  }
  return t_returned_error.c_str();
}

const char* tdr_result_string(tdr_result_t r) {
  return r >= tdr_ok && r <= tdr_internal ? treeduce::host::to_string(static_cast<Result>(r))
                                          : "unknown";
}

}  // extern "C"
