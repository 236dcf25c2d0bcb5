// treeduce-switch's datapath, the façade: set-up in order, the run, counters, shutdown. The parts
// are in ports.cpp, worker.cpp, neighbors.cpp and trees.cpp (datapath_impl.h says which does
// what). Design and measured costs: docs/switch.md.
#include "datapath.h"

#include <rte_cycles.h>
#include <rte_lcore.h>
#include <rte_malloc.h>

#include <thread>

#include "datapath_impl.h"

namespace treeduce::switchd {

std::atomic<bool> g_stop{false};

namespace {

/// The datapath lcores: the configured ones, or every EAL lcore.
Result<std::vector<unsigned>> datapath_lcores(const SwitchConfig& cfg) {
  std::vector<unsigned> lcores = cfg.lcores;
  if (lcores.empty()) {
    unsigned l;
    RTE_LCORE_FOREACH(l) lcores.push_back(l);
  }
  for (unsigned l : lcores) {
    if (l >= RTE_MAX_LCORE || !rte_lcore_is_enabled(l))
      return invalid_argument("lcore " + std::to_string(l) +
                              " is not one of the EAL's lcores (give it with -l).");
  }
  return lcores;
}

int launch_worker(void* arg) {
  auto* p = static_cast<std::pair<Switch::Impl*, Worker*>*>(arg);
  p->first->worker_loop(*p->second);
  return 0;
}

/// Ends the run (g_stop) after run_ms, or exit_idle_ms after the last received frame.
void watch_run_limits(const Switch::Impl& s) {
  const auto start = std::chrono::steady_clock::now();
  auto last_change = start;
  std::uint64_t last_rx = 0;
  while (!g_stop.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto now = std::chrono::steady_clock::now();
    if (s.cfg.run_ms != 0 && now - start >= std::chrono::milliseconds(s.cfg.run_ms)) g_stop = true;
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
}

}  // namespace

// ---- set-up ----------------------------------------------------------------------------------

Result<std::unique_ptr<Switch>> Switch::create(const SwitchConfig& cfg) {
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.cfg = cfg;
  s.tsc_hz = rte_get_tsc_hz();
  Result<std::vector<unsigned>> lcores = datapath_lcores(cfg);
  if (!lcores.ok()) return lcores.status();
  if (cfg.ports.size() > kMaxPorts)
    return invalid_argument("at most " + std::to_string(kMaxPorts) + " ports are supported.");
  s.n_workers = static_cast<std::uint32_t>(lcores->size());
  if (Status st = s.create_pools(); !st.ok()) return st;
  if (Status st = s.create_rcu(); !st.ok()) return st;
  if (Status st = s.create_neighbor_rings(); !st.ok()) return st;
  if (Status st = s.create_workers(*lcores); !st.ok()) return st;
  if (Status st = s.setup_ports(); !st.ok()) return st;
  if (Status st = s.create_capture(); !st.ok()) return st;
  s.add_static_neighbors();
  s.publish_neighbors();
  auto sw = std::unique_ptr<Switch>(new Switch(std::move(impl)));
  for (const StaticTree& t : cfg.trees) {
    if (Status st = sw->install(t.tree, t.job); !st.ok())
      return Status(st.code(),
                    "static tree " + std::to_string(t.tree.tree_id) + ": " + st.message());
    std::lock_guard l(sw->impl_->mu);
    sw->impl_->static_trees.insert(t.tree.tree_id);
  }
  return sw;
}

Status Switch::Impl::create_rcu() {
  const std::size_t qs_size = rte_rcu_qsbr_get_memsize(n_workers);
  qsbr = static_cast<rte_rcu_qsbr*>(rte_zmalloc("td_qsbr", qs_size, RTE_CACHE_LINE_SIZE));
  if (qsbr == nullptr || rte_rcu_qsbr_init(qsbr, n_workers) != 0)
    return resource_exhausted("cannot set up RCU.");
  return Status::Ok();
}

Switch::Impl::~Impl() {
  stop_ports();
  if (cap_ring != nullptr) {
    std::lock_guard l(cap_mu);
    write_captures();  // what the lcores saw last, then the files close with `captures`
  }
  rte_ring_free(cap_ring);
  for (auto& c : captures) c.reset();
  rte_mempool_free(cap_pool);
  delete neighbors.load();
  for (auto& w : workers) {
    for (auto* b : w->txbuf) rte_free(b);
    rte_ring_free(w->steer);
  }
  rte_ring_free(ctl_ring);
  rte_ring_free(probe_ring);
  rte_ring_free(inject_ring);
  rte_free(qsbr);
  for (const Port& p : ports) rte_mempool_free(p.own_pool);
  rte_mempool_free(pool);
  rte_mempool_free(hdr_pool);
  rte_mempool_free(ind_pool);
}

Switch::Switch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Switch::~Switch() = default;

// ---- counters --------------------------------------------------------------------------------

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
                           __atomic_load_n(&w->sleeps, __ATOMIC_RELAXED),
                           __atomic_load_n(&w->yields, __ATOMIC_RELAXED)});
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
  snap.ports = s.port_stats();
  return snap;
}

// ---- run -------------------------------------------------------------------------------------

void Switch::run() {
  Impl& s = *impl_;
  std::thread neighbor([&s] { s.neighbor_loop(); });
  // run_ms and exit_idle_ms end the run from here; g_stop is also set by signals.
  std::thread timer([&s] { watch_run_limits(s); });
  std::thread capture([&s] { s.capture_loop(); });
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
  capture.join();
  s.drain_rings();
}

}  // namespace treeduce::switchd
