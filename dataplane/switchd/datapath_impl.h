/// @file
/// Switch::Impl: the state the datapath's parts share, and which file does what with it.
///   datapath.cpp   the façade: create (set-up in order), run, snapshot, shutdown
///   ports.cpp      mbuf pools, port bring-up (treeduce/dpdk/port.h), TX buffers, port stop
///   worker.cpp     the per-lcore loop: RX, steering, slow path, the core, TX
///   neighbors.cpp  the neighbour thread: ARP learning and resolution, the table through RCU
///   trees.cpp      tree install and removal through RCU
/// Private to treeduce-switch; design and measured costs in docs/switch.md.
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>

#include <pcap/pcap.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "datapath.h"
#include "neighbor_table.h"
#include "treeduce/dataplane/probe_log.h"
#include "treeduce/protocol/tree.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::switchd {

constexpr std::size_t kMaxBurst = 64;
constexpr std::size_t kMaxPorts = 16;
/// Room for the core's output of one call: it stops early when the next frame might not fit.
constexpr std::size_t kTxFrames = proto::kMaxChildren * 4;
constexpr std::uint16_t kNoQueue = 0xFFFF;
/// Bytes of an mbuf's data room for whole frames (the largest treeduce frame, rounded up).
constexpr std::uint16_t kFrameRoom = 8448;
constexpr std::size_t kL2L4 = proto::kFrameHeaderBytes - sizeof(proto::TdHdr);
/// Offset of TdHdr::slot in a frame without IP options: where steering reads the slot.
constexpr std::size_t kSlotOffset = kL2L4 + offsetof(proto::TdHdr, slot);
constexpr std::size_t kUdpDstOffset = sizeof(proto::EtherHdr) + sizeof(proto::Ipv4Hdr) + 2;
constexpr std::size_t kIpDstOffset = sizeof(proto::EtherHdr) + offsetof(proto::Ipv4Hdr, dst_addr);
constexpr std::size_t kOpcodeOffset = kL2L4 + offsetof(proto::TdHdr, opcode);
constexpr std::size_t kMaxWanted = 1024;
constexpr std::size_t kMaxNeighbors = 16384;

/// One line on stderr, "treeduce-switch: ...". Off the per-packet path.
[[gnu::format(printf, 1, 2)]] inline void log(const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "treeduce-switch: %s\n", line);
}

inline std::uint16_t load_be16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] << 8 | p[1]);
}
inline std::uint32_t load_be32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return proto::bswap_be(v);
}

/// Messages from the lcores to the neighbour thread.
struct CtlMsg {
  enum Type : std::uint8_t { learn = 1, resolve = 2 };
  std::uint8_t type = 0;
  std::uint8_t pad = 0;
  std::uint16_t port = 0;
  std::uint32_t ip = 0;
  std::uint8_t mac[6] = {};
  std::uint8_t pad2[2] = {};
};
static_assert(sizeof(CtlMsg) == 16);

struct Port {
  PortConfig cfg;
  std::uint16_t id = 0;
  proto::Endpoint self;  ///< port MAC and IP (data port number unused)
  std::uint16_t rx_queues = 1;
  bool chain = false;  ///< the PMD takes multi-segment mbufs: multicast shares one payload
  /// The port's own RX pool (net_af_xdp: its UMEM, page-sized frames); null: the shared `pool`.
  rte_mempool* own_pool = nullptr;
};

/// A port's injected faults as the workers read them (relaxed atomics, one load each per burst):
/// set from the port's configuration at start and by set_port_fault() at run time.
struct alignas(64) FaultState {
  std::atomic<std::uint64_t> loss_threshold{0};  ///< rx_loss scaled to 2^64: drop below a draw
  std::atomic<bool> down{false};
  std::atomic<std::uint64_t> delay_tsc{0};  ///< delay_us in TSC cycles
  /// TSC cycles per byte at rate_mbps, times 2^16; 0: line rate.
  std::atomic<std::uint64_t> tsc_per_byte_q16{0};
  /// Frames through the port are copied to its capture file (capture.cpp).
  std::atomic<bool> capture{false};
  /// The neighbour thread is stopping and starting the port (a memif client whose link stayed
  /// down): the workers neither poll nor send on it. Set before an RCU grace period.
  std::atomic<bool> restarting{false};
  PortFault now;  ///< as last set, for snapshots; under Impl::mu
};

/// A frame copied for a capture: a clone of its mbuf (sharing its buffer) and when the port saw
/// it. Lcores enqueue, the capture thread writes.
struct CaptureRec {
  rte_mbuf* m;
  std::uint64_t tsc;
};
static_assert(sizeof(CaptureRec) == 16);

/// One port's capture file (pcap, Ethernet), written by the capture thread under cap_mu.
struct CaptureFile {
  std::string path;
  pcap_t* dead = nullptr;
  pcap_dumper_t* dumper = nullptr;
  std::uint64_t frames = 0;
  std::uint64_t tsc0 = 0;  ///< TSC at the start, with the real time then, for timestamps
  timespec t0{};
  std::vector<std::uint8_t> buf;  ///< a multi-segment frame made contiguous
  ~CaptureFile() {
    if (dumper != nullptr) pcap_dump_close(dumper);
    if (dead != nullptr) pcap_close(dead);
  }
};

/// Frames a worker holds for a delayed or slowed port, due in order (the delay is the same for
/// every frame and the rate serialises them).
struct HeldQueue {
  struct Held {
    rte_mbuf* m;
    std::uint64_t due;
  };
  std::unique_ptr<Held[]> q;  ///< kFaultQueueFrames entries
  std::uint32_t head = 0, size = 0;
  std::uint64_t free_at = 0;  ///< when the slowed link finishes the last frame queued (TSC)
};

struct alignas(64) Worker {
  unsigned lcore = 0;
  std::uint32_t index = 0;
  std::unique_ptr<dp::Core> core;
  rte_ring* steer = nullptr;  ///< MP/SC: frames other workers received for this worker's slots
  std::uint16_t rxq[kMaxPorts] = {};  ///< queue polled on each port, kNoQueue for none
  rte_eth_dev_tx_buffer* txbuf[kMaxPorts] = {};
  std::uint64_t tx_dropped[kMaxPorts] = {};  ///< counted by the TX buffers' error callback
  std::array<std::uint64_t, kNumSwitchdCounters> counters{};
  std::uint64_t polls = 0, busy_polls = 0, sleeps = 0, yields = 0, rx_total = 0;
  std::uint64_t rng = 0;      ///< xorshift64 state for rx_loss
  HeldQueue held[kMaxPorts];  ///< frames held by a port's delay_us / rate_mbps
  /// Direct-mapped memory of recent resolve requests, so a burst to an unknown neighbour sends
  /// one message, not 32.
  struct Asked {
    std::uint32_t ip = 0;
    std::uint64_t tsc = 0;
  } asked[64];
  /// Contiguous copies of multi-segment frames for the core.
  std::vector<std::uint8_t> scratch;

  void count(SwitchdCounter c) { ++counters[static_cast<std::size_t>(c)]; }
};

struct Switch::Impl {
  SwitchConfig cfg;
  std::vector<Port> ports;
  std::array<FaultState, kMaxPorts> faults;  ///< by index in `ports`
  // Captures (faults: true only): clones of the frames into cap_ring, written by capture_loop.
  rte_mempool* cap_pool = nullptr;  ///< indirect mbufs for the clones
  rte_ring* cap_ring = nullptr;     ///< MP/SC CaptureRec
  mutable std::mutex cap_mu;        ///< captures, cap_active; held while a batch is written
  std::condition_variable cap_cv;   ///< a capture started (the thread sleeps while none runs)
  std::array<std::unique_ptr<CaptureFile>, kMaxPorts> captures;
  std::size_t cap_active = 0;                       ///< non-null entries of `captures`
  std::uint16_t port_index[RTE_MAX_ETHPORTS] = {};  ///< port id -> index in `ports`
  rte_mempool* pool = nullptr;      ///< whole frames (RX, unicast TX, multicast payloads)
  rte_mempool* hdr_pool = nullptr;  ///< multicast header mbufs
  rte_mempool* ind_pool = nullptr;  ///< indirect mbufs attached to a shared payload
  std::vector<std::unique_ptr<Worker>> workers;
  std::uint32_t n_workers = 1;  ///< workers.size(), for a 32-bit modulo per steered frame
  rte_rcu_qsbr* qsbr = nullptr;
  rte_ring* ctl_ring = nullptr;     ///< MP/SC CtlMsg: lcores -> neighbour thread
  rte_ring* inject_ring = nullptr;  ///< SP/SC mbufs: neighbour thread -> worker 0 (ARP requests)
  /// MP/SC dp::Probe: the cores' bad_key/bad_source refusals -> the neighbour thread, which logs
  /// them through `probe_log` (rate-limited; no syscall on an lcore).
  rte_ring* probe_ring = nullptr;
  dp::ProbeLog probe_log{dp::ProbeLog::Config{}};  ///< neighbour thread only
  std::uint64_t last_probe_flush = 0;              ///< steady_clock ns; neighbour thread only
  std::atomic<const NeighborTable*> neighbors{nullptr};
  std::uint64_t tsc_hz = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  /// A port's link as the neighbour thread watches it (links.cpp), under `mu`.
  struct LinkState {
    bool known = false;  ///< looked at once
    bool up = false;
    bool memif_client = false;  ///< restarted while its link stays down
    bool stopped = false;       ///< a restart stopped it and could not start it again yet
    std::uint64_t changes = 0, restarts = 0;
    std::uint64_t down_since = 0, next_try = 0;  ///< tsc
    std::uint32_t backoff_ms = 0;
  };
  std::array<LinkState, kMaxPorts> links{};
  std::uint64_t last_link_check = 0;  ///< tsc; neighbour thread only

  // Control state, under `mu`: trees, their jobs, the neighbour book.
  mutable std::mutex mu;
  std::map<std::uint16_t, std::string> jobs;
  std::set<std::uint16_t> static_trees;  ///< from the configuration: not reported to the manager
  NeighborBook book;
  /// Unresolved next hops of installed trees: when last asked (tsc) and how often. Asked every
  /// 100 ms for 3 s, then forgotten until a packet needs the address again.
  struct Wanted {
    std::uint64_t last = 0;
    std::uint32_t tries = 0;
  };
  std::map<std::uint32_t, Wanted> wanted;
  std::set<std::uint32_t> static_ips;  ///< configured neighbours: never overwritten by ARP

  ~Impl();  // datapath.cpp

  // datapath.cpp: RCU over the workers.
  Status create_rcu();
  void synchronize() { rte_rcu_qsbr_synchronize(qsbr, RTE_QSBR_THRID_INVALID); }

  // ports.cpp
  Status create_pools();
  Status setup_ports();
  Status setup_port(const PortConfig& pc);
  Result<rte_mempool*> af_xdp_pool(const PortConfig& pc, std::uint16_t port, std::uint16_t idx);
  static std::uint32_t af_xdp_frame_room(rte_mempool* mp);
  Status attach_port(std::uint16_t idx, int socket);
  void stop_ports();
  std::vector<PortStats> port_stats() const;

  // worker.cpp
  Status create_workers(const std::vector<unsigned>& lcores);
  void worker_loop(Worker& w);
  std::uint64_t poll_ports(Worker& w, const NeighborTable* nt, bool* backlog);
  bool lose(Worker& w, std::uint64_t threshold);
  /// Applies port pi's faults to received frames pkts[0..n): the frames to process now stay in
  /// pkts (their number returned), the others are dropped or held.
  std::uint16_t apply_faults(Worker& w, std::size_t pi, rte_mbuf** pkts, std::uint16_t n);
  /// Held frames of port pi that are due, up to `max`, into out; their number.
  std::uint16_t release_held(Worker& w, std::size_t pi, rte_mbuf** out, std::uint16_t max);
  void set_fault(std::size_t pi, const PortFault& f);  // ports.cpp; caller holds mu
  /// The index of the port named `name`, or not_found naming the switch's ports.
  Status port_named(const std::string& name, std::size_t* pi) const;
  /// A clone of `m` (received or sent on port index pi) to the capture ring.
  void capture(Worker& w, rte_mbuf* m);

  // capture.cpp
  Status create_capture();
  void capture_loop();
  /// Writes what the ring holds; the number written. Under cap_mu.
  std::size_t write_captures();
  void rx_frame(Worker& w, rte_mbuf* m, rte_mbuf** local, std::uint16_t* nlocal);
  void slow_path(Worker& w, rte_mbuf* m);
  void run_core(Worker& w, rte_mbuf** pkts, std::uint16_t n, const NeighborTable* nt);
  void emit(Worker& w, const dp::TxFrame* f, std::size_t n, const NeighborTable* nt);
  void emit_multicast(Worker& w, const dp::TxFrame* f, std::size_t n, const NeighborTable* nt);
  void copy_frame(Worker& w, const dp::TxFrame& t, const NeighborTable* nt);
  rte_mbuf* route(Worker& w, rte_mbuf* m, std::uint16_t hop, const NeighborTable* nt);
  void send(Worker& w, rte_mbuf* m);
  void post(Worker& w, const CtlMsg& msg);
  void post_probes(Worker& w);
  void send_injected(Worker& w);
  void flush(Worker& w);
  void idle_sleep(Worker& w, std::uint32_t* sleep_us);
  void drain_rings();

  // neighbors.cpp
  Status create_neighbor_rings();
  void add_static_neighbors();
  void neighbor_loop();
  bool take(const CtlMsg& msg);
  void ask_again();
  void want(std::uint32_t ip);
  void want_next_hops(const dp::TreeConfig& t);
  bool may_learn(const NeighborEntry& e) const;
  void send_arp(std::uint32_t ip);
  void publish_neighbors();
  /// Resolves the next hops of tree `tree_id` (every installed tree: `all`) from the neighbour
  /// book into the cores' header templates (dp::Core::set_next_hops()); the replaced templates go
  /// to `old`, to free after a grace period. Under `mu`.
  void resolve_hops(std::uint16_t tree_id, std::vector<dp::TreeHops*>* old);
  void resolve_all_hops(std::vector<dp::TreeHops*>* old);
  /// `last`: at shutdown, everything not logged yet.
  void log_probes(bool last = false);

  // links.cpp
  void watch_links();
  void restart_port(std::size_t pi, std::uint64_t now);

  // trees.cpp
  Status admit_tree(const dp::TreeConfig& t) const;
  Status install_in_cores(const dp::TreeConfig& t);
};

}  // namespace treeduce::switchd
