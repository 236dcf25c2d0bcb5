/// @file
/// A tree as one switch serves it (docs/protocol.md section 3), and the one function that says
/// whether such a tree is valid.
///
/// The manager programs TreeConfig into switches, a switch's YAML file lists them, the switch core
/// installs them, and hosts check the window and payload size they are given against the same
/// rules: every one of them asks validate_tree() (or its parts check_slots() and
/// check_payload_bytes()), so a rule is written once and worded once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::proto {

/// Most children one switch can have in one tree: a contribution bitmap is one 64-bit word.
inline constexpr std::size_t kMaxChildren = 64;
/// Most slots per tree (two versions each).
inline constexpr std::uint32_t kMaxSlots = 4096;
/// The ncontrib header field counts hosts in 16 bits.
inline constexpr std::uint32_t kMaxTreeHosts = 0xFFFF;
/// Every element type and every operation a tree may allow (TreeConfig::dtype_mask, op_mask).
using treeduce::kAllDTypesMask;
using treeduce::kAllOpsMask;

/// A tree's role on this switch. Only root vs non-root changes behaviour; leaf/inner is for
/// reporting (a leaf's children are hosts).
enum class Role : std::uint8_t { leaf = 0, inner = 1, root = 2 };
/// "leaf", "inner", "root"; "?" for anything else.
std::string_view name(Role r) noexcept;

/// One child of a tree on this switch: a host or a switch one level down.
struct ChildConfig {
  Endpoint addr;            ///< where RESULTs go; CONTRIBs must come from addr.ip
  std::uint16_t hosts = 1;  ///< hosts under this child: the ncontrib its CONTRIBs must carry
  bool operator==(const ChildConfig&) const = default;
};

/// Everything a switch needs to serve one tree. Built by the control plane.
struct TreeConfig {
  std::uint16_t tree_id = 0;
  std::uint64_t key = 0;  ///< per-job key; every packet must carry it
  Role role = Role::root;
  Endpoint parent;                            ///< ignored for Role::root
  std::uint16_t index_at_parent = 0;          ///< our child index in the parent's tree entry
  std::vector<ChildConfig> children;          ///< 1..kMaxChildren, index = child index on the wire
  std::uint32_t slots = 8;                    ///< power of two, 1..kMaxSlots
  std::uint32_t payload_bytes = 1024;         ///< power of two, 256..8192
  std::uint32_t dtype_mask = kAllDTypesMask;  ///< bit d allows DType d
  std::uint32_t op_mask = kAllOpsMask;        ///< bit o allows ReduceOp o
  /// Keep each child's payload and reduce in child order when all are in: results bit-identical
  /// whatever the arrival order, loss and retransmissions.
  bool deterministic = false;
  bool operator==(const TreeConfig&) const = default;
};

/// The part of a TreeConfig a problem is in, so that a reader of a file can point at its line.
enum class TreeField : std::uint8_t {
  children,       ///< their number, or their hosts in all
  child_address,  ///< TreeIssue::child's address
  child_hosts,    ///< TreeIssue::child's hosts
  slots,
  payload_bytes,
  dtype_mask,
  op_mask,
  role,
  parent,
  index_at_parent,
};

/// Why a TreeConfig is not valid: where, and a whole sentence without the tree's name (callers
/// put "tree 7: " in front), e.g. "slots must be a power of two from 1 to 4096, got 12."
struct TreeIssue {
  TreeField field = TreeField::children;
  std::size_t child = 0;  ///< for child_address and child_hosts
  std::string sentence;
};

/// "slots must be a power of two from 1 to 4096, got 12.", or nullopt when `slots` is valid.
std::optional<std::string> check_slots(std::uint64_t slots);
/// "payload_bytes must be a power of two from 256 to 8192, got 100.", or nullopt.
std::optional<std::string> check_payload_bytes(std::uint64_t bytes);

/// The window a host asks for when it is given none (libtreeduce, `treeduce doctor`): the slots
/// that hold kDefaultWindowBytes of payload, from 32 to 64: 64 at payloads up to 1 KiB, 32 from
/// 2 KiB. Per-packet costs make a small payload's window the one that limits a stream, and at
/// 8 KiB payloads 16 slots (128 KiB in flight) took up to 1.3x the time of 64 where 32 stayed
/// within 1.17x (docs/performance.md, "Issue 16: back to back, and fast without tuning"). The
/// slot memory a job takes on a switch, 2 x window x payload, is 128 KiB up to 2 KiB payloads,
/// 256 KiB at 4 KiB and 512 KiB at 8 KiB.
inline constexpr std::uint32_t kDefaultWindowBytes = 64 * 1024;
constexpr std::uint32_t default_window(std::uint32_t payload_bytes) {
  const std::uint32_t w = payload_bytes == 0 ? 64 : kDefaultWindowBytes / payload_bytes;
  return w < 32 ? 32 : w > 64 ? 64 : w;
}

/// The first rule `t` breaks, in the order of TreeField, or nullopt when a switch can serve it.
/// Checks what the protocol needs: 1..64 children with distinct addresses and ports other than
/// 0, each with 1..65535 hosts and at most 65535 in all; slots and payload as above; masks that
/// allow something and nothing unknown; a role; a parent (address and port) for a non-root and
/// none for a root, with index_at_parent below 64. Whether a switch allows deterministic trees is
/// the switch's policy, not checked here.
std::optional<TreeIssue> validate_tree(const TreeConfig& t);

}  // namespace treeduce::proto
