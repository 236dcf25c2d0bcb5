#include "dpdk_transport.h"

#include <arpa/inet.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pause.h>

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
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
    rte_mempool_free(tx_pool_);
    rte_mempool_free(rx_pool_);
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
    if (std::string err = create_pools(opt); !err.empty()) return err;

    dpdk::PortRequest req;
    req.name = opt.port_name;
    req.rx_desc = opt.rx_desc;
    req.tx_desc = opt.tx_desc;
    // The MTU: the port's own, raised to what the payload size needs.
    req.min_mtu = static_cast<std::uint16_t>(kL3Overhead + opt.payload_bytes);
    req.rx_pool = rx_pool_;
    if (!opt.local_mac.empty()) req.mac = std::to_array(self_.mac);
    treeduce::Result<dpdk::PortUp> up = dpdk::start_port(port_, *info, req);
    if (!up.ok()) return up.status().message();
    std::memcpy(self_.mac, up->mac.data(), 6);
    started_ = true;
    rx_buf_.resize(kBatch * datagram_bytes_);
    scratch_.resize(proto::kMaxFrameBytes);
    return {};
  }

  std::size_t batch() const noexcept override { return kBatch; }
  const TransportStats& stats() const noexcept override { return stats_; }

  void wake() noexcept override { wake_.store(true, std::memory_order_release); }

  std::string send(const OutPacket* p, std::size_t n) override {
    // More than batch() breaks the contract; it is sent all the same, a batch at a time.
    for (std::size_t i = 0; i < n; i += kBatch) {
      if (std::string err = send_batch(p + i, std::min(kBatch, n - i)); !err.empty()) return err;
    }
    return {};
  }

  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* /*error*/) override {
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
  // The TX and RX pools: one mbuf holds a whole frame of the largest payload (plus CRC room), so
  // neither side chains.
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
    }
    return {};
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
    if (rte_pktmbuf_alloc_bulk(tx_pool_, m.data(), static_cast<unsigned>(n)) != 0) {
      // Every mbuf is still in a TX ring: count the batch lost, the engine retransmits.
      stats_.send_errors += n;
      return {};
    }
    for (std::size_t i = 0; i < n; ++i) {
      // One mbuf per frame and the payload copied: simple and correct. A header mbuf chained to
      // an external-buffer mbuf (rte_pktmbuf_attach_extbuf) over the caller's payload would save
      // the copy, at the price of a completion callback that tells the engine when the payload
      // is free again, and of PMDs that take multi-segment frames.
      const std::size_t dgram = sizeof(proto::TdHdr) + p[i].payload_len;
      auto* f = reinterpret_cast<std::uint8_t*>(
          rte_pktmbuf_append(m[i], static_cast<std::uint16_t>(kL2L4Bytes + dgram)));
      proto::write_l2_l4(f, self_, leaf_, dgram);
      proto::store_header(f + kL2L4Bytes, p[i].td);
      if (p[i].payload_len != 0) {
        std::memcpy(f + kL2L4Bytes + sizeof(proto::TdHdr), p[i].payload, p[i].payload_len);
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
