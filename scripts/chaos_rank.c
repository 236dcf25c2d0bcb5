/* A rank of the chaos soak (scripts/chaos.sh, docs/lab.md "Chaos soak"), on the documented C API
 * only (docs/host.md); the script builds it with `cc chaos_rank.c $(pkg-config --cflags --libs
 * treeduce)` against the build tree.
 *
 *   chaos_rank --stop FILE [--count N (65536)] [--op-timeout-ms T] [--join-timeout-ms J]
 *              [--collectives N] [--tag TAG]
 *
 * Joins the job `treeduce lab run` gives it (its TREEDUCE_* variables) with the given timeouts,
 * then runs allreduces until a rank finds FILE (the ranks vote on it every 16 collectives), or N
 * of them with --collectives N:
 * collective k alternates i32 sum and f32 sum of N elements whose exact result it knows (rank r's
 * element i is (r + 1) * ((i + k) % 1000 + 1): small integers, so the f32 sum is exact in any
 * order). One line per collective on stdout:
 *
 *   chaos: TAG rank R collective K ok-network|ok-host|failed|WRONG MS [what]
 *
 * ok-network / ok-host: exact, and where it was reduced (from the communicator's counters);
 * failed: the call returned an error (its sentence follows); WRONG: the call said ok and an
 * element differs (never acceptable). MS is the call's wall time in milliseconds, which the
 * script compares with the documented bound. A failed vote is a line "vote K failed". After a
 * failed or wrong collective the rank stops (its communicator may no longer agree with the
 * others'), exit status 1; 0 when it stopped at FILE or after N; 2 on a bad command line. TAG
 * (default "-") names the job in the script's logs. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <treeduce/treeduce.h>
#include <unistd.h>

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static const char* env_or_null(const char* name) {
  const char* v = getenv(name);
  return v != NULL && v[0] != '\0' ? v : NULL;
}

static int env_u32(const char* name, uint32_t* out) {
  const char* v = env_or_null(name);
  if (v == NULL) return 0;
  char* end = NULL;
  unsigned long x = strtoul(v, &end, 10);
  if (*end != '\0' || x > 0xFFFFFFFFul) return 0;
  *out = (uint32_t)x;
  return 1;
}

int main(int argc, char** argv) {
  size_t count = 65536;
  uint32_t op_timeout_ms = 20000, join_timeout_ms = 20000;
  const char* stop = NULL;
  const char* tag = "-";
  uint64_t limit = 0;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 < argc && strcmp(argv[i], "--count") == 0) {
      count = strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--op-timeout-ms") == 0) {
      op_timeout_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--join-timeout-ms") == 0) {
      join_timeout_ms = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--stop") == 0) {
      stop = argv[++i];
    } else if (i + 1 < argc && strcmp(argv[i], "--collectives") == 0) {
      limit = strtoull(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--tag") == 0) {
      tag = argv[++i];
    } else {
      fprintf(stderr,
              "usage: chaos_rank --stop FILE [--count N] [--op-timeout-ms T] "
              "[--join-timeout-ms J] [--tag TAG]\n");
      return 2;
    }
  }
  if (stop == NULL || count == 0 || count > 1000000 || op_timeout_ms == 0 || join_timeout_ms == 0) {
    fprintf(stderr,
            "chaos_rank: --stop is required, --count is 1 to 1000000 and the timeouts "
            "are at least 1 ms.\n");
    return 2;
  }
  tdr_options_t opt;
  tdr_options_init(&opt);
  opt.job = env_or_null("TREEDUCE_JOB");
  opt.manager = env_or_null("TREEDUCE_MANAGER");
  opt.host = env_or_null("TREEDUCE_HOST");
  opt.bind_address = env_or_null("TREEDUCE_BIND");
  opt.fallback_store = env_or_null("TREEDUCE_FALLBACK_STORE");
  opt.fallback_address = env_or_null("TREEDUCE_FALLBACK_ADDRESS");
  opt.op_timeout_ms = op_timeout_ms;
  opt.join_timeout_ms = join_timeout_ms;
  if (opt.job == NULL || opt.manager == NULL || !env_u32("TREEDUCE_RANK", &opt.rank) ||
      !env_u32("TREEDUCE_WORLD_SIZE", &opt.world_size)) {
    fprintf(stderr,
            "chaos_rank: run it under `treeduce lab run` (TREEDUCE_JOB, TREEDUCE_MANAGER, "
            "TREEDUCE_RANK and TREEDUCE_WORLD_SIZE must be set).\n");
    return 2;
  }
  const uint32_t rank = opt.rank, size = opt.world_size;
  tdr_comm_t* comm = NULL;
  const double t_join = now_ms();
  if (tdr_comm_create(&opt, &comm) != tdr_ok) {
    printf("chaos: %s rank %u join failed %.0f %s\n", tag, rank, now_ms() - t_join,
           tdr_last_error(NULL));
    return 1;
  }
  int32_t* ibuf = malloc(count * sizeof *ibuf);
  float* fbuf = malloc(count * sizeof *fbuf);
  if (ibuf == NULL || fbuf == NULL) {
    free(ibuf);
    free(fbuf);
    tdr_comm_destroy(comm);
    return 1;
  }
  const int64_t ranks_sum = (int64_t)size * (size + 1) / 2;
  int status = 0;
  for (uint64_t k = 0; limit == 0 || k < limit; ++k) {
    /* Every 16 collectives the ranks agree whether to stop (a 1-element i32 max of "the stop file
     * exists"): a rank that stopped on its own would leave the others in a collective it never
     * joins, which they would end as a failure. */
    if (k % 16 == 0) {
      int32_t seen = access(stop, F_OK) == 0, any = 0;
      const tdr_result_t v = tdr_allreduce(comm, &seen, &any, 1, tdr_i32, tdr_max);
      if (v != tdr_ok) {
        printf("chaos: %s rank %u vote %llu failed 0 %s: %s\n", tag, rank, (unsigned long long)k,
               tdr_result_string(v), tdr_last_error(comm));
        status = 1;
        break;
      }
      if (any) break;
    }
    const int as_float = (int)(k % 2);
    for (size_t i = 0; i < count; ++i) {
      const int32_t v = (int32_t)((rank + 1) * ((i + k) % 1000 + 1));
      ibuf[i] = v;
      fbuf[i] = (float)v;
    }
    tdr_stats_t before, after;
    tdr_get_stats(comm, &before);
    const double t0 = now_ms();
    const tdr_result_t r = as_float ? tdr_allreduce(comm, fbuf, fbuf, count, tdr_f32, tdr_sum)
                                    : tdr_allreduce(comm, ibuf, ibuf, count, tdr_i32, tdr_sum);
    const double ms = now_ms() - t0;
    tdr_get_stats(comm, &after);
    if (r != tdr_ok) {
      printf("chaos: %s rank %u collective %llu failed %.0f %s: %s\n", tag, rank,
             (unsigned long long)k, ms, tdr_result_string(r), tdr_last_error(comm));
      status = 1;
      break;
    }
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < count; ++i) {
      const int64_t want = ((int64_t)((i + k) % 1000) + 1) * ranks_sum;
      const int ok = as_float ? fbuf[i] == (float)want : ibuf[i] == (int32_t)want;
      if (!ok && wrong++ == 0) first = i;
    }
    const char* outcome = wrong != 0                                 ? "WRONG"
                          : after.fallback_ops > before.fallback_ops ? "ok-host"
                                                                     : "ok-network";
    if (wrong != 0) {
      printf(
          "chaos: %s rank %u collective %llu WRONG %.0f %zu of %zu %s elements wrong, the first "
          "at %zu\n",
          tag, rank, (unsigned long long)k, ms, wrong, count, as_float ? "f32" : "i32", first);
      status = 1;
      break;
    }
    printf("chaos: %s rank %u collective %llu %s %.0f\n", tag, rank, (unsigned long long)k, outcome,
           ms);
    fflush(stdout);
  }
  fflush(stdout);
  free(ibuf);
  free(fbuf);
  tdr_comm_destroy(comm);
  return status;
}
