// libFuzzer target over the manager's request handling below the gRPC edge (JobRegistry: what
// JobService and SwitchRegistry call): any sequence of joins, heartbeats, leaves, aborts, switch
// registrations, heartbeats, failures and drains, topology changes (a few fixed fabrics and
// hostile text), clock steps with lease sweeps, and switch agents that fail installs, with hostile
// names and sizes. Never a crash, a hang or an exception; every
// refusal is a sentence; and once every rank has left and every lease and hold has run out, no
// job, tree, slot or byte is left on any switch, and once each switch has registered again with
// what it holds (reconciliation), no switch holds a tree (docs/manager.md). Input: byte 0 picks the
// options, then records read by FuzzedDataProvider (tests/fuzz/corpus-registry/ has seeds).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "treeduce/control/registry.h"
#include "treeduce/control/topology.h"

namespace {

using namespace treeduce;
using namespace treeduce::ctl;

/// A failed check names its line before the trap, so that a crash file says what broke.
void check_at(bool ok, int line) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_registry.cpp:%d: check failed\n", line);
    __builtin_trap();
  }
}
#define check(ok) check_at((ok), __LINE__)

/// Switch agents in memory: installs succeed unless `failing`; what each switch holds.
class FakeSwitches final : public SwitchClient {
 public:
  Status install(const std::string&, const TreeInstall& t) override {
    if (failing) return unavailable("the fuzzer's switch " + t.switch_name + " is unreachable.");
    held[t.switch_name].insert(t.tree_id);
    return Status::Ok();
  }
  Status remove(const std::string&, const std::string& sw, std::uint16_t tree) override {
    if (failing) return unavailable("the fuzzer's switch " + sw + " is unreachable.");
    held[sw].erase(tree);
    return Status::Ok();
  }
  bool failing = false;
  std::map<std::string, std::set<std::uint16_t>> held;
};

const Topology& topology() {
  static const Topology t = *make_fat_tree2(4, "server");  // 4 leaves of 2 hosts, 2 spines
  return t;
}

/// `t` in the YAML of docs/manager.md, switches in reverse order when `reverse` (every index
/// shifts), without switch `drop` (and its hosts) and the link `cut` ("lower-upper"), with
/// switch `profile_of` on profile `profile`, plus an extra leaf "leafX" under the first spine.
std::string to_yaml(const Topology& t, bool reverse, const std::string& drop,
                    const std::string& cut, bool extra, const std::string& profile_of = "",
                    const std::string& profile = "") {
  std::string sw = "switches:\n", hosts = "hosts:\n", links = "links:\n";
  for (std::size_t k = 0; k < t.switches.size(); ++k) {
    const Switch& s = t.switches[reverse ? t.switches.size() - 1 - k : k];
    if (s.name == drop) continue;
    sw += "  - {name: " + s.name + ", level: " + std::to_string(s.level) + ", data: \"" +
          to_string(s.data) +
          "\", profile: " + (s.name == profile_of ? profile : t.profiles[s.profile].name) + "}\n";
    for (std::uint32_t u : s.up)
      if (t.switches[u].name != drop && s.name + "-" + t.switches[u].name != cut)
        links += "  - {a: " + s.name + ", b: " + t.switches[u].name + "}\n";
  }
  for (const Host& h : t.hosts)
    if (t.switches[h.leaf].name != drop)
      hosts += "  - {name: " + h.name + ", address: " + to_string(Address{h.data.ip, 0}) +
               ", switch: " + t.switches[h.leaf].name + "}\n";
  if (extra) {
    sw += "  - {name: leafX, level: 0, data: \"10.9.9.9:4791\", profile: server}\n";
    hosts += "  - {name: hX, address: 10.9.9.10, switch: leafX}\n";
    links += "  - {a: leafX, b: " + t.switches[t.at_level(1).front()].name + "}\n";
  }
  return sw + hosts + links;
}

/// The fabrics set_topology() chooses from: [0] is topology() itself.
const std::vector<std::string>& fabrics() {
  static const std::vector<std::string> f = [] {
    const Topology& t = topology();
    const std::string leaf = t.switches[t.at_level(0).back()].name;
    const std::string spine = t.switches[t.at_level(1).back()].name;
    const std::string link =
        t.switches[t.at_level(0).front()].name + "-" + t.switches[t.at_level(1).front()].name;
    return std::vector<std::string>{to_yaml(t, false, "", "", false),
                                    to_yaml(t, true, "", "", false),
                                    to_yaml(t, false, "", "", true),
                                    to_yaml(t, true, spine, "", true),
                                    to_yaml(t, false, leaf, "", false),
                                    to_yaml(t, false, "", link, false),
                                    to_yaml(t, true, "", "", false, spine, "tofino")};
  }();
  return f;
}

/// fabrics() loaded once: applying an unchanged fabric need not parse its YAML again (the
/// loader has a fuzz target of its own; the text of every changed or hostile one is parsed).
const std::vector<Topology>& loaded_fabrics() {
  static const std::vector<Topology> f = [] {
    std::vector<Topology> out;
    for (const std::string& text : fabrics()) out.push_back(*load_topology_yaml(text));
    return out;
  }();
  return f;
}

std::string pick_name(FuzzedDataProvider& in, const char* const* known, std::size_t n) {
  if (in.ConsumeBool()) return known[in.ConsumeIntegralInRange<std::size_t>(0, n - 1)];
  return in.ConsumeRandomLengthString(24);
}

void check_refusal(const Status& s) { check(s.ok() || !s.message().empty()); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const Topology& topo = topology();
  std::int64_t now = 1'000'000;
  RegistryOptions opt;
  opt.lease_ms = 1000;
  opt.switch_lease_ms = 1000;
  opt.abort_hold_ms = 2000;
  opt.require_registration = in.ConsumeBool();
  opt.clock = [&now] { return now; };
  FakeSwitches sw;
  JobRegistry reg(topo, sw, opt);

  static const char* const jobs[] = {"a", "b", "c"};
  std::vector<std::string> switch_names, host_names;
  for (const auto& s : topo.switches) switch_names.push_back(s.name);
  for (const auto& h : topo.hosts) host_names.push_back(h.name);
  switch_names.push_back("leafX");  // of the fabrics set_topology() may apply
  host_names.push_back("hX");
  std::vector<const char*> sws, hosts;
  for (const auto& s : switch_names) sws.push_back(s.c_str());
  for (const auto& h : host_names) hosts.push_back(h.c_str());
  std::set<std::pair<std::string, std::uint32_t>> joined;
  bool changed = false;  // a set_topology() was applied

  for (int step = 0; step < 256 && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: {
        JoinArgs a;
        a.job = pick_name(in, jobs, 3);
        a.rank = in.ConsumeIntegralInRange<std::uint32_t>(0, 9);
        a.world = in.ConsumeIntegralInRange<std::uint32_t>(0, 9);
        a.host = pick_name(in, hosts.data(), hosts.size());
        a.port = in.ConsumeIntegral<std::uint16_t>();
        a.slots = in.ConsumeBool() ? 1u << in.ConsumeIntegralInRange(0, 13)
                                   : in.ConsumeIntegral<std::uint32_t>();
        a.payload_bytes = in.ConsumeBool() ? 1u << in.ConsumeIntegralInRange(7, 14)
                                           : in.ConsumeIntegral<std::uint32_t>();
        a.dtype_mask = in.ConsumeIntegral<std::uint32_t>();
        a.op_mask = in.ConsumeIntegral<std::uint32_t>();
        a.deterministic = in.ConsumeBool();
        const auto r = reg.join(a, 0);
        if (r.ok()) {
          joined.insert({a.job, a.rank});
          check(r->slots >= 1 && r->payload_bytes >= 1);
        } else {
          check_refusal(r.status());
          joined.insert({a.job, a.rank});  // a gathering rank is a member too
        }
        break;
      }
      case 1: {
        const auto r = reg.heartbeat(pick_name(in, jobs, 3), in.ConsumeIntegralInRange(0, 9));
        if (!r.ok()) check_refusal(r.status());
        break;
      }
      case 2:
        check_refusal(reg.leave(pick_name(in, jobs, 3), in.ConsumeIntegralInRange(0, 9)));
        break;
      case 3: {
        std::optional<std::uint32_t> rank;
        if (in.ConsumeBool()) rank = in.ConsumeIntegralInRange<std::uint32_t>(0, 9);
        const std::string job = pick_name(in, jobs, 3);
        check_refusal(reg.abort(job, rank, in.ConsumeRandomLengthString(40)));
        break;
      }
      case 4: {
        const std::string name = pick_name(in, sws.data(), sws.size());
        std::optional<ResourceProfile> limits;
        if (in.ConsumeBool()) {
          ResourceProfile p;
          p.name = "fuzz";
          p.max_trees = in.ConsumeIntegralInRange<std::uint32_t>(0, 8);
          p.max_slots = in.ConsumeIntegral<std::uint32_t>();
          p.max_payload_bytes = in.ConsumeIntegralInRange<std::uint32_t>(0, 16384);
          p.memory_bytes = in.ConsumeIntegral<std::uint64_t>();
          p.max_children = in.ConsumeIntegralInRange<std::uint32_t>(0, 80);
          p.dtype_mask = in.ConsumeIntegral<std::uint32_t>();
          p.op_mask = in.ConsumeIntegral<std::uint32_t>();
          p.deterministic = in.ConsumeBool();
          limits = p;
        }
        const std::string agent =
            in.ConsumeBool() ? "127.0.0.1:" + std::to_string(in.ConsumeIntegral<std::uint16_t>())
                             : in.ConsumeRandomLengthString(24);
        // What the switch holds (reconciliation, docs/manager.md), and now and then a made-up
        // tree as a restarted or confused switch might report.
        std::vector<HeldTree> held;
        for (std::uint16_t id : sw.held[name]) held.push_back({id, "?", 0});
        if (in.ConsumeBool())
          held.push_back({in.ConsumeIntegral<std::uint16_t>(), in.ConsumeRandomLengthString(8),
                          in.ConsumeIntegral<std::uint64_t>()});
        const auto r = reg.register_switch(name, agent, limits, held);
        if (!r.ok()) check_refusal(r.status());
        break;
      }
      case 5:
        check_refusal(reg.switch_heartbeat(pick_name(in, sws.data(), sws.size())));
        break;
      case 6: {
        const std::string name = pick_name(in, sws.data(), sws.size());
        check_refusal(reg.fail_switch(name, in.ConsumeRandomLengthString(40)));
        break;
      }
      case 7:
        now += in.ConsumeIntegralInRange<std::int64_t>(0, 5000);
        reg.sweep();
        break;
      case 8:
        sw.failing = !sw.failing;
        break;
      case 9: {
        if (in.ConsumeBool()) {
          // An admin drains or undrains a switch: its trees stay, new ones avoid it.
          const std::string name = pick_name(in, sws.data(), sws.size());
          check_refusal(reg.drain_switch(name, in.ConsumeBool(), in.ConsumeRandomLengthString(40)));
          break;
        }
        // An admin changes the topology: one of the fixed fabrics, perhaps cut short or with
        // a byte changed, or text of the fuzzer's own. A refusal changes nothing.
        const auto before = reg.topology();
        const bool own = in.ConsumeBool();
        const std::size_t k =
            own ? 0 : in.ConsumeIntegralInRange<std::size_t>(0, fabrics().size() - 1);
        std::string text = own ? in.ConsumeRandomLengthString(256) : fabrics()[k];
        bool edited = own;
        if (!text.empty() && in.ConsumeBool()) {
          const auto at = in.ConsumeIntegralInRange<std::size_t>(0, text.size() - 1);
          if (in.ConsumeBool())
            text.resize(at);
          else
            text[at] = char(in.ConsumeIntegral<std::uint8_t>());
          edited = true;
        }
        const auto r =
            edited ? reg.set_topology(text) : reg.set_topology(loaded_fabrics()[k], text);
        if (!r.ok()) {
          check_refusal(r.status());
          check(reg.topology() == before);
        } else {
          check(reg.switches().size() == reg.topology()->switches.size());
          changed = true;
        }
        break;
      }
    }
    for (const SwitchView& v : reg.switches()) {
      const ResourceProfile& p = v.profile;
      check(p.max_trees == 0 || v.used.trees <= p.max_trees);
    }
  }

  // Everyone leaves; every lease and hold runs out: nothing may be left behind.
  sw.failing = false;
  // Back to the first fabric (no job is left to refuse it): the switches a change dropped come
  // back and register below, so the trees they still hold (a switch that failed keeps them) are
  // removed too.
  for (const auto& [job, rank] : joined) (void)reg.leave(job, rank);
  now += 1'000'000;
  reg.sweep();
  check(reg.jobs().empty());
  if (changed) check(reg.set_topology(loaded_fabrics()[0], fabrics()[0]).ok());
  for (const SwitchView& v : reg.switches()) {
    check(v.used.trees == 0);
    check(v.used.slots == 0);
    check(v.used.bytes == 0);
  }
  // Every switch registers again with what it holds: the manager removes every tree, and the
  // switches then agree with it that nothing is left.
  for (const Switch& s : topo.switches) {
    const std::string& name = s.name;
    std::vector<HeldTree> held;
    for (std::uint16_t id : sw.held[name]) held.push_back({id, "?", 0});
    if (!held.empty()) check(reg.register_switch(name, "127.0.0.1:1", std::nullopt, held).ok());
  }
  // leafX is in no fabric now: what it may hold is the forgotten switch's business.
  for (const auto& [name, trees] : sw.held) check(name == "leafX" || trees.empty());
  return 0;
}
