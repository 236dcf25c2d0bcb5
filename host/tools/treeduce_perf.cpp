// treeduce-perf (host/tools): an allreduce sweep in the manner of nccl-tests' all_reduce_perf,
// on libtreeduce.
// One process per rank; the job comes from the environment (docs/host.md: TREEDUCE_MANAGER,
// TREEDUCE_JOB, TREEDUCE_RANK, TREEDUCE_WORLD_SIZE, ... or torchrun's/Open MPI's variables).
// Rank 0 prints a row per size, dtype and op as it completes:
//   size, count, type, op, time, algbw, busbw, path, wrong
// Inputs are exactly checkable (tests/tools/exact_inputs.h): every rank checks its result element
// by element, and the wrong counts of all ranks are summed with one more allreduce.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "exact_inputs.h"
#include "treeduce/host/communicator.h"

namespace {

using namespace treeduce;
using host::Communicator;
using host::Result;

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

template <class E, std::size_t N>
bool parse_names(const std::string& list, const std::array<E, N>& all, std::vector<E>* out) {
  for (const std::string& n : split(list)) {
    const auto it = std::find_if(all.begin(), all.end(), [&](E e) { return name(e) == n; });
    if (it == all.end()) return false;
    out->push_back(*it);
  }
  return !out->empty();
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"treeduce-perf: allreduce sweep on libtreeduce (nccl-tests style)"};
  std::uint64_t min_bytes = 1024, max_bytes = 4 << 20, factor = 4;
  std::string dtypes = "f32,bf16,f16,e4m3,e5m2,i32", ops = "sum";
  int iters = 10, warmup = 2;
  bool check = true, json = false;
  std::uint64_t seed = 1;
  app.add_option("-b,--minbytes", min_bytes, "smallest message")->capture_default_str();
  app.add_option("-e,--maxbytes", max_bytes, "largest message")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "size multiplier per step")->check(CLI::Range(2, 1024));
  app.add_option("-d,--dtypes", dtypes, "element types")->capture_default_str();
  app.add_option("-o,--ops", ops, "operations: sum, min, max")->capture_default_str();
  app.add_option("-n,--iters", iters, "timed iterations")->check(CLI::Range(1, 100000));
  app.add_option("-w,--warmup", warmup, "untimed iterations first")->check(CLI::Range(0, 1000));
  app.add_option("-c,--check", check, "check every result (1) or not (0)");
  app.add_option("--seed", seed, "input seed");
  app.add_flag("--json", json, "one JSON object per row instead of the table");
  CLI11_PARSE(app, argc, argv);
  std::vector<DType> dts;
  std::vector<ReduceOp> rops;
  if (!parse_names(dtypes, kAllDTypes, &dts) || !parse_names(ops, kAllReduceOps, &rops) ||
      min_bytes == 0 || max_bytes < min_bytes) {
    std::fprintf(stderr, "treeduce-perf: bad --dtypes, --ops or sizes.\n");
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
  Result rc = Result::ok;
  auto comm = Communicator::create(opt, &rc, &error);
  if (!comm) {
    std::fprintf(stderr, "treeduce-perf: rank %u: %s (%s)\n", opt.rank, error.c_str(),
                 host::to_string(rc));
    return 1;
  }
  const std::uint32_t rank = comm->rank(), world = comm->world_size();
  const bool lead = rank == 0;
  // busbw for an in-network allreduce (DESIGN.md section 8): each rank sends its data up once
  // and receives the result once; scaled so that ring and tree figures compare.
  const double bus = world > 1 ? static_cast<double>(world - 1) / (world + 1) : 1.0;
  if (lead && !json) {
    std::printf("# treeduce-perf: %u ranks, path %s%s%s\n", world,
                comm->path() == host::Path::network ? "network" : "host",
                comm->path_reason().empty() ? "" : ": ", comm->path_reason().c_str());
    std::printf("#%12s %12s %6s %5s %11s %11s %11s %8s %7s\n", "size", "count", "type", "op",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "path", "wrong");
  }
  std::uint64_t total_wrong = 0, own_wrong = 0;
  int failures = 0;
  for (std::uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    for (DType d : dts) {
      for (ReduceOp op : rops) {
        const std::size_t count = std::max<std::size_t>(1, bytes / dtype_size(d));
        const std::size_t nbytes = count * dtype_size(d);
        std::vector<std::uint8_t> send(nbytes), recv(nbytes), want(check ? nbytes : 0);
        const exact::Inputs in(seed, exact::Case{d, op, count, 0}, world);
        for (std::size_t i = 0; i < count; ++i) {
          exact::store(d, send.data(), i, in.element(rank, i));
          if (check) exact::store(d, want.data(), i, in.expected(i));
        }
        const host::Stats before = comm->stats();
        Result r = Result::ok;
        for (int i = 0; i < warmup && r == Result::ok; ++i) {
          r = comm->allreduce(send.data(), recv.data(), count, d, op);
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < iters && r == Result::ok; ++i) {
          r = comm->allreduce(send.data(), recv.data(), count, d, op);
        }
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                .count() /
            iters;
        // The path this row took, from the counters (the path now may differ after a fallback).
        const host::Stats after = comm->stats();
        const bool on_net = after.network_ops != before.network_ops;
        const bool on_host = after.fallback_ops != before.fallback_ops;
        const char* path = r != Result::ok     ? "FAILED"
                           : on_net && on_host ? "mixed"
                           : on_host           ? "host"
                                               : "network";
        std::int32_t wrong = 0;
        if (r != Result::ok) {
          std::fprintf(stderr, "treeduce-perf: rank %u: %s %s %zu: %s: %s\n", rank, name(d).data(),
                       name(op).data(), count, host::to_string(r), comm->last_error().c_str());
          ++failures;  // an error is counted apart: "wrong" is only for results that came back
        } else if (check) {
          for (std::size_t i = 0; i < count; ++i) {
            wrong += exact::load(d, recv.data(), i) != exact::load(d, want.data(), i);
          }
        }
        own_wrong += static_cast<std::uint64_t>(wrong);
        // Every rank's wrong count, summed; a rank whose allreduce failed still joins this one.
        std::int32_t all_wrong = wrong;
        if (comm->allreduce(&wrong, &all_wrong, 1, DType::i32, ReduceOp::sum) != Result::ok) {
          all_wrong = wrong;
        }
        total_wrong += static_cast<std::uint64_t>(all_wrong);
        const host::Stats st = comm->stats();
        const double algbw = static_cast<double>(nbytes) / (us * 1e3);
        if (!lead) continue;
        if (json) {
          std::printf(
              "{\"size\":%zu,\"count\":%zu,\"type\":\"%s\",\"op\":\"%s\",\"time_us\":%.3f,"
              "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"path\":\"%s\",\"wrong\":%d,"
              "\"fallbacks\":%llu}\n",
              nbytes, count, name(d).data(), name(op).data(), us, algbw, algbw * bus, path,
              all_wrong, static_cast<unsigned long long>(st.fallback_ops));
        } else {
          std::printf(" %12s %12zu %6s %5s %11.1f %11.3f %11.3f %8s %7d\n", human(nbytes).c_str(),
                      count, name(d).data(), name(op).data(), us, algbw, algbw * bus, path,
                      all_wrong);
        }
        std::fflush(stdout);
      }
    }
  }
  // Every rank's own account on stderr: after a mid-job failure the summed counts above may not
  // have reached rank 0.
  std::fprintf(stderr, "treeduce-perf: rank %u: %d failed operations, %llu wrong elements\n", rank,
               failures, static_cast<unsigned long long>(own_wrong));
  if (lead) {
    const host::Stats st = comm->stats();
    std::printf("# %s: %llu wrong elements, %llu ops in the network, %llu on the hosts%s%s\n",
                total_wrong == 0 && failures == 0 ? "verified" : "FAILED",
                static_cast<unsigned long long>(total_wrong),
                static_cast<unsigned long long>(st.network_ops),
                static_cast<unsigned long long>(st.fallback_ops),
                st.fallback_reason.empty() ? "" : "; last fallback: ", st.fallback_reason.c_str());
  }
  return total_wrong == 0 && failures == 0 ? 0 : 1;
}
