// treeduce-switch's workers: one per datapath lcore, run to completion. RX from its queue of every
// port, steering to the slot's owner, the slow path (ARP, ICMP), the core, TX. No allocation, lock
// or log per packet. Design and measured costs: docs/switch.md ("Datapath").
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_ring_elem.h>
#include <sched.h>

#include <algorithm>

#include "datapath_impl.h"
#include "treeduce/dataplane/neighbor.h"

namespace treeduce::switchd {

// ---- set-up ----------------------------------------------------------------------------------

Status Switch::Impl::create_workers(const std::vector<unsigned>& lcores) {
  const int socket = static_cast<int>(rte_socket_id());
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
    w->steer = rte_ring_create(rn.c_str(), 4096, socket, RING_F_SC_DEQ);
    if (w->steer == nullptr) return resource_exhausted("cannot create rings.");
    w->rng = (cfg.seed * 0x9E3779B97F4A7C15ull + i) | 1;  // xorshift's state must not be 0
    w->scratch.resize(kMaxBurst * 2 * proto::kMaxFrameBytes);
    rte_rcu_qsbr_thread_register(qsbr, i);
    workers.push_back(std::move(w));
  }
  return Status::Ok();
}

// ---- the loop --------------------------------------------------------------------------------

void Switch::Impl::worker_loop(Worker& w) {
  rte_rcu_qsbr_thread_online(qsbr, w.index);
  const std::uint64_t drain_tsc = tsc_hz * cfg.tx_drain_us / 1'000'000;
  const std::uint16_t burst = static_cast<std::uint16_t>(cfg.burst);
  std::uint64_t last_drain = rte_rdtsc();
  // The core's NACK budget: a tenth of nack_rate every 100 ms (at least one).
  const std::uint64_t nack_period = tsc_hz / 10;
  const std::uint64_t nack_budget = std::max<std::uint64_t>(1, cfg.nack_rate / 10);
  std::uint64_t next_nack_refill = 0;
  if (cfg.nack_rate != 0) {
    w.core->refill_nacks(nack_budget);
    next_nack_refill = rte_rdtsc() + nack_period;
  }
  const std::uint64_t yield_tsc = tsc_hz * cfg.idle_yield_us / 1'000'000;
  std::uint32_t idle = 0, sleep_us = 1;
  std::uint64_t idle_since = 0;
  rte_mbuf* local[kMaxBurst * 2];
  while (!g_stop.load(std::memory_order_relaxed)) {
    ++w.polls;
    // One table per iteration: a published replacement is seen from the next one, and the old
    // table lives until every worker has passed rte_rcu_qsbr_quiescent below.
    const NeighborTable* nt = neighbors.load(std::memory_order_acquire);
    bool backlog = false;
    std::uint64_t got = poll_ports(w, nt, &backlog);
    const auto ns = static_cast<std::uint16_t>(
        rte_ring_sc_dequeue_burst(w.steer, reinterpret_cast<void**>(local), burst, nullptr));
    if (ns != 0) {
      got += ns;
      run_core(w, local, ns, nt);
    }
    if (w.index == 0) send_injected(w);
    // Flush as soon as the queues run dry: waiting for a full TX burst would add latency to
    // every chunk of a window-limited allreduce. Under backlog, the timer bounds the delay.
    const std::uint64_t now = rte_rdtsc();
    if (cfg.nack_rate != 0 && now >= next_nack_refill) {
      w.core->refill_nacks(nack_budget);
      next_nack_refill = now + nack_period;
    }
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
    if (cfg.idle_sleep_us == 0) continue;
    if (idle < 64) {
      ++idle;
      continue;
    }
    // Idle: yield the CPU between polls for idle_yield_us, then sleep. On a machine the switch
    // shares, a sleeping lcore adds its sleep (and the timer's slack, 50 us by default) to the
    // next packet's latency, while a yield hands the CPU to whoever is runnable and keeps the
    // lcore awake for a small collective's next round trip.
    if (idle == 64) {
      idle_since = now;
      idle = 65;
    }
    if (now - idle_since < yield_tsc) {
      sched_yield();
      ++w.yields;
    } else {
      idle_sleep(w, &sleep_us);
    }
  }
  flush(w);
  rte_rcu_qsbr_thread_offline(qsbr, w.index);
}

/// One RX burst from the worker's queue of every port, each burst sorted (rx_frame) and its
/// frames for this worker run through the core, after the port's injected faults (drop, hold,
/// release what is due). Returns the frames received or released; `*backlog` is set when a queue
/// gave a full burst.
std::uint64_t Switch::Impl::poll_ports(Worker& w, const NeighborTable* nt, bool* backlog) {
  const std::uint16_t burst = static_cast<std::uint16_t>(cfg.burst);
  rte_mbuf* pkts[kMaxBurst * 2];
  rte_mbuf* local[kMaxBurst * 2];
  std::uint64_t got = 0;
  for (std::size_t pi = 0; pi < ports.size(); ++pi) {
    if (w.rxq[pi] == kNoQueue) continue;
    const FaultState& fs = faults[pi];
    if (fs.restarting.load(std::memory_order_relaxed)) [[unlikely]]
      continue;
    // Held frames that are due go first: they arrived before anything received now.
    std::uint16_t r = 0;
    if (w.held[pi].size != 0) [[unlikely]] {
      r = release_held(w, pi, pkts, kMaxBurst);
      got += r;
      if (fs.down.load(std::memory_order_relaxed)) {  // the link went down while they waited
        for (std::uint16_t i = 0; i < r; ++i) {
          w.count(SwitchdCounter::injected_down);
          rte_pktmbuf_free(pkts[i]);
        }
        r = 0;
      }
    }
    std::uint16_t n = rte_eth_rx_burst(ports[pi].id, w.rxq[pi], pkts + r, burst);
    *backlog |= n == burst;
    got += n;  // received: not idle, even when every frame is dropped or held
    // Frames still held (a fault just lifted) keep newer ones behind them: apply_faults queues.
    if (n != 0 && (w.held[pi].size != 0 || fs.loss_threshold.load(std::memory_order_relaxed) != 0 ||
                   fs.down.load(std::memory_order_relaxed) ||
                   fs.delay_tsc.load(std::memory_order_relaxed) != 0 ||
                   fs.tsc_per_byte_q16.load(std::memory_order_relaxed) != 0)) [[unlikely]] {
      n = apply_faults(w, pi, pkts + r, n);
    }
    n = static_cast<std::uint16_t>(n + r);
    if (n == 0) continue;
    if (faults[pi].capture.load(std::memory_order_relaxed)) [[unlikely]] {
      for (std::uint16_t i = 0; i < n; ++i) capture(w, pkts[i]);
    }
    std::uint16_t nlocal = 0;
    for (std::uint16_t i = 0; i < n; ++i) {
      if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(pkts[i + 1], void*));
      rx_frame(w, pkts[i], local, &nlocal);
    }
    if (nlocal != 0) run_core(w, local, nlocal, nt);
  }
  return got;
}

/// Faults in the order a link would apply them: down, then loss, then the slow or long link.
std::uint16_t Switch::Impl::apply_faults(Worker& w, std::size_t pi, rte_mbuf** pkts,
                                         std::uint16_t n) {
  const FaultState& fs = faults[pi];
  if (fs.down.load(std::memory_order_relaxed)) {
    for (std::uint16_t i = 0; i < n; ++i) {
      w.count(SwitchdCounter::injected_down);
      rte_pktmbuf_free(pkts[i]);
    }
    return 0;
  }
  const std::uint64_t loss = fs.loss_threshold.load(std::memory_order_relaxed);
  const std::uint64_t delay = fs.delay_tsc.load(std::memory_order_relaxed);
  const std::uint64_t per_byte = fs.tsc_per_byte_q16.load(std::memory_order_relaxed);
  HeldQueue& h = w.held[pi];
  const std::uint64_t now = rte_rdtsc();
  std::uint16_t keep = 0;
  for (std::uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = pkts[i];
    if (loss != 0 && lose(w, loss)) {
      w.count(SwitchdCounter::injected_loss);
      rte_pktmbuf_free(m);
      continue;
    }
    // Frames held before the fault was lifted go first: order on the link is kept.
    if (delay == 0 && per_byte == 0 && h.size == 0) {
      pkts[keep++] = m;
      continue;
    }
    if (h.size == kFaultQueueFrames) {
      w.count(SwitchdCounter::fault_queue_full);
      rte_pktmbuf_free(m);
      continue;
    }
    // A slowed link sends one frame after the other: this one starts when the link is free.
    std::uint64_t done = now;
    if (per_byte != 0) {
      done = std::max(now, h.free_at) + ((per_byte * m->pkt_len) >> 16);
      h.free_at = done;
    }
    // The delay may have shrunk since the last frame: never overtake it.
    std::uint64_t due = done + delay;
    if (h.size != 0) due = std::max(due, h.q[(h.head + h.size - 1) % kFaultQueueFrames].due);
    h.q[(h.head + h.size) % kFaultQueueFrames] = {m, due};
    ++h.size;
    w.count(SwitchdCounter::fault_delayed);
  }
  return keep;
}

std::uint16_t Switch::Impl::release_held(Worker& w, std::size_t pi, rte_mbuf** out,
                                         std::uint16_t max) {
  HeldQueue& h = w.held[pi];
  const std::uint64_t now = rte_rdtsc();
  std::uint16_t n = 0;
  while (h.size != 0 && n < max && h.q[h.head].due <= now) {
    out[n++] = h.q[h.head].m;
    h.head = (h.head + 1) % kFaultQueueFrames;
    --h.size;
  }
  return n;
}

/// rx_loss: a xorshift64 draw below the port's threshold loses the frame.
bool Switch::Impl::lose(Worker& w, std::uint64_t threshold) {
  w.rng ^= w.rng << 13;
  w.rng ^= w.rng >> 7;
  w.rng ^= w.rng << 17;
  return w.rng < threshold;
}

/// Worker 0 sends what the neighbour thread built (ARP requests).
void Switch::Impl::send_injected(Worker& w) {
  rte_mbuf* inj[16];
  const unsigned ni =
      rte_ring_sc_dequeue_burst(inject_ring, reinterpret_cast<void**>(inj), 16, nullptr);
  for (unsigned i = 0; i < ni; ++i) send(w, inj[i]);
}

void Switch::Impl::flush(Worker& w) {
  for (std::size_t i = 0; i < ports.size(); ++i) {
    if (faults[i].restarting.load(std::memory_order_relaxed)) [[unlikely]]
      continue;  // what it holds goes out once the port runs again
    rte_eth_tx_buffer_flush(ports[i].id, static_cast<std::uint16_t>(w.index), w.txbuf[i]);
  }
}

/// Idle: sleep, backing off to idle_sleep_us. Offline while asleep, so that an RCU grace period
/// does not wait for a sleeping worker.
void Switch::Impl::idle_sleep(Worker& w, std::uint32_t* sleep_us) {
  rte_rcu_qsbr_thread_offline(qsbr, w.index);
  rte_delay_us_sleep(*sleep_us);
  rte_rcu_qsbr_thread_online(qsbr, w.index);
  ++w.sleeps;
  *sleep_us = std::min(*sleep_us * 2, cfg.idle_sleep_us);
}

/// After the run: whatever is still queued for a worker (ARP requests, frames steered after the
/// owner's last pass) is not sent.
void Switch::Impl::drain_rings() {
  rte_mbuf* m;
  while (rte_ring_sc_dequeue(inject_ring, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
  for (auto& w : workers) {
    while (rte_ring_sc_dequeue(w->steer, reinterpret_cast<void**>(&m)) == 0) rte_pktmbuf_free(m);
    for (HeldQueue& h : w->held) {
      for (; h.size != 0; --h.size, h.head = (h.head + 1) % kFaultQueueFrames)
        rte_pktmbuf_free(h.q[h.head].m);
    }
  }
}

// ---- RX: sorting, the slow path, the core ----------------------------------------------------

/// Sorts one received frame: ARP/ICMP to the slow path, treeduce frames of another worker's slot
/// to that worker's ring, everything else to this worker's core (which counts what it drops).
void Switch::Impl::rx_frame(Worker& w, rte_mbuf* m, rte_mbuf** local, std::uint16_t* nlocal) {
  const auto* d = rte_pktmbuf_mtod(m, const std::uint8_t*);
  if (m->data_len >= sizeof(proto::EtherHdr) + sizeof(proto::Ipv4Hdr)) [[likely]] {
    const std::uint16_t type = load_be16(d + 12);
    const std::uint8_t ip_proto = d[sizeof(proto::EtherHdr) + offsetof(proto::Ipv4Hdr, protocol)];
    if (type == dp::kEtherTypeArp || (type == 0x0800 && ip_proto == 1)) return slow_path(w, m);
    if (workers.size() > 1 && type == 0x0800 && ip_proto == 17 &&
        m->data_len >= proto::kFrameHeaderBytes && load_be16(d + kUdpDstOffset) == cfg.data.port) {
      const std::uint32_t owner = load_be16(d + kSlotOffset) % n_workers;
      if (owner != w.index) {
        if (rte_ring_mp_enqueue(workers[owner]->steer, m) != 0) {
          w.count(SwitchdCounter::steer_ring_full);
          rte_pktmbuf_free(m);
        } else {
          w.count(SwitchdCounter::steered);
        }
        return;
      }
    }
  }
  local[(*nlocal)++] = m;
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
    if (arp.request) w.count(SwitchdCounter::arp_requests_in);
    CtlMsg msg;
    msg.type = CtlMsg::learn;
    msg.port = m->port;
    msg.ip = arp.ip;
    std::memcpy(msg.mac, arp.mac, 6);
    post(w, msg);
  }
  // The reply is written on the stack first: most ARP on a shared segment is for others, and
  // needs no mbuf.
  std::uint8_t out[proto::kMaxFrameBytes];
  std::size_t out_len = 0;
  proto::Endpoint data_self = p.self;
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
        w.count(SwitchdCounter::tx_no_mbuf);
        break;
      }
      w.count(v == dp::NeighborVerdict::arp_reply ? SwitchdCounter::arp_replies_out
                                                  : SwitchdCounter::echo_replies_out);
      std::memcpy(rte_pktmbuf_append(r, static_cast<std::uint16_t>(out_len)), out, out_len);
      r->port = m->port;
      send(w, r);
      break;
    }
    case dp::NeighborVerdict::malformed:
      w.count(SwitchdCounter::neighbor_malformed);
      break;
    default:
      w.count(SwitchdCounter::neighbor_ignored);
      break;
  }
  rte_pktmbuf_free(m);
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
  if (!w.core->probes().empty()) [[unlikely]]
    post_probes(w);
  rte_pktmbuf_free_bulk(pkts, n);
}

/// The core's bad_key/bad_source refusals of this burst to the neighbour thread, which logs them
/// rate-limited (probe_log.h): a ring enqueue per burst that had any, never a syscall here.
void Switch::Impl::post_probes(Worker& w) {
  const auto p = w.core->probes();
  const unsigned n = rte_ring_mp_enqueue_burst_elem(probe_ring, p.data(), sizeof(dp::Probe),
                                                    static_cast<unsigned>(p.size()), nullptr);
  w.counters[static_cast<std::size_t>(SwitchdCounter::probe_ring_full)] += p.size() - n;
  w.core->clear_probes();
}

// ---- TX --------------------------------------------------------------------------------------

void Switch::Impl::post(Worker& w, const CtlMsg& msg) {
  CtlMsg copy = msg;  // the ring API takes a non-const pointer
  if (rte_ring_mp_enqueue_elem(ctl_ring, &copy, sizeof copy) != 0) {
    w.count(SwitchdCounter::ctl_ring_full);
  }
}

/// An output frame's way out. A tree's resolved next hop (`hop`, dp::TxFrame::hop): its port,
/// the core wrote the MACs from the hop's template. Otherwise (a NACK, a hop not resolved yet)
/// the Ethernet addresses come from the neighbour table, or the frame is dropped (and the
/// neighbour thread asked to resolve the address, at most once per 10 ms per worker).
/// Returns the mbuf to send with its `port` set, or nullptr.
rte_mbuf* Switch::Impl::route(Worker& w, rte_mbuf* m, std::uint16_t hop, const NeighborTable* nt) {
  if (hop != dp::kNoHop) [[likely]] {
    m->port = hop;
    return m;
  }
  auto* eth = rte_pktmbuf_mtod(m, std::uint8_t*);
  const std::uint32_t dst = load_be32(eth + kIpDstOffset);
  const NeighborEntry* e = nt->find(dst);
  if (e == nullptr) [[unlikely]] {
    w.count(SwitchdCounter::tx_unresolved);
    // A NACK goes only to a known neighbour: resolving whatever address a refused frame claims
    // would let anyone make the switch ARP for made-up addresses.
    const bool nack = eth[kOpcodeOffset] == static_cast<std::uint8_t>(proto::Opcode::nack);
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

/// Into the TX buffer of the mbuf's port (nullptr: nothing to send).
void Switch::Impl::send(Worker& w, rte_mbuf* m) {
  if (m == nullptr) return;
  const std::uint16_t idx = port_index[m->port];
  if (faults[idx].down.load(std::memory_order_relaxed)) [[unlikely]] {
    w.count(SwitchdCounter::injected_down);
    rte_pktmbuf_free(m);
    return;
  }
  if (faults[idx].restarting.load(std::memory_order_relaxed)) [[unlikely]] {
    w.count(SwitchdCounter::tx_port_restarting);
    rte_pktmbuf_free(m);
    return;
  }
  if (faults[idx].capture.load(std::memory_order_relaxed)) [[unlikely]]
    capture(w, m);
  rte_eth_tx_buffer(m->port, static_cast<std::uint16_t>(w.index), w.txbuf[idx], m);
}

/// One whole-frame mbuf: unicast, NACKs, and multicast to ports that cannot chain.
void Switch::Impl::copy_frame(Worker& w, const dp::TxFrame& t, const NeighborTable* nt) {
  rte_mbuf* m = rte_pktmbuf_alloc(pool);
  if (m == nullptr) return w.count(SwitchdCounter::tx_no_mbuf);
  auto* d =
      reinterpret_cast<std::uint8_t*>(rte_pktmbuf_append(m, static_cast<std::uint16_t>(t.len())));
  std::memcpy(d, t.hdr, proto::kFrameHeaderBytes);
  if (t.payload_len != 0) std::memcpy(d + proto::kFrameHeaderBytes, t.payload, t.payload_len);
  send(w, route(w, m, t.hop, nt));
}

/// The core's output: runs of frames that share one payload are a multicast, the rest unicast.
/// A run is at most kMaxChildren frames, what emit_multicast holds: a RESULT to 64 children and
/// the re-sent copies of it that duplicates in the same burst asked for share one payload too.
void Switch::Impl::emit(Worker& w, const dp::TxFrame* f, std::size_t n, const NeighborTable* nt) {
  std::size_t i = 0;
  while (i < n) {
    std::size_t j = i + 1;
    if (f[i].payload_len != 0) {
      while (j < n && j - i < proto::kMaxChildren && f[j].payload == f[i].payload) ++j;
    }
    if (j - i == 1) {
      copy_frame(w, f[i], nt);
    } else {
      emit_multicast(w, f + i, j - i, nt);
    }
    i = j;
  }
}

/// A multicast of `n` frames with one payload: the payload is copied once out of the slot (the
/// core reuses slot memory after this call), each child gets its own 74-byte header chained to
/// an indirect mbuf attached to it; the last child's header is chained to the payload mbuf
/// itself. The header and indirect mbufs come in two bulk allocations (one mempool cache access
/// each, not 2n): all or none. The payload's reference count is written with plain stores while
/// the payload is still this lcore's alone: every frame is built first, its count set once to
/// the frames that hold it, and only then are they sent (a send may flush a TX buffer, and a
/// PMD free what it sent). rte_pktmbuf_attach's increment is a plain store when the count is 1
/// (a locked add otherwise, which waits for the payload's copy to drain).
void Switch::Impl::emit_multicast(Worker& w, const dp::TxFrame* f, std::size_t n,
                                  const NeighborTable* nt) {
  rte_mbuf* hs[proto::kMaxChildren];
  rte_mbuf* cs[proto::kMaxChildren];
  rte_mbuf* pay = rte_pktmbuf_alloc(pool);
  if (pay == nullptr || rte_pktmbuf_alloc_bulk(hdr_pool, hs, static_cast<unsigned>(n)) != 0) {
    rte_pktmbuf_free(pay);
    for (std::size_t i = 0; i < n; ++i) w.count(SwitchdCounter::tx_no_mbuf);
    return;
  }
  const unsigned nc = static_cast<unsigned>(n - 1);
  if (nc != 0 && rte_pktmbuf_alloc_bulk(ind_pool, cs, nc) != 0) {
    rte_pktmbuf_free(pay);
    rte_pktmbuf_free_bulk(hs, static_cast<unsigned>(n));
    for (std::size_t i = 0; i < n; ++i) w.count(SwitchdCounter::tx_no_mbuf);
    return;
  }
  std::memcpy(rte_pktmbuf_append(pay, static_cast<std::uint16_t>(f[0].payload_len)), f[0].payload,
              f[0].payload_len);
  rte_mbuf* out[proto::kMaxChildren];  // built frames: each holds one reference to `pay`
  std::uint16_t nout = 0;
  for (std::size_t k = 0; k < n; ++k) {
    rte_mbuf* h = hs[k];
    // The last child takes `pay` itself, the others an indirect mbuf attached to it.
    const bool last = k == n - 1;
    rte_mbuf* c = last ? pay : cs[k];
    std::memcpy(rte_pktmbuf_append(h, proto::kFrameHeaderBytes), f[k].hdr,
                proto::kFrameHeaderBytes);
    if (route(w, h, f[k].hop, nt) == nullptr) {
      if (!last) rte_pktmbuf_free(c);  // not attached: a plain mbuf back to its pool
      continue;
    }
    if (!ports[port_index[h->port]].chain) {
      // This child's port takes only single-segment frames.
      rte_pktmbuf_free(h);
      copy_frame(w, f[k], nt);
      if (!last) rte_pktmbuf_free(c);
      continue;
    }
    if (!last) {
      rte_mbuf_refcnt_set(pay, 1);  // so that the attach raises it with a plain store
      rte_pktmbuf_attach(c, pay);
    }
    // Two segments never exceed the chain limit; a failure would leave c unchained and ours.
    if (rte_pktmbuf_chain(h, c) != 0) {
      rte_pktmbuf_free(h);
      if (!last) rte_pktmbuf_free(c);  // the attach left the count at 2, this takes it to 1
      w.count(SwitchdCounter::tx_no_mbuf);
      continue;
    }
    out[nout++] = h;
  }
  if (nout == 0) {
    rte_mbuf_refcnt_set(pay, 1);
    rte_pktmbuf_free(pay);
  } else {
    rte_mbuf_refcnt_set(pay, nout);
  }
  for (std::uint16_t i = 0; i < nout; ++i) send(w, out[i]);
}

}  // namespace treeduce::switchd
