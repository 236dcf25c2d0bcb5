// treeduce-perf (host/tools): an allreduce sweep in the manner of nccl-tests' all_reduce_perf,
// on libtreeduce, optionally side by side with Gloo's ring allreduce and MPI_Allreduce.
// One process per rank; the job comes from the environment (docs/host.md: TREEDUCE_MANAGER,
// TREEDUCE_JOB, TREEDUCE_RANK, TREEDUCE_WORLD_SIZE, ... or torchrun's/Open MPI's variables).
// Rank 0 prints a row per size, dtype and op as it completes:
//   size, count, type, op, time, algbw, busbw, path, wrong
// or with --compare, treeduce's time, algbw and path, then each baseline's time, algbw and
// speed-up, then the wrong elements of all of them.
// Inputs are exactly checkable (treeduce/lab/exact_inputs.h): every rank checks every backend's
// result element by element, and the wrong counts of all ranks are summed with one more
// allreduce.
#include <arpa/inet.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "perf_baselines.h"
#include "treeduce/host/communicator.h"
#include "treeduce/lab/exact_inputs.h"

namespace {

using namespace treeduce;
using host::Communicator;
using host::Result;
using perf::Baseline;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at <= s.size()) {
    const std::size_t comma = std::min(s.find(',', at), s.size());
    if (comma > at) out.push_back(s.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

// A comma list of names (name(E)), or "all" for every one. "" or a sentence naming the unknown
// name and the known ones.
template <class E, std::size_t N>
std::string parse_names(const char* flag, const std::string& list, const std::array<E, N>& all,
                        std::vector<E>* out) {
  std::string known;
  for (E e : all) known += (known.empty() ? "" : ", ") + std::string(name(e));
  for (const std::string& n : split(list)) {
    if (n == "all") {
      out->insert(out->end(), all.begin(), all.end());
      continue;
    }
    const auto it = std::find_if(all.begin(), all.end(), [&](E e) { return name(e) == n; });
    if (it == all.end())
      return std::string(flag) + ": '" + n + "' is not one of all, " + known + ".";
    out->push_back(*it);
  }
  if (out->empty()) return std::string(flag) + " names nothing; give all or some of " + known + ".";
  return "";
}

// --compare's list, each name once, in the order given. "" or an error sentence.
std::string parse_compare(const std::string& list, std::vector<std::string>* out) {
  for (const std::string& n : split(list)) {
    if (n != "gloo" && n != "mpi")
      return "--compare takes a comma list of gloo and mpi, and '" + n + "' is neither.";
#ifndef TREEDUCE_PERF_HAVE_MPI
    if (n == "mpi")
      return "--compare mpi is not available: this build has no MPI (meson found none when it "
             "was configured).";
#endif
    if (std::find(out->begin(), out->end(), n) == out->end()) out->push_back(n);
  }
  return "";
}

std::string human(std::uint64_t bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  double v = static_cast<double>(bytes);
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.4g %s", v, unit[u]);
  return buf;
}

bool is_ipv4(const std::string& s) {
  in_addr a{};
  return inet_pton(AF_INET, s.c_str(), &a) == 1;
}

// ---------------------------------------------------------------------------------------------
// Setting up the baselines.

// The Gloo baseline rendezvouses where libtreeduce's own host-side reduction does (same store
// directory and address defaults, communicator.cpp), under a prefix of its own.
perf::GlooBaselineOptions gloo_options(const host::Options& o) {
  perf::GlooBaselineOptions g;
  g.rank = o.rank;
  g.world_size = o.world_size;
  g.store_dir = !o.fallback_store.empty() ? o.fallback_store : "/tmp/treeduce-gloo-" + o.job;
  g.prefix = o.job + "/perf-gloo-baseline";
  g.bind_address = !o.fallback_address.empty() ? o.fallback_address
                   : !o.bind_address.empty()   ? o.bind_address
                   : is_ipv4(o.host)           ? o.host
                                               : "127.0.0.1";
  g.timeout = std::chrono::milliseconds(std::max(o.join_timeout_ms, o.op_timeout_ms));
  return g;
}

// Ends MPI on every way out of main() once it was started.
struct MpiSession {
  ~MpiSession() {
#ifdef TREEDUCE_PERF_HAVE_MPI
    perf::finalize_mpi();
#endif
  }
};

// ---------------------------------------------------------------------------------------------
// Measuring one backend on one row.

struct Timing {
  double mean_us = 0;  // over the timed iterations, as nccl-tests
  double min_us = 0;   // the fastest single iteration: the noise-robust figure for small sizes
  /// This rank's CPU time (user + system, every thread of the process: the caller's, the
  /// library's progress thread, a baseline's) per timed iteration.
  double cpu_us = 0;
  std::string error;  // "" or the first failure's sentence
};

// This process's CPU time so far (every thread, user and system), in microseconds.
double process_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

// `once` runs one allreduce and returns "" or an error sentence. Each timed iteration is timed on
// its own so that the fastest one is known; the mean is the whole loop's time over `iters`.
template <class F>
Timing measure(int warmup, int iters, F&& once) {
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); };
  Timing t;
  for (int i = 0; i < warmup && t.error.empty(); ++i) t.error = once();
  const double cpu_start = process_cpu_us();
  const Clock::time_point start = Clock::now();
  Clock::time_point prev = start;
  t.min_us = std::numeric_limits<double>::infinity();
  for (int i = 0; i < iters && t.error.empty(); ++i) {
    t.error = once();
    const Clock::time_point now = Clock::now();
    t.min_us = std::min(t.min_us, us(now - prev));
    prev = now;
  }
  t.mean_us = us(prev - start) / iters;
  t.cpu_us = (process_cpu_us() - cpu_start) / iters;
  if (t.min_us == std::numeric_limits<double>::infinity()) t.min_us = 0;  // the warm-up failed
  return t;
}

// One backend's account of one row. wrong and failed are this rank's until summed over the ranks.
struct Outcome {
  std::string name;  // "treeduce", "gloo" or "mpi"
  Timing timing;
  std::int32_t wrong = 0;
  std::int32_t failed = 0;  // 1 here when it failed on this rank; after the sum, ranks that did
  double cpu_us_ranks = 0;  // after the sum: the mean over the ranks of timing.cpu_us
};

// Counts the elements of `got` that differ from `want`; the first one goes to stderr, so that a
// wrong row says which backend, where and what.
std::int32_t count_wrong(const std::string& backend, std::uint32_t rank, DType d, ReduceOp op,
                         const std::vector<std::uint8_t>& got,
                         const std::vector<std::uint8_t>& want, std::size_t count) {
  std::int32_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const exact::Elem g = exact::load(d, got.data(), i), w = exact::load(d, want.data(), i);
    if (g == w) continue;
    if (wrong++ == 0) {
      std::fprintf(stderr,
                   "treeduce-perf: rank %u: %s: %s %s of %zu elements: element %zu is %s, not "
                   "%s.\n",
                   rank, backend.c_str(), name(d).data(), name(op).data(), count, i,
                   exact::show(d, g).c_str(), exact::show(d, w).c_str());
    }
  }
  return wrong;
}

// The wrong and failed counts of every backend, summed over the ranks with one allreduce (so a
// row costs the same number of operations with and without baselines). When that allreduce fails
// the counts stay this rank's.
void sum_over_ranks(Communicator& comm, std::vector<Outcome>* outs) {
  std::vector<std::int32_t> mine, all(3 * outs->size());
  for (const Outcome& o : *outs) {
    mine.push_back(o.wrong);
    mine.push_back(o.failed);
    // CPU per iteration in units of 0.1 us (up to 195 s: the sum over 1024 ranks fits an int32).
    mine.push_back(static_cast<std::int32_t>(std::clamp(o.timing.cpu_us * 10, 0.0, 2e9 / 1024)));
  }
  if (comm.allreduce(mine.data(), all.data(), mine.size(), DType::i32, ReduceOp::sum) != Result::ok)
    return;
  for (std::size_t i = 0; i < outs->size(); ++i) {
    (*outs)[i].wrong = all[3 * i];
    (*outs)[i].failed = all[3 * i + 1];
    (*outs)[i].cpu_us_ranks = all[3 * i + 2] / 10.0 / comm.world_size();
  }
}

// ---------------------------------------------------------------------------------------------
// Rank 0's report of one row.

struct Row {
  std::size_t nbytes, count;
  DType dtype;
  ReduceOp op;
  std::uint32_t world;
  int iters, warmup;
  const char* path;  // treeduce's: network, host, mixed or FAILED
  std::uint64_t fallbacks;
  std::uint64_t retransmits;  // rank 0's during this row's treeduce operations
  int back_to_back;           // --back-to-back N, 0 without
};

// CPU milliseconds per allreduced MiB (of each rank's input), from a CPU time per iteration.
double cpu_ms_per_mib(const Row& r, double cpu_us) {
  return r.nbytes > 0 ? cpu_us / 1e3 / (static_cast<double>(r.nbytes) / (1 << 20)) : 0;
}

double algbw(const Row& r, const Timing& t) {
  return t.mean_us > 0 ? static_cast<double>(r.nbytes) / (t.mean_us * 1e3) : 0;
}

// busbw: for treeduce's in-network allreduce each rank sends its data up once and receives the
// result once (DESIGN.md section 8); for the ring baselines 2(n-1)/n, as nccl-tests. Both scale
// so that figures of different algorithms compare.
double tree_bus(std::uint32_t n) { return n > 1 ? static_cast<double>(n - 1) / (n + 1) : 1.0; }
double ring_bus(std::uint32_t n) { return n > 1 ? 2.0 * (n - 1) / n : 1.0; }

// A baseline is left out of the figures when it failed on any rank: its timing means nothing.
bool usable(const Outcome& o) { return o.failed == 0 && o.timing.error.empty(); }

// A JSON number with `decimals` decimals, or null when there is none to give.
std::string json_number(bool have, int decimals, double v) {
  if (!have) return "null";
  char s[64];
  std::snprintf(s, sizeof s, "%.*f", decimals, v);
  return s;
}

// The JSON object of a row (docs/host.md, "treeduce-perf"): the same for --json and --json-out.
std::string json_row(const Row& r, const std::vector<Outcome>& outs) {
  const Outcome& td = outs[0];
  // A treeduce that failed on any rank has no figures: its loop stopped early.
  const bool td_ok = usable(td) && td.timing.mean_us > 0;
  const double td_bw = algbw(r, td.timing);
  char head[256];
  std::snprintf(head, sizeof head,
                "{\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"op\":\"%s\",\"ranks\":%u,"
                "\"iters\":%d,\"warmup\":%d,",
                r.nbytes, r.count, name(r.dtype).data(), name(r.op).data(), r.world, r.iters,
                r.warmup);
  std::string s = head;
  // A --back-to-back run says how many allreduces went at once.
  if (r.back_to_back > 0) s += "\"back_to_back\":" + std::to_string(r.back_to_back) + ",";
  s += "\"treeduce\":{\"time_us\":" + json_number(td_ok, 3, td.timing.mean_us) +
       ",\"min_us\":" + json_number(td_ok, 3, td.timing.min_us) +
       ",\"cpu_us\":" + json_number(td_ok, 3, td.cpu_us_ranks) +
       ",\"algbw_GBps\":" + json_number(td_ok, 4, td_bw) +
       ",\"busbw_GBps\":" + json_number(td_ok, 4, td_bw * tree_bus(r.world)) +
       ",\"cpu_ms_per_MiB\":" + json_number(td_ok, 4, cpu_ms_per_mib(r, td.cpu_us_ranks)) +
       ",\"path\":\"" + r.path + "\",\"wrong\":" + std::to_string(td.wrong) +
       ",\"fallbacks\":" + std::to_string(r.fallbacks) +
       ",\"retransmits\":" + std::to_string(r.retransmits) + "}";
  for (std::size_t i = 1; i < outs.size(); ++i) {
    const Outcome& b = outs[i];
    const bool ok = usable(b);
    const double bw = algbw(r, b.timing);
    s += ",\"" + b.name + "\":{\"time_us\":" + json_number(ok, 3, b.timing.mean_us) +
         ",\"min_us\":" + json_number(ok, 3, b.timing.min_us) +
         ",\"cpu_us\":" + json_number(ok, 3, b.cpu_us_ranks) +
         ",\"algbw_GBps\":" + json_number(ok, 4, bw) +
         ",\"busbw_GBps\":" + json_number(ok, 4, bw * ring_bus(r.world)) +
         ",\"cpu_ms_per_MiB\":" + json_number(ok, 4, cpu_ms_per_mib(r, b.cpu_us_ranks)) +
         ",\"wrong\":" + std::to_string(b.wrong) +
         ",\"speedup\":" + json_number(ok && td_ok, 5, b.timing.mean_us / td.timing.mean_us) + "}";
  }
  return s + "}";
}

void print_header(const Communicator& comm, const std::vector<std::string>& compare) {
  std::string with;
  for (const std::string& b : compare) {
    with += with.empty() ? "; compared with " : ", ";
    with += b == "gloo"         ? "gloo (Gloo's ring allreduce over TCP)"
            : b == "sequential" ? "sequential (the same allreduces one after the other; treeduce "
                                  "= issued non-blocking, then waited for; times per allreduce)"
                                : "mpi (MPI_Allreduce)";
  }
  std::printf("# treeduce-perf: %u ranks, path %s%s%s%s\n", comm.world_size(),
              comm.path() == host::Path::network ? "network" : "host",
              comm.path_reason().empty() ? "" : ": ", comm.path_reason().c_str(), with.c_str());
  if (compare.empty()) {
    std::printf("#%12s %12s %6s %5s %11s %11s %11s %8s %7s %7s\n", "size", "count", "type", "op",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "path", "retx", "wrong");
    return;
  }
  // A line naming the column groups, then the columns; x = baseline time / treeduce time.
  std::printf("#%38s %40s", "", "treeduce");
  for (const std::string& b : compare) std::printf(" %31s", b.c_str());
  std::printf("\n#%12s %12s %6s %5s %11s %11s %8s %7s", "size", "count", "type", "op", "time(us)",
              "algbw(GB/s)", "path", "retx");
  for (std::size_t i = 0; i < compare.size(); ++i)
    std::printf(" %11s %11s %7s", "time(us)", "algbw(GB/s)", "x");
  std::printf(" %7s\n", "wrong");
}

void print_table_row(const Row& r, const std::vector<Outcome>& outs) {
  const Outcome& td = outs[0];
  std::int64_t wrong = 0;
  for (const Outcome& o : outs) wrong += o.wrong;
  std::printf(" %12s %12zu %6s %5s %11.1f %11.3f", human(r.nbytes).c_str(), r.count,
              name(r.dtype).data(), name(r.op).data(), td.timing.mean_us, algbw(r, td.timing));
  if (outs.size() == 1) {
    std::printf(" %11.3f %8s %7llu %7lld\n", algbw(r, td.timing) * tree_bus(r.world), r.path,
                static_cast<unsigned long long>(r.retransmits), static_cast<long long>(wrong));
    return;
  }
  std::printf(" %8s %7llu", r.path, static_cast<unsigned long long>(r.retransmits));
  const bool td_ok = usable(td) && td.timing.mean_us > 0;
  for (std::size_t i = 1; i < outs.size(); ++i) {
    const Outcome& b = outs[i];
    if (!usable(b)) {
      std::printf(" %11s %11s %7s", "FAILED", "-", "-");
    } else if (!td_ok) {
      std::printf(" %11.1f %11.3f %7s", b.timing.mean_us, algbw(r, b.timing), "-");
    } else {
      std::printf(" %11.1f %11.3f %7.2f", b.timing.mean_us, algbw(r, b.timing),
                  b.timing.mean_us / td.timing.mean_us);
    }
  }
  std::printf(" %7lld\n", static_cast<long long>(wrong));
}

// ---------------------------------------------------------------------------------------------
// The sweep.

struct Config {
  std::uint64_t min_bytes = 1024, max_bytes = 4 << 20, factor = 4;
  int iters = 10, warmup = 2;
  int back_to_back = 0;  // > 0: that many allreduces per iteration, non-blocking vs sequential
  bool check = true, json = false;
  std::uint64_t seed = 1;
  std::vector<DType> dtypes;
  std::vector<ReduceOp> ops;
  std::vector<std::pair<DType, ReduceOp>> pairs;  // the defined ones, dtype-major
};

// Whole-run account of one backend on this rank (own) and over all ranks (summed).
struct Account {
  std::string name;
  std::uint64_t own_wrong = 0, own_failed = 0, all_wrong = 0, all_failed = 0;
};

class Sweep {
 public:
  Sweep(const Config& cfg, Communicator& comm, std::vector<std::unique_ptr<Baseline>> baselines,
        std::FILE* json_out)
      : cfg_(cfg), comm_(comm), baselines_(std::move(baselines)), json_out_(json_out) {
    accounts_.push_back({"treeduce"});
    if (cfg_.back_to_back > 0) accounts_.push_back({"sequential"});
    for (const auto& b : baselines_) accounts_.push_back({std::string(b->name())});
  }

  void run() {
    for (std::uint64_t bytes = cfg_.min_bytes; bytes <= cfg_.max_bytes; bytes *= cfg_.factor)
      for (const auto& [d, op] : cfg_.pairs) run_row(bytes, d, op);
  }

  const std::vector<Account>& accounts() const { return accounts_; }
  /// This rank's retransmissions during the rows' treeduce operations (each row's `retx`).
  std::uint64_t row_retransmits() const { return row_retransmits_; }

 private:
  // Every backend in turn on the same buffers and inputs: interleaved per row, because on a noisy
  // machine only figures taken side by side compare.
  void run_row(std::uint64_t bytes, DType d, ReduceOp op) {
    const std::uint32_t rank = comm_.rank(), world = comm_.world_size();
    const std::size_t count = std::max<std::size_t>(1, bytes / dtype_size(d));
    const std::size_t nbytes = count * dtype_size(d);
    send_.assign(nbytes, 0);
    recv_.resize(nbytes);
    want_.assign(cfg_.check ? nbytes : 0, 0);
    const exact::Inputs in(cfg_.seed, exact::Case{d, op, count, 0}, world);
    for (std::size_t i = 0; i < count; ++i) {
      exact::store(d, send_.data(), i, in.element(rank, i));
      if (cfg_.check) exact::store(d, want_.data(), i, in.expected(i));
    }
    // A barrier, outside the row's times and counts: the ranks build a row's inputs in different
    // times (4 ranks on 2 CPUs build them two after two), and a rank that starts the row first
    // would time out waiting for the last one, in the row's first operation (docs/host.md,
    // section 7). A failure here is the row's own operations' too, and reported by them.
    std::int32_t one = 1, ranks = 0;
    (void)comm_.allreduce(&one, &ranks, 1, DType::i32, ReduceOp::sum);
    std::vector<Outcome> outs;
    const host::Stats before = comm_.stats();
    if (cfg_.back_to_back > 0) {
      run_back_to_back(d, op, count, &outs);
    } else {
      outs.push_back(run_backend("treeduce", d, op, count, [&] {
        const Result r = comm_.allreduce(send_.data(), recv_.data(), count, d, op);
        return r == Result::ok ? std::string()
                               : std::string(host::to_string(r)) + ": " + comm_.last_error();
      }));
    }
    const host::Stats after = comm_.stats();
    row_retransmits_ += after.retransmits - before.retransmits;
    for (std::size_t i = 0; i < baselines_.size(); ++i) {
      Baseline* b = dead_[i] ? nullptr : baselines_[i].get();
      outs.push_back(run_backend(std::string(baselines_[i]->name()), d, op, count, [&] {
        return b ? b->allreduce(send_.data(), recv_.data(), count, d, op)
                 : "It failed earlier in the run, so it is not used again.";
      }));
    }
    for (std::size_t i = 0; i < outs.size(); ++i) {
      accounts_[i].own_wrong += static_cast<std::uint64_t>(outs[i].wrong);
      accounts_[i].own_failed += static_cast<std::uint64_t>(outs[i].failed);
    }
    // Every rank's counts, summed; a rank whose allreduce failed still joins this one.
    sum_over_ranks(comm_, &outs);
    for (std::size_t i = 0; i < outs.size(); ++i) {
      accounts_[i].all_wrong += static_cast<std::uint64_t>(outs[i].wrong);
      accounts_[i].all_failed += static_cast<std::uint64_t>(outs[i].failed);
    }
    // A baseline that failed on any rank is dropped on every rank, from the summed counts that
    // every rank has: one rank leaving a collective the others still call would hang them.
    for (std::size_t i = 0; i < baselines_.size(); ++i) {
      if (outs[i + 1 + (cfg_.back_to_back > 0)].failed != 0) dead_[i] = true;
    }
    if (rank != 0) return;
    // The path this row took, from the counters (the path now may differ after a fallback).
    const bool on_net = after.network_ops != before.network_ops;
    const bool on_host = after.fallback_ops != before.fallback_ops;
    const Row row{nbytes,
                  count,
                  d,
                  op,
                  world,
                  cfg_.iters,
                  cfg_.warmup,
                  !usable(outs[0])    ? "FAILED"
                  : on_net && on_host ? "mixed"
                  : on_host           ? "host"
                                      : "network",
                  comm_.stats().fallback_ops,
                  after.retransmits - before.retransmits,
                  cfg_.back_to_back};
    report(row, outs);
  }

  // --back-to-back N: N allreduces of the row per iteration into N receive buffers, issued
  // non-blocking and then waited for in order ("treeduce"), and the same N one after the other
  // ("sequential", in the baseline's place: its x is the speed-up of back to back). Times are
  // per allreduce; every element of every buffer is checked.
  void run_back_to_back(DType d, ReduceOp op, std::size_t count, std::vector<Outcome>* outs) {
    const std::size_t n = static_cast<std::size_t>(cfg_.back_to_back);
    many_.resize(n);
    std::vector<host::Request> req(n);
    const auto error = [&](Result r) {
      return std::string(host::to_string(r)) + ": " + comm_.last_error();
    };
    const auto pipelined = [&]() -> std::string {
      std::string err;
      std::size_t started = 0;
      for (; started < n; ++started) {
        const Result r =
            comm_.iallreduce(send_.data(), many_[started].data(), count, d, op, &req[started]);
        if (r != Result::ok) {
          err = error(r);
          break;
        }
      }
      for (std::size_t k = 0; k < started; ++k)  // every started one is waited for
        if (const Result r = comm_.wait(req[k]); r != Result::ok && err.empty()) err = error(r);
      return err;
    };
    const auto sequential = [&]() -> std::string {
      for (std::size_t k = 0; k < n; ++k)
        if (const Result r = comm_.allreduce(send_.data(), many_[k].data(), count, d, op);
            r != Result::ok)
          return error(r);
      return {};
    };
    for (const auto& [label, once] :
         {std::pair<const char*, std::function<std::string()>>{"treeduce", pipelined},
          {"sequential", sequential}}) {
      for (auto& b : many_) b.assign(send_.size(), 0xA5);
      Outcome o{label, measure(cfg_.warmup, cfg_.iters, once)};
      o.timing.mean_us /= static_cast<double>(n);
      o.timing.min_us /= static_cast<double>(n);
      o.timing.cpu_us /= static_cast<double>(n);
      if (!o.timing.error.empty()) {
        std::fprintf(stderr, "treeduce-perf: rank %u: %s: %zu x %s %s of %zu elements failed: %s\n",
                     comm_.rank(), label, n, name(d).data(), name(op).data(), count,
                     o.timing.error.c_str());
        o.failed = 1;
      } else if (cfg_.check) {
        for (const auto& b : many_)
          o.wrong += count_wrong(label, comm_.rank(), d, op, b, want_, count);
      }
      outs->push_back(std::move(o));
    }
  }

  template <class F>
  Outcome run_backend(const std::string& backend, DType d, ReduceOp op, std::size_t count,
                      F&& once) {
    // A poisoned output: a backend that wrote nothing cannot pass with another's result.
    std::fill(recv_.begin(), recv_.end(), std::uint8_t{0xA5});
    Outcome o{backend, measure(cfg_.warmup, cfg_.iters, once)};
    if (!o.timing.error.empty()) {
      std::fprintf(stderr, "treeduce-perf: rank %u: %s: %s %s of %zu elements failed: %s\n",
                   comm_.rank(), backend.c_str(), name(d).data(), name(op).data(), count,
                   o.timing.error.c_str());
      o.failed = 1;  // an error is counted apart: "wrong" is only for results that came back
    } else if (cfg_.check) {
      o.wrong = count_wrong(backend, comm_.rank(), d, op, recv_, want_, count);
    }
    return o;
  }

  void report(const Row& row, const std::vector<Outcome>& outs) {
    if (cfg_.json || json_out_) {
      const std::string line = json_row(row, outs);
      if (cfg_.json) std::printf("%s\n", line.c_str());
      if (json_out_) {
        std::fprintf(json_out_, "%s\n", line.c_str());
        std::fflush(json_out_);
      }
    }
    if (!cfg_.json) print_table_row(row, outs);
    std::fflush(stdout);
  }

  const Config& cfg_;
  Communicator& comm_;
  std::vector<std::unique_ptr<Baseline>> baselines_;
  std::vector<bool> dead_ = std::vector<bool>(baselines_.size(), false);
  std::FILE* json_out_;
  std::vector<Account> accounts_;
  std::vector<std::uint8_t> send_, recv_, want_;
  std::vector<std::vector<std::uint8_t>> many_;  // --back-to-back's receive buffers
  std::uint64_t row_retransmits_ = 0;
};

// Rank 0's closing lines: treeduce's as before baselines existed, its retransmissions in and
// outside the rows, then one per baseline.
void print_summary(const Communicator& comm, const std::vector<Account>& acc,
                   std::uint64_t row_retransmits) {
  const host::Stats st = comm.stats();
  std::printf("# %s: %llu wrong elements, %llu ops in the network, %llu on the hosts%s%s\n",
              acc[0].all_wrong == 0 && acc[0].all_failed == 0 ? "verified" : "FAILED",
              static_cast<unsigned long long>(acc[0].all_wrong),
              static_cast<unsigned long long>(st.network_ops),
              static_cast<unsigned long long>(st.fallback_ops),
              st.fallback_reason.empty() ? "" : "; last fallback: ", st.fallback_reason.c_str());
  std::printf(
      "# retransmissions: %llu in the rows, %llu outside them (the barriers before the rows and "
      "the sums of the ranks' counts after them)\n",
      static_cast<unsigned long long>(row_retransmits),
      static_cast<unsigned long long>(st.retransmits - row_retransmits));
  for (std::size_t i = 1; i < acc.size(); ++i) {
    std::printf("# %s: %s: %llu wrong elements, %llu failed operations over all ranks\n",
                acc[i].name.c_str(),
                acc[i].all_wrong == 0 && acc[i].all_failed == 0 ? "verified" : "FAILED",
                static_cast<unsigned long long>(acc[i].all_wrong),
                static_cast<unsigned long long>(acc[i].all_failed));
  }
}

// Every rank's own account on stderr: after a mid-job failure the summed counts may not have
// reached rank 0. The first two figures are totals over all backends.
void print_own_account(std::uint32_t rank, const std::vector<Account>& acc) {
  std::uint64_t failed = 0, wrong = 0;
  std::string each;
  for (const Account& a : acc) {
    failed += a.own_failed;
    wrong += a.own_wrong;
    each += (each.empty() ? " (" : "; ") + a.name + ": " + std::to_string(a.own_failed) +
            " failed, " + std::to_string(a.own_wrong) + " wrong";
  }
  std::fprintf(stderr, "treeduce-perf: rank %u: %llu failed operations, %llu wrong elements%s\n",
               rank, static_cast<unsigned long long>(failed),
               static_cast<unsigned long long>(wrong), acc.size() > 1 ? (each + ")").c_str() : "");
}

bool all_verified(const std::vector<Account>& acc) {
  for (const Account& a : acc)
    if (a.own_failed || a.own_wrong || a.all_failed || a.all_wrong) return false;
  return true;
}

// The baselines named by --compare, in its order. Empty and a sentence in `*error` on failure.
std::vector<std::unique_ptr<Baseline>> make_baselines(const std::vector<std::string>& names,
                                                      const host::Options& opt,
                                                      std::unique_ptr<Baseline> mpi,
                                                      std::string* error) {
  std::vector<std::unique_ptr<Baseline>> out;
  for (const std::string& n : names) {
    if (n == "mpi") {
      out.push_back(std::move(mpi));
    } else {
      auto g = perf::make_gloo_baseline(gloo_options(opt), error);
      if (!g) return {};
      out.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"treeduce-perf: allreduce sweep on libtreeduce (nccl-tests style)"};
  Config cfg;
  std::string dtypes = "f32,bf16,f16,e4m3,e5m2,i32", ops = "sum", compare, json_out_path;
  app.add_option("-b,--minbytes", cfg.min_bytes, "smallest message")->capture_default_str();
  app.add_option("-e,--maxbytes", cfg.max_bytes, "largest message")->capture_default_str();
  app.add_option("-f,--stepfactor", cfg.factor, "size multiplier per step")
      ->check(CLI::Range(2, 1024));
  app.add_option("-d,--dtypes", dtypes,
                 "element types, a comma list or all: f32, f16, bf16, e4m3, e5m2, i32, i8, u8, "
                 "i16, u16, u32, i64, u64, f64, f32_i32, f64_i32, i32_i32")
      ->capture_default_str();
  app.add_option("-o,--ops", ops,
                 "operations, a comma list or all: sum, min, max, prod, band, bor, bxor, land, "
                 "lor, lxor, minloc, maxloc; each type runs the ones defined on it")
      ->capture_default_str();
  app.add_option("-n,--iters", cfg.iters, "timed iterations")->check(CLI::Range(1, 100000));
  app.add_option("-w,--warmup", cfg.warmup, "untimed iterations first")->check(CLI::Range(0, 1000));
  app.add_option("-c,--check", cfg.check, "check every result (1) or not (0)");
  app.add_option("--seed", cfg.seed, "input seed");
  app.add_option("--back-to-back", cfg.back_to_back,
                 "N allreduces per iteration issued non-blocking then waited for, against the "
                 "same N one after the other (the x column: sequential time / back-to-back time)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--json", cfg.json, "one JSON object per row instead of the table");
  app.add_option("--json-out", json_out_path,
                 "rank 0 also appends one JSON object per row to this file (JSON Lines)");
  app.add_option("--compare", compare,
                 "baselines run on the same ranks and buffers after treeduce, per row: a comma "
                 "list of gloo (Gloo's ring allreduce), mpi (MPI_Allreduce)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the sentence; every usage error is exit code 2, as the lists' are (--help 0).
    return app.exit(e) == 0 ? 0 : 2;
  }
  std::string bad = parse_names("--dtypes", dtypes, kAllDTypes, &cfg.dtypes);
  if (bad.empty()) bad = parse_names("--ops", ops, kAllReduceOps, &cfg.ops);
  // A type with none of the operations defined on it (or the other way round) is an error that
  // names both; other undefined pairs of the two lists are left out.
  if (bad.empty()) bad = exact::defined_pairs(cfg.dtypes, cfg.ops, &cfg.pairs);
  if (bad.empty() && (cfg.min_bytes == 0 || cfg.max_bytes < cfg.min_bytes))
    bad = "--minbytes must be at least 1 and at most --maxbytes.";
  if (!bad.empty()) {
    std::fprintf(stderr, "treeduce-perf: %s\n", bad.c_str());
    return 2;
  }
  std::vector<std::string> names;
  if (const std::string why = parse_compare(compare, &names); !why.empty()) {
    std::fprintf(stderr, "treeduce-perf: %s\n", why.c_str());
    return 2;
  }
  if (cfg.back_to_back > 0 && !names.empty()) {
    std::fprintf(stderr,
                 "treeduce-perf: --back-to-back compares treeduce with itself; run "
                 "--compare in another run.\n");
    return 2;
  }

  // Rows are progress: line-buffered even into a file or a pipe.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  host::Options opt;
  std::string error;
  if (host::options_from_environment(&opt, &error) != Result::ok) {
    std::fprintf(stderr, "treeduce-perf: %s\n", error.c_str());
    return 2;
  }
  // MPI starts only when asked for, so that treeduce-perf runs without mpirun otherwise; and
  // before the communicator, whose threads MPI_Init should not find running.
  MpiSession mpi_session;
  std::unique_ptr<Baseline> mpi;
#ifdef TREEDUCE_PERF_HAVE_MPI
  if (std::find(names.begin(), names.end(), "mpi") != names.end()) {
    mpi = perf::make_mpi_baseline(opt.rank, opt.world_size, &error);
    if (!mpi) {
      std::fprintf(stderr, "treeduce-perf: rank %u: %s\n", opt.rank, error.c_str());
      return 2;
    }
  }
#endif
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> json_out(nullptr, &std::fclose);
  if (!json_out_path.empty() && opt.rank == 0) {
    json_out.reset(std::fopen(json_out_path.c_str(), "a"));
    if (!json_out) {
      std::fprintf(stderr, "treeduce-perf: cannot open %s to append JSON rows: %s.\n",
                   json_out_path.c_str(), std::strerror(errno));
      return 2;
    }
  }
  Result rc = Result::ok;
  auto comm = Communicator::create(opt, &rc, &error);
  if (!comm) {
    std::fprintf(stderr, "treeduce-perf: rank %u: %s (%s)\n", opt.rank, error.c_str(),
                 host::to_string(rc));
    return 1;
  }
  auto baselines = make_baselines(names, opt, std::move(mpi), &error);
  if (baselines.size() != names.size()) {
    std::fprintf(stderr, "treeduce-perf: rank %u: %s\n", opt.rank, error.c_str());
    return 1;
  }
  const bool lead = comm->rank() == 0;
  if (cfg.back_to_back > 0) names.push_back("sequential");  // the header's second group
  if (lead && !cfg.json) print_header(*comm, names);
  Sweep sweep(cfg, *comm, std::move(baselines), json_out.get());
  sweep.run();
  print_own_account(comm->rank(), sweep.accounts());
  if (lead) print_summary(*comm, sweep.accounts(), sweep.row_retransmits());
  return all_verified(sweep.accounts()) ? 0 : 1;
}
