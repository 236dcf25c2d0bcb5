// libtreeduce-mpi: MPI's collectives through treeduce switches, for programs that know nothing of
// treeduce (docs/mpi.md). Every MPI_X defined here overrides Open MPI's and calls PMPI_X for what
// it does not offload.
//
// Per communicator, a CommState in a communicator attribute (deleted with the communicator):
// unjoined until its first offloadable collective, then joined to a treeduce job of its own (on
// path network: the fallback is PMPI, not libtreeduce's host path) or passed through for good.
// Every decision is one every rank takes alike: the variables are agreed at MPI_Init, the join
// and every offloaded operation's outcome are agreed with a PMPI_Allreduce (MIN of an ok flag) on
// a private duplicate of the communicator, so that a failure on one rank makes every rank redo
// the operation through PMPI from the same inputs and pass the communicator through from then on.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "config.h"
#include "mapping.h"
#include "treeduce/host/communicator.h"

namespace treeduce::mpi {
namespace {

// libtreeduce's C++ communicator: the C API has no way to make one from the environment but for
// the variables this library gives per communicator (create_tdr). Its enums are the C API's
// values (c_api.cpp pins that), so conversions are casts.
using TdrComm = treeduce::host::Communicator;
tdr_result_t to_c(treeduce::host::Result r) { return static_cast<tdr_result_t>(r); }
treeduce::DType to_cpp(tdr_dtype_t d) { return static_cast<treeduce::DType>(d); }
treeduce::ReduceOp to_cpp(tdr_op_t o) { return static_cast<treeduce::ReduceOp>(o); }

// What the counters of one communicator hold, printed at MPI_Finalize with TREEDUCE_MPI_STATS=1.
struct Counters {
  std::map<std::string, std::uint64_t> offloaded;                       // by collective
  std::map<std::pair<std::string, std::string>, std::uint64_t> passed;  // (collective, reason)
};

struct CommState;

// treeduce's types (tdr_f32 .. tdr_i32_i32) and operations (tdr_sum .. tdr_maxloc).
constexpr int kTdrDtypes = static_cast<int>(tdr_i32_i32) + 1;
constexpr int kTdrOps = static_cast<int>(tdr_maxloc) + 1;

// An offloaded MPI_Iallreduce: a generalized request that the interposer's progress thread
// completes once its in-network operation and every rank's agreement on it are done (and, after a
// failure, its redo through PMPI).
struct PendingOp {
  enum class Stage : std::uint8_t { running, agreeing, redoing };
  CommState* comm = nullptr;
  MPI_Request greq = MPI_REQUEST_NULL;
  treeduce::host::Request req = 0;
  Stage stage = Stage::running;
  bool started = false;  // tdr_iallreduce started (else it failed at once: agree on the failure)
  int ok = 0;            // this rank's outcome, then (agreed) every rank's
  MPI_Request mpi_req = MPI_REQUEST_NULL;  // the agreement's, then the redo's
  // For a redo through PMPI: the inputs (a copy when in place: results overwrite them).
  const void* send = nullptr;
  void* recv = nullptr;
  int count = 0;
  MPI_Datatype dtype = MPI_DATATYPE_NULL;
  MPI_Op op = MPI_OP_NULL;
  std::vector<unsigned char> saved;
};

enum class JoinState : std::uint8_t { unjoined, joined, passthrough };

struct CommState {
  std::string label;
  int rank = 0;
  int size = 0;
  bool inter = false;
  JoinState state = JoinState::unjoined;
  std::string why_passthrough;      // once state is passthrough
  std::unique_ptr<TdrComm> tdr;     // its treeduce job's communicator, while joined
  MPI_Comm shadow = MPI_COMM_NULL;  // a duplicate for agreements and redos
  int port_slot = -1;
  std::string job;
  bool had_job = false;                     // joined its job at some point (the counters name it)
  bool offloads[kTdrDtypes][kTdrOps] = {};  // tdr_offloads() at join: decisions never change later
  std::deque<PendingOp*> pending;  // offloaded Iallreduces in start order (under Global::mu)
  // The progress thread's news of a failed MPI_Iallreduce (under Global::mu): it becomes the
  // communicator's pass-through at the next drain, where every rank knows the same agreements.
  std::string failed;
  Counters counters;
  bool finished = false;  // left its job (freed, or MPI_Finalize)
};

constexpr int kPortSlots = 16;
// A communicator's UDP port: TREEDUCE_PORT (or this) + kPortSlots x the process's local rank on
// its host + its slot, so that no two processes of a host share one however many ranks it has.
constexpr std::uint32_t kDefaultPortBase = 29000;

struct Global {
  bool active = false;  // MPI_Init went through us and the interposer is set up
  Config cfg;
  std::string off_reason = "TREEDUCE_MPI=off";  // why every call passes through, in mode off
  int keyval = MPI_KEYVAL_INVALID;
  int world_rank = 0;
  std::string job_base;
  std::uint32_t port_base = kDefaultPortBase;
  std::string port_error;  // TREEDUCE_PORT is malformed: every communicator passes through
  int local_rank = 0;      // among the processes of this host (MPI_COMM_TYPE_SHARED)
  std::atomic<int> join_counter{0};
  // Set when a join could not reach the manager or the network: later communicators do not wait
  // for their join timeout again (every rank of them agrees before anyone tries).
  std::string join_broken;  // under mu
  std::atomic<int> comm_counter{0};
  bool port_used[kPortSlots] = {};
  std::vector<std::unique_ptr<CommState>> states;  // every communicator's, for the counters
  std::mutex mu;                                   // states, ports, pending operations, counters
  std::condition_variable cv;    // an operation was queued (the thread) or completed (drains)
  bool thread_multiple = false;  // MPI provides MPI_THREAD_MULTIPLE: the progress thread may run
  std::thread progress;
  bool stopping = false;    // under mu
  bool queued = false;      // under mu: an operation was queued since the thread last looked
  std::string freed_stats;  // under mu: the counters of freed communicators (stats_text)
};

// How long the progress thread waits between polls of operations that are not done: from
// kPollFirst after something moved, doubling while nothing does, up to kPollMax. Ranks,
// libtreeduce's threads and a software switch may share few CPUs: four threads polling every
// 50 us starved the lab's switch into timeouts on a loaded 2-vCPU machine.
constexpr std::chrono::microseconds kPollFirst{50};
constexpr std::chrono::microseconds kPollMax{1000};

Global& g() {
  static Global* glob = new Global;  // never destroyed: attribute callbacks may run at exit
  return *glob;
}

void warn(const CommState* s, const std::string& what) {
  std::fprintf(stderr, "treeduce-mpi: warning: rank %d: %s: %s\n", g().world_rank,
               s != nullptr ? s->label.c_str() : "MPI", what.c_str());
}

// ---------------------------------------------------------------------------------------------
// Communicator state

void leave(CommState* s);

void forget(CommState* s);

// The communicator is freed (MPI_Comm_free, or MPI_Finalize for the predefined ones): its job is
// left and its state goes.
int delete_attr(MPI_Comm, int, void* attr, void*) {
  auto* s = static_cast<CommState*>(attr);
  if (s != nullptr) {
    leave(s);
    forget(s);
  }
  return MPI_SUCCESS;
}

CommState* new_state(MPI_Comm comm, std::string label) {
  auto st = std::make_unique<CommState>();
  st->label = std::move(label);
  int inter = 0;
  PMPI_Comm_test_inter(comm, &inter);
  st->inter = inter != 0;
  if (st->inter) {
    PMPI_Comm_rank(comm, &st->rank);
    PMPI_Comm_remote_size(comm, &st->size);
  } else {
    PMPI_Comm_rank(comm, &st->rank);
    PMPI_Comm_size(comm, &st->size);
  }
  CommState* s = st.get();
  {
    std::lock_guard lk(g().mu);
    g().states.push_back(std::move(st));
  }
  PMPI_Comm_set_attr(comm, g().keyval, s);
  return s;
}

CommState* state_of(MPI_Comm comm) {
  if (comm == MPI_COMM_NULL) return nullptr;
  void* attr = nullptr;
  int flag = 0;
  if (PMPI_Comm_get_attr(comm, g().keyval, &attr, &flag) != MPI_SUCCESS) return nullptr;
  if (flag != 0) return static_cast<CommState*>(attr);
  std::string label;
  if (comm == MPI_COMM_WORLD) {
    label = "MPI_COMM_WORLD";
  } else if (comm == MPI_COMM_SELF) {
    label = "MPI_COMM_SELF";
  } else {
    label = "communicator " + std::to_string(++g().comm_counter);
  }
  return new_state(comm, label);
}

// Leaves the communicator's treeduce job, if it has one, and gives its port slot back. Only when
// none of its operations is pending (the progress thread no longer uses its tdr).
void release_job(CommState* s) {
  s->tdr.reset();
  if (s->port_slot >= 0) {
    std::lock_guard lk(g().mu);
    g().port_used[s->port_slot] = false;
    s->port_slot = -1;
  }
}

// From now on every collective of the communicator passes through; its job is left at once (a
// failed communicator keeps neither its job nor its port). Called with nothing pending on it.
void go_passthrough(CommState* s, const std::string& why, bool say) {
  release_job(s);
  s->state = JoinState::passthrough;
  s->why_passthrough = why;
  if (say) warn(s, "every collective passes through to MPI from now on: " + why);
}

// Reads libtreeduce's options with its one parser (manager, host, transport, timeouts: every
// TREEDUCE_* exactly as for a program of its own), with this communicator's job, rank, size, port
// and path given as overrides, and joins the job. No lock: the join blocks until every rank
// joined, and threads joining other communicators (in another order on other ranks) must not
// wait for it.
std::unique_ptr<TdrComm> create_tdr(const CommState* s, std::uint16_t port, tdr_result_t* result,
                                    std::string* error) {
  treeduce::host::Options opt;
  treeduce::host::Result r = treeduce::host::Result::ok;
  // This communicator's job, rank, size, port and path are read in place of the environment's,
  // which stays as it is (setenv() would race with the program's own getenv() in other threads).
  const std::map<std::string, std::string> overrides = {
      {"TREEDUCE_JOB", s->job},
      {"TREEDUCE_RANK", std::to_string(s->rank)},
      {"TREEDUCE_WORLD_SIZE", std::to_string(s->size)},
      {"TREEDUCE_PORT", std::to_string(port)},
      {"TREEDUCE_PATH", "network"},
  };
  try {
    r = treeduce::host::options_from_environment(&opt, error, overrides);
  } catch (const std::exception& e) {
    r = treeduce::host::Result::internal;
    *error = e.what();
  }
  std::unique_ptr<TdrComm> comm;
  if (r == treeduce::host::Result::ok) {
    try {
      comm = TdrComm::create(opt, &r, error);
    } catch (const std::exception& e) {
      r = treeduce::host::Result::internal;
      *error = e.what();
    }
    if (comm) r = treeduce::host::Result::ok;
  }
  *result = to_c(r);
  return comm;
}

std::string broken_join() {
  std::lock_guard lk(g().mu);
  return g().join_broken;
}

// Joins the communicator's own treeduce job: collective, at its first offloadable call, which
// every rank reaches alike. Any rank's failure passes the communicator through on every rank.
void join(CommState* s, MPI_Comm comm) {
  if (PMPI_Comm_dup(comm, &s->shadow) != MPI_SUCCESS) {
    go_passthrough(s, "MPI_Comm_dup of it failed", true);
    return;
  }
  std::string local_why;
  {
    std::lock_guard lk(g().mu);
    for (int i = 0; i < kPortSlots; ++i) {
      if (!g().port_used[i]) {
        s->port_slot = i;
        g().port_used[i] = true;
        break;
      }
    }
  }
  const std::uint32_t port = g().port_base +
                             static_cast<std::uint32_t>(g().local_rank) * kPortSlots +
                             static_cast<std::uint32_t>(s->port_slot);
  if (!g().port_error.empty()) {
    local_why = g().port_error;
  } else if (s->port_slot >= 0 && port > 65535) {
    local_why = "its UDP port would be " + std::to_string(port) + " (TREEDUCE_PORT " +
                std::to_string(g().port_base) + " + " + std::to_string(kPortSlots) +
                " x local rank " + std::to_string(g().local_rank) +
                " + slot), above 65535: lower TREEDUCE_PORT";
  } else if (s->port_slot < 0) {
    local_why = "this process already has " + std::to_string(kPortSlots) +
                " communicators in treeduce jobs (free one)";
  } else if (g().job_base.empty()) {
    local_why = "TREEDUCE_JOB is not set (it names the job every communicator's job derives from)";
  } else if (std::string broken = broken_join(); !broken.empty()) {
    local_why =
        "an earlier communicator's join failed here, so this one does not wait for its "
        "join timeout: " +
        broken;
  }
  // The job name: rank 0's, from its world rank and its own counter, so that every job is new.
  long long name[2] = {g().world_rank, 0};
  if (s->rank == 0) name[1] = ++g().join_counter;
  PMPI_Bcast(name, 2, MPI_LONG_LONG, 0, s->shadow);
  s->job = g().job_base + "-c" + std::to_string(name[0]) + "-" + std::to_string(name[1]);
  int ok = local_why.empty() ? 1 : 0;
  PMPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->shadow);
  if (ok != 0) {
    tdr_result_t r = tdr_ok;
    std::string error;
    s->tdr = create_tdr(s, static_cast<std::uint16_t>(port), &r, &error);
    if (r != tdr_ok) {
      local_why = std::string("joining treeduce job '") + s->job + "' failed: " + error;
      if (r == tdr_unavailable || r == tdr_timeout) {
        std::lock_guard lk(g().mu);
        g().join_broken = local_why;
      }
    } else if (s->tdr->path() != treeduce::host::Path::network) {
      local_why = std::string("treeduce job '") + s->job +
                  "' has no network path: " + s->tdr->path_reason();
    }
    ok = local_why.empty() ? 1 : 0;
    PMPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->shadow);
  }
  if (ok == 0) {
    go_passthrough(s,
                   local_why.empty() ? "another rank could not join its treeduce job '" + s->job +
                                           "' (its warning says why)"
                                     : local_why,
                   true);
    return;
  }
  for (int d = 0; d < kTdrDtypes; ++d) {
    for (int o = 0; o < kTdrOps; ++o) {
      s->offloads[d][o] =
          s->tdr->offloads(to_cpp(static_cast<tdr_dtype_t>(d)), to_cpp(static_cast<tdr_op_t>(o)));
    }
  }
  s->state = JoinState::joined;
  s->had_job = true;
}

// ---------------------------------------------------------------------------------------------
// Decisions

std::string bytes_str(std::uint64_t b) { return std::to_string(b) + " bytes"; }

// The bytes `count` elements of a predefined datatype span in memory: by its extent, not its
// size (MPI_DOUBLE_INT holds 12 bytes of data in 16), for the copy of an in-place buffer.
std::size_t span_bytes(MPI_Datatype dtype, int count) {
  MPI_Aint lb = 0, extent = 0;
  PMPI_Type_get_extent(dtype, &lb, &extent);
  return static_cast<std::size_t>(count) * static_cast<std::size_t>(extent);
}

// The reason a call passes through, or nullopt when it is offloaded (then *d and *o are set;
// the communicator is joined). Everything it looks at is the same on every rank.
std::optional<std::string> decide(CommState* s, MPI_Comm comm, MPI_Datatype dtype, MPI_Op op,
                                  int count, bool reduction, tdr_dtype_t* d, tdr_op_t* o,
                                  std::uint64_t* bytes) {
  const Config& cfg = g().cfg;
  if (cfg.mode == Mode::off) return g().off_reason;
  if (s->inter) return std::string("an intercommunicator");
  if (s->size < 2) return std::string("a communicator of one rank");
  if (s->state == JoinState::passthrough) return s->why_passthrough;
  if (count < 0) return std::string("a negative count");
  *bytes = 0;
  if (reduction) {
    const auto md = map_dtype(dtype);
    if (!md) return dtype_name(dtype) + " has no treeduce type";
    const auto mo = map_op(op);
    if (!mo) return op_name(op) + " is not one of MPI's predefined reductions";
    if (dtype == MPI_BYTE && *mo != tdr_band && *mo != tdr_bor && *mo != tdr_bxor) {
      return "MPI_BYTE with " + op_name(op) + " (MPI defines only the bitwise operations on it)";
    }
    if (const auto why = undefined_pair(*md, *mo)) {
      return dtype_name(dtype) + " with " + op_name(op) + " is not a reduction MPI defines (" +
             *why + ")";
    }
    *d = *md;
    *o = *mo;
    int size = 0;
    PMPI_Type_size(dtype, &size);
    *bytes = static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(size);
  } else if (dtype != MPI_DATATYPE_NULL) {
    // A broadcast moves bytes: count x the type's size, which the type signatures (the same on
    // every rank, as MPI requires) fix, whatever datatype each rank describes its buffer with.
    int size = 0;
    PMPI_Type_size(dtype, &size);
    *d = tdr_u8;
    *o = tdr_sum;
    *bytes = static_cast<std::uint64_t>(count) * static_cast<std::uint64_t>(size);
  }
  if (cfg.mode != Mode::force) {
    if (static_cast<std::uint32_t>(s->size) < cfg.min_ranks) {
      return std::to_string(s->size) +
             " ranks, below TREEDUCE_MPI_MIN_RANKS=" + std::to_string(cfg.min_ranks);
    }
    if (*bytes < cfg.min_bytes) {
      return bytes_str(*bytes) + ", below TREEDUCE_MPI_MIN_BYTES=" + std::to_string(cfg.min_bytes);
    }
    if (*bytes > cfg.max_bytes) {
      return bytes_str(*bytes) + ", above TREEDUCE_MPI_MAX_BYTES=" + std::to_string(cfg.max_bytes);
    }
  }
  if (reduction && count == 0) return std::string("no elements");
  if (s->state == JoinState::unjoined) join(s, comm);
  if (s->state != JoinState::joined) return s->why_passthrough;
  if (!reduction && !s->offloads[tdr_i32][tdr_sum]) {
    // libtreeduce's broadcast and barrier are int32 sums in the network.
    return std::string(
        "the tree does not reduce i32 sum, which MPI_Bcast and MPI_Barrier are in "
        "the network");
  }
  if (reduction && !s->offloads[*d][*o]) {
    return std::string("the tree does not reduce ") + tdr_dtype_name(*d) + " " + tdr_op_name(*o) +
           " (" + dtype_name(dtype) + " " + op_name(op) + ")";
  }
  return std::nullopt;
}

void count_passed(CommState* s, const char* what, const std::string& why) {
  std::lock_guard lk(g().mu);  // the progress thread counts too
  ++s->counters.passed[{what, why}];
}

// Every rank's outcome of an offloaded operation: true when all succeeded. Otherwise the
// communicator passes through from now on, on every rank, and the caller redoes the operation.
bool agree(CommState* s, tdr_result_t r, const char* what) {
  int ok = r == tdr_ok ? 1 : 0;
  PMPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, s->shadow);
  if (ok != 0) {
    std::lock_guard lk(g().mu);
    ++s->counters.offloaded[what];
    return true;
  }
  const std::string mine = r == tdr_ok
                               ? std::string("it succeeded here, failed on another rank")
                               : std::string(tdr_result_string(r)) + ": " + s->tdr->last_error();
  go_passthrough(
      s, std::string("the network path failed in ") + what + " (" + mine + "); redone through MPI",
      true);
  count_passed(s, what, "the network path failed; redone through MPI");
  return false;
}

// ---------------------------------------------------------------------------------------------
// Offloaded MPI_Iallreduce: a thread of the interposer's own moves every communicator's pending
// operations on in start order (tdr_test, then a PMPI_Iallreduce of the outcome on the
// communicator's duplicate, then, after a failure, a PMPI_Iallreduce of the data), never blocking,
// so that a request completes once every rank started it, whatever the ranks' threads do
// meanwhile, as an Open MPI request would. It needs MPI_THREAD_MULTIPLE, which MPI_Init asks for.

int query_fn(void*, MPI_Status* status) {
  PMPI_Status_set_elements(status, MPI_BYTE, 0);
  PMPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  return MPI_SUCCESS;
}

int free_fn(void* extra) {
  delete static_cast<PendingOp*>(extra);
  return MPI_SUCCESS;
}

int cancel_fn(void*, int) { return MPI_SUCCESS; }  // an in-network operation cannot be cancelled

// One step of `p`, the oldest pending operation of its communicator: true when it is done.
// Never blocks: a request waiting for the other ranks must not hold back another communicator's,
// which those ranks may be waiting for first (legal MPI).
bool step(PendingOp* p) {
  CommState* s = p->comm;
  if (p->stage == PendingOp::Stage::running) {
    if (p->started) {
      const tdr_result_t r = to_c(s->tdr->test(p->req));
      if (r == tdr_in_progress) return false;
      p->ok = r == tdr_ok ? 1 : 0;
      if (r != tdr_ok) {
        warn(s, std::string("MPI_Iallreduce failed on the network path here: ") +
                    tdr_result_string(r) + ": " + s->tdr->last_error());
      }
    }
    PMPI_Iallreduce(MPI_IN_PLACE, &p->ok, 1, MPI_INT, MPI_MIN, s->shadow, &p->mpi_req);
    p->stage = PendingOp::Stage::agreeing;
  }
  int flag = 0;
  PMPI_Test(&p->mpi_req, &flag, MPI_STATUS_IGNORE);
  if (flag == 0) return false;
  if (p->stage == PendingOp::Stage::redoing) return true;
  std::lock_guard lk(g().mu);
  if (p->ok != 0) {
    ++s->counters.offloaded["MPI_Iallreduce"];
    return true;
  }
  ++s->counters.passed[{"MPI_Iallreduce", "the network path failed; redone through MPI"}];
  if (s->failed.empty()) s->failed = "the network path failed in MPI_Iallreduce on a rank";
  // Every rank redoes it from the same inputs, in the same place of the duplicate's sequence.
  if (!p->saved.empty()) {
    std::memcpy(p->recv, p->saved.data(), p->saved.size());
    PMPI_Iallreduce(MPI_IN_PLACE, p->recv, p->count, p->dtype, p->op, s->shadow, &p->mpi_req);
  } else {
    PMPI_Iallreduce(p->send, p->recv, p->count, p->dtype, p->op, s->shadow, &p->mpi_req);
  }
  p->stage = PendingOp::Stage::redoing;
  return false;
}

void progress_loop() {
  Global& gl = g();
  std::vector<PendingOp*> fronts;
  std::chrono::microseconds interval = kPollFirst;
  for (;;) {
    fronts.clear();
    {
      std::unique_lock lk(gl.mu);
      gl.cv.wait(lk, [&] {
        if (gl.stopping) return true;
        for (const auto& st : gl.states) {
          if (!st->pending.empty()) return true;
        }
        return false;
      });
      for (const auto& st : gl.states) {
        if (!st->pending.empty()) fronts.push_back(st->pending.front());
      }
      if (fronts.empty()) return;  // stopping, and nothing is pending
    }
    bool moved = false;
    for (PendingOp* p : fronts) {
      if (!step(p)) continue;
      moved = true;
      {
        std::lock_guard lk(gl.mu);
        p->comm->pending.pop_front();
      }
      gl.cv.notify_all();
      PMPI_Grequest_complete(p->greq);  // p is the user's request's now: not touched again
    }
    // Nothing finished: operations are in the network, or an agreement or a redo waits for the
    // other ranks' threads. The thread polls again after `interval` (at once for a new
    // operation), never blocking in tdr_wait on one: every pending operation must move on.
    if (moved) {
      interval = kPollFirst;
    } else {
      std::unique_lock lk(gl.mu);
      if (gl.cv.wait_for(lk, interval, [&] { return gl.stopping || gl.queued; })) {
        interval = kPollFirst;
      } else {
        interval = std::min(interval * 2, kPollMax);
      }
      gl.queued = false;
    }
  }
}

// Waits until the communicator's pending operations completed (every rank waits for the same
// ones: those started before this call), then makes a failure among them its pass-through.
void drain(CommState* s) {
  std::unique_lock lk(g().mu);
  if (s->pending.empty() && s->failed.empty()) return;
  g().cv.wait(lk, [&] { return s->pending.empty(); });
  if (!s->failed.empty() && s->state == JoinState::joined) {
    const std::string why = s->failed + "; redone through MPI";
    lk.unlock();
    go_passthrough(s, why, true);
  }
}

void start_progress_thread() {
  std::lock_guard lk(g().mu);
  if (!g().progress.joinable()) g().progress = std::thread(progress_loop);
}

void stop_progress_thread() {
  {
    std::lock_guard lk(g().mu);
    g().stopping = true;
  }
  g().cv.notify_all();
  if (g().progress.joinable()) g().progress.join();
}

void leave(CommState* s) {
  if (s->finished) return;
  drain(s);
  s->finished = true;
  release_job(s);
  if (s->shadow != MPI_COMM_NULL) PMPI_Comm_free(&s->shadow);
}

// The counters of one communicator as printed at MPI_Finalize ("" when nothing was counted, or
// on a rank other than its rank 0: the counters are the same on every rank, rank 0 prints them).
std::string stats_text(const CommState* s) {
  if (s->rank != 0) return "";
  std::uint64_t off = 0, passed = 0;
  for (const auto& [k, v] : s->counters.offloaded) off += v;
  for (const auto& [k, v] : s->counters.passed) passed += v;
  if (off == 0 && passed == 0) return "";
  std::string text = "treeduce-mpi: stats: " + s->label + " (" + std::to_string(s->size) +
                     (s->size == 1 ? " rank" : " ranks") +
                     (s->had_job ? ", treeduce job '" + s->job + "'" : "") + "): offloaded " +
                     std::to_string(off);
  std::string sep = " (";
  for (const auto& [k, v] : s->counters.offloaded) {
    text += sep + k + " " + std::to_string(v);
    sep = ", ";
  }
  if (off != 0) text += ")";
  text += "; passed through " + std::to_string(passed) + "\n";
  for (const auto& [k, v] : s->counters.passed) {
    text += "treeduce-mpi: stats:   " + k.first + " " + std::to_string(v) + ": " + k.second + "\n";
  }
  return text;
}

// A freed communicator's state goes, its counters kept as text for MPI_Finalize.
void forget(CommState* s) {
  std::string text = g().cfg.stats ? stats_text(s) : std::string();
  std::lock_guard lk(g().mu);
  g().freed_stats += text;
  std::erase_if(g().states, [&](const std::unique_ptr<CommState>& st) { return st.get() == s; });
}

void print_stats() {
  std::string text;
  {
    std::lock_guard lk(g().mu);
    text = g().freed_stats;
    for (const auto& st : g().states) text += stats_text(st.get());
  }
  std::fputs(text.c_str(), stderr);
}

std::optional<std::string> env_lookup(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
}

// Whether MPI_Init asks for MPI_THREAD_MULTIPLE: whenever the variables (the one parser's
// reading) may offload anything. setup() says what is malformed.
bool wants_progress_thread() {
  std::string error;
  return parse_config(env_lookup, &error).mode != Mode::off;
}

// Sets the interposer up once MPI runs: the variables, agreed by every rank of MPI_COMM_WORLD.
void setup(int thread_level) {
  Global& gl = g();
  gl.thread_multiple = thread_level == MPI_THREAD_MULTIPLE;
  PMPI_Comm_rank(MPI_COMM_WORLD, &gl.world_rank);
  std::string error;
  gl.cfg = parse_config(env_lookup, &error);
  if (!error.empty()) {
    gl.off_reason = "a TREEDUCE_MPI variable is malformed (MPI_Init said which)";
    std::fprintf(stderr,
                 "treeduce-mpi: error: rank %d: %s Every rank passes its collectives through to "
                 "MPI.\n",
                 gl.world_rank, error.c_str());
  }
  if (const char* j = std::getenv("TREEDUCE_JOB")) gl.job_base = j;
  if (const char* p = std::getenv("TREEDUCE_PORT"); p != nullptr && *p != '\0') {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(p, &end, 10);
    if (*p < '0' || *p > '9' || *end != '\0' || errno != 0 || v < 1 || v > 65535) {
      gl.port_error = std::string("TREEDUCE_PORT is '") + p +
                      "'; it must be a UDP port from 1 to 65535 (the first of this host's "
                      "communicators' ports)";
    } else {
      gl.port_base = static_cast<std::uint32_t>(v);
    }
  }
  // The rank among this host's processes: the ports of a host's processes never collide.
  MPI_Comm node = MPI_COMM_NULL;
  if (PMPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    PMPI_Comm_rank(node, &gl.local_rank);
    PMPI_Comm_free(&node);
  } else {
    gl.local_rank = gl.world_rank;
  }
  // Every rank must take the same decisions: the same mode and thresholds everywhere.
  // A malformed variable has been said by its rank; a mere difference is said by rank 0.
  // The last: whether MPI gave this rank MPI_THREAD_MULTIPLE, which MPI_Iallreduce's offload
  // needs on every rank (the minimum decides).
  long long mine[6] = {
      static_cast<long long>(gl.cfg.mode),
      gl.cfg.min_ranks,
      static_cast<long long>(gl.cfg.min_bytes),
      static_cast<long long>(gl.cfg.max_bytes == UINT64_MAX ? -1 : gl.cfg.max_bytes),
      error.empty() ? 0 : 1,
      gl.thread_multiple ? 1 : 0};
  long long lo[6], hi[6];
  PMPI_Allreduce(mine, lo, 6, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  PMPI_Allreduce(mine, hi, 6, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  gl.thread_multiple = lo[5] != 0;
  if (std::memcmp(lo, hi, 5 * sizeof lo[0]) != 0) {
    if (gl.world_rank == 0 && hi[4] == 0) {
      std::fprintf(stderr,
                   "treeduce-mpi: error: TREEDUCE_MPI, TREEDUCE_MPI_MIN_RANKS, "
                   "TREEDUCE_MPI_MIN_BYTES or TREEDUCE_MPI_MAX_BYTES differ between ranks; every "
                   "rank passes its collectives through to MPI.\n");
    }
    gl.cfg.mode = Mode::off;
    if (error.empty()) {
      gl.off_reason = hi[4] != 0 ? "a TREEDUCE_MPI variable is malformed on another rank"
                                 : "the TREEDUCE_MPI variables differ between ranks";
    }
  }
  PMPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, delete_attr, &gl.keyval, nullptr);
  gl.active = true;
}

const char* const kAllreduce = "MPI_Allreduce";

[[noreturn]] void fatal(const char* call, const char* what) {
  std::fprintf(stderr,
               "treeduce-mpi: error: rank %d: %s: %s inside the interposer; aborting the job (the "
               "other ranks may be inside the same call, so it cannot be redone through MPI "
               "consistently)\n",
               g().world_rank, call, what);
  int init = 0, fin = 0;
  PMPI_Initialized(&init);
  PMPI_Finalized(&fin);
  if (init != 0 && fin == 0) PMPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// Every MPI_* entry point runs in here: an exception from inside the interposer (libtreeduce's
// C++ API, an allocation) never crosses into the caller's C or Fortran frames (undefined
// behaviour there); it aborts the job with a sentence instead (docs/mpi.md, "Failures").
template <class F>
int guarded(const char* call, F&& f) noexcept {
  try {
    return f();
  } catch (const std::exception& e) {
    fatal(call, e.what());
  } catch (...) {
    fatal(call, "an exception that is not a std::exception");
  }
}

}  // namespace
}  // namespace treeduce::mpi

using namespace treeduce::mpi;

// Only the MPI_* entry points are the library's interface (-fvisibility=hidden hides the rest).
#pragma GCC visibility push(default)
extern "C" {

// MPI_THREAD_MULTIPLE is asked for whenever offloading may happen: the progress thread that
// completes offloaded MPI_Iallreduce requests calls PMPI. The caller is told the level it asked
// for (or less, if that is all MPI gives).
int MPI_Init(int* argc, char*** argv) {
  return guarded("MPI_Init", [&]() -> int {
    if (!wants_progress_thread()) {
      const int rc = PMPI_Init(argc, argv);
      if (rc == MPI_SUCCESS) setup(MPI_THREAD_SINGLE);
      return rc;
    }
    int provided = MPI_THREAD_SINGLE;
    const int rc = PMPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc == MPI_SUCCESS) setup(provided);
    return rc;
  });
}

int MPI_Init_thread(int* argc, char*** argv, int required, int* provided) {
  return guarded("MPI_Init_thread", [&]() -> int {
    const int ask = wants_progress_thread() ? MPI_THREAD_MULTIPLE : required;
    int got = MPI_THREAD_SINGLE;
    const int rc = PMPI_Init_thread(argc, argv, ask, &got);
    if (rc == MPI_SUCCESS) setup(got);
    if (provided != nullptr) *provided = got < required ? got : required;
    return rc;
  });
}

int MPI_Finalize(void) {
  return guarded("MPI_Finalize", [&]() -> int {
    if (g().active) {
      std::vector<CommState*> live;
      {
        std::lock_guard lk(g().mu);
        for (const auto& s : g().states) live.push_back(s.get());
      }
      for (CommState* s : live) drain(s);
      stop_progress_thread();
      for (CommState* s : live) leave(s);
      if (g().cfg.stats) print_stats();
      g().active = false;
    }
    return PMPI_Finalize();
  });
}

// Communicators made from others: labelled after their parent, joined lazily.
static void label_new(MPI_Comm parent, MPI_Comm* out, const char* how) {
  if (!g().active || *out == MPI_COMM_NULL) return;
  CommState* p = state_of(parent);
  new_state(*out, std::string(how) + " #" + std::to_string(++g().comm_counter) + " of " +
                      (p != nullptr ? p->label : std::string("a communicator")));
}

int MPI_Comm_dup(MPI_Comm comm, MPI_Comm* newcomm) {
  return guarded("MPI_Comm_dup", [&]() -> int {
    const int rc = PMPI_Comm_dup(comm, newcomm);
    if (rc == MPI_SUCCESS) label_new(comm, newcomm, "MPI_Comm_dup");
    return rc;
  });
}

int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm* newcomm) {
  return guarded("MPI_Comm_split", [&]() -> int {
    const int rc = PMPI_Comm_split(comm, color, key, newcomm);
    if (rc == MPI_SUCCESS) label_new(comm, newcomm, "MPI_Comm_split");
    return rc;
  });
}

int MPI_Comm_create(MPI_Comm comm, MPI_Group group, MPI_Comm* newcomm) {
  return guarded("MPI_Comm_create", [&]() -> int {
    const int rc = PMPI_Comm_create(comm, group, newcomm);
    if (rc == MPI_SUCCESS) label_new(comm, newcomm, "MPI_Comm_create");
    return rc;
  });
}

int MPI_Comm_free(MPI_Comm* comm) {
  return guarded("MPI_Comm_free", [&]() -> int {
    // Pending offloaded operations end before the job is left (MPI_Comm_free is collective, so
    // every rank is here to agree on them); the attribute's delete callback then leaves.
    if (g().active && comm != nullptr && *comm != MPI_COMM_NULL) {
      void* attr = nullptr;
      int flag = 0;
      PMPI_Comm_get_attr(*comm, g().keyval, &attr, &flag);
      if (flag != 0) drain(static_cast<CommState*>(attr));
    }
    return PMPI_Comm_free(comm);
  });
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                  MPI_Comm comm) {
  return guarded("MPI_Allreduce", [&]() -> int {
    CommState* s = g().active ? state_of(comm) : nullptr;
    if (s == nullptr) return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    drain(s);
    tdr_dtype_t d{};
    tdr_op_t o{};
    std::uint64_t bytes = 0;
    if (auto why = decide(s, comm, datatype, op, count, true, &d, &o, &bytes)) {
      count_passed(s, kAllreduce, *why);
      return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, comm);
    }
    const bool in_place = sendbuf == MPI_IN_PLACE;
    // In place, results overwrite the inputs chunk by chunk: a redo needs a copy (one memcpy).
    std::vector<unsigned char> saved;
    if (in_place) {
      saved.assign(static_cast<unsigned char*>(recvbuf),
                   static_cast<unsigned char*>(recvbuf) + span_bytes(datatype, count));
    }
    const tdr_result_t r =
        to_c(s->tdr->allreduce(in_place ? recvbuf : sendbuf, recvbuf,
                               static_cast<std::size_t>(count), to_cpp(d), to_cpp(o)));
    if (agree(s, r, kAllreduce)) return MPI_SUCCESS;
    if (in_place) {
      std::memcpy(recvbuf, saved.data(), saved.size());
      return PMPI_Allreduce(MPI_IN_PLACE, recvbuf, count, datatype, op, s->shadow);
    }
    return PMPI_Allreduce(sendbuf, recvbuf, count, datatype, op, s->shadow);
  });
}

int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
               int root, MPI_Comm comm) {
  return guarded("MPI_Reduce", [&]() -> int {
    CommState* s = g().active ? state_of(comm) : nullptr;
    if (s == nullptr) return PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm);
    drain(s);
    tdr_dtype_t d{};
    tdr_op_t o{};
    std::uint64_t bytes = 0;
    std::optional<std::string> why;
    if (root < 0 || root >= s->size)
      why = "the root is not a rank of it";
    else
      why = decide(s, comm, datatype, op, count, true, &d, &o, &bytes);
    if (why) {
      count_passed(s, "MPI_Reduce", *why);
      return PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, comm);
    }
    const bool in_place = sendbuf == MPI_IN_PLACE && s->rank == root;
    std::vector<unsigned char> saved;
    if (in_place) {
      saved.assign(static_cast<unsigned char*>(recvbuf),
                   static_cast<unsigned char*>(recvbuf) + span_bytes(datatype, count));
    }
    const tdr_result_t r = to_c(s->tdr->reduce(
        in_place ? recvbuf : sendbuf, s->rank == root ? recvbuf : nullptr,
        static_cast<std::size_t>(count), to_cpp(d), to_cpp(o), static_cast<std::uint32_t>(root)));
    if (agree(s, r, "MPI_Reduce")) return MPI_SUCCESS;
    if (in_place) {
      std::memcpy(recvbuf, saved.data(), saved.size());
      return PMPI_Reduce(MPI_IN_PLACE, recvbuf, count, datatype, op, root, s->shadow);
    }
    return PMPI_Reduce(sendbuf, recvbuf, count, datatype, op, root, s->shadow);
  });
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype datatype, int root, MPI_Comm comm) {
  return guarded("MPI_Bcast", [&]() -> int {
    CommState* s = g().active ? state_of(comm) : nullptr;
    if (s == nullptr) return PMPI_Bcast(buffer, count, datatype, root, comm);
    drain(s);
    tdr_dtype_t d{};
    tdr_op_t o{};
    std::uint64_t bytes = 0;
    std::optional<std::string> why;
    int type_size = 0;
    if (root < 0 || root >= s->size)
      why = "the root is not a rank of it";
    else if (datatype == MPI_DATATYPE_NULL)
      why = "MPI_DATATYPE_NULL";
    else if (PMPI_Type_size(datatype, &type_size) != MPI_SUCCESS || count <= 0 || type_size <= 0)
      why = "no elements";
    else
      why = decide(s, comm, datatype, MPI_OP_NULL, count, false, &d, &o, &bytes);
    if (why) {
      count_passed(s, "MPI_Bcast", *why);
      return PMPI_Bcast(buffer, count, datatype, root, comm);
    }
    // A contiguous predefined datatype goes as it lies; any other (a rank may describe the same
    // bytes with a derived datatype while the others do not) is packed into MPI's contiguous form
    // and unpacked, so that every rank takes the same path.
    tdr_result_t r = tdr_ok;
    if (bcast_element_bytes(datatype) != 0) {
      // The root's buffer is only read (libtreeduce copies it), the others' rewritten by a redo.
      r = to_c(s->tdr->broadcast(buffer, static_cast<std::size_t>(bytes), treeduce::DType::u8,
                                 static_cast<std::uint32_t>(root)));
    } else {
      int packed_max = 0;
      PMPI_Pack_size(count, datatype, s->shadow, &packed_max);
      std::vector<unsigned char> packed(
          std::max(static_cast<std::size_t>(packed_max), static_cast<std::size_t>(bytes)));
      int position = 0;
      if (s->rank == root) {
        PMPI_Pack(buffer, count, datatype, packed.data(), static_cast<int>(packed.size()),
                  &position, s->shadow);
      }
      if (s->rank == root && static_cast<std::uint64_t>(position) != bytes) {
        warn(s, "MPI_Pack of the MPI_Bcast buffer gave " + bytes_str(position) + ", not " +
                    bytes_str(bytes));
        r = tdr_internal;  // the other ranks' broadcast fails at its timeout: all redo it
      } else {
        r = to_c(s->tdr->broadcast(packed.data(), static_cast<std::size_t>(bytes),
                                   treeduce::DType::u8, static_cast<std::uint32_t>(root)));
      }
      const bool all_ok = agree(s, r, "MPI_Bcast");
      if (all_ok && s->rank != root) {
        position = 0;
        PMPI_Unpack(packed.data(), static_cast<int>(packed.size()), &position, buffer, count,
                    datatype, s->shadow);
      }
      return all_ok ? MPI_SUCCESS : PMPI_Bcast(buffer, count, datatype, root, s->shadow);
    }
    if (agree(s, r, "MPI_Bcast")) return MPI_SUCCESS;
    return PMPI_Bcast(buffer, count, datatype, root, s->shadow);
  });
}

int MPI_Barrier(MPI_Comm comm) {
  return guarded("MPI_Barrier", [&]() -> int {
    CommState* s = g().active ? state_of(comm) : nullptr;
    if (s == nullptr) return PMPI_Barrier(comm);
    drain(s);
    tdr_dtype_t d{};
    tdr_op_t o{};
    std::uint64_t bytes = 0;
    if (auto why = decide(s, comm, MPI_DATATYPE_NULL, MPI_OP_NULL, 0, false, &d, &o, &bytes)) {
      count_passed(s, "MPI_Barrier", *why);
      return PMPI_Barrier(comm);
    }
    // The agreement is itself a barrier of every rank: a failed network barrier needs no redo.
    agree(s, to_c(s->tdr->barrier()), "MPI_Barrier");
    return MPI_SUCCESS;
  });
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype datatype, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
  return guarded("MPI_Iallreduce", [&]() -> int {
    CommState* s = g().active ? state_of(comm) : nullptr;
    if (s == nullptr) return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
    tdr_dtype_t d{};
    tdr_op_t o{};
    std::uint64_t bytes = 0;
    std::optional<std::string> why;
    if (!g().thread_multiple) {
      why =
          "MPI gave no MPI_THREAD_MULTIPLE on some rank, which the interposer's progress thread "
          "needs";
    } else {
      why = decide(s, comm, datatype, op, count, true, &d, &o, &bytes);
    }
    if (why) {
      count_passed(s, "MPI_Iallreduce", *why);
      return PMPI_Iallreduce(sendbuf, recvbuf, count, datatype, op, comm, request);
    }
    auto* p = new PendingOp;
    p->comm = s;
    p->send = sendbuf;
    p->recv = recvbuf;
    p->count = count;
    p->dtype = datatype;
    p->op = op;
    const bool in_place = sendbuf == MPI_IN_PLACE;
    if (in_place) {
      p->saved.assign(static_cast<unsigned char*>(recvbuf),
                      static_cast<unsigned char*>(recvbuf) + span_bytes(datatype, count));
    }
    const tdr_result_t r =
        to_c(s->tdr->iallreduce(in_place ? recvbuf : sendbuf, recvbuf,
                                static_cast<std::size_t>(count), to_cpp(d), to_cpp(o), &p->req));
    p->started = r == tdr_ok;
    p->ok = 0;
    if (r != tdr_ok) {
      warn(s, std::string("MPI_Iallreduce could not start on the network path here: ") +
                  s->tdr->last_error());
    }
    const int rc = PMPI_Grequest_start(query_fn, free_fn, cancel_fn, p, request);
    if (rc != MPI_SUCCESS) {
      if (p->started) s->tdr->wait(p->req);
      delete p;
      return rc;
    }
    p->greq = *request;
    start_progress_thread();
    {
      std::lock_guard lk(g().mu);
      s->pending.push_back(p);
      g().queued = true;
    }
    g().cv.notify_all();
    return MPI_SUCCESS;
  });
}

}  // extern "C"
#pragma GCC visibility pop
