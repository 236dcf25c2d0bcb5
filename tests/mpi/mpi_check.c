/*
 * An MPI program that knows nothing of treeduce (built with mpicc, no treeduce header): every
 * collective libtreeduce-mpi offloads and some it passes through, on MPI_COMM_WORLD and on the
 * halves of an MPI_Comm_split, each result checked against a local computation (integers exactly,
 * float sums within docs/mpi.md's bound). tests/mpi/test_mpi_lab.cpp runs it under `lab run
 * --mpi` with and without the interposer and compares the digests of the integer results.
 *
 *   mpi_check                 every case once; prints "mpi_check: rank R: N checks, W wrong,
 *                             digest D" and exits 1 when W > 0
 *   mpi_check --hold FILE N   only N rounds of 256 KiB allreduces (MPI_Iallreduce and
 *                             MPI_Wait in even rounds, MPI_Allreduce in odd ones), stopping
 *                             after the tenth (rank 0 prints "mpi_check: held", waits for FILE)
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static long checks, wrong;
static uint64_t digest = 1469598103934665603ULL;
/* The float sums' bits: equal between two runs only on a deterministic tree (docs/mpi.md). */
static uint64_t float_digest = 1469598103934665603ULL;
static int world_rank;

static void mix_into(uint64_t* d, const void* p, size_t n) {
  const unsigned char* b = p;
  for (size_t i = 0; i < n; ++i) *d = (*d ^ b[i]) * 1099511628211ULL;
}

static void mix(const void* p, size_t n) { mix_into(&digest, p, n); }

static void expect(int ok, const char* what, size_t i) {
  ++checks;
  if (!ok) {
    if (wrong < 10) fprintf(stderr, "mpi_check: rank %d: %s wrong at %zu\n", world_rank, what, i);
    ++wrong;
  }
}

static int ival(int r, size_t i) { return (int)((r * 7 + (long)i * 13) % 1000) - 500; }
static double dval(int r, size_t i) {
  return (i % 2 ? 1.0 : -1.0) / (1.0 + r + (double)(i % 13)) + 0.1 * (double)(i % 7);
}

/* |r - exact| <= 2 gamma(k-1) S (1 + u): docs/mpi.md ("Results"), for MPI's order and ours. */
static int within(double got, long double exact, long double abs_sum, int k, double u) {
  const double m = (k - 1) * u;
  const long double bound = 2.0L * (m / (1 - m)) * abs_sum * (1 + u) + 1e-300L;
  return fabsl((long double)got - exact) <= bound;
}

static void cases(MPI_Comm comm, const char* tag) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  char what[128];
  /* int32 sum, 280 KB */
  {
    const size_t n = 70000;
    int* in = malloc(n * sizeof(int));
    int* out = malloc(n * sizeof(int));
    for (size_t i = 0; i < n; ++i) in[i] = ival(rank, i);
    MPI_Allreduce(in, out, (int)n, MPI_INT, MPI_SUM, comm);
    snprintf(what, sizeof what, "%s int sum", tag);
    for (size_t i = 0; i < n; ++i) {
      long want = 0;
      for (int r = 0; r < size; ++r) want += ival(r, i);
      expect(out[i] == want, what, i);
    }
    mix(out, n * sizeof(int));
    /* in place, and MPI_Reduce in place at the last rank */
    memcpy(out, in, n * sizeof(int));
    MPI_Allreduce(MPI_IN_PLACE, out, (int)n, MPI_INT, MPI_MAX, comm);
    snprintf(what, sizeof what, "%s int max in place", tag);
    for (size_t i = 0; i < n; ++i) {
      int want = ival(0, i);
      for (int r = 1; r < size; ++r) want = ival(r, i) > want ? ival(r, i) : want;
      expect(out[i] == want, what, i);
    }
    mix(out, n * sizeof(int));
    memcpy(out, in, n * sizeof(int));
    MPI_Reduce(rank == size - 1 ? MPI_IN_PLACE : in, rank == size - 1 ? out : NULL, (int)n, MPI_INT,
               MPI_SUM, size - 1, comm);
    if (rank == size - 1) {
      snprintf(what, sizeof what, "%s int reduce in place", tag);
      for (size_t i = 0; i < n; ++i) {
        long want = 0;
        for (int r = 0; r < size; ++r) want += ival(r, i);
        expect(out[i] == want, what, i);
      }
    }
    free(in);
    free(out);
  }
  /* small integer types: sums that never overflow (Open MPI saturates some), bitwise, logical */
  {
    enum { n = 4096 };
    static int8_t a8[n], o8[n];
    static uint16_t a16[n], o16[n];
    static int64_t a64[n], o64[3][n];
    static int al[n], ol[n];
    for (size_t i = 0; i < n; ++i) {
      a8[i] = (int8_t)((rank + (int)i) % 7 - 3);
      a16[i] = (uint16_t)((rank * 1000 + i * 37) % 65536);
      a64[i] = (int64_t)(0x0123456789abcdefULL * (uint64_t)(rank + 1) ^ (uint64_t)i);
      al[i] = (int)((i >> rank) & 1);
    }
    MPI_Allreduce(a8, o8, n, MPI_INT8_T, MPI_SUM, comm);
    MPI_Allreduce(a16, o16, n, MPI_UNSIGNED_SHORT, MPI_MAX, comm);
    MPI_Allreduce(a64, o64[0], n, MPI_INT64_T, MPI_BAND, comm);
    MPI_Allreduce(a64, o64[1], n, MPI_LONG, MPI_BOR, comm);
    MPI_Allreduce(a64, o64[2], n, MPI_LONG_LONG, MPI_BXOR, comm);
    MPI_Allreduce(al, ol, n, MPI_INT, MPI_LXOR, comm);
    snprintf(what, sizeof what, "%s small types", tag);
    for (size_t i = 0; i < n; ++i) {
      int s8 = 0, x = 0;
      uint16_t m16 = 0;
      int64_t band = -1, bor = 0, bxor = 0;
      for (int r = 0; r < size; ++r) {
        s8 += (r + (int)i) % 7 - 3;
        const uint16_t v = (uint16_t)((r * 1000 + i * 37) % 65536);
        m16 = v > m16 ? v : m16;
        const int64_t w = (int64_t)(0x0123456789abcdefULL * (uint64_t)(r + 1) ^ (uint64_t)i);
        band &= w;
        bor |= w;
        bxor ^= w;
        x ^= (int)((i >> r) & 1);
      }
      expect(o8[i] == s8 && o16[i] == m16 && o64[0][i] == band && o64[1][i] == bor &&
                 o64[2][i] == bxor && ol[i] == x,
             what, i);
    }
    mix(o8, sizeof o8);
    mix(o16, sizeof o16);
    mix(o64, sizeof o64);
    mix(ol, sizeof ol);
  }
  /* MINLOC and MAXLOC pairs, with ties (the lowest index wins in MPI and in treeduce) */
  {
    enum { n = 2048 };
    static struct { int v, i; } a2[n], o2[n];
    static struct {
      float v;
      int i;
    } af[n], of[n];
    static struct {
      double v;
      int i;
    } ad[n], od[n];
    for (size_t i = 0; i < n; ++i) {
      a2[i].v = (int)((i * (size_t)(rank + 3)) % 5);
      a2[i].i = rank;
      af[i].v = (float)((i + (size_t)rank * 3) % 4);
      af[i].i = rank;
      ad[i].v = (double)((i * 7 + (size_t)rank) % 3) / 3.0;
      ad[i].i = rank;
    }
    MPI_Allreduce(a2, o2, n, MPI_2INT, MPI_MAXLOC, comm);
    MPI_Allreduce(af, of, n, MPI_FLOAT_INT, MPI_MINLOC, comm);
    MPI_Allreduce(ad, od, n, MPI_DOUBLE_INT, MPI_MAXLOC, comm);
    snprintf(what, sizeof what, "%s minloc/maxloc", tag);
    for (size_t i = 0; i < n; ++i) {
      int bv = -1, bi = -1, fi = -1, di = -1;
      float fv = 1e30f;
      double dv = -1;
      for (int r = 0; r < size; ++r) {
        const int v = (int)((i * (size_t)(r + 3)) % 5);
        if (v > bv) bv = v, bi = r;
        const float f = (float)((i + (size_t)r * 3) % 4);
        if (f < fv) fv = f, fi = r;
        const double d = (double)((i * 7 + (size_t)r) % 3) / 3.0;
        if (d > dv) dv = d, di = r;
      }
      expect(o2[i].v == bv && o2[i].i == bi && of[i].v == fv && of[i].i == fi && od[i].v == dv &&
                 od[i].i == di,
             what, i);
      mix(&o2[i], sizeof o2[i]);
      mix(&of[i].i, sizeof(int));
      mix(&od[i].i, sizeof(int));
    }
  }
  /* float sums: within the bound of the exact sum */
  {
    const size_t n = 50000;
    double* in = malloc(n * sizeof(double));
    double* out = malloc(n * sizeof(double));
    float* fin = malloc(n * sizeof(float));
    float* fout = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      in[i] = dval(rank, i);
      fin[i] = (float)dval(rank, i);
      out[i] = in[i];
    }
    MPI_Allreduce(MPI_IN_PLACE, out, (int)n, MPI_DOUBLE, MPI_SUM, comm);
    MPI_Allreduce(fin, fout, (int)n, MPI_FLOAT, MPI_SUM, comm);
    snprintf(what, sizeof what, "%s float sums", tag);
    for (size_t i = 0; i < n; ++i) {
      long double s = 0, S = 0, fs = 0, fS = 0;
      for (int r = 0; r < size; ++r) {
        s += dval(r, i);
        S += fabs(dval(r, i));
        fs += (float)dval(r, i);
        fS += fabsf((float)dval(r, i));
      }
      expect(within(out[i], s, S, size, 0x1p-53) && within(fout[i], fs, fS, size, 0x1p-24), what,
             i);
    }
    mix_into(&float_digest, out, n * sizeof(double));
    mix_into(&float_digest, fout, n * sizeof(float));
    free(in);
    free(out);
    free(fin);
    free(fout);
  }
  /* MPI_Bcast of bytes and doubles; MPI_Barrier */
  {
    const size_t n = 100000;
    unsigned char* b = malloc(n);
    const int root = 1 % size;
    for (size_t i = 0; i < n; ++i) b[i] = rank == root ? (unsigned char)(i * 31 + 7) : 0;
    MPI_Bcast(b, (int)n, MPI_BYTE, root, comm);
    snprintf(what, sizeof what, "%s bcast", tag);
    for (size_t i = 0; i < n; ++i) expect(b[i] == (unsigned char)(i * 31 + 7), what, i);
    mix(b, n);
    double d[1000];
    for (int i = 0; i < 1000; ++i) d[i] = rank == 0 ? i / 7.0 : -1;
    MPI_Bcast(d, 1000, MPI_DOUBLE, 0, comm);
    for (int i = 0; i < 1000; ++i) expect(d[i] == i / 7.0, what, (size_t)i);
    free(b);
    MPI_Barrier(comm);
  }
  /* MPI_Iallreduce with MPI_Wait, MPI_Waitall and an MPI_Test loop */
  {
    enum { n = 20000 };
    static int in[4][n], out[4][n];
    for (int k = 0; k < 4; ++k) {
      for (size_t i = 0; i < n; ++i) in[k][i] = ival(rank + k, i);
    }
    MPI_Request req[3];
    MPI_Iallreduce(in[0], out[0], n, MPI_INT, MPI_SUM, comm, &req[0]);
    MPI_Wait(&req[0], MPI_STATUS_IGNORE);
    MPI_Iallreduce(in[1], out[1], n, MPI_INT, MPI_SUM, comm, &req[0]);
    MPI_Iallreduce(in[2], out[2], n, MPI_INT, MPI_SUM, comm, &req[1]);
    memcpy(out[3], in[3], sizeof out[3]);
    MPI_Iallreduce(MPI_IN_PLACE, out[3], n, MPI_INT, MPI_SUM, comm, &req[2]);
    MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    for (int flag = 0; !flag;) MPI_Test(&req[2], &flag, MPI_STATUS_IGNORE);
    snprintf(what, sizeof what, "%s iallreduce", tag);
    for (int k = 0; k < 4; ++k) {
      for (size_t i = 0; i < n; ++i) {
        long want = 0;
        for (int r = 0; r < size; ++r) want += ival(r + k, i);
        expect(out[k][i] == want, what, i);
      }
    }
    mix(out, sizeof out);
  }
}

/* An MPI_Iallreduce on MPI_COMM_WORLD overlapped with a blocking MPI_Allreduce on another
 * communicator, waited for before it on odd ranks and after it on even ones: valid MPI, which
 * completes whatever the order (the request needs only every rank to have started it). */
static void overlapped(void) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm other;
  MPI_Comm_dup(MPI_COMM_WORLD, &other);
  enum { n = 20000 };
  static int in[n], out[n], in2[n], out2[n];
  for (size_t i = 0; i < n; ++i) {
    in[i] = ival(world_rank, i);
    in2[i] = ival(world_rank + 5, i);
  }
  MPI_Request req;
  MPI_Iallreduce(in, out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
  if (world_rank % 2 == 1) MPI_Wait(&req, MPI_STATUS_IGNORE);
  MPI_Allreduce(in2, out2, n, MPI_INT, MPI_SUM, other);
  if (world_rank % 2 == 0) MPI_Wait(&req, MPI_STATUS_IGNORE);
  for (size_t i = 0; i < n; ++i) {
    long want = 0, want2 = 0;
    for (int r = 0; r < size; ++r) {
      want += ival(r, i);
      want2 += ival(r + 5, i);
    }
    expect(out[i] == want && out2[i] == want2, "overlapped", i);
  }
  mix(out, sizeof out);
  mix(out2, sizeof out2);
  /* Two requests on two communicators: even ranks start A (on the world) then B (on `other`) and
   * wait for B first; odd ranks start B, wait for it, and only then start A. B completes only if
   * the even ranks' interposer moves B on while A waits for the odd ranks. */
  MPI_Request ra, rb;
  if (world_rank % 2 == 0) {
    MPI_Iallreduce(in, out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &ra);
    MPI_Iallreduce(in2, out2, n, MPI_INT, MPI_SUM, other, &rb);
    MPI_Wait(&rb, MPI_STATUS_IGNORE);
    MPI_Wait(&ra, MPI_STATUS_IGNORE);
  } else {
    MPI_Iallreduce(in2, out2, n, MPI_INT, MPI_SUM, other, &rb);
    MPI_Wait(&rb, MPI_STATUS_IGNORE);
    MPI_Iallreduce(in, out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &ra);
    MPI_Wait(&ra, MPI_STATUS_IGNORE);
  }
  for (size_t i = 0; i < n; ++i) {
    long want = 0, want2 = 0;
    for (int r = 0; r < size; ++r) {
      want += ival(r, i);
      want2 += ival(r + 5, i);
    }
    expect(out[i] == want && out2[i] == want2, "crossed requests", i);
  }
  MPI_Comm_free(&other);
}

static void user_sum(void* in, void* inout, int* len, MPI_Datatype* t) {
  (void)t;
  for (int i = 0; i < *len; ++i) ((int*)inout)[i] += ((int*)in)[i];
}

/* MPI_Bcast with a derived datatype: a strided one on every rank, then on the root only, the
 * other ranks receiving the same type signature as contiguous MPI_INTs (legal MPI: every rank
 * must take the same path, or they wait for each other in different places). */
static void derived_bcast(MPI_Comm comm) {
  int rank;
  MPI_Comm_rank(comm, &rank);
  enum { n = 1000 };
  static int out[n];
  MPI_Datatype strided;
  MPI_Type_vector(n / 2, 1, 2, MPI_INT, &strided);
  MPI_Type_commit(&strided);
  for (int i = 0; i < n; ++i) out[i] = rank == 0 ? ival(0, (size_t)i) : -1;
  MPI_Bcast(out, 1, strided, 0, comm);
  for (int i = 0; i < n; ++i) {
    expect(out[i] == (i % 2 == 0 || rank == 0 ? ival(0, (size_t)i) : -1), "derived datatype",
           (size_t)i);
  }
  /* The broadcast ints as every rank has them, in signature order: the same digest on all */
  static int got[n / 2];
  for (int i = 0; i < n / 2; ++i) got[i] = out[2 * i];
  mix(got, sizeof got);
  for (int i = 0; i < n; ++i) out[i] = rank == 0 ? ival(1, (size_t)i) : -1;
  if (rank == 0)
    MPI_Bcast(out, 1, strided, 0, comm);
  else
    MPI_Bcast(out, n / 2, MPI_INT, 0, comm);
  for (int i = 0; i < n; ++i) {
    const int want = rank == 0 ? ival(1, (size_t)i) : i < n / 2 ? ival(1, (size_t)(2 * i)) : -1;
    expect(out[i] == want, "derived datatype on the root only", (size_t)i);
  }
  for (int i = 0; i < n / 2; ++i) got[i] = rank == 0 ? out[2 * i] : out[i];
  mix(got, sizeof got);
  MPI_Type_free(&strided);
}

/* What libtreeduce-mpi passes through: a user operation, types treeduce has not, a message
 * below TREEDUCE_MPI_MIN_BYTES. */
static void passed_through(MPI_Comm comm) {
  int rank, size;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  enum { n = 1000 };
  static int in[n], out[n];
  for (int i = 0; i < n; ++i) in[i] = ival(rank, (size_t)i);
  MPI_Op op;
  MPI_Op_create(user_sum, 1, &op);
  MPI_Allreduce(in, out, n, MPI_INT, op, comm);
  MPI_Op_free(&op);
  for (int i = 0; i < n; ++i) {
    long want = 0;
    for (int r = 0; r < size; ++r) want += ival(r, (size_t)i);
    expect(out[i] == want, "user op", (size_t)i);
  }
  long double ld = rank + 1, lds = 0;
  MPI_Allreduce(&ld, &lds, 1, MPI_LONG_DOUBLE, MPI_SUM, comm);
  expect(lds == (long double)size * (size + 1) / 2, "long double", 0);
  int one = 1, total = 0;
  MPI_Allreduce(&one, &total, 1, MPI_INT, MPI_SUM, comm);
  expect(total == size, "small int", 0);
  mix(&total, sizeof total);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc == 4 && strcmp(argv[1], "--hold") == 0) {
    /* Rounds of 256 KiB allreduces; after the tenth every rank waits in a barrier (passed through
     * below TREEDUCE_MPI_MIN_BYTES) while rank 0 waits for FILE: the test kills the switch then. */
    const int rounds = atoi(argv[3]);
    enum { n = 65536 };
    static int in[n], out[n];
    for (int k = 0; k < rounds; ++k) {
      for (size_t i = 0; i < n; ++i) in[i] = ival(world_rank + k, i);
      /* even rounds non-blocking: the first after the switch died is one */
      if (k % 2 == 0) {
        MPI_Request req;
        MPI_Iallreduce(in, out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
      } else {
        MPI_Allreduce(in, out, n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      }
      for (size_t i = 0; i < n; ++i) {
        long want = 0;
        for (int r = 0; r < size; ++r) want += ival(r + k, i);
        expect(out[i] == want, "hold round", i);
      }
      if (k == 9) {
        if (world_rank == 0) {
          printf("mpi_check: held\n");
          fflush(stdout);
          while (access(argv[2], F_OK) != 0) usleep(10000);
        }
        MPI_Barrier(MPI_COMM_WORLD);
      }
    }
  } else {
    cases(MPI_COMM_WORLD, "world");
    MPI_Comm half, dup;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank % 2, world_rank, &half);
    cases(half, "split");
    MPI_Comm_dup(half, &dup);
    cases(dup, "dup");
    MPI_Comm_free(&dup);
    MPI_Comm_free(&half);
    overlapped();
    derived_bcast(MPI_COMM_WORLD);
    passed_through(MPI_COMM_WORLD);
  }
  printf("mpi_check: rank %d: %ld checks, %ld wrong, digest %016llx, float digest %016llx\n",
         world_rank, checks, wrong, (unsigned long long)digest, (unsigned long long)float_digest);
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
