/// @file
/// The job registry: ranks join jobs, the registry allocates and installs trees, leases expire,
/// switches register and fail. Pure C++: the gRPC edge (control/grpc/) translates calls and
/// Status codes; switches are reached through the SwitchClient interface so that tests can run
/// the registry against in-process agents.
///
/// Thread-safe: one mutex guards everything. Tree installs run under it (bounded by the
/// client's deadline), which serialises allocations; joins of other jobs wait meanwhile.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "treeduce/common/status.h"
#include "treeduce/control/allocator.h"
#include "treeduce/control/store.h"
#include "treeduce/control/topology.h"

namespace treeduce::ctl {

/// One child of a tree on one switch, ready for the switch (dp::ChildConfig).
struct InstallChild {
  Address addr;
  std::uint16_t hosts = 1;  ///< ranks below this child
};

/// One tree on one switch (mirrors dp::TreeConfig plus the switch's name).
struct TreeInstall {
  std::string switch_name;
  std::string job;
  std::uint16_t tree_id = 0;
  std::uint64_t key = 0;
  NodeRole role = NodeRole::root;
  Address parent;
  std::uint16_t index_at_parent = 0;
  std::vector<InstallChild> children;
  std::uint32_t slots = 0;
  std::uint32_t payload_bytes = 0;
  std::uint32_t dtype_mask = 0;
  std::uint32_t op_mask = 0;
  bool deterministic = false;
  bool operator==(const TreeInstall&) const = default;
};
inline bool operator==(const InstallChild& a, const InstallChild& b) {
  return a.addr == b.addr && a.hosts == b.hosts;
}

/// How the registry reaches switch agents. Implementations must bound every call's time.
class SwitchClient {
 public:
  virtual ~SwitchClient() = default;
  /// unavailable/deadline_exceeded mean the switch is unreachable (it is marked down).
  virtual Status install(const std::string& agent, const TreeInstall& t) = 0;
  virtual Status remove(const std::string& agent, const std::string& switch_name,
                        std::uint16_t tree_id) = 0;
};

/// A tree a switch says it holds when it registers (RegisterRequest.trees).
struct HeldTree {
  std::uint16_t tree_id = 0;
  std::string job;
  std::uint64_t key = 0;
};

/// What a registration did to bring the switch in line with the registry (reconciliation).
struct Reconciled {
  std::vector<std::uint16_t> removed;      ///< stale trees removed from the switch
  std::vector<std::uint16_t> reinstalled;  ///< known trees installed again
};

/// What a rank sends to join.
struct JoinArgs {
  std::string job;
  std::uint32_t rank = 0;
  std::uint32_t world = 0;
  std::string host;  ///< name or dotted IPv4
  std::uint16_t port = 0;
  std::uint32_t slots = 16;
  std::uint32_t payload_bytes = 1024;
  std::uint32_t dtype_mask = 0;  ///< pairs needed in the network (JobRequest); 0, 0 = none
  std::uint32_t op_mask = 0;
  bool deterministic = false;
  /// The caller's identity (its certificate's name with TLS; "" without). A job belongs to the
  /// identity of its first join: a join or credential-less abort from another is refused.
  std::string owner;
};

/// What one switch of a job's tree offloads, so that a rank reducing a pair on the hosts can
/// name the switch model that cannot (docs/manager.md, "What a tree offloads").
struct SwitchCaps {
  std::string name;     ///< the switch
  std::string profile;  ///< its resource profile (the switch model)
  std::uint32_t dtype_mask = 0;
  std::uint32_t op_mask = 0;
  bool operator==(const SwitchCaps&) const = default;
};

/// What a rank gets back.
struct RankAssignment {
  std::uint16_t tree_id = 0;
  std::string leaf_switch;
  Address leaf;
  std::uint16_t child_index = 0;
  std::uint32_t slots = 0;
  std::uint32_t payload_bytes = 0;
  std::uint64_t key = 0;
  std::uint32_t dtype_mask = 0;  ///< the tree offloads the defined pairs of dtype_mask x op_mask
  std::uint32_t op_mask = 0;
  bool deterministic = false;
  std::uint32_t depth = 0;
  std::uint64_t lease_ms = 0;
  std::vector<SwitchCaps> switches;  ///< the tree's switches, root first
  std::string credential;            ///< the job's credential (JobRegistry::check_credential)
};

enum class JobState : std::uint8_t { gathering = 1, running = 2, refused = 3, failed = 4 };
std::string_view name(JobState s) noexcept;

/// Snapshot of a job for queries.
struct JobView {
  std::string job;
  JobState state = JobState::gathering;
  std::string reason;
  std::uint32_t world = 0;
  std::uint32_t joined = 0;
  std::optional<Allocation> tree;
  /// The tree's switches by name, root first (tree->nodes[i].sw indexes the topology of the
  /// moment: JobRegistry::set_topology may renumber).
  std::vector<std::string> tree_switches;
};

/// Snapshot of a switch for queries.
struct SwitchView {
  std::uint32_t index = 0;  ///< in the topology of the moment
  std::string name;
  std::uint32_t level = 0;
  Address data;
  bool up = false;
  bool registered = false;
  std::string agent;
  ResourceProfile profile;
  Usage used;
  bool drained = false;      ///< JobRegistry::drain_switch
  std::string drain_reason;  ///< "" when none was given
};

/// What JobRegistry::set_topology changed, by name. A link is "lower-upper" (switch names).
/// A kept switch is changed when its level, addresses, ports or profile differ; a kept host
/// when its data address, leaf or port does.
struct TopologyChange {
  std::vector<std::string> switches_added, switches_removed, switches_changed;
  std::vector<std::string> hosts_added, hosts_removed, hosts_changed;
  std::vector<std::string> links_added, links_removed;
};

/// Settings.
struct RegistryOptions {
  std::uint64_t lease_ms = 10000;         ///< rank lease
  std::uint64_t switch_lease_ms = 10000;  ///< switch heartbeat lease
  /// Switches take trees only once registered. Off for tests that need no agents.
  bool require_registration = true;
  /// Milliseconds on a monotonic clock; tests substitute their own.
  std::function<std::int64_t()> clock;
  std::uint32_t max_world = 65535;  ///< a child's rank count is 16 bits on the wire
  std::uint32_t max_jobs = 16384;   ///< live jobs, gathering or not: bounds hostile joiners
  /// Where every change is written before the call that made it returns; nullptr = memory only.
  Store* store = nullptr;
  /// After a restart, ranks and switches get at least this long to check in again: agents and
  /// hosts back off while the manager is away (gRPC reconnects after up to seconds).
  std::uint64_t restore_grace_ms = 15000;
  /// How long a job a rank aborted (JobRegistry::abort) is remembered: longer than a launcher's
  /// spread between its ranks' starts, short enough that a corrected job may reuse the name.
  std::uint64_t abort_hold_ms = 60000;
  /// topology_hash() of the --topology file the manager started from, stored with a topology
  /// that set_topology applies: the next start tells an edited file from an unchanged one
  /// (startup_topology(), topology_source.h).
  std::string topology_file_hash;
};

/// The job registry.
class JobRegistry {
 public:
  /// Copies `topo`: set_topology() may replace it later.
  JobRegistry(const Topology& topo, SwitchClient& client, RegistryOptions opt = {});

  /// Joins and waits up to `wait_ms` for the assignment (see JobService.Join in the .proto).
  Result<RankAssignment> join(const JoinArgs& a, std::uint64_t wait_ms);
  /// The job's credential: a random secret made at its first join, kept with the job (and in
  /// the store), that its ranks show for heartbeat, leave and queries. "" for an unknown job.
  std::string credential_of(const std::string& job) const;
  /// Ok when `credential` is job's. not_found for an unknown job, unauthenticated for an empty
  /// credential, permission_denied for another; the sentence names `call` and the job.
  Status check_credential(const std::string& job, const std::string& credential,
                          const std::string& call) const;
  /// Renews a lease. not_found when the rank is not in the job.
  Result<JobView> heartbeat(const std::string& job, std::uint32_t rank);
  /// A rank leaves; the last one out ends the job and removes its tree.
  Status leave(const std::string& job, std::uint32_t rank);
  /// A rank that cannot start (JobService.Abort; `rank` unknown when its own variable is the
  /// malformed one) fails its gathering job for every rank: joins waiting or to come return
  /// invalid_argument "Rank R of job 'J' cannot start: <why> Fix its environment and start the
  /// job again." The job is kept (in memory only) for RegistryOptions::abort_hold_ms, a job not
  /// yet known too, so that ranks starting after the report learn it; the reporting rank's own
  /// Join (a fixed restart) clears it. failed_precondition when the job is running.
  /// `owner`: the caller's identity (JoinArgs::owner); an abort for a job of another identity is
  /// permission_denied, and a held abort applies only to joins of the identity that made it.
  Status abort(const std::string& job, std::optional<std::uint32_t> rank, const std::string& why,
               const std::string& owner = {});

  /// A switch agent announces itself (and optionally its real limits) with the trees it holds:
  /// those no job has on it (by id and key) are removed through the SwitchClient, the trees of
  /// its jobs it lacks are installed again, before the call returns (under the registry's lock,
  /// so no allocation can reuse a stale tree's id in between). unavailable when the agent does
  /// not answer; a job whose tree the switch refuses to take back fails.
  Result<Reconciled> register_switch(const std::string& name, const std::string& agent,
                                     const std::optional<ResourceProfile>& limits,
                                     const std::vector<HeldTree>& held = {});
  Status switch_heartbeat(const std::string& name);
  /// Marks a switch failed: its jobs fail (ranks are told through heartbeats) and free their
  /// trees on the other switches.
  Status fail_switch(const std::string& name, const std::string& why);
  /// Drains a switch (`drain`) or makes it eligible again. A drained switch takes no new trees
  /// (the allocator routes around it as if it were down; a job that cannot do without it is
  /// refused with a sentence naming the drain and `reason`); the jobs it carries run on until
  /// they leave, and it keeps registering and heartbeating. The drain is stored and survives a
  /// restart, and a re-registration or a failure does not lift it. not_found for a switch the
  /// topology lacks, invalid_argument for a reason that is not one line of UTF-8 text of at most
  /// 200 bytes.
  Status drain_switch(const std::string& name, bool drain, const std::string& reason);

  /// Replaces the topology at run time with the one `yaml` describes (the format of
  /// load_topology_yaml). invalid_argument with the loader's sentence when it is not valid;
  /// failed_precondition naming the jobs and elements when it would remove or change a switch,
  /// host or link that a gathering or running job uses (drain first), or when a kept switch's
  /// new profile is below what its trees use. Nothing changes on a refusal. Otherwise applied
  /// at once: the jobs keep their trees; registered switches the new topology lacks are
  /// forgotten; kept switches keep their registration, lease, drain, up/down state and limits
  /// (a profile the new file changes replaces them); failed or refused jobs whose hosts are
  /// gone are forgotten. Stored (with RegistryOptions::topology_file_hash) so that a restart
  /// keeps it.
  Result<TopologyChange> set_topology(const std::string& yaml);
  /// The same for text already loaded: `loaded` is what load_topology_yaml(yaml) returned, and
  /// `yaml` is kept for a restart. For a caller that loads outside the registry (the registry
  /// fuzzer applies fabrics it parsed once).
  Result<TopologyChange> set_topology(Topology loaded, const std::string& yaml);

  /// Loads jobs, trees and switches from the store after a restart. Trees are re-reserved
  /// (Allocator::adopt) but not re-installed: the switches still hold them and their traffic
  /// never stops. Every rank and registered switch gets a fresh lease to check in again.
  /// Returns how many jobs came back.
  Result<std::size_t> restore();

  /// Expires rank and switch leases. The daemon calls it periodically.
  void sweep();
  /// Wakes every waiting join with `unavailable` and refuses new joins: the server is stopping
  /// and must not wait out 30-second joins.
  void close();

  std::vector<JobView> jobs() const;
  std::vector<SwitchView> switches() const;
  /// The topology of the moment; the snapshot stays valid after a set_topology().
  std::shared_ptr<const Topology> topology() const;
  std::uint64_t lease_ms() const noexcept { return opt_.lease_ms; }
  std::uint64_t switch_lease_ms() const noexcept { return opt_.switch_lease_ms; }

  /// The per-switch install messages of a tree (what each switch is told); rank r's RESULTs
  /// go to rank_addr[r].
  std::vector<TreeInstall> installs_for(const Allocation& a, std::uint64_t key,
                                        const std::vector<Address>& rank_addr) const;

 private:
  struct Rank {
    std::uint32_t host = 0;
    std::uint16_t port = 0;
    std::int64_t lease_until = 0;
    bool left = false;
    int waiting = 0;  // inside join(): alive whatever its lease says
  };
  struct Job {
    JoinArgs params;  // first rank's sizes; the others must match
    JobState state = JobState::gathering;
    std::string reason;
    Status refusal;
    std::map<std::uint32_t, Rank> ranks;
    std::optional<Allocation> tree;
    std::uint64_t key = 0;
    std::string credential;  ///< see credential_of()
    std::string owner;       ///< JoinArgs::owner of the join (or abort) that made the job
    /// A rank reported it cannot start (abort()): every join gets `refusal` until hold_until.
    bool aborted = false;
    std::optional<std::uint32_t> aborted_rank;
    std::int64_t hold_until = 0;
  };
  struct Sw {
    bool registered = false;
    std::int64_t lease_until = 0;
    std::string agent;
  };

  std::int64_t now() const { return opt_.clock(); }
  Status validate(const JoinArgs& a, std::uint32_t* host) const;
  void try_start(const std::string& name, Job& j);
  Status install_tree(Job& j);
  /// One install; a tree the switch already holds under the id with another configuration is
  /// stale (ids are the registry's) and is removed first.
  Status install_on(std::uint32_t sw, const TreeInstall& t);
  void remove_tree(Job& j);
  /// Brings switch `sw` (its agent address set) in line with the jobs: see register_switch.
  Result<Reconciled> reconcile(std::uint32_t sw, const std::vector<HeldTree>& held);
  void end_job(std::map<std::string, Job>::iterator it);
  void fail_jobs_on(std::uint32_t sw, const std::string& why);
  /// A switch agent's RPC, made with mu_ held: heartbeats wait for mu_ meanwhile, so the time it
  /// takes is added to every lease (a slow agent on a loaded machine must not make the other
  /// switches and the ranks look dead).
  Status agent_install(std::uint32_t sw, const TreeInstall& t);
  Status agent_remove(std::uint32_t sw, const std::string& switch_name, std::uint16_t tree_id);
  void extend_leases(std::int64_t ms);
  void touch(const std::string& job) { dirty_jobs_.insert(job); }
  void touch_switch(std::uint32_t sw) { dirty_sw_.insert(sw); }
  /// Writes what was touched in one transaction. A store failure is logged, not returned: the
  /// in-memory state is still right, only a later restart would lose the change.
  void flush();
  std::string job_doc(const Job& j) const;
  std::string switch_doc(std::uint32_t sw) const;
  RankAssignment assignment(const Job& j, std::uint32_t rank) const;

  /// Replaced whole by set_topology() (under mu_); indices in jobs, trees and sw_ refer to it.
  std::shared_ptr<const Topology> topo_;
  SwitchClient& client_;
  RegistryOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Allocator alloc_;
  std::map<std::string, Job> jobs_;
  std::vector<Sw> sw_;
  std::uint64_t key_state_;
  bool closed_ = false;
  std::set<std::string> dirty_jobs_;
  std::set<std::uint32_t> dirty_sw_;
  std::vector<std::string> gone_sw_;         ///< switches set_topology() dropped
  std::optional<std::string> topology_doc_;  ///< an applied topology to store
};

}  // namespace treeduce::ctl
