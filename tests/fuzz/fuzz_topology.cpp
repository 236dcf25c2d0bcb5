// libFuzzer target over the manager's topology loader (docs/manager.md, "Topology YAML format"):
// any text is either a topology whose structure holds (every host on a leaf that lists it, every
// link between adjacent levels, each switch's profile known) or one error sentence; never a
// crash, a hang or an exception out of load_topology_yaml. The corpus seeds are the documented
// and installed examples (tests/fuzz/corpus-topology/).
#include <cstddef>
#include <cstdint>
#include <string>

#include "treeduce/control/topology.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto t = treeduce::ctl::load_topology_yaml(text);
  if (!t.ok()) {
    check(!t.status().message().empty());
    return 0;
  }
  check(t->levels() >= 1);
  for (std::uint32_t h = 0; h < t->hosts.size(); ++h) {
    const auto& host = t->hosts[h];
    check(host.leaf < t->switches.size());
    const auto& leaf = t->switches[host.leaf];
    check(leaf.level == 0);
    bool listed = false;
    for (std::uint32_t x : leaf.hosts) listed = listed || x == h;
    check(listed);
    check(t->find_host(host.name) == h);
  }
  for (std::uint32_t s = 0; s < t->switches.size(); ++s) {
    const auto& sw = t->switches[s];
    check(sw.level < t->levels());
    check(sw.profile < t->profiles.size());
    check(t->find_switch(sw.name) == s);
    for (std::uint32_t u : sw.up)
      check(u < t->switches.size() && t->switches[u].level == sw.level + 1);
    for (std::uint32_t d : sw.down)
      check(d < t->switches.size() && t->switches[d].level + 1 == sw.level);
  }
  return 0;
}
