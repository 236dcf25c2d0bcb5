/*
 * treeduce-mpi-bench: an OSU-style MPI_Allreduce sweep written against MPI alone, for timing the
 * same program with and without libtreeduce-mpi (docs/mpi.md, "Benchmark"). Per size: the
 * average, minimum and maximum over the ranks of each rank's average latency (as
 * osu_allreduce), and the bandwidth size / average latency. Every result is checked: the inputs
 * are small integers in binary32, whose sums are exact in any order.
 *
 *   treeduce-mpi-bench [-b MIN_BYTES] [-e MAX_BYTES] [-f FACTOR] [-i ITERS] [-w WARMUP] [-p]
 *                      [-s]
 *
 * -p: in place (MPI_IN_PLACE). -s: on MPI_COMM_SELF, each rank alone, where Open MPI's
 * allreduce is a copy: what a call passed through costs beyond plain Open MPI stands out there.
 * The exit status is 1 when a result was wrong.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long parse(const char* s, const char* what) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || v <= 0) {
    fprintf(stderr, "treeduce-mpi-bench: %s is '%s', not a positive number.\n", what, s);
    exit(2);
  }
  if (*end == 'K' || *end == 'k')
    v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, ++end;
  if (*end != '\0') {
    fprintf(stderr, "treeduce-mpi-bench: %s is '%s', not a positive number (K and M allowed).\n",
            what, s);
    exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  long min_bytes = 4, max_bytes = 1L << 20, factor = 2, iters = 100, warmup = 10;
  int in_place = 0, self = 0, opt;
  while ((opt = getopt(argc, argv, "b:e:f:i:w:ps")) != -1) {
    switch (opt) {
      case 'b':
        min_bytes = parse(optarg, "-b");
        break;
      case 'e':
        max_bytes = parse(optarg, "-e");
        break;
      case 'f':
        factor = parse(optarg, "-f");
        break;
      case 'i':
        iters = parse(optarg, "-i");
        break;
      case 'w':
        warmup = parse(optarg, "-w");
        break;
      case 'p':
        in_place = 1;
        break;
      case 's':
        self = 1;
        break;
      default:
        fprintf(stderr,
                "usage: treeduce-mpi-bench [-b MIN] [-e MAX] [-f FACTOR] [-i ITERS] "
                "[-w WARMUP] [-p] [-s]\n");
        return 2;
    }
  }
  if (factor < 2 || min_bytes > max_bytes) {
    fprintf(stderr, "treeduce-mpi-bench: -f must be 2 or more and -b at most -e.\n");
    return 2;
  }
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const MPI_Comm comm = self ? MPI_COMM_SELF : MPI_COMM_WORLD;
  const int csize = self ? 1 : size;
  /* libtreeduce-mpi defines tdr_* through libtreeduce: present only when it is loaded. */
  const int interposed = dlsym(RTLD_DEFAULT, "tdr_comm_create") != NULL;
  const size_t max_count = (size_t)max_bytes / sizeof(float) + 1;
  float* send = malloc(max_count * sizeof(float));
  float* recv = malloc(max_count * sizeof(float));
  if (send == NULL || recv == NULL) {
    fprintf(stderr, "treeduce-mpi-bench: rank %d: out of memory for %ld bytes.\n", rank, max_bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (rank == 0) {
    printf(
        "# treeduce-mpi-bench: MPI_Allreduce MPI_FLOAT MPI_SUM%s, %d ranks, libtreeduce-mpi %s\n",
        in_place ? " in place" : "", size, interposed ? "loaded" : "not loaded");
    printf("# %-10s %16s %16s %16s %16s %10s\n", "Size(B)", "Avg Latency(us)", "Min Latency(us)",
           "Max Latency(us)", "Bandwidth(MB/s)", "Wrong");
  }
  long wrong_total = 0;
  for (long bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const size_t count = (size_t)bytes / sizeof(float);
    if (count == 0) continue;
    long wrong = 0;
    double elapsed = 0;
    for (long it = 0; it < warmup + iters; ++it) {
      for (size_t i = 0; i < count; ++i) send[i] = (float)((rank + (int)i + (int)it) % 7);
      float* out = recv;
      if (in_place) {
        memcpy(recv, send, count * sizeof(float));
      }
      if (!self) MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allreduce(in_place ? MPI_IN_PLACE : send, out, (int)count, MPI_FLOAT, MPI_SUM,
                    comm);
      const double t1 = MPI_Wtime();
      if (it >= warmup) elapsed += t1 - t0;
      for (size_t i = 0; i < count; ++i) {
        long want = 0;
        for (int r = 0; r < csize; ++r) want += ((self ? rank : r) + (int)i + (int)it) % 7;
        if (out[i] != (float)want) ++wrong;
      }
    }
    double mine = elapsed * 1e6 / (double)iters, avg = 0, lo = 0, hi = 0;
    MPI_Reduce(&mine, &avg, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine, &lo, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&mine, &hi, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    long wrong_all = 0;
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      avg /= size;
      printf("  %-10zu %16.2f %16.2f %16.2f %16.2f %10ld\n", count * sizeof(float), avg, lo, hi,
             (double)(count * sizeof(float)) / avg, wrong_all);
      fflush(stdout);
    }
    wrong_total += wrong_all;
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return rank == 0 && wrong_total != 0 ? 1 : 0;
}
