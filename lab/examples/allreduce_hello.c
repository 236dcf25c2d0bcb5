/* A rank of your own on a lab (docs/lab.md): `treeduce lab run` sets RANK, WORLD_SIZE and the
 * TREEDUCE_* variables; tdr_comm_create_from_env() reads them, joins the job at the lab's manager
 * and gets a tree. Every rank adds its rank + 1 into 1000 floats; rank 0 prints the first sum and
 * the path the allreduce took. Build: cc allreduce_hello.c $(pkg-config --cflags --libs treeduce) */
#include <stdio.h>
#include <treeduce/treeduce.h>

int main(void) {
  tdr_comm_t* comm = NULL;
  if (tdr_comm_create_from_env(&comm) != tdr_ok) {
    fprintf(stderr, "join: %s\n", tdr_last_error(NULL));
    return 1;
  }
  uint32_t rank = 0, size = 0;
  tdr_comm_rank(comm, &rank);
  tdr_comm_size(comm, &size);
  float v[1000];
  for (int i = 0; i < 1000; ++i) v[i] = (float)(rank + 1);
  if (tdr_allreduce(comm, v, v, 1000, tdr_f32, tdr_sum) != tdr_ok) {
    fprintf(stderr, "allreduce: %s\n", tdr_last_error(comm));
    tdr_comm_destroy(comm);
    return 1;
  }
  const float want = (float)size * (float)(size + 1) / 2;
  if (rank == 0) {
    printf("sum over %u ranks: %g (want %g), path %s\n", size, v[0], want,
           tdr_path(comm) == tdr_path_network ? "network" : "host");
  }
  tdr_comm_destroy(comm);
  return v[0] == want ? 0 : 1;
}
