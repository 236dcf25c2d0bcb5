// treeduce-switch's link watch: the neighbour thread looks at every port's link every 100 ms,
// logs each change and exports it (treeduce_port_link_up), and restarts a memif client whose
// link stays down, with the lcores kept off the port around the stop and start (docs/switch.md,
// "Links").
#include <rte_cycles.h>
#include <rte_errno.h>

#include <algorithm>

#include "datapath_impl.h"

namespace treeduce::switchd {

namespace {

constexpr std::uint32_t kCheckEveryMs = 100;
/// A memif client's link down this long is restarted; then after twice as long, up to the cap.
constexpr std::uint32_t kFirstRestartMs = 500;
constexpr std::uint32_t kMaxRestartMs = 5000;

}  // namespace

/// Under `mu`, from the neighbour thread.
void Switch::Impl::watch_links() {
  const std::uint64_t now = rte_rdtsc();
  if (last_link_check != 0 && now - last_link_check < tsc_hz * kCheckEveryMs / 1000) return;
  last_link_check = now;
  for (std::size_t i = 0; i < ports.size(); ++i) {
    LinkState& ls = links[i];
    bool up = false;
    if (!ls.stopped) {
      rte_eth_link link{};
      up = rte_eth_link_get_nowait(ports[i].id, &link) == 0 && link.link_status == RTE_ETH_LINK_UP;
    }
    if (!ls.known || up != ls.up) {
      log("port %s link %s", ports[i].cfg.name.c_str(), up ? "up" : "down");
      if (ls.known) ++ls.changes;
      ls.known = true;
      ls.up = up;
      ls.down_since = now;
      ls.backoff_ms = kFirstRestartMs;
      ls.next_try = now + tsc_hz * kFirstRestartMs / 1000;
    }
    if (!up && ls.memif_client && now >= ls.next_try) restart_port(i, now);
  }
}

/// Stops and starts port `pi` with every lcore off it: the workers skip a port that is
/// `restarting`, and the RCU grace period after setting it means none is still inside a burst
/// on it. A start that fails leaves the port stopped (and skipped) until the next attempt.
void Switch::Impl::restart_port(std::size_t pi, std::uint64_t now) {
  LinkState& ls = links[pi];
  const Port& p = ports[pi];
  ++ls.restarts;
  log("port %s: memif client link down for %llu ms; restarting the port (attempt %llu, next in "
      "%u ms)",
      p.cfg.name.c_str(), static_cast<unsigned long long>((now - ls.down_since) * 1000 / tsc_hz),
      static_cast<unsigned long long>(ls.restarts), std::min(ls.backoff_ms * 2, kMaxRestartMs));
  faults[pi].restarting.store(true);
  synchronize();
  if (!ls.stopped) {
    if (const int rc = rte_eth_dev_stop(p.id); rc != 0)
      log("port %s: stop failed: %s", p.cfg.name.c_str(), rte_strerror(-rc));
    ls.stopped = true;
  }
  if (const int rc = rte_eth_dev_start(p.id); rc == 0) {
    ls.stopped = false;
    faults[pi].restarting.store(false);
  } else {
    log("port %s: cannot start it again: %s", p.cfg.name.c_str(), rte_strerror(-rc));
  }
  ls.backoff_ms = std::min(ls.backoff_ms * 2, kMaxRestartMs);
  ls.next_try = now + tsc_hz * ls.backoff_ms / 1000;
}

}  // namespace treeduce::switchd
