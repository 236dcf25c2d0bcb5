#include "dpdk_transport.h"

#include <arpa/inet.h>
#include <rte_dev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pause.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <sstream>
#include <vector>

#include "treeduce/dpdk/port.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {
namespace {

// Ethernet + IPv4 + UDP in front of the treeduce header.
constexpr std::size_t kL2L4Bytes =
    sizeof(proto::EtherHdr) + sizeof(proto::Ipv4Hdr) + sizeof(proto::UdpHdr);
// IPv4 + UDP + treeduce: what the MTU must hold besides the payload.
constexpr std::size_t kL3Overhead =
    sizeof(proto::Ipv4Hdr) + sizeof(proto::UdpHdr) + sizeof(proto::TdHdr);
// A full TX ring gets this long to drain before the rest of the batch counts as lost (as a full
// socket buffer does in the UDP transport): the progress thread never blocks on a stuck port.
constexpr auto kTxDrainBound = std::chrono::milliseconds(100);
constexpr std::uint16_t kRxBurst = 32;

std::atomic<unsigned> g_pool_serial{0};

// Zero-copy TX: what the transport knows of the external-buffer mbufs the PMD still holds. Each
// such mbuf carries an ExtRef in its private area: the shared info whose free callback DPDK calls
// when the PMD frees the mbuf (from rte_eth_tx_burst, rte_eth_tx_done_cleanup, a reader's free
// on net_ring: in each case the thread that drives the transport), and its place in the list of
// live references. The list is walked only by references(), and is empty at once on PMDs that
// copy the frame in rte_eth_tx_burst.
struct ExtRefs;
struct ExtRef {
  rte_mbuf_ext_shared_info shinfo;
  ExtRefs* owner;
  const std::uint8_t* addr;
  std::uint32_t len;
  ExtRef* prev;
  ExtRef* next;
};
struct ExtRefs {
  ExtRef* head = nullptr;
  std::size_t live = 0;
  bool orphaned = false;  // the transport went away with references out: whoever frees them last
                          // frees this
};

void ext_freed(void* /*addr*/, void* opaque) {
  auto* r = static_cast<ExtRef*>(opaque);
  ExtRefs* o = r->owner;
  if (r->prev != nullptr) {
    r->prev->next = r->next;
  } else {
    o->head = r->next;
  }
  if (r->next != nullptr) r->next->prev = r->prev;
  if (--o->live == 0 && o->orphaned) delete o;
}

// PMDs that read a frame with the CPU and free its mbufs within rte_eth_tx_burst (memif in copy
// mode: eth_memif_tx copies every segment into the shared ring and frees the chain; af_packet and
// tap copy into the kernel; af_xdp copies an mbuf that is not from its umem), so a zero-copy
// reference into the caller's buffer lives no longer than the send() that made it.
bool frees_on_tx(const std::string& driver) {
  return driver == "net_memif" || driver == "net_af_packet" || driver == "net_af_xdp" ||
         driver == "net_tap";
}

// The pools of every open DPDK transport: the ones a thread that ends empties its caches into
// (LcoreOfThisThread). Only these, under this lock, which a transport holds to take its pools off
// the list before it frees them: rte_mempool_walk over all of the EAL's pools would race with any
// rte_mempool_free in the process (it takes another lock), and would touch DPDK's memory after
// an application's rte_eal_cleanup. Never destroyed: a thread may end after static destructors
// ran.
struct OpenPools {
  std::mutex mu;
  std::vector<rte_mempool*> pools;
};
OpenPools& open_pools() {
  static auto* p = new OpenPools;
  return *p;
}

void list_pool(rte_mempool* mp) {
  OpenPools& o = open_pools();
  const std::lock_guard<std::mutex> lock(o.mu);
  o.pools.push_back(mp);
}

void unlist_pools(std::initializer_list<rte_mempool*> pools) {
  OpenPools& o = open_pools();
  const std::lock_guard<std::mutex> lock(o.mu);
  std::erase_if(o.pools, [&](rte_mempool* mp) {
    return std::find(pools.begin(), pools.end(), mp) != pools.end();
  });
}

// The thread that drives the transport as an lcore of its own. A thread the EAL did not start has
// no lcore id, and a mempool has no per-lcore cache for it: every mbuf it allocates or frees (ours,
// and the PMD's in rte_eth_rx_burst and rte_eth_tx_burst) goes to the pool's shared ring, with
// its atomics. The communicator's progress thread, which runs every non-blocking operation, is
// such a thread, and so is any application thread that is not the one that started the EAL.
// Measured (treeduce-fabric --hosts dpdk, 4 ranks, 32 x 256 KiB issued non-blocking): 0.69-0.83
// CPU ms per MiB per rank without a cache, 0.47-0.67 with one. So each such thread registers
// once (rte_thread_register: an lcore id the EAL does not use) and gives its id back when it
// ends, after emptying its caches into the open transports' pools (a cache left in a closed
// transport's pool goes with the pool). Where it cannot register (every id taken, a process with
// DPDK secondary processes) it runs without caches, as before.
class LcoreOfThisThread {
 public:
  LcoreOfThisThread() : registered_(rte_lcore_id() == LCORE_ID_ANY && rte_thread_register() == 0) {}
  ~LcoreOfThisThread() {
    if (!registered_) return;
    {
      OpenPools& o = open_pools();
      const std::lock_guard<std::mutex> lock(o.mu);
      for (rte_mempool* mp : o.pools) rte_mempool_cache_flush(nullptr, mp);
    }
    rte_thread_unregister();
  }
  LcoreOfThisThread(const LcoreOfThisThread&) = delete;
  LcoreOfThisThread& operator=(const LcoreOfThisThread&) = delete;

 private:
  const bool registered_;
};

void be_an_lcore() {
  thread_local LcoreOfThisThread lcore;
  (void)lcore;
}

bool parse_mac(const std::string& s, std::uint8_t out[6]) {
  rte_ether_addr a;
  if (rte_ether_unformat_addr(s.c_str(), &a) != 0) return false;
  std::memcpy(out, a.addr_bytes, 6);
  return true;
}

class DpdkTransport final : public Transport {
 public:
  static constexpr std::size_t kBatch = 64;

  ~DpdkTransport() override {
    // Off the list first: no thread that ends from here on flushes its caches into them.
    unlist_pools({tx_pool_, rx_pool_, ext_pool_});
    release_held();
    if (started_) {
      // Free what is still queued for us (on a loopback PMD that includes our own TX mbufs) before
      // the pools go away.
      std::array<rte_mbuf*, kRxBurst> m{};
      for (int rounds = 0; rounds < 1 << 16; ++rounds) {
        const std::uint16_t n = rte_eth_rx_burst(port_, 0, m.data(), kRxBurst);
        if (n == 0) break;
        rte_pktmbuf_free_bulk(m.data(), n);
      }
      rte_eth_tx_done_cleanup(port_, 0, 0);  // TX mbufs the PMD still holds (where it can)
      rte_eth_dev_stop(port_);
    }
    // Stopping the port frees what its TX ring held on most PMDs. A reference still out (net_ring
    // keeps them until its reader frees them) keeps its pools and its list alive: leaked, as
    // freeing them would leave the PMD with dangling mbufs.
    if (refs_ != nullptr && refs_->live != 0) {
      refs_->orphaned = true;
      refs_.release();
      return;
    }
    rte_mempool_free(tx_pool_);
    rte_mempool_free(rx_pool_);
    rte_mempool_free(ext_pool_);
  }

  std::string open(const DpdkTransportOptions& opt) {
    treeduce::Result<std::uint16_t> port = dpdk::find_port(opt.port_name);
    if (!port.ok()) return port.status().message();
    port_ = *port;
    in_addr a{};
    if (inet_pton(AF_INET, opt.local_address.c_str(), &a) != 1) {
      return "The local address '" + opt.local_address + "' is not an IPv4 address.";
    }
    if (opt.local_port == 0) return "The local UDP port must not be 0.";
    self_.ip = ntohl(a.s_addr);
    self_.port = opt.local_port;
    if (!parse_ipv4_endpoint(opt.leaf_address, &leaf_.ip, &leaf_.port)) {
      return "The leaf switch address '" + opt.leaf_address + "' is not a.b.c.d:port.";
    }
    if (opt.leaf_mac.empty()) {
      return "The DPDK transport needs the leaf switch's MAC address (it does no ARP).";
    }
    if (!parse_mac(opt.leaf_mac, leaf_.mac)) {
      return "The leaf switch MAC '" + opt.leaf_mac + "' is not aa:bb:cc:dd:ee:ff.";
    }
    if (!opt.local_mac.empty() && !parse_mac(opt.local_mac, self_.mac)) {
      return "The local MAC '" + opt.local_mac + "' is not aa:bb:cc:dd:ee:ff.";
    }
    if (opt.payload_bytes == 0 || opt.payload_bytes > proto::kMaxPayloadBytes) {
      return "The payload size must be from 1 to " + std::to_string(proto::kMaxPayloadBytes) +
             " bytes, not " + std::to_string(opt.payload_bytes) + ".";
    }
    payload_bytes_ = opt.payload_bytes;
    datagram_bytes_ = sizeof(proto::TdHdr) + opt.payload_bytes;

    treeduce::Result<rte_eth_dev_info> info = dpdk::device_info(port_, opt.port_name);
    if (!info.ok()) return info.status().message();
    choose_tx_mode(opt, *info);
    if (std::string err = create_pools(opt); !err.empty()) return err;

    dpdk::PortRequest req;
    req.name = opt.port_name;
    req.rx_desc = opt.rx_desc;
    req.tx_desc = opt.tx_desc;
    // The MTU: the port's own, raised to what the payload size needs.
    req.min_mtu = static_cast<std::uint16_t>(kL3Overhead + opt.payload_bytes);
    req.rx_pool = rx_pool_;
    req.multi_seg_tx = zero_copy_;
    if (!opt.local_mac.empty()) req.mac = std::to_array(self_.mac);
    treeduce::Result<dpdk::PortUp> up = dpdk::start_port(port_, *info, req);
    if (!up.ok()) return up.status().message();
    std::memcpy(self_.mac, up->mac.data(), 6);
    started_ = true;
    if (zero_copy_ && !up->multi_seg_tx) {  // what the port was configured with
      zero_copy_ = false;
      tx_why_ = "TX copies each payload into its mbuf (the port took no multi-segment TX)";
    }
    // The per-flow template: the headers of a full-size datagram, patched only for a shorter one.
    proto::write_l2_l4(template_.data(), self_, leaf_, datagram_bytes_);
    std::fprintf(stderr, "treeduce: info: DPDK port '%s' (%s): %s\n", opt.port_name.c_str(),
                 info->driver_name, tx_why_.c_str());
    rx_buf_.resize(kBatch * datagram_bytes_);
    scratch_.resize(proto::kMaxFrameBytes);
    return {};
  }

  std::size_t batch() const noexcept override { return kBatch; }
  const TransportStats& stats() const noexcept override { return stats_; }

  void wake() noexcept override { wake_.store(true, std::memory_order_release); }

  bool references(const void* p, std::size_t len) override {
    if (refs_ == nullptr || refs_->live == 0) return false;
    be_an_lcore();
    rte_eth_tx_done_cleanup(port_, 0, 0);  // have the PMD free what it has sent, where it can
    const auto* b = static_cast<const std::uint8_t*>(p);
    for (const ExtRef* r = refs_->head; r != nullptr; r = r->next) {
      if (r->addr < b + len && b < r->addr + r->len) return true;
    }
    return false;
  }

  std::string send(const OutPacket* p, std::size_t n) override {
    be_an_lcore();
    // More than batch() breaks the contract; it is sent all the same, a batch at a time.
    for (std::size_t i = 0; i < n; i += kBatch) {
      if (std::string err = send_batch(p + i, std::min(kBatch, n - i)); !err.empty()) return err;
    }
    return {};
  }

  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* /*error*/) override {
    be_an_lcore();
    std::size_t n = poll();
    if (n != 0 || timeout_ns == 0) return {rx_out_.data(), n};
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::nanoseconds(std::min<std::uint64_t>(timeout_ns, std::uint64_t{1} << 62));
    for (;;) {
      if (wake_.exchange(false, std::memory_order_acq_rel)) return {};
      n = poll();
      if (n != 0) return {rx_out_.data(), n};
      if (std::chrono::steady_clock::now() >= deadline) return {};
      // Poll, but hand the CPU to whoever else is runnable between polls: a host shares its
      // cores with the application (and, in an emulated fabric, with the switches and the other
      // ranks), and a spinning progress thread would hold a CPU for a whole scheduler slice.
      if (++idle_polls_ % 16 == 0) {
        sched_yield();
      } else {
        rte_pause();
      }
    }
  }

 private:
  // Zero-copy TX or copying, and why (said on stderr once the port is up).
  void choose_tx_mode(const DpdkTransportOptions& opt, const rte_eth_dev_info& info) {
    const std::string driver = info.driver_name;
    const rte_devargs* da = rte_dev_devargs(info.device);
    const std::string args = da != nullptr && da->args != nullptr ? da->args : "";
    zero_copy_ = false;
    if (opt.tx_mode == DpdkTransportOptions::TxMode::copy) {
      tx_why_ = "TX copies each payload into its mbuf (zero-copy switched off)";
    } else if ((info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) == 0) {
      tx_why_ = "TX copies each payload into its mbuf (the PMD takes no multi-segment frames)";
    } else if (driver == "net_memif" && args.find("zero-copy=yes") != std::string::npos) {
      tx_why_ =
          "TX copies each payload into its mbuf (memif with zero-copy=yes sends segments as "
          "offsets into DPDK's first memory segment list, and the caller's buffer is not in it)";
    } else if (opt.tx_mode == DpdkTransportOptions::TxMode::automatic && !frees_on_tx(driver)) {
      tx_why_ =
          "TX copies each payload into its mbuf (zero-copy is used only on PMDs that copy the "
          "frame and free it in rte_eth_tx_burst: memif, af_packet, af_xdp, tap)";
    } else {
      zero_copy_ = true;
      tx_why_ =
          "TX zero-copy: a header mbuf chained to an external-buffer mbuf over the caller's "
          "payload";
    }
  }

  // The TX and RX pools: one mbuf holds a whole frame of the largest payload (plus CRC room), so
  // neither side chains. With zero-copy TX, a third pool of data-less mbufs that point into the
  // caller's buffers, each with an ExtRef in its private area.
  std::string create_pools(const DpdkTransportOptions& opt) {
    const std::size_t frame_room = std::max<std::size_t>(
        RTE_MBUF_DEFAULT_DATAROOM, kL2L4Bytes + datagram_bytes_ + RTE_ETHER_CRC_LEN);
    const auto room = static_cast<std::uint16_t>(RTE_PKTMBUF_HEADROOM + frame_room);
    const int socket = dpdk::port_socket(port_);
    // Pool names are global to the EAL: a serial keeps successive transports apart.
    const std::string serial = std::to_string(g_pool_serial.fetch_add(1));
    // A per-lcore cache of at most an eighth of the pool (the mempool wants n >= 1.5 x cache).
    const unsigned cache = std::min(256u, opt.mbufs / 8);
    for (auto [name, pool] : {std::pair{"tdh_tx", &tx_pool_}, std::pair{"tdh_rx", &rx_pool_}}) {
      treeduce::Result<rte_mempool*> mp =
          dpdk::create_pool(name + serial, opt.mbufs, cache, room, socket);
      if (!mp.ok()) return mp.status().message();
      *pool = *mp;
      list_pool(*pool);
    }
    if (zero_copy_) {
      const auto priv = static_cast<std::uint16_t>(RTE_ALIGN(sizeof(ExtRef), RTE_MBUF_PRIV_ALIGN));
      ext_pool_ =
          rte_pktmbuf_pool_create(("tdh_ext" + serial).c_str(), opt.mbufs, cache, priv, 0, socket);
      if (ext_pool_ == nullptr) {
        return "Cannot allocate " + std::to_string(opt.mbufs) +
               " external-buffer mbufs: give DPDK more memory (-m) or use fewer mbufs (" +
               rte_strerror(rte_errno) + ").";
      }
      list_pool(ext_pool_);
      refs_ = std::make_unique<ExtRefs>();
      iova_va_ = rte_eal_iova_mode() == RTE_IOVA_VA;
    }
    return {};
  }

  // Frame i's headers into `f`: the template when the payload is full-size.
  void write_headers(std::uint8_t* f, const OutPacket& p) const {
    const std::size_t dgram = sizeof(proto::TdHdr) + p.payload_len;
    if (dgram == datagram_bytes_) {
      std::memcpy(f, template_.data(), kL2L4Bytes);
    } else {
      proto::write_l2_l4(f, self_, leaf_, dgram);
    }
    proto::store_header(f + kL2L4Bytes, p.td);
  }

  // Frame i as a header mbuf chained to an external-buffer mbuf over the caller's payload.
  void attach_payload(rte_mbuf* h, rte_mbuf* e, const OutPacket& p) {
    auto* r = static_cast<ExtRef*>(rte_mbuf_to_priv(e));
    r->shinfo.free_cb = ext_freed;
    r->shinfo.fcb_opaque = r;
    rte_mbuf_ext_refcnt_set(&r->shinfo, 1);
    r->owner = refs_.get();
    r->addr = p.payload;
    r->len = p.payload_len;
    r->prev = nullptr;
    r->next = refs_->head;
    if (refs_->head != nullptr) refs_->head->prev = r;
    refs_->head = r;
    ++refs_->live;
    // The PMDs zero-copy is used on read with the CPU; a physical address is never needed.
    void* addr = const_cast<std::uint8_t*>(p.payload);
    const rte_iova_t iova = iova_va_ ? reinterpret_cast<rte_iova_t>(addr) : RTE_BAD_IOVA;
    rte_pktmbuf_attach_extbuf(e, addr, iova, static_cast<std::uint16_t>(p.payload_len), &r->shinfo);
    e->data_len = static_cast<std::uint16_t>(p.payload_len);
    e->pkt_len = p.payload_len;
    rte_pktmbuf_chain(h, e);
  }

  std::string send_batch(const OutPacket* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (p[i].payload_len > payload_bytes_) {
        return "A " + std::to_string(sizeof(proto::TdHdr) + p[i].payload_len) +
               "-byte datagram exceeds the DPDK transport's " + std::to_string(datagram_bytes_) +
               " bytes; use a smaller payload size.";
      }
    }
    if (n == 0) return {};
    std::array<rte_mbuf*, kBatch> m{};
    std::array<rte_mbuf*, kBatch> ext{};
    if (rte_pktmbuf_alloc_bulk(tx_pool_, m.data(), static_cast<unsigned>(n)) != 0) {
      // Every mbuf is still in a TX ring: count the batch lost, the engine retransmits.
      stats_.send_errors += n;
      return {};
    }
    if (zero_copy_ &&
        rte_pktmbuf_alloc_bulk(ext_pool_, ext.data(), static_cast<unsigned>(n)) != 0) {
      rte_pktmbuf_free_bulk(m.data(), static_cast<unsigned>(n));
      stats_.send_errors += n;
      return {};
    }
    for (std::size_t i = 0; i < n; ++i) {
      // Zero-copy: the header mbuf holds the headers only, the payload stays where the caller
      // has it (a retransmission attaches the same bytes again). Copying: one mbuf per frame.
      // Measured (treeduce-bench-dpdk-tx, memif, payloads out of cache, memif's own copy
      // included): 8 KiB 0.8-1.1 us per packet in send() zero-copy, 1.3-1.7 us copying; 1 KiB
      // 211 ns against 240 ns.
      const bool attach = zero_copy_ && p[i].payload_len != 0;
      const std::size_t len = kL2L4Bytes + sizeof(proto::TdHdr) + (attach ? 0 : p[i].payload_len);
      auto* f = reinterpret_cast<std::uint8_t*>(
          rte_pktmbuf_append(m[i], static_cast<std::uint16_t>(len)));
      write_headers(f, p[i]);
      if (attach) {
        attach_payload(m[i], ext[i], p[i]);
      } else {
        if (zero_copy_) rte_pktmbuf_free(ext[i]);
        if (p[i].payload_len != 0) {
          std::memcpy(f + kL2L4Bytes + sizeof(proto::TdHdr), p[i].payload, p[i].payload_len);
        }
      }
    }
    std::size_t done = 0;
    auto deadline = std::chrono::steady_clock::time_point::max();
    while (done < n) {
      const std::uint16_t k =
          rte_eth_tx_burst(port_, 0, &m[done], static_cast<std::uint16_t>(n - done));
      done += k;
      stats_.sent += k;
      if (done == n) break;
      if (k != 0) {
        deadline = std::chrono::steady_clock::time_point::max();
        continue;
      }
      // The ring is full: wait for room, within a bound (the clock is read only when stuck).
      const auto now = std::chrono::steady_clock::now();
      if (deadline == std::chrono::steady_clock::time_point::max()) deadline = now + kTxDrainBound;
      if (now >= deadline) {
        rte_pktmbuf_free_bulk(&m[done], static_cast<unsigned>(n - done));
        stats_.send_errors += n - done;
        break;
      }
      rte_pause();
    }
    return {};
  }

  // The mbufs whose data the last receive() returned: they stay ours until the next one.
  void release_held() {
    if (nheld_ != 0) rte_pktmbuf_free_bulk(held_.data(), static_cast<unsigned>(nheld_));
    nheld_ = 0;
  }

  // One pass over the RX queue: up to kBatch datagrams for us. A datagram in one segment is
  // returned where it lies, its mbuf kept until the next receive() (the engine copies the
  // payload to the caller's buffer: one copy instead of two); a chained one is copied out.
  std::size_t poll() {
    release_held();
    std::size_t out = 0;
    std::array<rte_mbuf*, kRxBurst> m{};
    while (out < kBatch) {
      const auto want = static_cast<std::uint16_t>(std::min<std::size_t>(kRxBurst, kBatch - out));
      const std::uint16_t k = rte_eth_rx_burst(port_, 0, m.data(), want);
      for (std::uint16_t i = 0; i < k; ++i) {
        if (!take(m[i], out)) {
          rte_pktmbuf_free(m[i]);
          continue;
        }
        if (m[i]->nb_segs == 1) {
          held_[nheld_++] = m[i];
        } else {
          rte_pktmbuf_free(m[i]);
        }
        ++out;
      }
      if (k < want) break;
    }
    return out;
  }

  // Parse one frame; when it is a datagram from the leaf switch, point slot `out` at it (one
  // segment) or copy it there (chained).
  bool take(const rte_mbuf* mb, std::size_t out) {
    const std::uint32_t len = rte_pktmbuf_pkt_len(mb);
    const std::uint8_t* frame;
    if (mb->nb_segs == 1) {
      frame = rte_pktmbuf_mtod(mb, const std::uint8_t*);
    } else if (len <= scratch_.size()) {
      frame = static_cast<const std::uint8_t*>(rte_pktmbuf_read(mb, 0, len, scratch_.data()));
    } else {
      ++stats_.foreign;
      return false;
    }
    proto::Parsed ps;
    if (frame == nullptr ||
        proto::parse_frame(frame, len, self_.ip, self_.port, &ps) != proto::Reason::none ||
        ps.src_ip != leaf_.ip || ps.src_port != leaf_.port || ps.payload_len > payload_bytes_) {
      ++stats_.foreign;
      return false;
    }
    if (mb->nb_segs == 1) {
      // The wire header sits right before the payload.
      rx_out_[out] = {ps.payload - sizeof(proto::TdHdr), sizeof(proto::TdHdr) + ps.payload_len};
    } else {
      std::uint8_t* d = rx_buf_.data() + out * datagram_bytes_;
      proto::store_header(d, ps.td);
      std::memcpy(d + sizeof(proto::TdHdr), ps.payload, ps.payload_len);
      rx_out_[out] = {d, sizeof(proto::TdHdr) + ps.payload_len};
    }
    ++stats_.received;
    return true;
  }

  std::uint16_t port_ = 0;
  bool started_ = false;
  proto::Endpoint self_, leaf_;
  std::uint32_t payload_bytes_ = 0;
  std::size_t datagram_bytes_ = 0;
  rte_mempool* tx_pool_ = nullptr;
  rte_mempool* rx_pool_ = nullptr;
  rte_mempool* ext_pool_ = nullptr;  // zero-copy TX: mbufs over the caller's payloads
  std::unique_ptr<ExtRefs> refs_;    // zero-copy TX: references the PMD still holds
  bool zero_copy_ = false;
  bool iova_va_ = false;
  std::string tx_why_;                               // which TX mode, and why
  std::array<std::uint8_t, kL2L4Bytes> template_{};  // headers of a full-size datagram
  std::atomic<bool> wake_{false};
  std::uint64_t idle_polls_ = 0;          // empty polls in receive(): every 16th yields the CPU
  std::array<rte_mbuf*, kBatch> held_{};  // see release_held()
  std::size_t nheld_ = 0;
  TransportStats stats_;
  std::vector<std::uint8_t> rx_buf_;   // kBatch datagrams of datagram_bytes_
  std::vector<std::uint8_t> scratch_;  // a chained frame, made contiguous
  std::array<RxDatagram, kBatch> rx_out_{};
};

}  // namespace

std::string init_eal_once(const std::string& args) {
  static std::mutex m;
  static std::string result;
  static bool done = false;
  const std::lock_guard<std::mutex> lock(m);
  if (done) return result;
  done = true;
  // Whitespace-separated, no quoting: EAL arguments carry no spaces (paths included, here).
  std::vector<std::string> words{"treeduce"};
  std::istringstream in(args);
  for (std::string w; in >> w;) words.push_back(w);
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  // The EAL pins the thread that starts it to its main lcore's CPU, and every thread the
  // application starts afterwards inherits that: give the application its CPUs back.
  cpu_set_t cpus;
  const bool have_cpus = pthread_getaffinity_np(pthread_self(), sizeof cpus, &cpus) == 0;
  if (rte_eal_init(static_cast<int>(words.size()), argv.data()) < 0 && rte_errno != EALREADY) {
    result = "the EAL did not start with TREEDUCE_DPDK_EAL=\"" + args + "\" (" +
             rte_strerror(rte_errno) + ")";
  }
  if (have_cpus) pthread_setaffinity_np(pthread_self(), sizeof cpus, &cpus);
  return result;
}

std::unique_ptr<Transport> make_dpdk_transport(const DpdkTransportOptions& opt,
                                               std::string* error) {
  auto t = std::make_unique<DpdkTransport>();
  if (std::string err = t->open(opt); !err.empty()) {
    *error = err;
    return nullptr;
  }
  return t;
}

}  // namespace treeduce::host
