// DPDK telemetry for treeduce-switch: the same snapshot as the Prometheus endpoint, read with
// dpdk-telemetry.py (/treeduce/stats, /treeduce/ports, /treeduce/trees, /treeduce/tree,<id>).
#include <rte_telemetry.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <string>

#include "datapath.h"

namespace treeduce::switchd {

namespace {

// The telemetry thread outlives the switch (until rte_eal_cleanup()): callbacks hold the lock
// shared while they read, and register_telemetry(nullptr) takes it exclusively, so the switch is
// never freed under a running callback.
std::shared_mutex g_mu;
const Switch* g_switch = nullptr;

bool snap(Snapshot* out) {
  std::shared_lock l(g_mu);
  if (g_switch == nullptr) return false;
  *out = g_switch->snapshot();
  return true;
}

void add_counters(rte_tel_data* d, const dp::Counters& c) {
  for (std::size_t i = 1; i < dp::kNumDropReasons; ++i) {
    const std::string k = "drop_" + std::string(dp::name(static_cast<dp::DropReason>(i)));
    rte_tel_data_add_dict_u64(d, k.c_str(), c.drops[i]);
  }
  for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
    rte_tel_data_add_dict_u64(d, std::string(dp::name(static_cast<dp::Event>(i))).c_str(),
                              c.events[i]);
  }
}

int stats(const char*, const char*, rte_tel_data* d) {
  Snapshot s;
  if (!snap(&s)) return -ENODEV;
  rte_tel_data_start_dict(d);
  rte_tel_data_add_dict_string(d, "switch", s.switch_name.c_str());
  rte_tel_data_add_dict_u64(d, "uptime_s", static_cast<std::uint64_t>(s.uptime_s));
  rte_tel_data_add_dict_u64(d, "trees", s.trees.size());
  add_counters(d, s.core);
  for (std::size_t i = 0; i < kNumSwitchdCounters; ++i) {
    rte_tel_data_add_dict_u64(d, std::string(name(static_cast<SwitchdCounter>(i))).c_str(),
                              s.switchd[i]);
  }
  return 0;
}

int ports(const char*, const char*, rte_tel_data* d) {
  Snapshot s;
  if (!snap(&s)) return -ENODEV;
  rte_tel_data_start_dict(d);
  for (const PortStats& p : s.ports) {
    rte_tel_data* c = rte_tel_data_alloc();
    if (c == nullptr) return -ENOMEM;
    rte_tel_data_start_dict(c);
    rte_tel_data_add_dict_u64(c, "port_id", p.port_id);
    rte_tel_data_add_dict_u64(c, "rx_packets", p.rx_packets);
    rte_tel_data_add_dict_u64(c, "rx_bytes", p.rx_bytes);
    rte_tel_data_add_dict_u64(c, "tx_packets", p.tx_packets);
    rte_tel_data_add_dict_u64(c, "tx_bytes", p.tx_bytes);
    rte_tel_data_add_dict_u64(c, "rx_missed", p.rx_missed);
    rte_tel_data_add_dict_u64(c, "rx_errors", p.rx_errors);
    rte_tel_data_add_dict_u64(c, "tx_errors", p.tx_errors);
    rte_tel_data_add_dict_container(d, p.name.c_str(), c, 0);
  }
  return 0;
}

int trees(const char*, const char*, rte_tel_data* d) {
  Snapshot s;
  if (!snap(&s)) return -ENODEV;
  rte_tel_data_start_array(d, RTE_TEL_INT_VAL);
  for (const TreeStats& t : s.trees) rte_tel_data_add_array_int(d, t.tree_id);
  return 0;
}

int tree(const char*, const char* params, rte_tel_data* d) {
  if (params == nullptr || *params == '\0') return -EINVAL;
  char* end = nullptr;
  const unsigned long id = std::strtoul(params, &end, 10);
  if (*end != '\0' || id > 0xFFFF) return -EINVAL;
  Snapshot s;
  if (!snap(&s)) return -ENODEV;
  for (const TreeStats& t : s.trees) {
    if (t.tree_id != id) continue;
    rte_tel_data_start_dict(d);
    rte_tel_data_add_dict_string(d, "job", t.job.c_str());
    add_counters(d, t.counters);
    return 0;
  }
  return -ENOENT;
}

}  // namespace

void register_telemetry(const Switch* sw) {
  {
    std::unique_lock l(g_mu);
    g_switch = sw;
  }
  static bool registered = false;
  if (sw == nullptr || registered) return;
  registered = true;
  rte_telemetry_register_cmd("/treeduce/stats", stats,
                             "Switch-wide drops, events and daemon counters. No parameters");
  rte_telemetry_register_cmd("/treeduce/ports", ports, "Per-port packets and bytes. No parameters");
  rte_telemetry_register_cmd("/treeduce/trees", trees, "Installed tree ids. No parameters");
  rte_telemetry_register_cmd("/treeduce/tree", tree, "One tree's counters. Parameter: tree id");
}

}  // namespace treeduce::switchd
