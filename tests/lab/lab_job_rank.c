/* A rank of the lab's job tests (tests/lab/test_lab_jobs.cpp), built by the test with
 * `cc lab_job_rank.c $(pkg-config --cflags --libs treeduce)` against the build tree's
 * treeduce-uninstalled.pc, on the documented C API only (docs/host.md).
 *
 *   lab_job_rank [--count N] [--iters K] [--path network|host] [--hold FILE]
 *
 * Joins the job from the environment `treeduce lab run` gives it, checks tdr_comm_rank() and
 * tdr_comm_size() against RANK and WORLD_SIZE, runs K allreduces of N int32 (sum) whose exact
 * result it knows, and says so: "rank R of S: K allreduces of N i32 exact, path P". With --hold it
 * then prints "rank R: held" and keeps its communicator (and so the job's tree) until FILE exists,
 * then runs one more allreduce, checked the same way. With --path, a rank on the other path fails.
 * Exit status 0 only when every result was exact (and the path the one asked for). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <treeduce/treeduce.h>
#include <unistd.h>

/* Rank r's element i: (r + 1) * (i % 1000 + 1); the sum over S ranks is
 * (i % 1000 + 1) * S * (S + 1) / 2, exact in int32 for the sizes used here. */
static int allreduce_checked(tdr_comm_t* comm, uint32_t rank, uint32_t size, int32_t* buf,
                             size_t count) {
  for (size_t i = 0; i < count; ++i) buf[i] = (int32_t)((rank + 1) * (i % 1000 + 1));
  tdr_result_t r = tdr_allreduce(comm, buf, buf, count, tdr_i32, tdr_sum);
  if (r != tdr_ok) {
    fprintf(stderr, "rank %u: allreduce: %s: %s\n", rank, tdr_result_string(r),
            tdr_last_error(comm));
    return 0;
  }
  for (size_t i = 0; i < count; ++i) {
    const int32_t want = (int32_t)((i % 1000 + 1) * size * (size + 1) / 2);
    if (buf[i] != want) {
      fprintf(stderr, "rank %u: element %zu is %d, not %d\n", rank, i, buf[i], want);
      return 0;
    }
  }
  return 1;
}

static const char* path_name(tdr_path_t p) { return p == tdr_path_network ? "network" : "host"; }

int main(int argc, char** argv) {
  size_t count = 1000;
  long iters = 1;
  const char* want_path = NULL;
  const char* hold = NULL;
  for (int i = 1; i < argc; ++i) {
    if (i + 1 < argc && strcmp(argv[i], "--count") == 0) {
      count = strtoul(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--iters") == 0) {
      iters = strtol(argv[++i], NULL, 10);
    } else if (i + 1 < argc && strcmp(argv[i], "--path") == 0) {
      want_path = argv[++i];
    } else if (i + 1 < argc && strcmp(argv[i], "--hold") == 0) {
      hold = argv[++i];
    } else {
      fprintf(stderr,
              "usage: lab_job_rank [--count N] [--iters K] [--path network|host] [--hold FILE]\n");
      return 2;
    }
  }
  if (count == 0 || count > 1000000 || iters < 1) {
    fprintf(stderr, "lab_job_rank: --count is 1 to 1000000 and --iters at least 1.\n");
    return 2;
  }
  tdr_comm_t* comm = NULL;
  if (tdr_comm_create_from_env(&comm) != tdr_ok) {
    fprintf(stderr, "join: %s\n", tdr_last_error(NULL));
    return 1;
  }
  uint32_t rank = 0, size = 0;
  tdr_comm_rank(comm, &rank);
  tdr_comm_size(comm, &size);
  const char* env_rank = getenv("RANK");
  const char* env_size = getenv("WORLD_SIZE");
  int ok = 1;
  if (env_rank == NULL || env_size == NULL || strtoul(env_rank, NULL, 10) != rank ||
      strtoul(env_size, NULL, 10) != size) {
    fprintf(stderr, "rank %u of %u, but RANK is %s and WORLD_SIZE %s\n", rank, size,
            env_rank ? env_rank : "unset", env_size ? env_size : "unset");
    ok = 0;
  }
  int32_t* buf = malloc(count * sizeof *buf);
  if (buf == NULL) {
    tdr_comm_destroy(comm);
    return 1;
  }
  for (long k = 0; k < iters && ok; ++k) ok = allreduce_checked(comm, rank, size, buf, count);
  const char* path = path_name(tdr_path(comm));
  if (ok && want_path != NULL && strcmp(path, want_path) != 0) {
    fprintf(stderr, "rank %u: path %s (%s), not %s\n", rank, path, tdr_path_reason(comm),
            want_path);
    ok = 0;
  }
  printf("rank %u of %u: %ld allreduces of %zu i32 %s, path %s\n", rank, size, iters, count,
         ok ? "exact" : "WRONG", path);
  fflush(stdout);
  if (ok && hold != NULL) {
    printf("rank %u: held\n", rank);
    fflush(stdout);
    const struct timespec tick = {0, 10 * 1000 * 1000};
    while (access(hold, F_OK) != 0) nanosleep(&tick, NULL);
    ok = allreduce_checked(comm, rank, size, buf, count);
    printf("rank %u: released, one more allreduce %s, path %s\n", rank, ok ? "exact" : "WRONG",
           path_name(tdr_path(comm)));
  }
  free(buf);
  tdr_comm_destroy(comm);
  return ok ? 0 : 1;
}
