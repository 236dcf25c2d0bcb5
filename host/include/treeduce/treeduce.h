/**
 * @file
 * libtreeduce's C API: the C++ API of treeduce/host/communicator.h behind an opaque handle, for
 * C programs and for shims (MPI interposers, NCCL plugins, language bindings). C99.
 *
 * Every function returns a tdr_result_t (or a value that cannot fail); none lets a C++ exception
 * through. After a failure, tdr_last_error() gives the sentence that explains it. docs/host.md
 * is the guide.
 */
#ifndef TREEDUCE_TREEDUCE_H
#define TREEDUCE_TREEDUCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Outcome of a call (the C++ treeduce::host::Result, same values). */
typedef enum tdr_result {
  tdr_ok = 0,               /**< success */
  tdr_in_progress = 1,      /**< tdr_test(): the operation has not finished yet */
  tdr_invalid_argument = 2, /**< a bad argument; nothing was started */
  tdr_unavailable = 3,      /**< the manager or network path cannot be reached, no fallback */
  tdr_timeout = 4,          /**< the operation did not finish in the time allowed */
  tdr_refused = 5,          /**< the manager or a switch refused (see tdr_last_error()) */
  tdr_failed = 6,           /**< a result failed its checks, or the fallback failed */
  tdr_internal = 7,         /**< a bug, or memory ran out */
  /** Not a result: makes the enum as wide as an int, so that C++ may hold any value a C caller
   * passes (the library refuses those out of range instead of misreading them). */
  tdr_result_max_enum = 0x7FFFFFFF
} tdr_result_t;

/**
 * Element type (treeduce::DType, the wire's values; codes are only ever appended). Elements are
 * little-endian. The pair types are MPI's C struct layouts, for MINLOC and MAXLOC only: an
 * element's padding is ignored on input and zero on output.
 */
typedef enum tdr_dtype {
  tdr_f32 = 0,                    /**< IEEE binary32 */
  tdr_f16 = 1,                    /**< IEEE binary16, reduced in binary32, rounded once */
  tdr_bf16 = 2,                   /**< bfloat16, reduced in binary32, rounded once */
  tdr_e4m3 = 3,                   /**< OCP FP8 E4M3 (saturates), reduced in binary32 */
  tdr_e5m2 = 4,                   /**< OCP FP8 E5M2, reduced in binary32 */
  tdr_i32 = 5,                    /**< int32_t; sums and products wrap */
  tdr_i8 = 6,                     /**< int8_t; sums and products wrap */
  tdr_u8 = 7,                     /**< uint8_t */
  tdr_i16 = 8,                    /**< int16_t */
  tdr_u16 = 9,                    /**< uint16_t */
  tdr_u32 = 10,                   /**< uint32_t */
  tdr_i64 = 11,                   /**< int64_t */
  tdr_u64 = 12,                   /**< uint64_t */
  tdr_f64 = 13,                   /**< IEEE binary64, reduced in binary64 */
  tdr_f32_i32 = 14,               /**< struct { float v; int32_t i; }: MPI_FLOAT_INT, 8 bytes */
  tdr_f64_i32 = 15,               /**< struct { double v; int32_t i; }: MPI_DOUBLE_INT, 16 bytes */
  tdr_i32_i32 = 16,               /**< struct { int32_t v; int32_t i; }: MPI_2INT, 8 bytes */
  tdr_dtype_max_enum = 0x7FFFFFFF /**< not a type (see tdr_result_max_enum) */
} tdr_dtype_t;

/**
 * Reduction operation (treeduce::ReduceOp, MPI's predefined operations). Which pairs are defined
 * is MPI's rule: sum, prod, min, max on every integer and float type; the bitwise and logical
 * operations on integer types; minloc and maxloc on the pair types only. Any other pair is
 * refused with tdr_invalid_argument and a sentence naming both.
 */
typedef enum tdr_op {
  tdr_sum = 0,                 /**< sum (integers wrap in their own width) */
  tdr_min = 1,                 /**< IEEE minimum (NaN propagates, -0 < +0) */
  tdr_max = 2,                 /**< IEEE maximum */
  tdr_prod = 3,                /**< product (integers wrap) */
  tdr_band = 4,                /**< bitwise and: integer types */
  tdr_bor = 5,                 /**< bitwise or: integer types */
  tdr_bxor = 6,                /**< bitwise exclusive or: integer types */
  tdr_land = 7,                /**< logical and: integer types, results 0 or 1 */
  tdr_lor = 8,                 /**< logical or: integer types, results 0 or 1 */
  tdr_lxor = 9,                /**< logical exclusive or: integer types, results 0 or 1 */
  tdr_minloc = 10,             /**< lowest value, lowest index on ties: pair types */
  tdr_maxloc = 11,             /**< highest value, lowest index on ties: pair types */
  tdr_op_max_enum = 0x7FFFFFFF /**< not an operation (see tdr_result_max_enum) */
} tdr_op_t;

/** Which path runs collectives (treeduce::host::Path). */
typedef enum tdr_path {
  tdr_path_auto = 0,             /**< in-network when the manager gives a tree, else host-side */
  tdr_path_network = 1,          /**< in-network only: errors instead of a fallback */
  tdr_path_host = 2,             /**< host-side reduction only */
  tdr_path_max_enum = 0x7FFFFFFF /**< not a path (see tdr_result_max_enum) */
} tdr_path_t;

/** A communicator of one job's ranks (opaque). */
typedef struct tdr_comm tdr_comm_t;

/** A pending non-blocking operation; complete it with tdr_test() or tdr_wait(). */
typedef uint64_t tdr_request_t;

/**
 * How a communicator is made: the essentials of treeduce::host::Options. Fill it with
 * tdr_options_init() first, then set what differs. Strings are copied by tdr_comm_create();
 * NULL means "".
 */
typedef struct tdr_options {
  const char* job;            /**< job name, the same on every rank; required (NULL or "":
                                   tdr_invalid_argument) */
  uint32_t rank;              /**< 0 .. world_size-1 */
  uint32_t world_size;        /**< ranks in the job */
  const char* manager;        /**< "host:port" of the Aggregation Manager; NULL: none. Its TLS
                                   files come from TREEDUCE_TLS_CA/CERT/KEY, or TREEDUCE_INSECURE=1
                                   (docs/deploy.md, "TLS"; docs/host.md section 3) */
  const char* host;           /**< this host's name or data IPv4 address in the topology */
  const char* bind_address;   /**< local IPv4 of the UDP transport; NULL: from host */
  uint16_t port;              /**< UDP port for results; 0: 29000 + rank % 1000 */
  uint32_t slots;             /**< window asked of the manager; 0: from the payload */
  uint32_t payload_bytes;     /**< payload per packet asked of the manager; 0: from the MTU */
  int deterministic;          /**< non-zero: ask for bit-reproducible sums */
  tdr_path_t path;            /**< auto, network or host */
  uint32_t join_timeout_ms;   /**< waiting for every rank to join */
  uint32_t op_timeout_ms;     /**< one collective */
  const char* fallback_store; /**< host-side rendezvous directory; NULL: /tmp/treeduce-gloo-<job> */
  const char* fallback_address; /**< IPv4 for host-side reduction's TCP; NULL: bind_address */
  /** A tree given directly (no manager), used when manager is NULL and this is not: the leaf's
   * "IPv4:PORT". A static tree no switch could hold (this address, slots, payload bytes, a child
   * index of 64 or more) is tdr_invalid_argument at creation, unless the path is host. */
  const char* static_leaf_address;
  uint16_t static_tree_id;       /**< static tree: tree id */
  uint64_t static_key;           /**< static tree: job key */
  uint16_t static_child_index;   /**< static tree: this rank's child index at its leaf */
  uint32_t static_slots;         /**< static tree: slots, as installed */
  uint32_t static_payload_bytes; /**< static tree: payload bytes, as installed */
  /** Static tree: bit d = tdr_dtype_t d is reduced. 32 bits since issue 14 (was uint8_t: an
   * ABI change; rebuild callers). */
  uint32_t static_dtype_mask;
  uint32_t static_op_mask; /**< static tree: bit o = tdr_op_t o is reduced (was uint8_t) */
} tdr_options_t;

/** What a communicator counted (treeduce::host::Stats without the reason string). */
typedef struct tdr_stats {
  uint64_t network_ops;  /**< collectives reduced in the network */
  uint64_t fallback_ops; /**< collectives reduced on the hosts */
  uint64_t retransmits;  /**< network path retransmissions */
  uint64_t bytes;        /**< payload bytes reduced, both paths */
} tdr_stats_t;

/** Fill `opt` with the defaults of treeduce::host::Options. Does nothing when `opt` is NULL. */
void tdr_options_init(tdr_options_t* opt);

/**
 * Create a communicator from the launcher's environment (TREEDUCE_*, torchrun's RANK and
 * WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_*; docs/host.md). Blocks until every rank has joined or
 * the join timeout passed. On failure `*comm` is NULL and tdr_last_error(NULL) says why.
 */
tdr_result_t tdr_comm_create_from_env(tdr_comm_t** comm);

/** Create a communicator from `opt` (see tdr_comm_create_from_env()). */
tdr_result_t tdr_comm_create(const tdr_options_t* opt, tdr_comm_t** comm);

/** Leave the job and free the communicator; pending operations are cancelled. NULL is allowed. */
void tdr_comm_destroy(tdr_comm_t* comm);

/** Blocking allreduce of `count` elements; `send` may equal `recv` (in place). */
tdr_result_t tdr_allreduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                           tdr_dtype_t dtype, tdr_op_t op);

/**
 * Start an allreduce and return at once with `*req` set. Operations run in the order they are
 * started (on every rank the same order). Buffers must stay untouched until the request
 * completes.
 */
tdr_result_t tdr_iallreduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                            tdr_dtype_t dtype, tdr_op_t op, tdr_request_t* req);

/** tdr_ok when `req` is done (it is then gone), tdr_in_progress, or the operation's error. */
tdr_result_t tdr_test(tdr_comm_t* comm, tdr_request_t req);

/** Block until `req` is done; its result (the request is then gone). */
tdr_result_t tdr_wait(tdr_comm_t* comm, tdr_request_t req);

/** Reduce to `root`: `recv` is written on root only (may be NULL elsewhere). */
tdr_result_t tdr_reduce(tdr_comm_t* comm, const void* send, void* recv, size_t count,
                        tdr_dtype_t dtype, tdr_op_t op, uint32_t root);

/** Broadcast `count` elements of `buf` from `root` to every rank. */
tdr_result_t tdr_broadcast(tdr_comm_t* comm, void* buf, size_t count, tdr_dtype_t dtype,
                           uint32_t root);

/** Return once every rank has called it. */
tdr_result_t tdr_barrier(tdr_comm_t* comm);

/**
 * This process's rank and the job's number of ranks, as the communicator was made with them
 * (from the options, or from TREEDUCE_RANK/RANK/OMPI_COMM_WORLD_RANK and their world-size
 * counterparts for tdr_comm_create_from_env): a program under mpirun or torchrun asks here
 * rather than reading the variables itself. tdr_invalid_argument when an argument is NULL.
 */
tdr_result_t tdr_comm_rank(const tdr_comm_t* comm, uint32_t* rank);
tdr_result_t tdr_comm_size(const tdr_comm_t* comm, uint32_t* size);

/**
 * Non-zero when (dtype, op) would be reduced in the network (NCCL CollNet's reduceSupport);
 * 0 when it would be reduced on the hosts, or `comm` is NULL.
 */
int tdr_offloads(const tdr_comm_t* comm, tdr_dtype_t dtype, tdr_op_t op);

/**
 * The last fallback's reason ("" when no fallback was taken; the host path asked for is not a
 * fallback: tdr_path_reason() says so), the per-call one
 * for a pair the tree cannot reduce ("allreduce of 1024 f64 sum on the host path: switch 'leaf0'
 * (profile tofino) does not reduce f64 sum"). "The communicator is NULL." for a NULL `comm`.
 * Valid until the calling thread's next call of it.
 */
const char* tdr_fallback_reason(const tdr_comm_t* comm);

/** The path collectives take now; tdr_path_host when `comm` is NULL. */
tdr_path_t tdr_path(const tdr_comm_t* comm);

/**
 * Why collectives do not run in the network ("" when they do; "The communicator is NULL." for a
 * NULL `comm`). The string stays valid until the calling thread's next tdr_path_reason() call.
 */
const char* tdr_path_reason(const tdr_comm_t* comm);

/** Copy the communicator's counters into `*out` (tdr_invalid_argument when either is NULL). */
tdr_result_t tdr_get_stats(const tdr_comm_t* comm, tdr_stats_t* out);

/**
 * The sentence explaining the last failed call on `comm` ("" after a success). With `comm` NULL:
 * the last failure in this thread of a call without a communicator (creation, a NULL handle).
 * Valid until the calling thread's next tdr_last_error() call. Never NULL.
 */
const char* tdr_last_error(const tdr_comm_t* comm);

/** A constant name for `r` ("ok", "timeout", ...); "unknown" for other values. */
const char* tdr_result_string(tdr_result_t r);

#ifdef __cplusplus
}
#endif

#endif /* TREEDUCE_TREEDUCE_H */
