// treeduce-switch's neighbours: the neighbour thread learns ARP senders the workers report,
// resolves next hops (ARP requests handed to worker 0 to send) and publishes the immutable
// NeighborTable the workers read, freeing the old one after an RCU grace period (docs/switch.md,
// "Addresses").
#include <rte_cycles.h>
#include <rte_mbuf.h>
#include <rte_ring_elem.h>

#include <chrono>
#include <thread>

#include "datapath_impl.h"
#include "treeduce/dataplane/neighbor.h"

namespace treeduce::switchd {

namespace {

bool on_subnet(std::uint32_t ip, std::uint32_t port_ip, std::uint8_t prefix) {
  const std::uint32_t mask = prefix == 0 ? 0 : ~std::uint32_t{0} << (32 - prefix);
  return (ip & mask) == (port_ip & mask);
}

}  // namespace

// ---- set-up ----------------------------------------------------------------------------------

Status Switch::Impl::create_neighbor_rings() {
  const int socket = static_cast<int>(rte_socket_id());
  ctl_ring = rte_ring_create_elem("td_ctl", sizeof(CtlMsg), 4096, socket, RING_F_SC_DEQ);
  inject_ring = rte_ring_create("td_inject", 1024, socket, RING_F_SP_ENQ | RING_F_SC_DEQ);
  static_assert(sizeof(dp::Probe) % 4 == 0);
  probe_ring = rte_ring_create_elem("td_probe", sizeof(dp::Probe), 4096, socket, RING_F_SC_DEQ);
  if (ctl_ring == nullptr || inject_ring == nullptr || probe_ring == nullptr)
    return resource_exhausted("cannot create rings.");
  return Status::Ok();
}

/// The configuration's neighbours, on the ports they name; ARP never overwrites them.
void Switch::Impl::add_static_neighbors() {
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
}

// ---- publishing ------------------------------------------------------------------------------

/// The new table and the trees' next hops, then one grace period before the old ones are freed.
void Switch::Impl::publish_neighbors() {
  const NeighborTable* old = neighbors.exchange(book.build().release(), std::memory_order_acq_rel);
  std::vector<dp::TreeHops*> old_hops;
  resolve_all_hops(&old_hops);
  if (old != nullptr || !old_hops.empty()) synchronize();
  delete old;
  for (dp::TreeHops* h : old_hops) dp::Core::destroy_hops(h);
}

/// A tree's next hops as the book knows them now: the neighbour's MAC and port, the port's MAC
/// as the source. An address not known (yet) stays unresolved: its frames take the lookup in
/// route(), which asks for it.
void Switch::Impl::resolve_hops(std::uint16_t tree_id, std::vector<dp::TreeHops*>* old) {
  const proto::TreeConfig* t = workers[0]->core->tree_config(tree_id);
  if (t == nullptr) return;
  const auto hop_to = [&](std::uint32_t ip) {
    dp::NextHop h;
    if (const NeighborEntry* e = book.find(ip)) {
      std::memcpy(h.dst_mac, e->mac, 6);
      std::memcpy(h.src_mac, ports[port_index[e->port]].self.mac, 6);
      h.tag = e->port;
    }
    return h;
  };
  std::vector<dp::NextHop> children;
  children.reserve(t->children.size());
  for (const proto::ChildConfig& c : t->children) children.push_back(hop_to(c.addr.ip));
  const dp::NextHop parent = t->role == proto::Role::root ? dp::NextHop{} : hop_to(t->parent.ip);
  for (auto& w : workers) {
    dp::TreeHops* replaced = nullptr;
    // Only out of memory can fail here (the tree is installed, one hop per child): its frames
    // then keep the templates they have, and route() still finds the way.
    if (Status st = w->core->set_next_hops(tree_id, children, parent, &replaced); !st.ok()) {
      log("%s", st.message().c_str());
    }
    if (replaced != nullptr) old->push_back(replaced);
  }
}

void Switch::Impl::resolve_all_hops(std::vector<dp::TreeHops*>* old) {
  for (const auto& [id, job] : jobs) resolve_hops(id, old);
}

// ---- the neighbour thread --------------------------------------------------------------------

void Switch::Impl::neighbor_loop() {
  CtlMsg msgs[64];
  while (!g_stop.load(std::memory_order_relaxed)) {
    const unsigned n = rte_ring_sc_dequeue_burst_elem(ctl_ring, msgs, sizeof(CtlMsg), 64, nullptr);
    {
      std::lock_guard l(mu);
      bool changed = false;
      for (unsigned i = 0; i < n; ++i) changed |= take(msgs[i]);
      if (changed) publish_neighbors();
      ask_again();
      watch_links();
    }
    log_probes();
    if (n == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  log_probes(true);
}

/// The refusals the workers queued, into the rate-limited log; its lines written every 100 ms.
void Switch::Impl::log_probes(bool last) {
  dp::Probe p[256];
  unsigned n;
  while ((n = rte_ring_sc_dequeue_burst_elem(probe_ring, p, sizeof(dp::Probe), 256, nullptr)) !=
         0) {
    for (unsigned i = 0; i < n; ++i) probe_log.note(p[i]);
  }
  const auto now =
      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  if (probe_log.sources() == 0 || (!last && now - last_probe_flush < 100'000'000)) return;
  last_probe_flush = now;
  for (const std::string& l : probe_log.flush(now, last)) log("%s", l.c_str());
}

/// One message from a worker: an ARP sender to learn, or an address to resolve. True when the
/// neighbour book changed. Under `mu`.
bool Switch::Impl::take(const CtlMsg& msg) {
  if (msg.type != CtlMsg::learn) {
    want(msg.ip);
    return false;
  }
  NeighborEntry e;
  e.ip = msg.ip;
  e.port = msg.port;
  std::memcpy(e.mac, msg.mac, 6);
  if (!may_learn(e)) return false;
  const bool changed = book.learn(e);
  if (changed) {
    log("neighbour %s is %s on port %s", format_ipv4(e.ip).c_str(), format_mac(e.mac).c_str(),
        ports[port_index[e.port]].cfg.name.c_str());
  }
  wanted.erase(e.ip);
  return changed;
}

/// Unresolved next hops: ask again every 100 ms, 30 times. Under `mu`.
void Switch::Impl::ask_again() {
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

/// Broadcast an ARP request for `ip`: on the port whose subnet holds it, else on every port (a
/// switch's data address is usually outside the link subnets; its peers answer for it on every
/// port).
void Switch::Impl::send_arp(std::uint32_t ip) {
  std::vector<const Port*> out;
  for (const Port& p : ports) {
    if (on_subnet(ip, p.self.ip, p.cfg.prefix)) out.push_back(&p);
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

/// A tree's parent (unless it is the root) and children, resolved now rather than on its first
/// packets. Under `mu`.
void Switch::Impl::want_next_hops(const proto::TreeConfig& t) {
  if (t.role != proto::Role::root) want(t.parent.ip);
  for (const proto::ChildConfig& c : t.children) want(c.addr.ip);
}

/// What the switch may learn from an ARP packet: an address it asked for or already knows (not
/// a static one), or a sender on the receiving port's subnet. Anything else is a stranger
/// claiming an address, which would redirect a tree's RESULTs.
bool Switch::Impl::may_learn(const NeighborEntry& e) const {
  if (static_ips.count(e.ip) != 0) return false;
  if (wanted.count(e.ip) != 0 || book.contains(e.ip)) return true;
  const PortConfig& pc = ports[port_index[e.port]].cfg;
  return on_subnet(e.ip, pc.ip, pc.prefix) && book.size() < kMaxNeighbors;
}

}  // namespace treeduce::switchd
