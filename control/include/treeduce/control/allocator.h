/// @file
/// The tree allocator: picks, for a job, a tree of switches covering every rank's leaf switch and
/// reserves its aggregation resources.
///
/// Policy, in order: (1) shallowest tree: the lowest level at which one switch reaches every
/// leaf; (2) never over-commit: a switch joins a tree only if the tree's cost fits its profile;
/// (3) balanced: among feasible roots at that level, the tree whose busiest non-leaf switch is
/// least used, then the least used root (spreads jobs across spines); candidates are tried a
/// round at a time, least used root first. Below the root, children
/// are chosen greedily by how many of the job's leaves they reach (set cover; exact on
/// fat-trees, where those sets are disjoint). Candidate roots are evaluated in parallel with
/// oneTBB when there are enough of them (docs/manager.md has the measurement).
///
/// Not thread-safe: the job registry serialises calls.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "treeduce/common/status.h"
#include "treeduce/control/resources.h"
#include "treeduce/control/topology.h"

namespace treeduce::ctl {

/// What a job asks for.
struct JobRequest {
  std::string job;                       ///< unique job name
  std::vector<std::uint32_t> rank_host;  ///< rank -> host index; size = world size
  std::uint32_t slots = 16;              ///< window: outstanding chunks per rank
  std::uint32_t payload_bytes = 1024;    ///< wanted bytes per packet; lowered to fit the tree
  /// The (type, operation) pairs the job needs reduced in the network: every defined pair of
  /// dtype_mask x op_mask, a 0 mask standing for all types (operations). Both 0: nothing
  /// needed, the tree reduces what its switches can and the hosts the rest.
  std::uint32_t dtype_mask = 0;
  std::uint32_t op_mask = 0;
  bool deterministic = false;
};

/// A child of a tree node: a switch (node index in Allocation::nodes) or a rank.
struct TreeChild {
  bool is_rank = false;
  std::uint32_t id = 0;  ///< node index, or rank
};

/// Role on one switch; same values as treeduce::dp::Role.
enum class NodeRole : std::uint8_t { leaf = 0, inner = 1, root = 2 };

/// One switch of a tree.
struct TreeNode {
  std::uint32_t sw = 0;  ///< switch index
  NodeRole role = NodeRole::root;
  std::int32_t parent = -1;  ///< node index, -1 at the root
  std::uint16_t index_at_parent = 0;
  std::vector<TreeChild> children;  ///< index = child index on the wire
};

/// Where one rank sends.
struct RankPlace {
  std::uint32_t node = 0;         ///< its leaf's node index
  std::uint16_t child_index = 0;  ///< its child index there
};

/// A reserved tree.
struct Allocation {
  std::string job;
  std::uint16_t tree_id = 0;
  std::uint32_t slots = 0;
  std::uint32_t payload_bytes = 0;
  std::uint32_t dtype_mask = 0;  ///< what every switch of the tree offloads (intersection)
  std::uint32_t op_mask = 0;
  bool deterministic = false;
  std::uint32_t depth = 0;       ///< root level
  std::vector<TreeNode> nodes;   ///< nodes[0] is the root; parents before children
  std::vector<RankPlace> ranks;  ///< by rank
};

/// Tuning.
struct AllocatorOptions {
  /// Candidate roots (least used first) whose trees are built per round; the best tree of the
  /// first round with any feasible one is taken.
  std::uint32_t round = 16;
  /// Build a round's trees with tbb::parallel_for when the round has at least this many
  /// candidates; 0 = never. On 2 cores it cuts 945 to 719 us per 256-rank job at 64k hosts
  /// (docs/manager.md), and gains nothing when the cores are busy elsewhere.
  std::uint32_t parallel_threshold = 8;
};

/// Allocator over one topology. Holds per-switch usage and the live allocations.
class Allocator {
 public:
  explicit Allocator(const Topology& topo, AllocatorOptions opt = {});

  /// Chooses and reserves a tree. Refusals: invalid_argument (bad request, or masks that ask
  /// for no defined pair), already_exists (job has a tree), failed_precondition (no switch
  /// reaches every leaf, a switch cannot reduce a pair the job needs, the sentence naming the
  /// switch, its profile and the pair, or cannot run the mode; a drained switch the tree cannot do
  /// without, the sentence naming the drain), resource_exhausted (every candidate
  /// lacks capacity; the sentence names a switch and the resource that ran out).
  Result<Allocation> allocate(const JobRequest& req);
  /// Frees a job's tree. not_found when it has none.
  Status release(const std::string& job);
  /// Re-reserves a tree chosen earlier (manager restart). Checks ids, capacity and structure.
  Status adopt(const Allocation& a);

  /// Marks a switch up or down. Down switches take no new trees. Returns the jobs whose trees
  /// use it (they are not released: the registry decides).
  std::vector<std::string> set_switch_up(std::uint32_t sw, bool up);
  bool switch_up(std::uint32_t sw) const { return up_[sw] != 0; }

  /// Drains a switch (`drained`) or makes it eligible again: a drained switch takes no new
  /// trees, as if down, but keeps the ones it has. A refusal it causes names the drain and
  /// `reason` ("" = none given).
  void set_drained(std::uint32_t sw, bool drained, const std::string& reason = {});
  bool drained(std::uint32_t sw) const { return drained_[sw] != 0; }
  const std::string& drain_reason(std::uint32_t sw) const { return drain_reason_[sw]; }

  /// Replaces a switch's limits (a switch registered with its real ones). failed_precondition
  /// when what is in use would not fit the new limits.
  Status set_profile(std::uint32_t sw, const ResourceProfile& p);
  const ResourceProfile& profile(std::uint32_t sw) const { return prof_[sw]; }

  const Usage& usage(std::uint32_t sw) const { return used_[sw]; }
  const std::map<std::string, Allocation>& allocations() const noexcept { return jobs_; }
  const Topology& topology() const noexcept { return *topo_; }

  /// Moves onto another topology (JobRegistry::set_topology): `old_of[n]` is the index in the
  /// current topology of switch n of `next`, or -1 for a switch new to it. Per-switch state
  /// (usage, up, drain, limits) follows its switch by name; a new switch starts `new_up`,
  /// undrained, with its profile. A kept switch keeps its limits (those it registered with)
  /// unless `next` gives it another profile than the current topology did. Allocations are
  /// renumbered; tree ids stay. failed_precondition, and nothing changes, when an allocation
  /// uses a switch `next` lacks or no longer fits on a switch's new limits. `next` must outlive
  /// the allocator.
  Status rebase(const Topology& next, const std::vector<std::int64_t>& old_of, bool new_up);

 private:
  struct Plan;
  struct Ctx;
  bool plan_from(const Ctx& c, std::uint32_t root, Plan* plan) const;
  bool build(const Ctx& c, std::uint32_t sw, std::int32_t parent, std::uint16_t index_at_parent,
             std::vector<std::uint64_t> need, Plan* plan) const;
  bool admits(const Ctx& c, std::uint32_t sw, std::string* why) const;
  void commit(const Allocation& a, int sign);
  Result<std::uint16_t> take_tree_id();

  const Topology* topo_;  // a pointer, so that rebase() can move the allocator on
  AllocatorOptions opt_;
  std::vector<ResourceProfile> prof_;
  std::vector<Usage> used_;
  std::vector<std::uint8_t> up_;
  std::vector<std::uint8_t> drained_;
  std::vector<std::string> drain_reason_;
  std::map<std::string, Allocation> jobs_;
  std::vector<std::uint8_t> tree_ids_;  ///< 1 = in use; id 0 is never handed out
  std::uint32_t next_id_ = 1;
};

}  // namespace treeduce::ctl
