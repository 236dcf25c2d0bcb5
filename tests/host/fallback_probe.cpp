// A rank in a process of its own, for test_manager_client.cpp: makes a Communicator from the
// launcher's variables (TREEDUCE_MANAGER, TREEDUCE_JOB, ...), reports what it offloads, runs one
// allreduce of `count` elements of the dtype and operation named on the command line, and prints
// what the library said about it. A process apart because libtreeduce carries its own copy of the
// manager's protobuf code, which must not be registered twice with the in-process manager's.
//
//   treeduce-test-fallback-probe DTYPE OP COUNT [DTYPE OP]...
// prints "path network|host", then per pair "offloads DTYPE OP 0|1", then "result ok|...",
// "reason <Stats::fallback_reason>", "fallback_ops N", "network_ops N". Exit 0 when it ran; else
// "environment <error>" (exit 2) or "create <result> <error>" (exit 1).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "treeduce/host/communicator.h"

using namespace treeduce;
using namespace treeduce::host;

int main(int argc, char** argv) {
  if (argc < 4 || (argc - 4) % 2 != 0) {
    std::fprintf(stderr, "usage: %s DTYPE OP COUNT [DTYPE OP]...\n", argv[0]);
    return 2;
  }
  const auto d = parse_dtype(argv[1]);
  const auto op = parse_op(argv[2]);
  const std::size_t count = std::strtoul(argv[3], nullptr, 10);
  if (!d || !op) {
    std::fprintf(stderr, "unknown type or operation\n");
    return 2;
  }
  Options o;
  std::string error;
  if (options_from_environment(&o, &error) != Result::ok) {
    std::printf("environment %s\n", error.c_str());
    return 2;
  }
  Result r = Result::internal;
  auto comm = Communicator::create(o, &r, &error);
  if (!comm) {
    std::printf("create %s %s\n", to_string(r), error.c_str());
    return 1;
  }
  std::printf("path %s\n", comm->path() == Path::network ? "network" : "host");
  for (int a = 1; a + 1 < argc; a += a == 1 ? 3 : 2) {
    const auto pd = parse_dtype(argv[a]);
    const auto po = parse_op(argv[a + 1]);
    if (pd && po)
      std::printf("offloads %s %s %d\n", argv[a], argv[a + 1], comm->offloads(*pd, *po) ? 1 : 0);
  }
  std::vector<unsigned char> in(count * dtype_size(*d), 0), out(in.size());
  r = comm->allreduce(in.data(), out.data(), count, *d, *op);
  const Stats s = comm->stats();
  std::printf("result %s\nreason %s\nfallback_ops %llu\nnetwork_ops %llu\n", to_string(r),
              s.fallback_reason.c_str(), static_cast<unsigned long long>(s.fallback_ops),
              static_cast<unsigned long long>(s.network_ops));
  std::fflush(stdout);
  return 0;
}
