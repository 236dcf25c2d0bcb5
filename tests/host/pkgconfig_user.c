/* A user's own program, as docs/host.md describes it: the C API only, built by the test with
 * `cc $(pkg-config --cflags --libs treeduce)` against the build tree and against an install.
 * One rank, host path: it reduces an f32 sum and a u8 bxor and prints the results and the path. */
#include <stdio.h>
#include <treeduce/treeduce.h>

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: pkgconfig_user STORE_DIR\n");
    return 2;
  }
  tdr_options_t opt;
  tdr_options_init(&opt);
  opt.job = "pkgconfig-user";
  opt.rank = 0;
  opt.world_size = 1;
  opt.path = tdr_path_host;
  opt.fallback_store = argv[1];
  opt.fallback_address = "127.0.0.1";
  opt.bind_address = "127.0.0.1";
  tdr_comm_t* comm = NULL;
  if (tdr_comm_create(&opt, &comm) != tdr_ok) {
    fprintf(stderr, "create: %s\n", tdr_last_error(NULL));
    return 1;
  }
  float x[4] = {1.5f, 2.0f, -3.0f, 4.0f};
  unsigned char b[3] = {0x0F, 0xF0, 0x55};
  if (tdr_allreduce(comm, x, x, 4, tdr_f32, tdr_sum) != tdr_ok ||
      tdr_allreduce(comm, b, b, 3, tdr_u8, tdr_bxor) != tdr_ok) {
    fprintf(stderr, "allreduce: %s\n", tdr_last_error(comm));
    tdr_comm_destroy(comm);
    return 1;
  }
  tdr_stats_t st;
  tdr_get_stats(comm, &st);
  printf("f32 %g %g %g %g u8 %02x %02x %02x host_ops %llu\n", x[0], x[1], x[2], x[3], b[0], b[1],
         b[2], (unsigned long long)st.fallback_ops);
  tdr_comm_destroy(comm);
  return 0;
}
