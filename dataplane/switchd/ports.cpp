// treeduce-switch's ports: the mbuf pools, each port brought up (treeduce/dpdk/port.h) with one TX
// queue per worker and up to one RX queue per worker, the workers' TX buffers, and the ports'
// stop and counters.
#include <rte_devargs.h>
#include <rte_lcore.h>
#include <rte_malloc.h>

#include <unistd.h>

#include <algorithm>

#include "datapath_impl.h"
#include "treeduce/dpdk/port.h"

namespace treeduce::switchd {

Status Switch::Impl::create_pools() {
  const int socket = static_cast<int>(rte_socket_id());
  // Pools: frames, headers and indirect mbufs, each with a per-lcore cache. The frame pool holds
  // at least what the queues can keep (every RX descriptor holds an mbuf all the time; a full TX
  // ring holds as many) and the lcore caches, or RX would stall silently under load.
  const std::uint32_t held =
      static_cast<std::uint32_t>(cfg.ports.size()) * n_workers * (cfg.rx_desc + cfg.tx_desc) +
      n_workers * 2 * 256 + 1024;
  const std::uint32_t nb = std::max(cfg.mbufs, held);
  if (nb > cfg.mbufs)
    log("%u mbufs per pool: the queues of %u lcore(s) can hold that many", nb, n_workers);
  const struct {
    const char* name;
    std::uint16_t room;
    rte_mempool** out;
  } pools[] = {{"td_frames", RTE_PKTMBUF_HEADROOM + kFrameRoom, &pool},
               {"td_hdrs", RTE_PKTMBUF_HEADROOM + 128, &hdr_pool},
               {"td_indirect", 0, &ind_pool}};
  for (const auto& p : pools) {
    Result<rte_mempool*> mp = dpdk::create_pool(p.name, nb, 256, p.room, socket);
    if (!mp.ok()) return mp.status();
    *p.out = *mp;
  }
  return Status::Ok();
}

Status Switch::Impl::setup_ports() {
  for (const PortConfig& pc : cfg.ports) {
    if (Status st = setup_port(pc); !st.ok()) return st;
  }
  return Status::Ok();
}

namespace {

/// XDP_PACKET_HEADROOM (linux/bpf.h): what the kernel keeps in front of a frame it writes.
constexpr std::uint32_t kXdpHeadroom = 256;
/// The mbufs DPDK 22.11's net_af_xdp puts in each RX queue's fill ring at set-up
/// (ETH_AF_XDP_DFLT_NUM_DESCS), whatever the queue's descriptor count.
constexpr std::uint32_t kAfXdpFillRing = 2048;

}  // namespace

/// The bytes of a frame an mbuf of `mp` (a net_af_xdp port's UMEM) holds: its data room less
/// DPDK's headroom and the kernel's XDP headroom, both in front of the frame.
std::uint32_t Switch::Impl::af_xdp_frame_room(rte_mempool* mp) {
  return rte_pktmbuf_data_room_size(mp) - RTE_PKTMBUF_HEADROOM - kXdpHeadroom;
}

/// A net_af_xdp port's RX pool. DPDK's PMD registers its RX pool as the socket's UMEM, one mbuf
/// per UMEM frame, and without hugepages the kernel takes frames of at most a page (the shared
/// 8448-byte frames fail with "Failed to create umem"): so the port gets a pool of its own with
/// the largest mbufs that fit a page, and an MTU whose frames do not fit them is refused here.
Result<rte_mempool*> Switch::Impl::af_xdp_pool(const PortConfig& pc, std::uint16_t port,
                                               std::uint16_t idx) {
  // Without `mtu:` the port keeps the interface's own (dpdk::start_port).
  std::uint16_t mtu = static_cast<std::uint16_t>(pc.mtu);
  if (mtu == 0 && rte_eth_dev_get_mtu(port, &mtu) != 0) mtu = RTE_ETHER_MTU;
  const auto page = static_cast<std::uint32_t>(sysconf(_SC_PAGESIZE));
  std::uint32_t room = page - sizeof(rte_mbuf);
  rte_mempool_objsz sz;
  while (room > 0 && rte_mempool_calc_obj_size(sizeof(rte_mbuf) + room, 0, &sz) > page)
    room -= RTE_CACHE_LINE_SIZE;
  const std::uint32_t frame = room - RTE_PKTMBUF_HEADROOM - kXdpHeadroom;
  if (std::uint32_t{mtu} + RTE_ETHER_HDR_LEN > frame) {
    return failed_precondition(
        "port '" + pc.name + "' (net_af_xdp) takes frames of at most " + std::to_string(frame) +
        " bytes (its UMEM frames are a page, " + std::to_string(page) +
        " bytes, less DPDK's and the kernel's headroom), but its MTU is " + std::to_string(mtu) +
        ": give it an MTU of at most " + std::to_string(frame - RTE_ETHER_HDR_LEN) +
        ", or use net_af_packet for jumbo frames.");
  }
  // What the port's queues can hold (as create_pools() counts for the shared pool): per queue
  // the PMD's fill ring, its RX ring and its TX ring (the PMD copies a frame from another pool
  // into one of these to send it), then the lcore caches.
  const std::uint32_t nb =
      n_workers * (kAfXdpFillRing + cfg.rx_desc + cfg.tx_desc) + n_workers * 2 * 256 + 1024;
  return dpdk::create_pool("td_xdp" + std::to_string(idx), nb, 256,
                           static_cast<std::uint16_t>(room), static_cast<int>(rte_socket_id()));
}

/// Brings up one port: as many RX queues as workers (or as the PMD has), one TX queue per worker,
/// multi-segment TX where the PMD takes it (multicast then chains a shared payload).
Status Switch::Impl::setup_port(const PortConfig& pc) {
  const auto nq = static_cast<std::uint16_t>(n_workers);  // TX queues: one per worker
  Port p;
  p.cfg = pc;
  Result<std::uint16_t> id = dpdk::find_port(pc.name);
  if (!id.ok()) return id.status();
  p.id = *id;
  Result<rte_eth_dev_info> info = dpdk::device_info(p.id, pc.name);
  if (!info.ok()) return info.status();
  if (info->max_tx_queues < nq) {
    return failed_precondition("port '" + pc.name + "' has " + std::to_string(info->max_tx_queues) +
                               " TX queues but " + std::to_string(nq) +
                               " datapath lcores need one each (give the PMD more queues, or "
                               "fewer lcores).");
  }
  if (std::string_view(info->driver_name) == "net_af_xdp") {
    Result<rte_mempool*> own = af_xdp_pool(pc, p.id, static_cast<std::uint16_t>(ports.size()));
    if (!own.ok()) return own.status();
    p.own_pool = *own;
  }
  dpdk::PortRequest req;
  req.name = pc.name;
  req.rx_queues = nq;
  req.tx_queues = nq;
  req.rx_desc = static_cast<std::uint16_t>(cfg.rx_desc);
  req.tx_desc = static_cast<std::uint16_t>(cfg.tx_desc);
  req.mtu = static_cast<std::uint16_t>(pc.mtu);
  req.rx_pool = p.own_pool != nullptr ? p.own_pool : pool;
  req.rx_frame_room = p.own_pool != nullptr ? af_xdp_frame_room(p.own_pool) : kFrameRoom;
  req.multi_seg_tx = true;
  req.mac = pc.mac;
  Result<dpdk::PortUp> up = dpdk::start_port(p.id, *info, req);
  if (!up.ok()) {
    rte_mempool_free(p.own_pool);
    return up.status();
  }
  if (up->configured_mtu != up->mtu) {
    log("port '%s': %s advertises %u-byte frames but carries longer ones: MTU %u configured, "
        "frames up to MTU %u pass",
        pc.name.c_str(), info->driver_name, info->max_rx_pktlen, unsigned(up->configured_mtu),
        unsigned(up->mtu));
  }
  p.rx_queues = up->rx_queues;
  p.chain = up->multi_seg_tx;
  std::memcpy(p.self.mac, up->mac.data(), 6);
  p.self.ip = pc.ip;
  const auto idx = static_cast<std::uint16_t>(ports.size());
  port_index[p.id] = idx;
  {
    // A memif client (role=client is memif's default) does not connect again by itself after
    // its server refused it or went away: the neighbour thread restarts it (links.cpp).
    const rte_devargs* da = info->device ? rte_dev_devargs(info->device) : nullptr;
    const std::string args = da && da->args ? da->args : "";
    std::lock_guard l(mu);
    links[idx].memif_client = std::string_view(info->driver_name) == "net_memif" &&
                              args.find("role=server") == std::string::npos;
  }
  ports.push_back(p);
  {
    std::lock_guard l(mu);
    set_fault(idx, PortFault{pc.rx_loss, false, pc.delay_us, pc.rate_mbps});
  }
  if (Status st = attach_port(idx, dpdk::port_socket(p.id)); !st.ok()) return st;
  log("port %s (id %u): %s/%u, MAC %s, %u RX queue(s), %s", pc.name.c_str(), p.id,
      format_ipv4(pc.ip).c_str(), pc.prefix, format_mac(p.self.mac).c_str(), p.rx_queues,
      p.chain ? "multicast chains a shared payload" : "multicast copies the payload");
  return Status::Ok();
}

/// Gives every worker the port at `idx`: its RX queue (worker i polls queue i, if there is one)
/// and a TX buffer for its TX queue.
Status Switch::Impl::attach_port(std::uint16_t idx, int socket) {
  const Port& p = ports[idx];
  for (auto& w : workers) {
    w->rxq[idx] = w->index < p.rx_queues ? static_cast<std::uint16_t>(w->index) : kNoQueue;
    w->txbuf[idx] = static_cast<rte_eth_dev_tx_buffer*>(
        rte_zmalloc_socket("td_txbuf", RTE_ETH_TX_BUFFER_SIZE(kMaxBurst), 0, socket));
    if (w->txbuf[idx] == nullptr) return resource_exhausted("cannot allocate TX buffers.");
    rte_eth_tx_buffer_init(w->txbuf[idx], cfg.burst);
    rte_eth_tx_buffer_set_err_callback(w->txbuf[idx], rte_eth_tx_buffer_count_callback,
                                       &w->tx_dropped[idx]);
    w->held[idx].q = std::make_unique<HeldQueue::Held[]>(kFaultQueueFrames);
  }
  return Status::Ok();
}

/// Publishes port pi's faults to the workers (relaxed: a worker sees them from a later burst).
void Switch::Impl::set_fault(std::size_t pi, const PortFault& f) {
  FaultState& fs = faults[pi];
  fs.loss_threshold.store(
      f.rx_loss >= 1 ? ~std::uint64_t{0} : static_cast<std::uint64_t>(f.rx_loss * 0x1p64),
      std::memory_order_relaxed);
  fs.down.store(f.down, std::memory_order_relaxed);
  fs.delay_tsc.store(tsc_hz * f.delay_us / 1'000'000, std::memory_order_relaxed);
  // 8 bits per byte at rate_mbps * 10^6 bits per second, in 2^-16 cycles.
  fs.tsc_per_byte_q16.store(
      f.rate_mbps == 0 ? 0 : (tsc_hz << 16) * 8 / (std::uint64_t{f.rate_mbps} * 1'000'000),
      std::memory_order_relaxed);
  fs.now = f;
}

Status Switch::Impl::port_named(const std::string& name, std::size_t* pi) const {
  std::string known;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    if (ports[i].cfg.name == name) {
      *pi = i;
      return Status::Ok();
    }
    known += (known.empty() ? "" : ", ") + ports[i].cfg.name;
  }
  return not_found("Switch " + cfg.name + " has no port '" + name + "' (its ports: " + known +
                   ").");
}

Status Switch::set_port_fault(const std::string& port, const PortFault& f) {
  Impl& s = *impl_;
  std::size_t i = 0;
  if (Status st = s.port_named(port, &i); !st.ok()) return st;
  std::lock_guard l(s.mu);
  if (s.faults[i].now == f) return Status::Ok();
  s.set_fault(i, f);
  log("port %s: faults now rx_loss %g, %s, delay %u us, rate %s", port.c_str(), f.rx_loss,
      f.down ? "down" : "up", f.delay_us,
      f.rate_mbps == 0 ? "line" : (std::to_string(f.rate_mbps) + " Mb/s").c_str());
  return Status::Ok();
}

void Switch::Impl::stop_ports() {
  for (const Port& p : ports) {
    rte_eth_dev_stop(p.id);
    rte_eth_dev_close(p.id);
  }
}

std::vector<PortStats> Switch::Impl::port_stats() const {
  std::vector<PortStats> out;
  for (const Port& p : ports) {
    PortStats ps;
    ps.name = p.cfg.name;
    ps.port_id = p.id;
    ps.fault = faults[port_index[p.id]].now;  // the caller holds mu
    const LinkState& ls = links[port_index[p.id]];
    ps.link_up = ls.up;
    ps.link_changes = ls.changes;
    ps.link_restarts = ls.restarts;
    {
      std::lock_guard l(cap_mu);
      if (const auto& c = captures[port_index[p.id]]) ps.capture = c->path;
    }
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
    out.push_back(std::move(ps));
  }
  return out;
}

}  // namespace treeduce::switchd
