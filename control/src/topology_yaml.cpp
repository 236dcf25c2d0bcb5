// YAML topology loader. yaml-cpp marks give every node's line, so each error names one.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

#include "treeduce/control/topology.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::ctl {

namespace {

// Thrown inside the loader only, and turned into a Status at its end: the loader is a deep
// recursive walk where early returns would triple its length.
struct LoadError {
  std::string msg;
};

std::string at(const YAML::Node& n) { return "line " + std::to_string(n.Mark().line + 1) + ": "; }

[[noreturn]] void fail(const YAML::Node& n, const std::string& msg) {
  throw LoadError{at(n) + msg};
}

YAML::Node need(const YAML::Node& parent, const char* key, const std::string& what) {
  YAML::Node v = parent[key];
  if (!v) fail(parent, what + " has no '" + key + "'.");
  if (!v.IsScalar()) fail(v, "'" + std::string(key) + "' of " + what + " must be a single value.");
  return v;
}

std::string str(const YAML::Node& n) { return n.as<std::string>(); }

std::uint64_t num(const YAML::Node& n, const std::string& what, std::uint64_t max) {
  if (!n.IsScalar()) fail(n, what + " must be a number.");
  std::uint64_t v = 0;
  const std::string s = n.Scalar();
  try {
    if (s.empty() || s[0] == '-') throw YAML::BadConversion(n.Mark());
    v = n.as<std::uint64_t>();
  } catch (const YAML::BadConversion&) {
    fail(n, what + " must be a non-negative whole number, not '" + s + "'.");
  }
  if (v > max) fail(n, what + " is " + s + ", more than the limit " + std::to_string(max) + ".");
  return v;
}

Address addr(const YAML::Node& n, const std::string& what) {
  auto a = parse_address(str(n));
  if (!a.ok()) fail(n, what + ": " + a.status().message());
  return *a;
}

void only_keys(const YAML::Node& n, const std::set<std::string>& keys, const std::string& what) {
  for (const auto& kv : n) {
    const std::string k = kv.first.as<std::string>();
    if (!keys.count(k)) fail(kv.first, what + " has an unknown key '" + k + "'.");
  }
}

YAML::Node seq(const YAML::Node& root, const char* key, bool required) {
  YAML::Node n = root[key];
  if (!n) {
    if (required) fail(root, std::string("the topology has no '") + key + "' list.");
    return n;
  }
  if (!n.IsSequence()) fail(n, std::string("'") + key + "' must be a list.");
  return n;
}

// A profile's `dtypes` or `ops`: a list of names (parse_dtype/parse_op spellings) or "all".
template <class E>
std::uint32_t names_mask(const YAML::Node& n, const std::string& what) {
  constexpr bool is_type = std::is_same_v<E, DType>;
  const std::uint32_t all = is_type ? kAllDTypesMask : kAllOpsMask;
  if (n.IsScalar() && n.Scalar() == "all") return all;
  if (!n.IsSequence()) fail(n, what + " must be a list of names or 'all'.");
  std::uint32_t m = 0;
  for (const auto& e : n) {
    const std::string s = e.IsScalar() ? e.Scalar() : std::string();
    std::optional<E> v;
    if constexpr (is_type)
      v = parse_dtype(s);
    else
      v = parse_op(s);
    if (!v)
      fail(e, what + ": '" + s + "' is not " +
                  (is_type ? "an element type (f32, i8, u64, f64_i32, ...)."
                           : "an operation (sum, prod, band, lxor, minloc, ...)."));
    m |= bit(*v);
  }
  if (m == 0) fail(n, what + " is empty: such a switch could reduce nothing.");
  return m;
}

Topology parse(const YAML::Node& root) {
  if (!root.IsMap()) fail(root, "a topology is a map with 'switches', 'hosts' and 'links'.");
  only_keys(root, {"profiles", "switches", "hosts", "links"}, "the topology");
  Topology t;
  for (const auto& p : builtin_profiles()) t.profiles.push_back(p);
  std::map<std::string, std::uint32_t> prof_idx;
  for (std::uint32_t i = 0; i < t.profiles.size(); ++i) prof_idx[t.profiles[i].name] = i;

  if (YAML::Node ps = seq(root, "profiles", false)) {
    for (const auto& p : ps) {
      if (!p.IsMap()) fail(p, "a profile is a map.");
      only_keys(p,
                {"name", "base", "max_trees", "max_slots", "max_payload_bytes", "memory_bytes",
                 "max_children", "deterministic", "dtypes", "ops"},
                "profile");
      const std::string name = str(need(p, "name", "a profile"));
      if (prof_idx.count(name)) fail(p["name"], "profile '" + name + "' is defined twice.");
      ResourceProfile rp;
      if (p["base"]) {
        auto it = prof_idx.find(str(p["base"]));
        if (it == prof_idx.end())
          fail(p["base"],
               "profile '" + name + "' is based on unknown profile '" + str(p["base"]) + "'.");
        rp = t.profiles[it->second];
      } else {
        rp = *find_builtin_profile("server");
      }
      rp.name = name;
      const std::string w = "profile '" + name + "': ";
      if (p["max_trees"]) rp.max_trees = std::uint32_t(num(p["max_trees"], w + "max_trees", 65535));
      if (p["max_slots"])
        rp.max_slots = std::uint32_t(num(p["max_slots"], w + "max_slots", 1u << 30));
      if (p["max_payload_bytes"]) {
        rp.max_payload_bytes = std::uint32_t(
            num(p["max_payload_bytes"], w + "max_payload_bytes", proto::kMaxPayloadBytes));
        if (proto::check_payload_bytes(rp.max_payload_bytes))
          fail(p["max_payload_bytes"], w + "max_payload_bytes must be a power of two, 256..8192.");
      }
      if (p["memory_bytes"]) rp.memory_bytes = num(p["memory_bytes"], w + "memory_bytes", ~0ull);
      if (p["max_children"]) {
        rp.max_children =
            std::uint32_t(num(p["max_children"], w + "max_children", proto::kMaxChildren));
        if (rp.max_children < 1) fail(p["max_children"], w + "max_children must be 1..64.");
      }
      if (p["deterministic"]) rp.deterministic = p["deterministic"].as<bool>();
      if (p["dtypes"]) rp.dtype_mask = names_mask<DType>(p["dtypes"], w + "dtypes");
      if (p["ops"]) rp.op_mask = names_mask<ReduceOp>(p["ops"], w + "ops");
      if (count_pairs(rp.dtype_mask, rp.op_mask) == 0)
        fail(p, w + "its element types and operations make no defined pair.");
      prof_idx[name] = std::uint32_t(t.profiles.size());
      t.profiles.push_back(rp);
    }
  }

  // Port use per switch, to refuse two cables in one port.
  std::vector<std::map<std::uint32_t, int>> port_use;
  auto use_port = [&](std::uint32_t sw, const YAML::Node& n, const std::string& what) {
    if (!n) return std::uint32_t(0);
    const Switch& s = t.switches[sw];
    auto port = std::uint32_t(num(n, what + " port", 65535));
    if (port == 0 || (s.ports && port > s.ports))
      fail(n, what + " uses port " + std::to_string(port) + " of '" + s.name + "', which has " +
                  (s.ports ? "ports 1.." + std::to_string(s.ports) : std::string("no port 0")) +
                  ".");
    auto [it, fresh] = port_use[sw].emplace(port, n.Mark().line + 1);
    if (!fresh)
      fail(n, "port " + std::to_string(port) + " of '" + s.name + "' is already used on line " +
                  std::to_string(it->second) + ".");
    return port;
  };

  for (const auto& s : seq(root, "switches", true)) {
    if (!s.IsMap()) fail(s, "a switch is a map.");
    only_keys(s, {"name", "level", "mgmt", "data", "profile", "ports"}, "switch");
    Switch sw;
    sw.line = s.Mark().line + 1;
    sw.name = str(need(s, "name", "a switch"));
    const std::string w = "switch '" + sw.name + "'";
    for (const auto& o : t.switches)
      if (o.name == sw.name)
        fail(s["name"], w + " is defined twice (first on line " + std::to_string(o.line) + ").");
    sw.level = std::uint32_t(num(need(s, "level", w), w + " level", 7));
    if (s["mgmt"]) sw.mgmt = str(s["mgmt"]);
    if (s["data"]) sw.data = addr(s["data"], w + " data address");
    if (s["ports"]) sw.ports = std::uint32_t(num(s["ports"], w + " ports", 65535));
    std::string prof = s["profile"] ? str(s["profile"]) : std::string("quantum2");
    auto it = prof_idx.find(prof);
    if (it == prof_idx.end()) {
      std::string known;
      for (const auto& kv : prof_idx) known += (known.empty() ? "" : ", ") + kv.first;
      fail(s["profile"], w + " uses unknown profile '" + prof + "' (known: " + known + ").");
    }
    sw.profile = it->second;
    t.switches.push_back(std::move(sw));
    port_use.emplace_back();
  }
  std::map<std::string, std::uint32_t> sw_idx;
  for (std::uint32_t i = 0; i < t.switches.size(); ++i) sw_idx[t.switches[i].name] = i;
  auto switch_ref = [&](const YAML::Node& n, const std::string& what) {
    const std::string name = str(n);
    auto it = sw_idx.find(name);
    if (it == sw_idx.end()) fail(n, what + " names unknown switch '" + name + "'.");
    return it->second;
  };

  std::map<std::string, int> host_lines;
  std::map<std::uint32_t, int> ip_lines;
  if (YAML::Node hs = seq(root, "hosts", false)) {
    for (const auto& h : hs) {
      if (!h.IsMap()) fail(h, "a host is a map.");
      only_keys(h, {"name", "address", "switch", "port"}, "host");
      Host host;
      host.name = str(need(h, "name", "a host"));
      const std::string w = "host '" + host.name + "'";
      if (auto [it, fresh] = host_lines.emplace(host.name, h.Mark().line + 1); !fresh)
        fail(h["name"],
             w + " is defined twice (first on line " + std::to_string(it->second) + ").");
      host.data = addr(need(h, "address", w), w + " address");
      if (auto [it, fresh] = ip_lines.emplace(host.data.ip, h.Mark().line + 1); !fresh)
        fail(h["address"],
             w + " reuses the address of the host on line " + std::to_string(it->second) + ".");
      host.leaf = switch_ref(need(h, "switch", w), w);
      if (t.switches[host.leaf].level != 0)
        fail(h["switch"], w + " attaches to '" + t.switches[host.leaf].name +
                              "', which is not a leaf (level 0).");
      host.port = use_port(host.leaf, h["port"], w);
      t.switches[host.leaf].hosts.push_back(std::uint32_t(t.hosts.size()));
      t.hosts.push_back(std::move(host));
    }
  }

  std::set<std::pair<std::uint32_t, std::uint32_t>> linked;
  if (YAML::Node ls = seq(root, "links", false)) {
    for (const auto& l : ls) {
      if (!l.IsMap()) fail(l, "a link is a map {a: switch, b: switch, a_port: n, b_port: n}.");
      only_keys(l, {"a", "b", "a_port", "b_port"}, "link");
      std::uint32_t a = switch_ref(need(l, "a", "a link"), "link end 'a'");
      std::uint32_t b = switch_ref(need(l, "b", "a link"), "link end 'b'");
      const std::string w = "link " + t.switches[a].name + " - " + t.switches[b].name;
      std::uint32_t la = t.switches[a].level, lb = t.switches[b].level;
      if (la + 1 != lb && lb + 1 != la)
        fail(l, w + " joins levels " + std::to_string(la) + " and " + std::to_string(lb) +
                    "; links must join adjacent levels.");
      use_port(a, l["a_port"], w);
      use_port(b, l["b_port"], w);
      std::uint32_t lo = la < lb ? a : b, hi = la < lb ? b : a;
      if (!linked.emplace(lo, hi).second) fail(l, w + " is listed twice.");
      t.switches[lo].up.push_back(hi);
      t.switches[hi].down.push_back(lo);
    }
  }
  return t;
}

}  // namespace

std::size_t utf8_valid_prefix(std::string_view s) noexcept {
  for (std::size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t n = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range (no overlongs, surrogates)
    if (b >= 0xc2 && b <= 0xdf) {
      n = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
      n = 2;
      if (b == 0xe0) lo = 0xa0;
      if (b == 0xed) hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
      n = 3;
      if (b == 0xf0) lo = 0x90;
      if (b == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (i + n >= s.size()) return i;  // cut short
    for (std::size_t k = 1; k <= n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return i;
    }
    i += n + 1;
  }
  return s.size();
}

Result<Topology> load_topology_yaml(std::string_view text) {
  // Its names end up in the store's JSON documents, which must be UTF-8; and YAML is.
  if (const std::size_t at = utf8_valid_prefix(text); at != text.size())
    return invalid_argument(
        "line " + std::to_string(1 + std::count(text.begin(), text.begin() + long(at), '\n')) +
        ": byte " + std::to_string(at) + " is not UTF-8; a topology is UTF-8 text.");
  Topology t;
  try {
    YAML::Node root = YAML::Load(std::string(text));
    t = parse(root);
  } catch (const LoadError& e) {
    return invalid_argument(e.msg);
  } catch (const YAML::Exception& e) {
    // Parser errors and failed conversions carry a mark too.
    return invalid_argument("line " + std::to_string(e.mark.line + 1) + ": " + e.msg + ".");
  }
  if (Status s = t.finalize(); !s.ok()) return s;
  return t;
}

Result<std::string> read_topology_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return not_found("Cannot open the topology file '" + path + "'.");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<Topology> load_topology_file(const std::string& path) {
  auto text = read_topology_text(path);
  if (!text.ok()) return text.status();
  auto r = load_topology_yaml(*text);
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

}  // namespace treeduce::ctl
