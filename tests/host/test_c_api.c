/* The C API from plain C: one allreduce through a one-rank static tree, every type and operation
 * (tdr_offloads() against MPI's rule written again here, every defined pair reduced, every other
 * refused by name), and the error paths.
 * Driven by test_communicator.cpp (CApi.AllreduceAndErrors), which runs the fake switch and
 * passes its address. Returns 0, or a non-zero line number with a sentence in `message`. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "treeduce/treeduce.h"

/* MPI's rule, independently of dtype.h: sum/prod/min/max on every integer and float type,
 * bitwise and logical operations on integers, minloc/maxloc on the pair types only. */
static int defined(int d, int o) {
  const int pair = d == tdr_f32_i32 || d == tdr_f64_i32 || d == tdr_i32_i32;
  const int integer = d == tdr_i32 || (d >= tdr_i8 && d <= tdr_u64);
  if (pair) return o == tdr_minloc || o == tdr_maxloc;
  if (o == tdr_minloc || o == tdr_maxloc) return 0;
  if (o >= tdr_band && o <= tdr_lxor) return integer;
  return 1;
}

static size_t size_of(int d) {
  static const size_t sizes[] = {4, 2, 2, 1, 1, 4, 1, 1, 2, 2, 4, 8, 8, 8, 8, 16, 8};
  return sizes[d];
}

int treeduce_test_c_api(const char* leaf_address, const char* bind_address, unsigned short port,
                        const char* store, char* message, size_t message_len);

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      snprintf(message, message_len, "test_c_api.c:%d: %s (last error: '%s')", __LINE__, #cond, \
               tdr_last_error(comm));                                                           \
      tdr_comm_destroy(comm);                                                                   \
      return __LINE__;                                                                          \
    }                                                                                           \
  } while (0)

int treeduce_test_c_api(const char* leaf_address, const char* bind_address, unsigned short port,
                        const char* store, char* message, size_t message_len) {
  tdr_comm_t* comm = NULL;
  tdr_options_t opt;
  tdr_request_t req = 0;
  tdr_stats_t stats;
  int32_t in[300], out[300];
  size_t i;

  /* Errors without a communicator: NULL arguments, a bad rank. */
  CHECK(tdr_comm_create(NULL, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strlen(tdr_last_error(NULL)) > 0);
  CHECK(tdr_comm_create_from_env(NULL) == tdr_invalid_argument);
  CHECK(tdr_allreduce(NULL, in, out, 1, tdr_i32, tdr_sum) == tdr_invalid_argument);
  CHECK(tdr_barrier(NULL) == tdr_invalid_argument);
  CHECK(tdr_wait(NULL, 1) == tdr_invalid_argument);
  CHECK(tdr_get_stats(NULL, &stats) == tdr_invalid_argument);
  CHECK(tdr_offloads(NULL, tdr_f32, tdr_sum) == 0);
  CHECK(strcmp(tdr_result_string(tdr_timeout), "timeout") == 0);
  CHECK(strcmp(tdr_result_string((tdr_result_t)99), "unknown") == 0);
  tdr_options_init(&opt);
  opt.path = (tdr_path_t)7;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strstr(tdr_last_error(NULL), "not a tdr_path_t") != NULL);
  tdr_options_init(&opt);
  opt.rank = 1;
  opt.world_size = 1;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strstr(tdr_last_error(NULL), "world size") != NULL);
  /* Timeouts of 0 are not "no bound": refused. */
  tdr_options_init(&opt);
  opt.job = "c-api";
  opt.op_timeout_ms = 0;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strcmp(tdr_last_error(NULL),
               "op_timeout_ms is 0; give a bound in milliseconds (the "
               "defaults are 30000 and 60000).") == 0);
  opt.op_timeout_ms = 60000;
  opt.join_timeout_ms = 0;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strstr(tdr_last_error(NULL), "join_timeout_ms is 0") != NULL);
  /* A job name is required: unrelated programs would otherwise share the host path's store. */
  tdr_options_init(&opt);
  opt.path = tdr_path_host;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strcmp(tdr_last_error(NULL),
               "The job name is empty; give every rank of the job the same name.") == 0);
  /* TREEDUCE_INSECURE is 0 or 1: anything else is refused, not read as 0. */
  tdr_options_init(&opt);
  opt.job = "c-api";
  setenv("TREEDUCE_INSECURE", "yes", 1);
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strcmp(tdr_last_error(NULL), "TREEDUCE_INSECURE is 'yes'; it must be 0 or 1.") == 0);
  unsetenv("TREEDUCE_INSECURE");

  /* A static tree no switch can have is refused on every path, auto too (not fallen back from). */
  tdr_options_init(&opt);
  opt.job = "c-api";
  opt.static_leaf_address = leaf_address;
  opt.static_slots = 3;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strcmp(tdr_last_error(NULL),
               "The static tree's slots must be a power of two from 1 to 4096, got 3.") == 0);
  opt.static_slots = 8;
  opt.static_child_index = 64;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strcmp(tdr_last_error(NULL), "The static tree's child index 64 is not below 64.") == 0);
  opt.static_child_index = 0;
  opt.static_leaf_address = "leaf0:4791";
  CHECK(tdr_comm_create(&opt, &comm) == tdr_invalid_argument && comm == NULL);
  CHECK(strstr(tdr_last_error(NULL), "leaf address 'leaf0:4791' is not") != NULL);

  /* One rank on the fake switch's static tree. */
  tdr_options_init(&opt);
  opt.job = "c-api";
  opt.bind_address = bind_address;
  opt.port = port;
  opt.path = tdr_path_network;
  opt.static_leaf_address = leaf_address;
  opt.static_tree_id = 7;
  opt.static_key = 0x5eed1234abcd0001ull;
  opt.static_slots = 8;
  opt.static_payload_bytes = 256;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_ok && comm != NULL);
  CHECK(tdr_path(comm) == tdr_path_network);
  CHECK(strcmp(tdr_path_reason(comm), "") == 0);
  CHECK(tdr_offloads(comm, tdr_bf16, tdr_max) == 1);
  {
    uint32_t r = 99, n = 0;
    CHECK(tdr_comm_rank(comm, &r) == tdr_ok && r == 0);
    CHECK(tdr_comm_size(comm, &n) == tdr_ok && n == 1);
    CHECK(tdr_comm_rank(NULL, &r) == tdr_invalid_argument);
    CHECK(strcmp(tdr_last_error(NULL), "The communicator is NULL.") == 0);
    CHECK(tdr_comm_size(comm, NULL) == tdr_invalid_argument);
    CHECK(strcmp(tdr_last_error(comm), "The size pointer is NULL.") == 0);
    CHECK(tdr_comm_rank(comm, NULL) == tdr_invalid_argument);
    CHECK(strcmp(tdr_last_error(comm), "The rank pointer is NULL.") == 0);
  }
  for (i = 0; i < 300; ++i) in[i] = (int32_t)(i * 7919) - 1000000;
  memset(out, 0, sizeof out);
  CHECK(tdr_allreduce(comm, in, out, 300, tdr_i32, tdr_sum) == tdr_ok);
  CHECK(memcmp(in, out, sizeof in) == 0); /* one rank: the sum is the input */
  memset(out, 0, sizeof out);
  CHECK(tdr_iallreduce(comm, in, out, 300, tdr_i32, tdr_max, &req) == tdr_ok);
  CHECK(tdr_wait(comm, req) == tdr_ok);
  CHECK(memcmp(in, out, sizeof in) == 0);
  CHECK(tdr_test(comm, req) == tdr_invalid_argument); /* the request is gone */
  CHECK(strlen(tdr_last_error(comm)) > 0);
  CHECK(tdr_broadcast(comm, in, 300, tdr_i32, 0) == tdr_ok);
  CHECK(tdr_reduce(comm, in, out, 300, tdr_i32, tdr_min, 0) == tdr_ok);
  CHECK(tdr_barrier(comm) == tdr_ok);
  CHECK(strcmp(tdr_last_error(comm), "") == 0);

  /* Errors with a communicator. */
  CHECK(tdr_allreduce(comm, NULL, out, 1, tdr_i32, tdr_sum) == tdr_invalid_argument);
  CHECK(strlen(tdr_last_error(comm)) > 0);
  CHECK(tdr_allreduce(comm, in, out, 1, (tdr_dtype_t)42, tdr_sum) == tdr_invalid_argument);
  CHECK(strstr(tdr_last_error(comm), "42 is not a tdr_dtype_t") != NULL);
  /* 261 = 256 + tdr_i32: must not wrap into a valid type. */
  CHECK(tdr_iallreduce(comm, in, out, 1, (tdr_dtype_t)261, tdr_sum, &req) == tdr_invalid_argument);
  CHECK(tdr_reduce(comm, in, out, 1, tdr_i32, (tdr_op_t)12, 0) == tdr_invalid_argument);
  CHECK(strstr(tdr_last_error(comm), "not a tdr_op_t") != NULL);
  CHECK(tdr_offloads(comm, (tdr_dtype_t)261, tdr_sum) == 0);
  CHECK(tdr_iallreduce(comm, in, out, 1, tdr_i32, tdr_sum, NULL) == tdr_invalid_argument);
  CHECK(tdr_reduce(comm, in, out, 1, tdr_i32, tdr_sum, 5) == tdr_invalid_argument);
  CHECK(tdr_get_stats(comm, NULL) == tdr_invalid_argument);
  /* Buffers that overlap without being the same: refused (in place is send == recv). */
  CHECK(tdr_allreduce(comm, in, in + 1, 4, tdr_i32, tdr_sum) == tdr_invalid_argument);
  CHECK(strcmp(tdr_last_error(comm),
               "The send and receive buffers overlap without being the "
               "same buffer (in place).") == 0);
  CHECK(tdr_allreduce(comm, in + 4, in, 4, tdr_i32, tdr_sum) == tdr_ok); /* adjacent: fine */
  /* A count whose bytes overflow size_t is refused before anything is read or allocated. */
  CHECK(tdr_allreduce(comm, in, out, SIZE_MAX / 2, tdr_i32, tdr_sum) == tdr_invalid_argument);
  CHECK(strstr(tdr_last_error(comm), "is more bytes than memory can hold") != NULL);
  CHECK(tdr_broadcast(comm, in, SIZE_MAX / 4, tdr_f64, 0) == tdr_invalid_argument);
  CHECK(strstr(tdr_last_error(comm), "of f64 is more bytes") != NULL);
  CHECK(strcmp(tdr_path_reason(NULL), "The communicator is NULL.") == 0);
  CHECK(tdr_path(NULL) == tdr_path_host);

  CHECK(tdr_barrier(comm) == tdr_ok);
  CHECK(strcmp(tdr_last_error(comm), "") == 0); /* a success clears the last error */
  CHECK(tdr_get_stats(comm, &stats) == tdr_ok);
  CHECK(stats.network_ops == 7 && stats.fallback_ops == 0);
  CHECK(strcmp(tdr_fallback_reason(comm), "") == 0);

  /* Every type and operation: offloaded when defined (the static tree allows every code),
   * reduced exactly, or refused with a sentence naming both. One rank: the result is the input,
   * except that logical operations give 1 for a non-zero input. */
  CHECK(opt.static_dtype_mask == 0x1FFFFu && opt.static_op_mask == 0xFFFu);
  {
    int d, o;
    size_t k;
    unsigned char src[3 * 16], dst[3 * 16], want[3 * 16];
    for (d = tdr_f32; d <= tdr_i32_i32; ++d) {
      for (o = tdr_sum; o <= tdr_maxloc; ++o) {
        const int integer = d == tdr_i32 || (d >= tdr_i8 && d <= tdr_u64);
        const size_t n = 3 * size_of(d);
        CHECK(tdr_offloads(comm, (tdr_dtype_t)d, (tdr_op_t)o) == defined(d, o));
        memset(src, integer ? 0x01 : 0x00, n);
        memset(dst, 0xEE, n);
        memcpy(want, src, n);
        if (integer && o >= tdr_land && o <= tdr_lxor) {
          memset(want, 0, n);
          for (k = 0; k < 3; ++k) want[k * size_of(d)] = 1;
        }
        if (defined(d, o)) {
          CHECK(tdr_allreduce(comm, src, dst, 3, (tdr_dtype_t)d, (tdr_op_t)o) == tdr_ok);
          CHECK(memcmp(dst, want, n) == 0);
        } else {
          CHECK(tdr_allreduce(comm, src, dst, 3, (tdr_dtype_t)d, (tdr_op_t)o) ==
                tdr_invalid_argument);
          CHECK(strstr(tdr_last_error(comm), "is not a reduction") != NULL);
        }
      }
    }
  }
  CHECK(tdr_allreduce(comm, in, out, 1, tdr_f32, tdr_band) == tdr_invalid_argument);
  CHECK(
      strcmp(tdr_last_error(comm),
             "The pair f32 band is not a reduction: band (bitwise and) is defined on integer types "
             "only, not on floating-point types.") == 0);
  CHECK(tdr_allreduce(comm, in, out, 1, tdr_i32, tdr_minloc) == tdr_invalid_argument);
  CHECK(strstr(tdr_last_error(comm), "i32 minloc is not a reduction: minloc is defined on") !=
        NULL);
  CHECK(tdr_get_stats(comm, &stats) == tdr_ok);
  CHECK(stats.fallback_ops == 0);
  tdr_comm_destroy(comm);
  comm = NULL;

  /* The fallback reasons docs/host.md promises, through the C API. Per call: a tree that reduces
   * i32 only sends an f32 sum to the host path, and says so in tdr_fallback_reason(); the path
   * stays the network's. */
  tdr_options_init(&opt);
  opt.job = "c-api-fallback";
  opt.bind_address = bind_address;
  opt.port = port;
  opt.path = tdr_path_auto;
  opt.fallback_store = store;
  opt.static_leaf_address = leaf_address;
  opt.static_tree_id = 7;
  opt.static_key = 0x5eed1234abcd0001ull; /* nothing is sent: no slot of the run above reused */
  opt.static_slots = 8;
  opt.static_payload_bytes = 256;
  opt.static_dtype_mask = 1u << tdr_i32;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_ok && comm != NULL);
  CHECK(strcmp(tdr_fallback_reason(comm), "") == 0);
  CHECK(tdr_offloads(comm, tdr_i32, tdr_sum) == 1 && tdr_offloads(comm, tdr_f32, tdr_sum) == 0);
  {
    float f[4] = {1, 2, 3, 4}, g[4] = {0, 0, 0, 0};
    CHECK(tdr_allreduce(comm, f, g, 4, tdr_f32, tdr_sum) == tdr_ok);
    CHECK(memcmp(f, g, sizeof f) == 0);
  }
  CHECK(strcmp(tdr_fallback_reason(comm),
               "allreduce of 4 f32 sum on the host path: the tree (given without its switches' "
               "models) does not reduce f32 sum") == 0);
  CHECK(tdr_path(comm) == tdr_path_network);
  CHECK(strcmp(tdr_path_reason(comm), "") == 0);
  CHECK(tdr_get_stats(comm, &stats) == tdr_ok);
  CHECK(stats.network_ops == 0 && stats.fallback_ops == 1 && stats.bytes == 16);
  tdr_comm_destroy(comm);
  comm = NULL;

  /* At creation: no manager and no tree with tdr_path_auto is a fallback for good, the same
   * sentence in tdr_path_reason() and tdr_fallback_reason(). */
  tdr_options_init(&opt);
  opt.job = "c-api-no-tree";
  opt.path = tdr_path_auto;
  opt.fallback_store = store;
  opt.fallback_address = "127.0.0.1";
  CHECK(tdr_comm_create(&opt, &comm) == tdr_ok && comm != NULL);
  CHECK(tdr_path(comm) == tdr_path_host);
  CHECK(strcmp(tdr_path_reason(comm),
               "no Aggregation Manager (TREEDUCE_MANAGER) and no static tree are set") == 0);
  CHECK(strcmp(tdr_fallback_reason(comm), tdr_path_reason(comm)) == 0);
  CHECK(tdr_barrier(comm) == tdr_ok);
  CHECK(tdr_get_stats(comm, &stats) == tdr_ok);
  CHECK(stats.network_ops == 0 && stats.fallback_ops == 1);
  tdr_comm_destroy(comm);
  comm = NULL;

  /* Asked for, the host path is not a fallback: "" in tdr_fallback_reason(). */
  opt.job = "c-api-host";
  opt.path = tdr_path_host;
  CHECK(tdr_comm_create(&opt, &comm) == tdr_ok && comm != NULL);
  CHECK(strcmp(tdr_path_reason(comm), "host-side reduction was asked for (path = host)") == 0);
  CHECK(strcmp(tdr_fallback_reason(comm), "") == 0);
  CHECK(tdr_barrier(comm) == tdr_ok);
  CHECK(tdr_get_stats(comm, &stats) == tdr_ok);
  CHECK(stats.fallback_ops == 1);
  tdr_comm_destroy(comm);
  return 0;
}
