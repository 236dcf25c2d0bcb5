#include "treeduce/control/topology.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <string>

namespace treeduce::ctl {

std::string to_string(const Address& a) {
  // snprintf rather than operator+ chains: GCC 12 reports a false -Wrestrict on those.
  char buf[24];
  int n = a.port ? std::snprintf(buf, sizeof buf, "%u.%u.%u.%u:%u", a.ip >> 24, (a.ip >> 16) & 0xFF,
                                 (a.ip >> 8) & 0xFF, a.ip & 0xFF, unsigned(a.port))
                 : std::snprintf(buf, sizeof buf, "%u.%u.%u.%u", a.ip >> 24, (a.ip >> 16) & 0xFF,
                                 (a.ip >> 8) & 0xFF, a.ip & 0xFF);
  return std::string(buf, std::size_t(n));
}

Result<Address> parse_address(std::string_view s) {
  auto bad = [&] {
    return invalid_argument("'" + std::string(s) +
                            "' is not an IPv4 address (a.b.c.d, optionally :port).");
  };
  Address a;
  std::string_view ip = s;
  if (auto colon = s.find(':'); colon != std::string_view::npos) {
    ip = s.substr(0, colon);
    auto p = s.substr(colon + 1);
    unsigned port = 0;
    auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), port);
    if (ec != std::errc() || end != p.data() + p.size() || port > 65535 || p.empty()) return bad();
    a.port = static_cast<std::uint16_t>(port);
  }
  const char* cur = ip.data();
  const char* last = ip.data() + ip.size();
  for (int i = 0; i < 4; ++i) {
    unsigned octet = 0;
    auto [end, ec] = std::from_chars(cur, last, octet);
    if (ec != std::errc() || octet > 255 || end == cur) return bad();
    a.ip = (a.ip << 8) | octet;
    cur = end;
    if (i < 3) {
      if (cur == last || *cur != '.') return bad();
      ++cur;
    }
  }
  if (cur != last) return bad();
  return a;
}

namespace {
std::string where(const Switch& s) {
  return s.line ? "line " + std::to_string(s.line) + ": " : std::string();
}
}  // namespace

Status Topology::finalize() {
  switch_by_name_.clear();
  host_by_name_.clear();
  host_by_ip_.clear();
  if (switches.empty()) return invalid_argument("The topology has no switches.");
  levels_ = 0;
  for (std::uint32_t i = 0; i < switches.size(); ++i) {
    const Switch& s = switches[i];
    if (!switch_by_name_.emplace(s.name, i).second)
      return invalid_argument(where(s) + "switch '" + s.name + "' is defined twice.");
    if (s.profile >= profiles.size())
      return invalid_argument(where(s) + "switch '" + s.name + "' has no resource profile.");
    levels_ = std::max(levels_, s.level + 1);
    for (std::uint32_t u : s.up)
      if (u >= switches.size() || switches[u].level != s.level + 1)
        return invalid_argument(where(s) + "switch '" + s.name +
                                "' has an up-link that does not lead one level up.");
  }
  for (std::uint32_t i = 0; i < hosts.size(); ++i) {
    const Host& h = hosts[i];
    if (!host_by_name_.emplace(h.name, i).second)
      return invalid_argument("host '" + h.name + "' is defined twice.");
    if (h.leaf >= switches.size() || switches[h.leaf].level != 0)
      return invalid_argument("host '" + h.name + "' must attach to a level-0 (leaf) switch.");
    if (h.data.ip != 0 && !host_by_ip_.emplace(h.data.ip, i).second)
      return invalid_argument("host '" + h.name + "' reuses the address " + to_string(h.data) +
                              ".");
  }
  // Every level from the leaves up has a switch: a fabric without leaves has nowhere for hosts,
  // and a missing level leaves the ones above unreachable.
  std::vector<bool> seen(levels_, false);
  for (const Switch& s : switches) seen[s.level] = true;
  for (std::uint32_t l = 0; l < levels_; ++l)
    if (!seen[l])
      return invalid_argument(l == 0 ? std::string("The topology has no leaf (level-0) switch.")
                                     : "The topology has switches at level " +
                                           std::to_string(levels_ - 1) + " but none at level " +
                                           std::to_string(l) + ".");
  by_level_.assign(levels_, {});
  leaves_.clear();
  leaf_no_.assign(switches.size(), ~0u);
  for (std::uint32_t i = 0; i < switches.size(); ++i) {
    by_level_[switches[i].level].push_back(i);
    if (switches[i].level == 0) {
      leaf_no_[i] = static_cast<std::uint32_t>(leaves_.size());
      leaves_.push_back(i);
    }
  }
  words_ = (leaves_.size() + 63) / 64;
  below_.assign(switches.size() * words_, 0);
  for (std::uint32_t l = 0; l < levels_; ++l) {
    for (std::uint32_t sw : by_level_[l]) {
      std::uint64_t* b = &below_[sw * words_];
      if (l == 0) {
        b[leaf_no_[sw] / 64] |= 1ull << (leaf_no_[sw] % 64);
        continue;
      }
      for (std::uint32_t d : switches[sw].down) {
        const std::uint64_t* db = &below_[d * words_];
        for (std::size_t w = 0; w < words_; ++w) b[w] |= db[w];
      }
    }
  }
  return Status::Ok();
}

std::int64_t Topology::find_switch(std::string_view name) const {
  auto it = switch_by_name_.find(std::string(name));
  return it == switch_by_name_.end() ? std::int64_t{-1} : std::int64_t{it->second};
}
std::int64_t Topology::find_host(std::string_view name) const {
  auto it = host_by_name_.find(std::string(name));
  return it == host_by_name_.end() ? std::int64_t{-1} : std::int64_t{it->second};
}
std::int64_t Topology::find_host_by_ip(std::uint32_t ip) const {
  auto it = host_by_ip_.find(ip);
  return it == host_by_ip_.end() ? std::int64_t{-1} : std::int64_t{it->second};
}

}  // namespace treeduce::ctl
