// The rules a tree must follow, written once: docs/protocol.md section 3.
#include "treeduce/protocol/tree.h"

#include <arpa/inet.h>

#include <bit>
#include <set>
#include <utility>

namespace treeduce::proto {

namespace {

std::string must(const std::string& what, std::uint64_t v, std::uint64_t lo, std::uint64_t hi) {
  return what + " must be from " + std::to_string(lo) + " to " + std::to_string(hi) + ", got " +
         std::to_string(v) + ".";
}

std::string format_endpoint(const Endpoint& e) {
  char ip[INET_ADDRSTRLEN] = {};
  const std::uint32_t be = htonl(e.ip);
  inet_ntop(AF_INET, &be, ip, sizeof ip);
  return std::string(ip) + ":" + std::to_string(e.port);
}

}  // namespace

std::string_view name(Role r) noexcept {
  switch (r) {
    case Role::leaf:
      return "leaf";
    case Role::inner:
      return "inner";
    case Role::root:
      return "root";
  }
  return "?";
}

std::optional<std::string> check_slots(std::uint64_t slots) {
  if (slots != 0 && slots <= kMaxSlots && std::has_single_bit(slots)) return std::nullopt;
  return "slots must be a power of two from 1 to " + std::to_string(kMaxSlots) + ", got " +
         std::to_string(slots) + ".";
}

std::optional<std::string> check_payload_bytes(std::uint64_t bytes) {
  if (valid_payload_bytes(bytes)) return std::nullopt;
  return "payload_bytes must be a power of two from " + std::to_string(kMinPayloadBytes) + " to " +
         std::to_string(kMaxPayloadBytes) + ", got " + std::to_string(bytes) + ".";
}

std::optional<TreeIssue> validate_tree(const TreeConfig& t) {
  const auto issue = [](TreeField f, std::string s, std::size_t child = 0) {
    return std::optional<TreeIssue>(TreeIssue{f, child, std::move(s)});
  };
  if (t.children.empty() || t.children.size() > kMaxChildren)
    return issue(TreeField::children,
                 must("the number of children", t.children.size(), 1, kMaxChildren));
  std::set<std::pair<std::uint32_t, std::uint16_t>> addrs;
  std::uint32_t hosts = 0;
  for (std::size_t i = 0; i < t.children.size(); ++i) {
    const ChildConfig& c = t.children[i];
    const std::string who = "child " + format_endpoint(c.addr);
    if (c.addr.ip == 0 || c.addr.port == 0)
      return issue(TreeField::child_address,
                   who + " needs an address other than 0.0.0.0 and a port from 1 to 65535.", i);
    if (!addrs.emplace(c.addr.ip, c.addr.port).second)
      return issue(TreeField::child_address, who + " is listed twice.", i);
    if (c.hosts == 0)
      return issue(TreeField::child_hosts, who + ": " + must("hosts", 0, 1, 65535), i);
    hosts += c.hosts;
  }
  if (hosts > kMaxTreeHosts)
    return issue(TreeField::children,
                 "the children have " + std::to_string(hosts) + " hosts in all, more than 65535.");
  if (auto s = check_slots(t.slots)) return issue(TreeField::slots, std::move(*s));
  if (auto s = check_payload_bytes(t.payload_bytes))
    return issue(TreeField::payload_bytes, std::move(*s));
  if ((t.dtype_mask & kAllDTypesMask) == 0)
    return issue(TreeField::dtype_mask, "dtypes must name at least one type.");
  if (const std::uint32_t bad = t.dtype_mask & ~kAllDTypesMask; bad != 0)
    return issue(TreeField::dtype_mask,
                 "dtypes names a type with code " + std::to_string(std::countr_zero(bad)) +
                     "; the codes are 0 to " + std::to_string(kNumDTypes - 1) + ".");
  if ((t.op_mask & kAllOpsMask) == 0)
    return issue(TreeField::op_mask, "ops must name at least one operation.");
  if (const std::uint32_t bad = t.op_mask & ~kAllOpsMask; bad != 0)
    return issue(TreeField::op_mask,
                 "ops names an operation with code " + std::to_string(std::countr_zero(bad)) +
                     "; the codes are 0 to " + std::to_string(kNumReduceOps - 1) + ".");
  if (t.role != Role::leaf && t.role != Role::inner && t.role != Role::root)
    return issue(TreeField::role, "the role must be leaf, inner or root.");
  const bool has_parent = t.parent.ip != 0 || t.parent.port != 0;
  if (t.role == Role::root && has_parent)
    return issue(TreeField::parent, "a root has no parent, but parent is set.");
  if (t.role != Role::root) {
    if (t.parent.ip == 0 || t.parent.port == 0)
      return issue(TreeField::parent,
                   "role " + std::string(name(t.role)) + " needs a parent (parent: A.B.C.D:PORT).");
    if (t.index_at_parent >= kMaxChildren)
      return issue(TreeField::index_at_parent,
                   must("index_at_parent", t.index_at_parent, 0, kMaxChildren - 1));
  }
  return std::nullopt;
}

}  // namespace treeduce::proto
