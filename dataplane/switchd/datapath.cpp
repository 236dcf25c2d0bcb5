// treeduce-switch's datapath: workers, steering, TX, neighbours, and tree changes through RCU.
// Design and measured costs: docs/switch.md.
#include "datapath.h"

#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_rcu_qsbr.h>
#include <rte_ring.h>
#include <rte_ring_elem.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "neighbor_table.h"
#include "treeduce/dataplane/dpdk_quirks.h"
#include "treeduce/dataplane/neighbor.h"

namespace treeduce::switchd {

std::atomic<bool> g_stop{false};

namespace {

constexpr std::size_t kMaxBurst = 64;
constexpr std::size_t kMaxPorts = 16;
/// Room for the core's output of one call: it stops early when the next frame might not fit.
constexpr std::size_t kTxFrames = dp::kMaxChildren * 4;
constexpr std::uint16_t kNoQueue = 0xFFFF;
/// Bytes of an mbuf's data room for whole frames (the largest treeduce frame, rounded up).
constexpr std::uint16_t kFrameRoom = 8448;
constexpr std::size_t kL2L4 = dp::kFrameHeaderBytes - sizeof(dp::TdHdr);
/// Offset of TdHdr::slot in a frame without IP options: where steering reads the slot.
constexpr std::size_t kSlotOffset = kL2L4 + offsetof(dp::TdHdr, slot);
constexpr std::size_t kUdpDstOffset = sizeof(dp::EtherHdr) + sizeof(dp::Ipv4Hdr) + 2;
constexpr std::size_t kIpDstOffset = sizeof(dp::EtherHdr) + offsetof(dp::Ipv4Hdr, dst_addr);
constexpr std::size_t kOpcodeOffset = kL2L4 + offsetof(dp::TdHdr, opcode);
constexpr std::size_t kMaxWanted = 1024;
constexpr std::size_t kMaxNeighbors = 16384;

[[gnu::format(printf, 1, 2)]] void log(const char* fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  std::fprintf(stderr, "treeduce-switch: %s\n", line);
}

std::uint16_t load_be16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] << 8 | p[1]);
}
std::uint32_t load_be32(const std::uint8_t* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return dp::bswap_be(v);
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
  dp::Endpoint self;  ///< port MAC and IP (data port number unused)
  std::uint16_t rx_queues = 1;
  std::uint64_t loss_threshold = 0;  ///< rx_loss scaled to 2^64: drop when a random draw is below
  bool chain = false;  ///< the PMD takes multi-segment mbufs: multicast shares one payload
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
  std::uint64_t polls = 0, busy_polls = 0, sleeps = 0, rx_total = 0;
  std::uint64_t rng = 0;  ///< xorshift64 state for rx_loss
  /// Direct-mapped memory of recent resolve requests, so a burst to an unknown neighbour sends
  /// one message, not 32.
  struct Asked {
    std::uint32_t ip = 0;
    std::uint64_t tsc = 0;
  } asked[64];
  /// Contiguous copies of multi-segment frames for the core.
  std::vector<std::uint8_t> scratch;
};

}  // namespace

struct Switch::Impl {
  SwitchConfig cfg;
  std::vector<Port> ports;
  std::uint16_t port_index[RTE_MAX_ETHPORTS] = {};  ///< port id -> index in `ports`
  rte_mempool* pool = nullptr;      ///< whole frames (RX, unicast TX, multicast payloads)
  rte_mempool* hdr_pool = nullptr;  ///< multicast header mbufs
  rte_mempool* ind_pool = nullptr;  ///< indirect mbufs attached to a shared payload
  std::vector<std::unique_ptr<Worker>> workers;
  std::uint32_t n_workers = 1;  ///< workers.size(), for a 32-bit modulo per steered frame
  rte_rcu_qsbr* qsbr = nullptr;
  rte_ring* ctl_ring = nullptr;     ///< MP/SC CtlMsg: lcores -> neighbour thread
  rte_ring* inject_ring = nullptr;  ///< SP/SC mbufs: neighbour thread -> worker 0 (ARP requests)
  std::atomic<const NeighborTable*> neighbors{nullptr};
  std::uint64_t tsc_hz = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  // Control state, under `mu`: trees, their jobs, the neighbour book.
  mutable std::mutex mu;
  std::map<std::uint16_t, std::string> jobs;
  NeighborBook book;
  /// Unresolved next hops of installed trees: when last asked (tsc) and how often. Asked every
  /// 100 ms for 3 s, then forgotten until a packet needs the address again.
  struct Wanted {
    std::uint64_t last = 0;
    std::uint32_t tries = 0;
  };
  std::map<std::uint32_t, Wanted> wanted;
  std::set<std::uint32_t> static_ips;  ///< configured neighbours: never overwritten by ARP

  ~Impl();
  std::string setup_ports();
  void worker_loop(Worker& w);
  void rx_frame(Worker& w, rte_mbuf* m, rte_mbuf** local, std::uint16_t* nlocal);
  void slow_path(Worker& w, rte_mbuf* m);
  void run_core(Worker& w, rte_mbuf** pkts, std::uint16_t n, const NeighborTable* nt);
  void emit(Worker& w, const dp::TxFrame* f, std::size_t n, const NeighborTable* nt);
  rte_mbuf* route(Worker& w, rte_mbuf* m, const NeighborTable* nt);
  void post(Worker& w, const CtlMsg& msg);
  void flush(Worker& w);
  void neighbor_loop();
  void want(std::uint32_t ip);
  bool may_learn(const NeighborEntry& e) const;
  void send_arp(std::uint32_t ip);
  void publish_neighbors();
  void synchronize() { rte_rcu_qsbr_synchronize(qsbr, RTE_QSBR_THRID_INVALID); }
};

// ---- set-up ----------------------------------------------------------------------------------

std::unique_ptr<Switch> Switch::create(const SwitchConfig& cfg, std::string* error) {
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.cfg = cfg;
  s.tsc_hz = rte_get_tsc_hz();
  std::vector<unsigned> lcores = cfg.lcores;
  if (lcores.empty()) {
    unsigned l;
    RTE_LCORE_FOREACH(l) lcores.push_back(l);
  }
  for (unsigned l : lcores) {
    if (l >= RTE_MAX_LCORE || !rte_lcore_is_enabled(l)) {
      *error = "lcore " + std::to_string(l) + " is not one of the EAL's lcores (give it with -l).";
      return nullptr;
    }
  }
  if (cfg.ports.size() > kMaxPorts) {
    *error = "at most " + std::to_string(kMaxPorts) + " ports are supported.";
    return nullptr;
  }
  const auto n_workers = static_cast<std::uint32_t>(lcores.size());
  s.n_workers = n_workers;
  const unsigned socket = rte_socket_id();
  // Pools: frames, headers and indirect mbufs, each with a per-lcore cache. The frame pool holds
  // at least what the queues can keep (every RX descriptor holds an mbuf all the time; a full TX
  // ring holds as many) and the lcore caches, or RX would stall silently under load.
  const std::uint32_t held =
      static_cast<std::uint32_t>(cfg.ports.size()) * n_workers * (cfg.rx_desc + cfg.tx_desc) +
      n_workers * 2 * 256 + 1024;
  const std::uint32_t nb = std::max(cfg.mbufs, held);
  if (nb > cfg.mbufs)
    log("%u mbufs per pool: the queues of %u lcore(s) can hold that many", nb, n_workers);
  s.pool = rte_pktmbuf_pool_create("td_frames", nb, 256, 0, RTE_PKTMBUF_HEADROOM + kFrameRoom,
                                   static_cast<int>(socket));
  s.hdr_pool = rte_pktmbuf_pool_create("td_hdrs", nb, 256, 0, RTE_PKTMBUF_HEADROOM + 128,
                                       static_cast<int>(socket));
  s.ind_pool = rte_pktmbuf_pool_create("td_indirect", nb, 256, 0, 0, static_cast<int>(socket));
  if (s.pool == nullptr || s.hdr_pool == nullptr || s.ind_pool == nullptr) {
    *error = "cannot allocate " + std::to_string(nb) +
             " mbufs: give DPDK more memory (-m) or lower --mbufs (" + rte_strerror(rte_errno) +
             ").";
    return nullptr;
  }
  for (rte_mempool* mp : {s.pool, s.hdr_pool, s.ind_pool}) dp::prefault_mempool(mp);
  const std::size_t qs_size = rte_rcu_qsbr_get_memsize(n_workers);
  s.qsbr = static_cast<rte_rcu_qsbr*>(rte_zmalloc("td_qsbr", qs_size, RTE_CACHE_LINE_SIZE));
  if (s.qsbr == nullptr || rte_rcu_qsbr_init(s.qsbr, n_workers) != 0) {
    *error = "cannot set up RCU.";
    return nullptr;
  }
  s.ctl_ring =
      rte_ring_create_elem("td_ctl", sizeof(CtlMsg), 4096, static_cast<int>(socket), RING_F_SC_DEQ);
  s.inject_ring =
      rte_ring_create("td_inject", 1024, static_cast<int>(socket), RING_F_SP_ENQ | RING_F_SC_DEQ);
  if (s.ctl_ring == nullptr || s.inject_ring == nullptr) {
    *error = "cannot create rings.";
    return nullptr;
  }
  for (std::uint32_t i = 0; i < n_workers; ++i) {
    auto w = std::make_unique<Worker>();
    w->lcore = lcores[i];
    w->index = i;
    dp::CoreConfig cc;
    cc.self = cfg.data;
    cc.shard = i;
    cc.shards = n_workers;
    w->core = std::make_unique<dp::Core>(cc);
    const std::string rn = "td_steer" + std::to_string(i);
    w->steer = rte_ring_create(rn.c_str(), 4096, static_cast<int>(socket), RING_F_SC_DEQ);
    if (w->steer == nullptr) {
      *error = "cannot create rings.";
      return nullptr;
    }
    w->rng = (cfg.seed * 0x9E3779B97F4A7C15ull + i) | 1;  // xorshift's state must not be 0
    w->scratch.resize(kMaxBurst * 2 * dp::kMaxFrameBytes);
    rte_rcu_qsbr_thread_register(s.qsbr, i);
    s.workers.push_back(std::move(w));
  }
  if (std::string e = s.setup_ports(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  s.publish_neighbors();
  auto sw = std::unique_ptr<Switch>(new Switch(std::move(impl)));
  for (const StaticTree& t : cfg.trees) {
    std::string why;
    if (sw->install(t.tree, t.job, &why) != 0) {
      *error = "static tree " + std::to_string(t.tree.tree_id) + ": " + why;
      return nullptr;
    }
  }
  return sw;
}

std::string Switch::Impl::setup_ports() {
  const auto nq = static_cast<std::uint16_t>(n_workers);  // TX queues: one per worker
  for (const PortConfig& pc : cfg.ports) {
    Port p;
    p.cfg = pc;
    if (rte_eth_dev_get_port_by_name(pc.name.c_str(), &p.id) != 0) {
      std::string known;
      std::uint16_t pid;
      RTE_ETH_FOREACH_DEV(pid) {
        char name[RTE_ETH_NAME_MAX_LEN];
        if (rte_eth_dev_get_name_by_port(pid, name) == 0)
          known += std::string(known.empty() ? "" : ", ") + name;
      }
      return "port '" + pc.name + "' is not a DPDK device (probed: " +
             (known.empty() ? "none; add --vdev=... or -a PCI before '--'" : known) + ").";
    }
    rte_eth_dev_info info;
    if (int rc = rte_eth_dev_info_get(p.id, &info); rc != 0) {
      return "port '" + pc.name + "': cannot read device info (" + rte_strerror(-rc) + ").";
    }
    if (info.max_tx_queues < nq) {
      return "port '" + pc.name + "' has " + std::to_string(info.max_tx_queues) +
             " TX queues but " + std::to_string(nq) +
             " datapath lcores need one each (give the PMD more queues, or fewer lcores).";
    }
    p.rx_queues = std::min(nq, info.max_rx_queues);
    rte_eth_conf conf{};
    if (p.rx_queues > 1) {
      conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
      conf.rx_adv_conf.rss_conf.rss_hf =
          (RTE_ETH_RSS_NONFRAG_IPV4_UDP | RTE_ETH_RSS_IPV4) & info.flow_type_rss_offloads;
      if (conf.rx_adv_conf.rss_conf.rss_hf == 0) conf.rxmode.mq_mode = RTE_ETH_MQ_RX_NONE;
    }
    p.chain = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
    if (p.chain) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    // configure() sets the MTU it is given, and 0 means 1500: keep the port's own unless told.
    std::uint16_t mtu = static_cast<std::uint16_t>(pc.mtu);
    if (mtu == 0 && rte_eth_dev_get_mtu(p.id, &mtu) != 0) mtu = RTE_ETHER_MTU;
    conf.rxmode.mtu = dp::configurable_mtu(info.driver_name, info.max_rx_pktlen, mtu);
    if (conf.rxmode.mtu != mtu) {
      log("port '%s': %s advertises %u-byte frames but carries longer ones: MTU %u configured, "
          "frames up to MTU %u pass",
          pc.name.c_str(), info.driver_name, info.max_rx_pktlen, unsigned(conf.rxmode.mtu),
          unsigned(mtu));
    }
    if (mtu + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN > kFrameRoom &&
        (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER) != 0) {
      conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;  // frames longer than one mbuf
    }
    if (int rc = rte_eth_dev_configure(p.id, p.rx_queues, nq, &conf); rc != 0) {
      return "port '" + pc.name + "': configure failed with MTU " + std::to_string(mtu) + " (" +
             rte_strerror(-rc) + ").";
    }
    std::uint16_t rxd = static_cast<std::uint16_t>(cfg.rx_desc),
                  txd = static_cast<std::uint16_t>(cfg.tx_desc);
    rte_eth_dev_adjust_nb_rx_tx_desc(p.id, &rxd, &txd);
    const int sock = rte_eth_dev_socket_id(p.id);
    for (std::uint16_t q = 0; q < p.rx_queues; ++q) {
      if (int rc = rte_eth_rx_queue_setup(p.id, q, rxd, static_cast<unsigned>(sock), nullptr, pool);
          rc != 0) {
        return "port '" + pc.name + "': RX queue set-up failed (" + rte_strerror(-rc) + ").";
      }
    }
    for (std::uint16_t q = 0; q < nq; ++q) {
      rte_eth_txconf txc = info.default_txconf;
      txc.offloads = conf.txmode.offloads;
      if (int rc = rte_eth_tx_queue_setup(p.id, q, txd, static_cast<unsigned>(sock), &txc);
          rc != 0) {
        return "port '" + pc.name + "': TX queue set-up failed (" + rte_strerror(-rc) + ").";
      }
    }
    rte_ether_addr mac;
    if (pc.mac) {
      std::memcpy(mac.addr_bytes, pc.mac->data(), 6);
      // A PMD that cannot take another MAC still receives it in promiscuous mode.
      if (rte_eth_dev_default_mac_addr_set(p.id, &mac) != 0) rte_eth_promiscuous_enable(p.id);
    } else {
      rte_eth_macaddr_get(p.id, &mac);
    }
    std::memcpy(p.self.mac, mac.addr_bytes, 6);
    p.self.ip = pc.ip;
    p.loss_threshold =
        pc.rx_loss >= 1 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(pc.rx_loss * 0x1p64);
    if (int rc = rte_eth_dev_start(p.id); rc != 0) {
      return "port '" + pc.name + "': start failed (" + rte_strerror(-rc) + ").";
    }
    const auto idx = static_cast<std::uint16_t>(ports.size());
    port_index[p.id] = idx;
    for (auto& w : workers) {
      w->rxq[idx] = w->index < p.rx_queues ? static_cast<std::uint16_t>(w->index) : kNoQueue;
      w->txbuf[idx] = static_cast<rte_eth_dev_tx_buffer*>(
          rte_zmalloc_socket("td_txbuf", RTE_ETH_TX_BUFFER_SIZE(kMaxBurst), 0, sock));
      if (w->txbuf[idx] == nullptr) return "cannot allocate TX buffers.";
      rte_eth_tx_buffer_init(w->txbuf[idx], cfg.burst);
      rte_eth_tx_buffer_set_err_callback(w->txbuf[idx], rte_eth_tx_buffer_count_callback,
                                         &w->tx_dropped[idx]);
    }
    log("port %s (id %u): %s/%u, MAC %s, %u RX queue(s), %s", pc.name.c_str(), p.id,
        format_ipv4(pc.ip).c_str(), pc.prefix, format_mac(p.self.mac).c_str(), p.rx_queues,
        p.chain ? "multicast chains a shared payload" : "multicast copies the payload");
    ports.push_back(p);
  }
  for (const StaticNeighbor& n : cfg.neighbors) {
    NeighborEntry e;
    e.ip = n.ip;
    for (std::size_t i = 0; i < ports.size(); ++i) {
      if (ports[i].cfg.name == n.port) e.port = ports[i].id;
    }
    std::memcpy(e.mac, n.mac.data(), 6);
    book.learn(e);
    static_ips.insert(e.ip);
  }
  return "";
}

Switch::Impl::~Impl() {
  for (const Port& p : ports) {
    rte_eth_dev_stop(p.id);
    rte_eth_dev_close(p.id);
  }
  delete neighbors.load();
  for (auto& w : workers) {
    for (auto* b : w->txbuf) rte_free(b);
    rte_ring_free(w->steer);
  }
  rte_ring_free(ctl_ring);
  rte_ring_free(inject_ring);
  rte_free(qsbr);
  rte_mempool_free(pool);
  rte_mempool_free(hdr_pool);
  rte_mempool_free(ind_pool);
}

Switch::Switch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Switch::~Switch() = default;

// ---- datapath --------------------------------------------------------------------------------

void Switch::Impl::post(Worker& w, const CtlMsg& msg) {
  CtlMsg copy = msg;  // the ring API takes a non-const pointer
  if (rte_ring_mp_enqueue_elem(ctl_ring, &copy, sizeof copy) != 0) {
    ++w.counters[static_cast<std::size_t>(SwitchdCounter::ctl_ring_full)];
  }
}

/// Sets the Ethernet addresses of an output frame from the neighbour table, or drops it (and
/// asks the neighbour thread to resolve the address, at most once per 10 ms per worker).
/// Returns the mbuf to send with its `port` set, or nullptr.
rte_mbuf* Switch::Impl::route(Worker& w, rte_mbuf* m, const NeighborTable* nt) {
  auto* eth = rte_pktmbuf_mtod(m, std::uint8_t*);
  const std::uint32_t dst = load_be32(eth + kIpDstOffset);
  const NeighborEntry* e = nt->find(dst);
  if (e == nullptr) [[unlikely]] {
    ++w.counters[static_cast<std::size_t>(SwitchdCounter::tx_unresolved)];
    // A NACK goes only to a known neighbour: resolving whatever address a refused frame claims
    // would let anyone make the switch ARP for made-up addresses.
    const bool nack = eth[kOpcodeOffset] == static_cast<std::uint8_t>(dp::Opcode::nack);
    Worker::Asked& a = w.asked[(dst * 0x9E3779B1u) >> 26];
    const std::uint64_t now = rte_rdtsc();
    if (!nack && (a.ip != dst || now - a.tsc > tsc_hz / 100)) {
      a = {dst, now};
      CtlMsg msg;
      msg.type = CtlMsg::resolve;
      msg.ip = dst;
      post(w, msg);
    }
    rte_pktmbuf_free(m);
    return nullptr;
  }
  const std::uint16_t idx = port_index[e->port];
  std::memcpy(eth, e->mac, 6);
  std::memcpy(eth + 6, ports[idx].self.mac, 6);
  m->port = e->port;
  return m;
}

void Switch::Impl::emit(Worker& w, const dp::TxFrame* f, std::size_t n, const NeighborTable* nt) {
  auto send = [&](rte_mbuf* m) {
    if (m == nullptr) return;
    const std::uint16_t idx = port_index[m->port];
    rte_eth_tx_buffer(m->port, static_cast<std::uint16_t>(w.index), w.txbuf[idx], m);
  };
  auto no_mbuf = [&] { ++w.counters[static_cast<std::size_t>(SwitchdCounter::tx_no_mbuf)]; };
  // One whole-frame mbuf: unicast, NACKs, and multicast to ports that cannot chain.
  auto copy_frame = [&](const dp::TxFrame& t) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) return no_mbuf();
    auto* d =
        reinterpret_cast<std::uint8_t*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(t.len())));
    std::memcpy(d, t.hdr, dp::kFrameHeaderBytes);
    if (t.payload_len != 0) std::memcpy(d + dp::kFrameHeaderBytes, t.payload, t.payload_len);
    send(route(w, m, nt));
  };
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    if (f[i].payload_len != 0) {
      while (j < n && f[j].payload == f[i].payload) ++j;
    }
    if (j - i == 1) {
      copy_frame(f[i]);
      i = j;
      continue;
    }
    // A multicast: the payload is copied once out of the slot (the core reuses slot memory after
    // this call), each child gets its own 74-byte header chained to an indirect mbuf.
    rte_mbuf* pay = rte_pktmbuf_alloc(pool);
    if (pay == nullptr) {
      for (; i < j; ++i) no_mbuf();
      continue;
    }
    std::memcpy(rte_pktmbuf_append(pay, static_cast<std::uint16_t>(f[i].payload_len)), f[i].payload,
                f[i].payload_len);
    for (; i < j; ++i) {
      rte_mbuf* h = rte_pktmbuf_alloc(hdr_pool);
      if (h == nullptr) {
        no_mbuf();
        continue;
      }
      std::memcpy(rte_pktmbuf_append(h, dp::kFrameHeaderBytes), f[i].hdr, dp::kFrameHeaderBytes);
      if (route(w, h, nt) == nullptr) continue;
      if (!ports[port_index[h->port]].chain) {
        // This child's port takes only single-segment frames.
        rte_pktmbuf_free(h);
        copy_frame(f[i]);
        continue;
      }
      rte_mbuf* c = rte_pktmbuf_clone(pay, ind_pool);
      if (c == nullptr || rte_pktmbuf_chain(h, c) != 0) {
        rte_pktmbuf_free(c);
        rte_pktmbuf_free(h);
        no_mbuf();
        continue;
      }
      send(h);
    }
    rte_pktmbuf_free(pay);  // the clones hold it until the PMD has sent them
  }
}

void Switch::Impl::run_core(Worker& w, rte_mbuf** pkts, std::uint16_t n, const NeighborTable* nt) {
  dp::RxFrame rx[kMaxBurst * 2];
  std::size_t scratch_used = 0;
  std::uint16_t nrx = 0;
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    // Longer than any treeduce frame: counted here, once, and not offered to the core.
    if (m->pkt_len > proto::kMaxFrameBytes) [[unlikely]] {
      ++w.counters[static_cast<std::size_t>(SwitchdCounter::rx_too_long)];
      continue;
    }
    if (m->nb_segs == 1) [[likely]] {
      rx[nrx++] = {rte_pktmbuf_mtod(m, const std::uint8_t*), m->data_len};
      continue;
    }
    // memif and af_packet deliver big frames in segments; the core wants contiguous bytes.
    ++w.counters[static_cast<std::size_t>(SwitchdCounter::rx_multiseg)];
    std::uint8_t* dst = w.scratch.data() + scratch_used;
    const auto* whole = static_cast<const std::uint8_t*>(rte_pktmbuf_read(m, 0, m->pkt_len, dst));
    rx[nrx++] = {whole, whole != nullptr ? m->pkt_len : 0};
    scratch_used += proto::kMaxFrameBytes;
  }
  dp::TxFrame tx[kTxFrames];
  std::size_t done = 0;
  while (done < nrx) {
    std::size_t ntx = 0;
    done += w.core->process_burst(rx + done, nrx - done, tx, kTxFrames, &ntx);
    emit(w, tx, ntx, nt);
  }
  rte_pktmbuf_free_bulk(pkts, n);
}

/// ARP and ICMP: answered for the port's address and for the switch's data address, on the port
/// they came in on; ARP senders are learned.
void Switch::Impl::slow_path(Worker& w, rte_mbuf* m) {
  const Port& p = ports[port_index[m->port]];
  const auto* data = rte_pktmbuf_mtod(m, const std::uint8_t*);
  const std::size_t len = m->data_len;
  dp::ArpSender arp;
  if (dp::parse_arp(data, len, &arp) &&
      (arp.target_ip == p.self.ip || arp.target_ip == cfg.data.ip)) {
    if (arp.request) ++w.counters[static_cast<std::size_t>(SwitchdCounter::arp_requests_in)];
    CtlMsg msg;
    msg.type = CtlMsg::learn;
    msg.port = m->port;
    msg.ip = arp.ip;
    std::memcpy(msg.mac, arp.mac, 6);
    post(w, msg);
  }
  // The reply is written on the stack first: most ARP on a shared segment is for others, and
  // needs no mbuf.
  std::uint8_t out[dp::kMaxFrameBytes];
  std::size_t out_len = 0;
  dp::Endpoint data_self = p.self;
  data_self.ip = cfg.data.ip;
  dp::NeighborVerdict v = dp::answer_neighbor(data, len, p.self, out, sizeof out, &out_len);
  if (v == dp::NeighborVerdict::ignored) {
    v = dp::answer_neighbor(data, len, data_self, out, sizeof out, &out_len);
  }
  switch (v) {
    case dp::NeighborVerdict::arp_reply:
    case dp::NeighborVerdict::echo_reply: {
      rte_mbuf* r = rte_pktmbuf_alloc(pool);
      if (r == nullptr) {
        ++w.counters[static_cast<std::size_t>(SwitchdCounter::tx_no_mbuf)];
        break;
      }
      ++w.counters[static_cast<std::size_t>(v == dp::NeighborVerdict::arp_reply
                                                ? SwitchdCounter::arp_replies_out
                                                : SwitchdCounter::echo_replies_out)];
      std::memcpy(rte_pktmbuf_append(r, static_cast<std::uint16_t>(out_len)), out, out_len);
      rte_eth_tx_buffer(m->port, static_cast<std::uint16_t>(w.index), w.txbuf[port_index[m->port]],
                        r);
      break;
    }
    case dp::NeighborVerdict::malformed:
      ++w.counters[static_cast<std::size_t>(SwitchdCounter::neighbor_malformed)];
      break;
    default:
      ++w.counters[static_cast<std::size_t>(SwitchdCounter::neighbor_ignored)];
      break;
  }
  rte_pktmbuf_free(m);
}

/// Sorts one received frame: ARP/ICMP to the slow path, treeduce frames of another worker's slot
/// to that worker's ring, everything else to this worker's core (which counts what it drops).
void Switch::Impl::rx_frame(Worker& w, rte_mbuf* m, rte_mbuf** local, std::uint16_t* nlocal) {
  const auto* d = rte_pktmbuf_mtod(m, const std::uint8_t*);
  if (m->data_len >= sizeof(dp::EtherHdr) + sizeof(dp::Ipv4Hdr)) [[likely]] {
    const std::uint16_t type = load_be16(d + 12);
    const std::uint8_t proto = d[sizeof(dp::EtherHdr) + offsetof(dp::Ipv4Hdr, protocol)];
    if (type == dp::kEtherTypeArp || (type == 0x0800 && proto == 1)) return slow_path(w, m);
    if (workers.size() > 1 && type == 0x0800 && proto == 17 &&
        m->data_len >= dp::kFrameHeaderBytes && load_be16(d + kUdpDstOffset) == cfg.data.port) {
      const std::uint32_t owner = load_be16(d + kSlotOffset) % n_workers;
      if (owner != w.index) {
        if (rte_ring_mp_enqueue(workers[owner]->steer, m) != 0) {
          ++w.counters[static_cast<std::size_t>(SwitchdCounter::steer_ring_full)];
          rte_pktmbuf_free(m);
        } else {
          ++w.counters[static_cast<std::size_t>(SwitchdCounter::steered)];
        }
        return;
      }
    }
  }
  local[(*nlocal)++] = m;
}

void Switch::Impl::flush(Worker& w) {
  for (std::size_t i = 0; i < ports.size(); ++i) {
    rte_eth_tx_buffer_flush(ports[i].id, static_cast<std::uint16_t>(w.index), w.txbuf[i]);
  }
}

void Switch::Impl::worker_loop(Worker& w) {
  rte_rcu_qsbr_thread_online(qsbr, w.index);
  const std::uint64_t drain_tsc = tsc_hz * cfg.tx_drain_us / 1'000'000;
  const std::uint16_t burst = static_cast<std::uint16_t>(cfg.burst);
  std::uint64_t last_drain = rte_rdtsc();
  std::uint32_t idle = 0, sleep_us = 1;
  rte_mbuf* pkts[kMaxBurst];
  rte_mbuf* local[kMaxBurst * 2];
  while (!g_stop.load(std::memory_order_relaxed)) {
    ++w.polls;
    // One table per iteration: a published replacement is seen from the next one, and the old
    // table lives until every worker has passed rte_rcu_qsbr_quiescent below.
    const NeighborTable* nt = neighbors.load(std::memory_order_acquire);
    bool backlog = false;
    std::uint64_t got = 0;
    for (std::size_t pi = 0; pi < ports.size(); ++pi) {
      if (w.rxq[pi] == kNoQueue) continue;
      const std::uint16_t n = rte_eth_rx_burst(ports[pi].id, w.rxq[pi], pkts, burst);
      if (n == 0) continue;
      got += n;
      backlog |= n == burst;
      std::uint16_t nlocal = 0;
      const std::uint64_t loss = ports[pi].loss_threshold;
      for (std::uint16_t i = 0; i < n; ++i) {
        if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(pkts[i + 1], void*));
        if (loss != 0) [[unlikely]] {
          w.rng ^= w.rng << 13;
          w.rng ^= w.rng >> 7;
          w.rng ^= w.rng << 17;
          if (w.rng < loss) {
            ++w.counters[static_cast<std::size_t>(SwitchdCounter::injected_loss)];
            rte_pktmbuf_free(pkts[i]);
            continue;
          }
        }
        rx_frame(w, pkts[i], local, &nlocal);
      }
      if (nlocal != 0) run_core(w, local, nlocal, nt);
    }
    const auto ns = static_cast<std::uint16_t>(
        rte_ring_sc_dequeue_burst(w.steer, reinterpret_cast<void**>(local), burst, nullptr));
    if (ns != 0) {
      got += ns;
      run_core(w, local, ns, nt);
    }
    if (w.index == 0) {
      rte_mbuf* inj[16];
      const unsigned ni =
          rte_ring_sc_dequeue_burst(inject_ring, reinterpret_cast<void**>(inj), 16, nullptr);
      for (unsigned i = 0; i < ni; ++i) {
        rte_eth_tx_buffer(inj[i]->port, 0, w.txbuf[port_index[inj[i]->port]], inj[i]);
      }
    }
    // Flush as soon as the queues run dry: waiting for a full TX burst would add latency to
    // every chunk of a window-limited allreduce. Under backlog, the timer bounds the delay.
    const std::uint64_t now = rte_rdtsc();
    if (!backlog || now - last_drain > drain_tsc) {
      flush(w);
      last_drain = now;
    }
    rte_rcu_qsbr_quiescent(qsbr, w.index);
    if (got != 0) {
      w.rx_total += got;
      ++w.busy_polls;
      idle = 0;
      sleep_us = 1;
      continue;
    }
    if (cfg.idle_sleep_us != 0 && ++idle > 64) {
      // Idle: sleep, backing off to idle_sleep_us. Offline while asleep, so that an RCU
      // grace period does not wait for a sleeping worker.
      rte_rcu_qsbr_thread_offline(qsbr, w.index);
      rte_delay_us_sleep(sleep_us);
      rte_rcu_qsbr_thread_online(qsbr, w.index);
      ++w.sleeps;
      sleep_us = std::min(sleep_us * 2, cfg.idle_sleep_us);
    }
  }
  flush(w);
  rte_rcu_qsbr_thread_offline(qsbr, w.index);
}

// ---- neighbours ------------------------------------------------------------------------------

void Switch::Impl::publish_neighbors() {
  const NeighborTable* old = neighbors.exchange(book.build().release(), std::memory_order_acq_rel);
  if (old != nullptr) {
    synchronize();
    delete old;
  }
}

/// Broadcast an ARP request for `ip`: on the port whose subnet holds it, else on every port (a
/// switch's data address is usually outside the link subnets; its peers answer for it on every
/// port).
void Switch::Impl::send_arp(std::uint32_t ip) {
  std::vector<const Port*> out;
  for (const Port& p : ports) {
    const std::uint32_t mask = p.cfg.prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - p.cfg.prefix);
    if ((p.self.ip & mask) == (ip & mask)) out.push_back(&p);
  }
  if (out.empty()) {
    for (const Port& p : ports) out.push_back(&p);
  }
  for (const Port* p : out) {
    rte_mbuf* m = rte_pktmbuf_alloc(pool);
    if (m == nullptr) return;
    dp::write_arp_request(
        reinterpret_cast<std::uint8_t*>(rte_pktmbuf_append(m, dp::kArpFrameBytes)), p->self, ip);
    m->port = p->id;
    if (rte_ring_sp_enqueue(inject_ring, m) != 0) rte_pktmbuf_free(m);
  }
}

void Switch::Impl::want(std::uint32_t ip) {
  // Bounded: a flood of resolve requests cannot grow the list without end.
  if (ip == 0 || book.contains(ip) || wanted.size() >= kMaxWanted) return;
  wanted.try_emplace(ip);
}

/// What the switch may learn from an ARP packet: an address it asked for or already knows (not
/// a static one), or a sender on the receiving port's subnet. Anything else is a stranger
/// claiming an address, which would redirect a tree's RESULTs.
bool Switch::Impl::may_learn(const NeighborEntry& e) const {
  if (static_ips.count(e.ip) != 0) return false;
  if (wanted.count(e.ip) != 0 || book.contains(e.ip)) return true;
  const PortConfig& pc = ports[port_index[e.port]].cfg;
  const std::uint32_t mask = pc.prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - pc.prefix);
  return (e.ip & mask) == (pc.ip & mask) && book.size() < kMaxNeighbors;
}

void Switch::Impl::neighbor_loop() {
  CtlMsg msgs[64];
  while (!g_stop.load(std::memory_order_relaxed)) {
    const unsigned n = rte_ring_sc_dequeue_burst_elem(ctl_ring, msgs, sizeof(CtlMsg), 64, nullptr);
    {
      std::lock_guard l(mu);
      bool changed = false;
      for (unsigned i = 0; i < n; ++i) {
        if (msgs[i].type == CtlMsg::learn) {
          NeighborEntry e;
          e.ip = msgs[i].ip;
          e.port = msgs[i].port;
          std::memcpy(e.mac, msgs[i].mac, 6);
          if (!may_learn(e)) continue;
          if (book.learn(e)) {
            changed = true;
            log("neighbour %s is %s on port %s", format_ipv4(e.ip).c_str(),
                format_mac(e.mac).c_str(), ports[port_index[e.port]].cfg.name.c_str());
          }
          wanted.erase(e.ip);
        } else {
          want(msgs[i].ip);
        }
      }
      if (changed) publish_neighbors();
      // Unresolved next hops: ask again every 100 ms, 30 times.
      const std::uint64_t now = rte_rdtsc();
      for (auto it = wanted.begin(); it != wanted.end();) {
        Wanted& w = it->second;
        if (w.tries != 0 && now - w.last < tsc_hz / 10) {
          ++it;
          continue;
        }
        if (w.tries == 30) {
          log("neighbour %s does not answer ARP; asking again when a packet needs it",
              format_ipv4(it->first).c_str());
          it = wanted.erase(it);
          continue;
        }
        send_arp(it->first);
        w.last = now;
        ++w.tries;
        ++it;
      }
    }
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

// ---- control ---------------------------------------------------------------------------------

int Switch::install(const dp::TreeConfig& t, const std::string& job, std::string* why) {
  Impl& s = *impl_;
  std::lock_guard l(s.mu);
  if (const dp::TreeConfig* have = s.workers[0]->core->tree_config(t.tree_id)) {
    if (*have == t) return 0;
    *why = "tree " + std::to_string(t.tree_id) + " is installed with another configuration";
    return -EEXIST;
  }
  if (Status bad = dp::Core::check_config(t); !bad.ok()) {
    *why = bad.message();
    return -EINVAL;
  }
  if (t.deterministic && !s.cfg.deterministic_allowed) {
    *why = "deterministic trees are not allowed on this switch (deterministic_allowed: false)";
    return -EINVAL;
  }
  for (std::size_t i = 0; i < s.workers.size(); ++i) {
    if (Status st = s.workers[i]->core->install_tree(t); !st.ok()) {
      const int rc = st.code() == Code::resource_exhausted ? -ENOMEM : -EINVAL;
      std::vector<dp::Tree*> undo;
      for (std::size_t k = 0; k < i; ++k)
        undo.push_back(s.workers[k]->core->unpublish_tree(t.tree_id));
      s.synchronize();
      for (dp::Tree* u : undo) dp::Core::destroy_tree(u);
      *why = st.message();
      return rc;
    }
  }
  s.jobs[t.tree_id] = job;
  // Resolve the tree's next hops now rather than on its first packets.
  if (t.role != dp::Role::root) s.want(t.parent.ip);
  for (const dp::ChildConfig& c : t.children) s.want(c.addr.ip);
  log("tree %u installed (job '%s', %s, %zu children, %u slots x %u B%s)", t.tree_id, job.c_str(),
      t.role == dp::Role::root    ? "root"
      : t.role == dp::Role::inner ? "inner"
                                  : "leaf",
      t.children.size(), t.slots, t.payload_bytes, t.deterministic ? ", deterministic" : "");
  return 0;
}

int Switch::remove(std::uint16_t tree_id) {
  Impl& s = *impl_;
  std::lock_guard l(s.mu);
  std::vector<dp::Tree*> gone;
  for (auto& w : s.workers) {
    if (dp::Tree* t = w->core->unpublish_tree(tree_id)) gone.push_back(t);
  }
  if (gone.empty()) return -ENOENT;
  s.synchronize();  // no lcore still holds a pointer into the tree's slots
  for (dp::Tree* t : gone) dp::Core::destroy_tree(t);
  s.jobs.erase(tree_id);
  log("tree %u removed", tree_id);
  return 0;
}

Snapshot Switch::snapshot() const {
  const Impl& s = *impl_;
  Snapshot snap;
  snap.switch_name = s.cfg.name;
  snap.uptime_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - s.started).count();
  std::lock_guard l(s.mu);  // trees are freed only under this lock
  for (const auto& w : s.workers) {
    dp::add_counters(w->core->counters(), &snap.core);
    for (std::size_t i = 0; i < kNumSwitchdCounters; ++i) {
      snap.switchd[i] += __atomic_load_n(&w->counters[i], __ATOMIC_RELAXED);
    }
    std::uint64_t full = 0;
    for (std::size_t i = 0; i < s.ports.size(); ++i)
      full += __atomic_load_n(&w->tx_dropped[i], __ATOMIC_RELAXED);
    snap.switchd[static_cast<std::size_t>(SwitchdCounter::tx_queue_full)] += full;
    snap.lcores.push_back({w->lcore, __atomic_load_n(&w->polls, __ATOMIC_RELAXED),
                           __atomic_load_n(&w->busy_polls, __ATOMIC_RELAXED),
                           __atomic_load_n(&w->sleeps, __ATOMIC_RELAXED)});
  }
  for (const auto& [id, job] : s.jobs) {
    TreeStats ts;
    ts.tree_id = id;
    ts.job = job;
    for (const auto& w : s.workers) {
      if (const dp::Counters* c = w->core->tree_counters(id)) dp::add_counters(*c, &ts.counters);
    }
    snap.trees.push_back(std::move(ts));
  }
  for (const Port& p : s.ports) {
    PortStats ps;
    ps.name = p.cfg.name;
    ps.port_id = p.id;
    rte_eth_stats st;
    if (rte_eth_stats_get(p.id, &st) == 0) {
      ps.rx_packets = st.ipackets;
      ps.rx_bytes = st.ibytes;
      ps.tx_packets = st.opackets;
      ps.tx_bytes = st.obytes;
      ps.rx_missed = st.imissed;
      ps.rx_errors = st.ierrors;
      ps.tx_errors = st.oerrors;
    }
    snap.ports.push_back(std::move(ps));
  }
  return snap;
}

// ---- run -------------------------------------------------------------------------------------

namespace {
int launch_worker(void* arg) {
  auto* p = static_cast<std::pair<Switch::Impl*, Worker*>*>(arg);
  p->first->worker_loop(*p->second);
  return 0;
}
}  // namespace

void Switch::run() {
  Impl& s = *impl_;
  std::thread neighbor([&s] { s.neighbor_loop(); });
  // run_ms and exit_idle_ms end the run from here; g_stop is also set by signals.
  std::thread timer([&s] {
    const auto start = std::chrono::steady_clock::now();
    auto last_change = start;
    std::uint64_t last_rx = 0;
    while (!g_stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const auto now = std::chrono::steady_clock::now();
      if (s.cfg.run_ms != 0 && now - start >= std::chrono::milliseconds(s.cfg.run_ms))
        g_stop = true;
      if (s.cfg.exit_idle_ms != 0) {
        std::uint64_t rx = 0;
        for (const auto& w : s.workers) rx += __atomic_load_n(&w->rx_total, __ATOMIC_RELAXED);
        if (rx != last_rx) {
          last_rx = rx;
          last_change = now;
        } else if (rx != 0 && now - last_change >= std::chrono::milliseconds(s.cfg.exit_idle_ms)) {
          g_stop = true;
        }
      }
    }
  });
  std::vector<std::pair<Impl*, Worker*>> args;
  args.reserve(s.workers.size());
  Worker* on_main = nullptr;
  for (auto& w : s.workers) {
    args.emplace_back(&s, w.get());
    if (w->lcore == rte_lcore_id()) {
      on_main = w.get();
    } else if (int rc = rte_eal_remote_launch(launch_worker, &args.back(), w->lcore); rc != 0) {
      // Its slots would be black-holed: stop rather than run without it.
      log("cannot start the datapath on lcore %u (%s); stopping", w->lcore, rte_strerror(-rc));
      g_stop = true;
    }
  }
  if (on_main != nullptr) {
    s.worker_loop(*on_main);
  } else {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  rte_eal_mp_wait_lcore();
  neighbor.join();
  timer.join();
  // Whatever is still queued for a worker (ARP requests, frames steered after the owner's last
  // pass) is not sent.
  rte_mbuf* m;
  while (rte_ring_sc_dequeue(s.inject_ring, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
  for (auto& w : s.workers) {
    while (rte_ring_sc_dequeue(w->steer, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
  }
}

}  // namespace treeduce::switchd
