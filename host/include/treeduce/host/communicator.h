/// @file
/// libtreeduce's C++ API: a communicator of one job's ranks that runs allreduce (and reduce,
/// broadcast, barrier on top of it) through the in-network path when the Aggregation Manager
/// gave the job a tree, and through host-side reduction (Gloo) when it did not, saying why.
///
/// Shaped after the SHARP collective library (init, comm init, allreduce, iallreduce, test/wait)
/// and NCCL's CollNet plugin (reduceSupport, iallreduce, test), so that a PyTorch backend, an MPI
/// interposer or an NCCL plugin is a thin shim. docs/host.md is the guide.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "treeduce/aggregation/dtype.h"

namespace treeduce::host {

/// Outcome of a call. Values are the C API's tdr_result_t.
enum class Result : int {
  ok = 0,
  in_progress = 1,       ///< test(): the operation has not finished yet
  invalid_argument = 2,  ///< a bad argument; nothing was started
  unavailable = 3,       ///< the manager or the network path cannot be reached, and no fallback
  timeout = 4,           ///< the operation did not finish in the time allowed
  refused = 5,           ///< the manager or a switch refused (the reason is in last_error())
  failed = 6,            ///< a result failed its checks or the fallback failed
  internal = 7,
};
const char* to_string(Result r) noexcept;

/// Which path runs collectives.
enum class Path : int {
  auto_select = 0,  ///< in-network when the manager gives a tree, else host-side (default)
  network = 1,      ///< in-network only: an error instead of a fallback
  host = 2,         ///< host-side reduction only
};

/// One switch of a job's tree and what its model offloads (manager.proto TreeSwitch): a call the
/// tree cannot reduce names the switch and profile that limit it.
struct TreeSwitch {
  std::string name;     ///< the switch ("leaf0")
  std::string profile;  ///< its resource profile, the switch model ("tofino")
  std::uint32_t dtype_mask = 0;
  std::uint32_t op_mask = 0;
};

/// What the manager tells a rank about its job's tree (control/api/manager.proto Assignment).
/// The tree offloads a (dtype, op) pair when both bits are set and op_defined(dtype, op).
struct TreeAssignment {
  std::string leaf_address;  ///< "a.b.c.d:port" of the rank's leaf switch
  std::uint16_t tree_id = 0;
  std::uint64_t key = 0;
  std::uint16_t child_index = 0;
  std::uint32_t slots = 16;
  std::uint32_t payload_bytes = 1024;
  std::uint32_t dtype_mask = kAllDTypesMask;  ///< bit = DType the tree can reduce
  std::uint32_t op_mask = kAllOpsMask;        ///< bit = ReduceOp
  bool deterministic = false;
  std::uint64_t lease_ms = 0;  ///< heartbeat at least this often (0: no manager)
  /// The tree's switches, root first, from the manager (empty for a static tree).
  std::vector<TreeSwitch> switches;
};

/// Which transport carries the network path's packets (docs/host.md, "Transports"). dpdk,
/// verbs and af_xdp are in builds that found DPDK, rdma-core, and libxdp/libbpf/clang; asking a
/// build for one it lacks is an error on the network path (a fallback on the auto path).
enum class TransportKind : int {
  udp = 0,     ///< kernel UDP sockets (the default)
  dpdk = 1,    ///< one DPDK ethdev port
  verbs = 2,   ///< an ibverbs raw-packet QP
  af_xdp = 3,  ///< an AF_XDP socket on a kernel interface
};

/// How the af_xdp transport attaches (TREEDUCE_XDP_MODE).
enum class XdpMode : int {
  auto_select = 0,  ///< native XDP with zero-copy, else native copy, else generic (SKB) copy
  native = 1,       ///< native XDP only (zero-copy when the driver offers it, else copy)
  skb = 2,          ///< generic XDP, copy mode: any interface (veth)
  zerocopy = 3,     ///< native XDP with a zero-copy socket, or fail
};

/// TransportOptions::busy_poll_us's default (docs/performance.md, "Issue 16: small messages").
inline constexpr std::uint32_t kDefaultBusyPollUs = 50;

/// The transport and its tuning (TREEDUCE_TRANSPORT, TREEDUCE_UDP_*, TREEDUCE_DPDK_*,
/// TREEDUCE_VERBS_*, TREEDUCE_XDP_*, TREEDUCE_LOCAL_MAC, TREEDUCE_LEAF_MAC in
/// options_from_environment()).
struct TransportOptions {
  TransportKind kind = TransportKind::udp;
  std::uint32_t udp_send_ports = 1;  ///< udp: source ports slots are spread over, 1..64
  bool udp_gso = false;              ///< udp: send same-size packets as GSO super-datagrams
  bool udp_gro = true;               ///< udp: let the kernel coalesce received datagrams
  std::string dpdk_port;             ///< dpdk: the ethdev name the EAL probed
  std::string dpdk_eal;              ///< dpdk: EAL arguments; "" = the process started the EAL
  bool dpdk_tx_copy = false;         ///< dpdk: copy payloads into mbufs even where the PMD allows
                                     ///< zero-copy TX
  std::string verbs_device;          ///< verbs: RDMA device; "" = the first one
  std::uint8_t verbs_port = 1;       ///< verbs: device port, 1-based
  std::string local_mac;             ///< dpdk, verbs: our MAC ("aa:bb:cc:dd:ee:ff")
  std::string leaf_mac;              ///< dpdk, verbs: the leaf switch's MAC (no ARP)
  std::string xdp_interface;         ///< af_xdp: interface; "" = the route's to the leaf
  std::uint32_t xdp_queue = 0;       ///< af_xdp: the interface's RX/TX queue
  XdpMode xdp_mode = XdpMode::auto_select;  ///< af_xdp: how to attach
  /// Every wait for the network during an operation first polls the transport for up to this
  /// many microseconds, yielding the CPU between polls, before it sleeps (TREEDUCE_BUSY_POLL_US,
  /// 0 to 10000; 0: sleep at once). Saves the wake-up of a small allreduce's one round trip;
  /// never polls while no operation is in flight (docs/host.md, "Transports").
  std::uint32_t busy_poll_us = kDefaultBusyPollUs;
};

/// How a communicator is made. options_from_environment() fills it from the launcher's
/// variables; nothing else in the library reads the environment.
struct Options {
  std::string job;         ///< job name, the same on every rank
  std::uint32_t rank = 0;  ///< 0 .. world_size-1
  std::uint32_t world_size = 1;
  std::string manager;  ///< "host:port" of the Aggregation Manager; "" = none
  /// Mutual TLS with the manager (docs/host.md, "Security"): PEM files of the CA, this job's
  /// certificate and its key. A manager needs all three, or `insecure` (no TLS: labs and tests).
  std::string tls_ca, tls_cert, tls_key;
  /// The name the manager's certificate carries when the host of `manager` is not it (a
  /// subject alternative name); "" = the host of `manager`.
  std::string tls_server_name;
  bool insecure = false;
  std::string host;          ///< this host's name or data IPv4 address in the topology
  std::string bind_address;  ///< local IPv4 for the UDP transport; "" = from `host` if IPv4
  std::uint16_t port = 0;    ///< UDP port for RESULTs; 0 = 29000 + rank % 1000 (below the
                             ///< kernel's ephemeral range, so no outgoing socket holds it)
  /// Window asked of the manager (it grants it or refuses the job); 0 = from the payload:
  /// proto::default_window() (64 KiB of payload in flight, 32 to 64 slots: 64 up to 1 KiB).
  std::uint32_t slots = 0;
  /// Payload per packet asked of the manager; 0 = from the path: the largest power of two (256
  /// to 8192) whose datagram fits the MTU of the interface holding bind_address (or `host`),
  /// 1024 when that is unknown (1024 at MTU 1500, 8192 with jumbo frames of 8300).
  std::uint32_t payload_bytes = 0;
  /// First retransmission timeout of a chunk, in microseconds, fixed (doubling up to 128 ms).
  /// 0 (the default): adaptive, from the measured per-chunk latency (the largest of the last
  /// 1-2 s, within 2 to 32 ms; 10 ms before the first result; docs/host.md section 5).
  std::uint32_t rto_us = 0;
  /// Retransmissions of a chunk that gets no answer before the network path is declared dead
  /// (1 to 1000; docs/host.md section 5): 80 (the default) is 9.7 to 10.2 s of silence with the
  /// adaptive timer, each one fewer takes 128 ms off.
  std::uint32_t max_retries = 80;
  bool deterministic = false;
  Path path = Path::auto_select;
  std::uint32_t join_timeout_ms = 30000;  ///< waiting for all ranks to join
  std::uint32_t op_timeout_ms = 60000;    ///< one collective on the network path
  /// Host-side reduction's rendezvous: a directory every rank can read and write (Gloo's
  /// FileStore), and this rank's address for Gloo's TCP transport. "" = "/tmp/treeduce-gloo-<job>"
  /// and bind_address.
  std::string fallback_store;
  std::string fallback_address;
  /// A tree given directly (tests, static trees; TREEDUCE_STATIC_* in
  /// options_from_environment()): no manager. Used when `manager` is empty and
  /// `static_tree.leaf_address` is not.
  TreeAssignment static_tree;
  /// The network path's transport.
  TransportOptions transport;
};

/// Reads TREEDUCE_MANAGER, TREEDUCE_TLS_CA, TREEDUCE_TLS_CERT, TREEDUCE_TLS_KEY,
/// TREEDUCE_TLS_SERVER_NAME, TREEDUCE_INSECURE (0 or 1), TREEDUCE_JOB, TREEDUCE_RANK,
/// TREEDUCE_WORLD_SIZE, TREEDUCE_HOST, TREEDUCE_BIND (bind_address), TREEDUCE_PORT, TREEDUCE_SLOTS,
/// TREEDUCE_PAYLOAD_BYTES, TREEDUCE_RTO_US, TREEDUCE_MAX_RETRIES, TREEDUCE_PATH
/// (auto|network|host), TREEDUCE_FALLBACK_STORE, TREEDUCE_FALLBACK_ADDRESS, the transport's
/// variables (TransportOptions), a static tree's (TREEDUCE_STATIC_LEAF, _TREE_ID, _KEY,
/// _CHILD_INDEX, _SLOTS, _PAYLOAD_BYTES, _DTYPES, _OPS, _DETERMINISTIC, _SWITCHES into
/// static_tree), and the launchers' RANK/WORLD_SIZE (torchrun) and
/// OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI) when treeduce's own are not set. Returns
/// invalid_argument with the variable named in `*error`; then, when the variables still name a
/// manager and a job, it has told the manager, which fails the job for every other rank at once
/// (docs/host.md, "Environment"), and `*error` says whether that worked.
Result options_from_environment(Options* out, std::string* error);

/// As above, with the variables in `overrides` read as if the environment held them (in place of
/// what it holds): for a caller that knows the rank, world size or job itself, e.g. a
/// framework's process group, without setenv() on the whole process.
Result options_from_environment(Options* out, std::string* error,
                                const std::map<std::string, std::string>& overrides);

/// Why the last collective (or creation) went the way it did, and what is counted.
struct Stats {
  std::uint64_t network_ops = 0;   ///< collectives reduced in the network
  std::uint64_t fallback_ops = 0;  ///< collectives reduced on the hosts
  std::uint64_t retransmits = 0;   ///< network path
  std::uint64_t bytes = 0;         ///< payload bytes reduced, both paths
  /// The last fallback's reason ("" = never fell back). For a call the tree cannot reduce it
  /// is that call's, naming the switch model ("allreduce of 1024 f64 sum on the host path:
  /// switch 'leaf0' (profile tofino) does not reduce f64 sum").
  std::string fallback_reason;
};

/// A pending non-blocking operation. test()/wait() on the communicator that made it.
using Request = std::uint64_t;

class Communicator {
 public:
  /// Joins the job (manager, or a static tree, or host-side only) and sets up the transport.
  /// Blocks until every rank has joined or join_timeout_ms passed. On failure returns nullptr
  /// with the reason in `*error` and the Result in `*result`.
  static std::unique_ptr<Communicator> create(const Options& opt, Result* result,
                                              std::string* error);
  virtual ~Communicator() = default;  ///< leaves the job; outstanding operations are cancelled

  /// True when (dtype, op) would be reduced in the network (NCCL CollNet's reduceSupport):
  /// false for a pair op_defined() refuses, one the tree's switches cannot reduce, or any pair
  /// when collectives run on the hosts.
  virtual bool offloads(DType dtype, ReduceOp op) const = 0;
  /// The path collectives take now, and why if it is not the network.
  virtual Path path() const = 0;
  virtual std::string path_reason() const = 0;

  /// Blocking allreduce of `count` elements; `send` may equal `recv` (in place). A pair that
  /// op_defined() refuses (f32 band, i32 minloc, ...) is invalid_argument, with op_refusal()'s
  /// sentence in last_error(). docs/host.md has the types, operations and pair layouts.
  virtual Result allreduce(const void* send, void* recv, std::size_t count, DType dtype,
                           ReduceOp op) = 0;
  /// Non-blocking: operations run in the order they were started. Buffers stay the caller's and
  /// must not be touched until the request completes.
  virtual Result iallreduce(const void* send, void* recv, std::size_t count, DType dtype,
                            ReduceOp op, Request* req) = 0;
  /// ok when done (the request is then gone), in_progress, or the operation's error.
  virtual Result test(Request req) = 0;
  virtual Result wait(Request req) = 0;

  /// Reduce to `root` (recv is written on root only), broadcast from `root`, barrier.
  virtual Result reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                        std::uint32_t root) = 0;
  virtual Result broadcast(void* buf, std::size_t count, DType dtype, std::uint32_t root) = 0;
  virtual Result barrier() = 0;

  virtual std::uint32_t rank() const = 0;
  virtual std::uint32_t world_size() const = 0;
  virtual Stats stats() const = 0;
  /// The last error's sentence ("" after a success).
  virtual std::string last_error() const = 0;
};

}  // namespace treeduce::host
