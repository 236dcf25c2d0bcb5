#include "treeduce/control/registry.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <bit>
#include <cctype>
#include <iostream>
#include <random>

#include <sys/random.h>

#include "treeduce/control/topology_source.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::ctl {

namespace {

std::int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool good_job_name(const std::string& s) {
  if (s.empty() || s.size() > 128) return false;
  for (char ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' ||
          ch == ':'))
      return false;
  return true;
}

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool unreachable(const Status& s) {
  return s.code() == Code::unavailable || s.code() == Code::deadline_exceeded;
}

// A job belongs to the identity (certificate name) of the call that made it.
Status not_owner(const std::string& job, const std::string& owner, const std::string& caller,
                 const char* what) {
  const auto who = [](const std::string& id) {
    return id.empty() ? std::string("a caller without a certificate") : "identity '" + id + "'";
  };
  return permission_denied("Job '" + job + "' belongs to " + who(owner) + "; " + who(caller) +
                           " cannot " + what +
                           " it (a job's ranks share one identity; pick another job name).");
}

// A job's credential: 128 bits from the kernel's CSPRNG, in hex. Unguessable, unlike the tree
// keys (splitmix), which only tell trees apart.
std::string new_credential() {
  unsigned char b[16];
  std::size_t got = 0;
  while (got < sizeof b) {
    const ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n > 0) got += std::size_t(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += hex[c >> 4];
    out += hex[c & 15];
  }
  return out;
}

// Compares without stopping at the first difference: the time of a refusal tells nothing of
// how much of a guess was right.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i]);
  return d == 0;
}

// One line of valid UTF-8 (no control characters): what may go into logs, tables, JSON
// documents (nlohmann refuses to write invalid UTF-8) and proto3 strings.
bool one_line_utf8(const std::string& s) {
  for (unsigned char c : s)
    if (c < 0x20 || c == 0x7f) return false;
  return utf8_valid_prefix(s) == s.size();
}

}  // namespace

std::string_view name(JobState s) noexcept {
  switch (s) {
    case JobState::gathering:
      return "gathering";
    case JobState::running:
      return "running";
    case JobState::refused:
      return "refused";
    case JobState::failed:
      return "failed";
  }
  return "unknown";
}

JobRegistry::JobRegistry(const Topology& topo, SwitchClient& client, RegistryOptions opt)
    : topo_(std::make_shared<const Topology>(topo)),
      client_(client),
      opt_(std::move(opt)),
      alloc_(*topo_),
      sw_(topo.switches.size()) {
  if (!opt_.clock) opt_.clock = steady_ms;
  // Job keys guard against stray packets of other jobs, not against attackers on the wire
  // (docs/manager.md): a seeded mixer is enough.
  key_state_ = (std::uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
  if (opt_.require_registration)
    for (std::uint32_t i = 0; i < sw_.size(); ++i) alloc_.set_switch_up(i, false);
}

Status JobRegistry::validate(const JoinArgs& a, std::uint32_t* host) const {
  if (!good_job_name(a.job))
    return invalid_argument("A job name must be 1 to 128 letters, digits or . _ - : characters.");
  if (a.world == 0 || a.world > opt_.max_world)
    return invalid_argument("World size " + std::to_string(a.world) + " of job '" + a.job +
                            "' is outside 1.." + std::to_string(opt_.max_world) + ".");
  if (std::uint64_t(a.world) > std::uint64_t(topo_->hosts.size()) * 64)
    return invalid_argument("World size " + std::to_string(a.world) + " of job '" + a.job +
                            "' exceeds what " + std::to_string(topo_->hosts.size()) +
                            " hosts with at most 64 ranks each can hold.");
  if (a.rank >= a.world)
    return invalid_argument("Rank " + std::to_string(a.rank) + " does not exist in job '" + a.job +
                            "' of world size " + std::to_string(a.world) + ".");
  if (auto bad = proto::check_slots(a.slots))
    return invalid_argument("Job '" + a.job + "': " + *bad);
  if (auto bad = proto::check_payload_bytes(a.payload_bytes))
    return invalid_argument("Job '" + a.job + "': " + *bad);
  if (a.dtype_mask > proto::kAllDTypesMask || a.op_mask > proto::kAllOpsMask)
    return invalid_argument("The job asks for an element type or operation that does not exist.");
  if ((a.dtype_mask != 0 || a.op_mask != 0) &&
      count_pairs(a.dtype_mask ? a.dtype_mask : kAllDTypesMask,
                  a.op_mask ? a.op_mask : kAllOpsMask) == 0)
    return invalid_argument(
        "Job '" + a.job +
        "' asks for element types and operations that make no defined pair "
        "(" +
        std::string(op_refusal(static_cast<DType>(std::countr_zero(a.dtype_mask)),
                               static_cast<ReduceOp>(std::countr_zero(a.op_mask)))) +
        ").");
  if (a.port == 0)
    return invalid_argument("Rank " + std::to_string(a.rank) + " gave no UDP port for results.");
  std::int64_t h = topo_->find_host(a.host);
  if (h < 0) {
    auto ip = parse_address(a.host);
    if (ip.ok() && ip->port == 0) h = topo_->find_host_by_ip(ip->ip);
  }
  if (h < 0)
    return not_found("Host '" + a.host + "' of rank " + std::to_string(a.rank) +
                     " is not in the topology.");
  *host = std::uint32_t(h);
  return Status::Ok();
}

Result<RankAssignment> JobRegistry::join(const JoinArgs& a, std::uint64_t wait_ms) {
  std::uint32_t host = 0;
  std::unique_lock lock(mu_);  // before validate(): set_topology() may renumber hosts
  if (Status s = validate(a, &host); !s.ok()) return s;
  if (closed_) return unavailable("The manager is shutting down; join again when it is back.");
  auto it = jobs_.find(a.job);
  if (it != jobs_.end() && it->second.aborted) {
    // The rank that reported joins again: its environment was fixed, the job starts afresh. An
    // abort another identity made is not from one of this job's ranks: it is forgotten.
    if (it->second.aborted_rank != a.rank && it->second.owner == a.owner) return it->second.refusal;
    end_job(it);
    it = jobs_.end();
  }
  if (it == jobs_.end()) {
    if (jobs_.size() >= opt_.max_jobs)
      return resource_exhausted("The manager already tracks " + std::to_string(jobs_.size()) +
                                " jobs; try again later.");
    it = jobs_.emplace(a.job, Job{}).first;
    it->second.params = a;
    it->second.credential = new_credential();
    it->second.owner = a.owner;
  }
  Job& j = it->second;
  if (j.owner != a.owner) return not_owner(a.job, j.owner, a.owner, "join");
  const JoinArgs& p = j.params;
  if (p.world != a.world)
    return invalid_argument("Rank " + std::to_string(a.rank) + " says job '" + a.job +
                            "' has world size " + std::to_string(a.world) +
                            ", but it was started with " + std::to_string(p.world) + ".");
  if (p.slots != a.slots || p.payload_bytes != a.payload_bytes || p.dtype_mask != a.dtype_mask ||
      p.op_mask != a.op_mask || p.deterministic != a.deterministic)
    return invalid_argument("Rank " + std::to_string(a.rank) + " asks job '" + a.job +
                            "' for other slots, payload, types or mode than its first rank did.");
  auto r = j.ranks.find(a.rank);
  if (r != j.ranks.end()) {
    if (r->second.left)
      return failed_precondition("Rank " + std::to_string(a.rank) + " has left job '" + a.job +
                                 "'.");
    if (r->second.host != host || r->second.port != a.port)
      return already_exists("Rank " + std::to_string(a.rank) + " of job '" + a.job +
                            "' already joined from " + topo_->hosts[r->second.host].name +
                            " port " + std::to_string(r->second.port) + ".");
    // Same endpoint: a retry after DEADLINE_EXCEEDED or a lost reply.
  } else {
    if (j.state != JobState::gathering)
      return failed_precondition("Job '" + a.job + "' already has all its ranks.");
    r = j.ranks.emplace(a.rank, Rank{host, a.port, 0, false, 0}).first;
    touch(a.job);
  }
  r->second.lease_until = now() + std::int64_t(opt_.lease_ms);
  if (j.state == JobState::gathering && j.ranks.size() == j.params.world) {
    try_start(a.job, j);
    touch(a.job);
    cv_.notify_all();
  }
  flush();
  ++r->second.waiting;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  cv_.wait_until(lock, deadline, [&] {
    auto f = jobs_.find(a.job);
    return closed_ || f == jobs_.end() || f->second.state != JobState::gathering;
  });
  if (closed_) return unavailable("The manager is shutting down; join again when it is back.");
  it = jobs_.find(a.job);
  if (it == jobs_.end())
    return Status(Code::aborted,
                  "Job '" + a.job + "' ended while rank " + std::to_string(a.rank) + " waited.");
  Job& jj = it->second;
  if (auto rr = jj.ranks.find(a.rank); rr != jj.ranks.end()) {
    --rr->second.waiting;
    rr->second.lease_until = now() + std::int64_t(opt_.lease_ms);
  }
  switch (jj.state) {
    case JobState::running:
      return assignment(jj, a.rank);
    case JobState::refused:
      return jj.refusal;
    case JobState::failed:
      return jj.aborted ? jj.refusal : unavailable(jj.reason);
    case JobState::gathering:
      break;
  }
  return Status(Code::deadline_exceeded,
                "Job '" + a.job + "' has " + std::to_string(jj.ranks.size()) + " of " +
                    std::to_string(jj.params.world) + " ranks after " + std::to_string(wait_ms) +
                    " ms; rank " + std::to_string(a.rank) + " stays joined: call Join again.");
}

void JobRegistry::try_start(const std::string& name, Job& j) {
  // A switch found dead during install is marked down; the next attempt avoids it.
  for (int attempt = 0; attempt < 4; ++attempt) {
    JobRequest req;
    req.job = name;
    req.slots = j.params.slots;
    req.payload_bytes = j.params.payload_bytes;
    req.dtype_mask = j.params.dtype_mask;
    req.op_mask = j.params.op_mask;
    req.deterministic = j.params.deterministic;
    for (const auto& [rank, r] : j.ranks) req.rank_host.push_back(r.host);
    auto a = alloc_.allocate(req);
    if (!a.ok()) {
      j.state = JobState::refused;
      j.refusal = a.status();
      j.reason = a.status().message();
      return;
    }
    j.tree = *a;
    j.key = splitmix(key_state_);
    Status s = install_tree(j);
    if (s.ok()) {
      j.state = JobState::running;
      return;
    }
    remove_tree(j);
    if (!unreachable(s) || attempt == 3) {
      j.state = JobState::failed;
      j.reason = s.message();
      return;
    }
  }
}

std::vector<TreeInstall> JobRegistry::installs_for(const Allocation& a, std::uint64_t key,
                                                   const std::vector<Address>& rank_addr) const {
  // Ranks below each node: children come after their parents in `nodes`.
  std::vector<std::uint32_t> below(a.nodes.size(), 0);
  for (std::size_t i = a.nodes.size(); i-- > 0;)
    for (const TreeChild& c : a.nodes[i].children) below[i] += c.is_rank ? 1 : below[c.id];
  std::vector<TreeInstall> out;
  for (const TreeNode& n : a.nodes) {
    TreeInstall t;
    t.switch_name = topo_->switches[n.sw].name;
    t.job = a.job;
    t.tree_id = a.tree_id;
    t.key = key;
    t.role = n.role;
    if (n.parent >= 0) t.parent = topo_->switches[a.nodes[std::size_t(n.parent)].sw].data;
    t.index_at_parent = n.index_at_parent;
    for (const TreeChild& c : n.children) {
      if (c.is_rank)
        t.children.push_back({rank_addr[c.id], 1});
      else
        t.children.push_back({topo_->switches[a.nodes[c.id].sw].data, std::uint16_t(below[c.id])});
    }
    t.slots = a.slots;
    t.payload_bytes = a.payload_bytes;
    t.dtype_mask = a.dtype_mask;
    t.op_mask = a.op_mask;
    t.deterministic = a.deterministic;
    out.push_back(std::move(t));
  }
  return out;
}

Status JobRegistry::install_tree(Job& j) {
  std::vector<Address> addr;
  for (const auto& [rank, r] : j.ranks) addr.push_back({topo_->hosts[r.host].data.ip, r.port});
  const auto installs = installs_for(*j.tree, j.key, addr);
  // Leaves last would let a host's first packet find its leaf before the root exists; install
  // root first (nodes order) so every parent is ready before its children forward to it.
  for (std::size_t i = 0; i < installs.size(); ++i) {
    const std::uint32_t sw = j.tree->nodes[i].sw;
    Status s = install_on(sw, installs[i]);
    if (!s.ok()) {
      Status out(s.code(), "Switch " + installs[i].switch_name + " did not take tree " +
                               std::to_string(j.tree->tree_id) + " of job '" + j.tree->job +
                               "': " + s.message());
      // Roll back what went in; the failed switch holds nothing of this tree.
      for (std::size_t k = 0; k < i; ++k)
        (void)agent_remove(j.tree->nodes[k].sw, installs[k].switch_name, j.tree->tree_id);
      (void)alloc_.release(j.tree->job);
      j.tree.reset();
      if (unreachable(s)) {
        sw_[sw].lease_until = 0;
        fail_jobs_on(sw, "did not answer an install");
      }
      return out;
    }
  }
  return Status::Ok();
}

Status JobRegistry::install_on(std::uint32_t sw, const TreeInstall& t) {
  Status s = agent_install(sw, t);
  if (s.code() != Code::already_exists) return s;
  // No live job of this registry has the id (the allocator hands each out once), so what the
  // switch holds under it is left over from a manager that forgot it: replace it.
  std::cerr << "treeduce-manager: switch " << t.switch_name << " holds a stale tree " << t.tree_id
            << "; removing it for job '" << t.job << "'\n";
  if (Status r = agent_remove(sw, t.switch_name, t.tree_id); !r.ok() && r.code() != Code::not_found)
    return r;
  return agent_install(sw, t);
}

Status JobRegistry::agent_install(std::uint32_t sw, const TreeInstall& t) {
  const std::int64_t t0 = now();
  Status s = client_.install(sw_[sw].agent, t);
  extend_leases(now() - t0);
  return s;
}

Status JobRegistry::agent_remove(std::uint32_t sw, const std::string& switch_name,
                                 std::uint16_t tree_id) {
  const std::int64_t t0 = now();
  Status s = client_.remove(sw_[sw].agent, switch_name, tree_id);
  extend_leases(now() - t0);
  return s;
}

// Every lease that runs gets the time back: only silence while the manager could listen counts.
void JobRegistry::extend_leases(std::int64_t ms) {
  if (ms <= 0) return;
  for (Sw& s : sw_)
    if (s.registered && s.lease_until > 0) s.lease_until += ms;
  for (auto& [name, j] : jobs_)
    for (auto& [r, rk] : j.ranks)
      if (!rk.left) rk.lease_until += ms;
}

void JobRegistry::remove_tree(Job& j) {
  if (!j.tree) return;
  for (const TreeNode& n : j.tree->nodes)
    if (alloc_.switch_up(n.sw))
      (void)agent_remove(n.sw, topo_->switches[n.sw].name, j.tree->tree_id);
  (void)alloc_.release(j.tree->job);
  j.tree.reset();
}

void JobRegistry::fail_jobs_on(std::uint32_t sw, const std::string& why) {
  const std::string& sname = topo_->switches[sw].name;
  touch_switch(sw);
  for (const std::string& job : alloc_.set_switch_up(sw, false)) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) continue;
    remove_tree(it->second);
    touch(job);
    it->second.state = JobState::failed;
    it->second.reason = "Switch " + sname + " of job '" + job + "' failed (" + why +
                        "); its tree was removed: reduce on the hosts.";
  }
  cv_.notify_all();
}

RankAssignment JobRegistry::assignment(const Job& j, std::uint32_t rank) const {
  const Allocation& a = *j.tree;
  RankAssignment out;
  out.tree_id = a.tree_id;
  const RankPlace& p = a.ranks[rank];  // a started job has every rank 0..world-1
  const std::uint32_t sw = a.nodes[p.node].sw;
  out.leaf_switch = topo_->switches[sw].name;
  out.leaf = topo_->switches[sw].data;
  out.child_index = p.child_index;
  out.slots = a.slots;
  out.payload_bytes = a.payload_bytes;
  out.key = j.key;
  out.credential = j.credential;
  out.dtype_mask = a.dtype_mask;
  out.op_mask = a.op_mask;
  out.deterministic = a.deterministic;
  out.depth = a.depth;
  out.lease_ms = opt_.lease_ms;
  for (const TreeNode& n : a.nodes) {
    const ResourceProfile& prof = alloc_.profile(n.sw);
    out.switches.push_back({topo_->switches[n.sw].name, prof.name, prof.dtype_mask, prof.op_mask});
  }
  return out;
}

std::string JobRegistry::credential_of(const std::string& job) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? std::string() : it->second.credential;
}

Status JobRegistry::check_credential(const std::string& job, const std::string& credential,
                                     const std::string& call) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return not_found("Job '" + job + "' is not known to the manager.");
  if (credential.empty())
    return unauthenticated(call + " of job '" + job +
                           "' carries no job credential; only the job's ranks, with the "
                           "credential Join gave them, may make it.");
  if (!same_secret(credential, it->second.credential))
    return permission_denied(call + " of job '" + job +
                             "' carries a credential that is not the job's (another job's, or "
                             "one from before the job started again).");
  return Status::Ok();
}

Result<JobView> JobRegistry::heartbeat(const std::string& job, std::uint32_t rank) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return not_found("Job '" + job + "' is not known to the manager.");
  auto r = it->second.ranks.find(rank);
  if (r == it->second.ranks.end() || r->second.left)
    return not_found("Rank " + std::to_string(rank) + " is not in job '" + job + "'.");
  r->second.lease_until = now() + std::int64_t(opt_.lease_ms);
  const Job& j = it->second;
  JobView v{job, j.state, j.reason, j.params.world, std::uint32_t(j.ranks.size()), j.tree, {}};
  return v;
}

void JobRegistry::end_job(std::map<std::string, Job>::iterator it) {
  touch(it->first);
  remove_tree(it->second);
  jobs_.erase(it);
  cv_.notify_all();
}

Status JobRegistry::leave(const std::string& job, std::uint32_t rank) {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return not_found("Job '" + job + "' is not known to the manager.");
  Job& j = it->second;
  auto r = j.ranks.find(rank);
  if (r == j.ranks.end() || r->second.left)
    return not_found("Rank " + std::to_string(rank) + " is not in job '" + job + "'.");
  touch(job);
  if (j.state == JobState::gathering) {
    j.ranks.erase(r);
    if (j.ranks.empty()) end_job(it);
  } else {
    r->second.left = true;
    if (std::all_of(j.ranks.begin(), j.ranks.end(), [](const auto& kv) { return kv.second.left; }))
      end_job(it);
  }
  flush();
  return Status::Ok();
}

Status JobRegistry::abort(const std::string& job, std::optional<std::uint32_t> rank,
                          const std::string& why, const std::string& owner) {
  if (!good_job_name(job))
    return invalid_argument("A job name must be 1 to 128 letters, digits or . _ - : characters.");
  if (why.empty()) return invalid_argument("An abort needs a reason.");
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    if (jobs_.size() >= opt_.max_jobs)
      return resource_exhausted("The manager already tracks " + std::to_string(jobs_.size()) +
                                " jobs; try again later.");
    it = jobs_.emplace(job, Job{}).first;
    it->second.params.job = job;
    it->second.owner = owner;
  }
  Job& j = it->second;
  if (j.owner != owner) return not_owner(job, j.owner, owner, "abort");
  if (j.state == JobState::running)
    return failed_precondition("Job '" + job +
                               "' is running with all its ranks; a rank that cannot start is "
                               "not one of them.");
  // A reason of at most a few lines: it is repeated to every rank.
  const std::string reason = why.size() > 1024 ? why.substr(0, 1024) + "..." : why;
  if (!j.aborted) {
    j.aborted = true;
    j.aborted_rank = rank;
    j.state = JobState::failed;
    j.reason = (rank ? "Rank " + std::to_string(*rank) : std::string("A rank")) + " of job '" +
               job + "' cannot start: " + reason + " Fix its environment and start the job again.";
    j.refusal = invalid_argument(j.reason);
  }
  j.hold_until = now() + std::int64_t(opt_.abort_hold_ms);
  cv_.notify_all();
  return Status::Ok();
}

void JobRegistry::sweep() {
  std::lock_guard lock(mu_);
  const std::int64_t t = now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    Job& j = it->second;
    for (auto r = j.ranks.begin(); r != j.ranks.end();) {
      Rank& rk = r->second;
      if (rk.left || rk.waiting || rk.lease_until > t) {
        ++r;
        continue;
      }
      touch(it->first);
      if (j.state == JobState::gathering) {
        r = j.ranks.erase(r);
        continue;
      }
      rk.left = true;
      if (j.state == JobState::running) {
        remove_tree(j);
        j.state = JobState::failed;
        j.reason = "The lease of rank " + std::to_string(r->first) + " of job '" + it->first +
                   "' expired; the job's tree was removed: reduce on the hosts.";
        cv_.notify_all();
      }
      ++r;
    }
    const bool empty = j.ranks.empty() || std::all_of(j.ranks.begin(), j.ranks.end(),
                                                      [](auto& kv) { return kv.second.left; });
    if (j.aborted ? j.hold_until <= t : empty) {
      touch(it->first);
      remove_tree(j);
      it = jobs_.erase(it);
      cv_.notify_all();
    } else {
      ++it;
    }
  }
  for (std::uint32_t s = 0; s < sw_.size(); ++s)
    if (sw_[s].registered && alloc_.switch_up(s) && sw_[s].lease_until <= t)
      fail_jobs_on(s, "its heartbeats stopped");
  flush();
}

Result<Reconciled> JobRegistry::register_switch(const std::string& name, const std::string& agent,
                                                const std::optional<ResourceProfile>& limits,
                                                const std::vector<HeldTree>& held) {
  std::lock_guard lock(mu_);
  std::int64_t sw = topo_->find_switch(name);
  if (sw < 0) return not_found("Switch '" + name + "' is not in the topology.");
  if (agent.empty() || agent.find(':') == std::string::npos)
    return invalid_argument("Switch '" + name + "' gave no agent address (host:port).");
  if (limits) {
    if (limits->max_children > 64 || limits->max_payload_bytes > proto::kMaxPayloadBytes)
      return invalid_argument("Switch '" + name +
                              "' reports more than 64 children or 8 KiB per slot, which the "
                              "treeduce protocol cannot use.");
    if (limits->max_payload_bytes < proto::kMinPayloadBytes)
      return invalid_argument("Switch '" + name + "' reports a largest payload of " +
                              std::to_string(limits->max_payload_bytes) +
                              " bytes per slot, below the treeduce protocol's smallest (" +
                              std::to_string(proto::kMinPayloadBytes) + ").");
    if (Status s = alloc_.set_profile(std::uint32_t(sw), *limits); !s.ok()) return s;
  }
  Sw& s = sw_[std::size_t(sw)];
  const std::string old_agent = s.agent;
  s.agent = agent;
  auto done = reconcile(std::uint32_t(sw), held);
  if (!done.ok()) {
    s.agent = old_agent;
    flush();
    return done.status();
  }
  s.registered = true;
  s.lease_until = now() + std::int64_t(opt_.switch_lease_ms);
  alloc_.set_switch_up(std::uint32_t(sw), true);
  touch_switch(std::uint32_t(sw));
  flush();
  return done;
}

Result<Reconciled> JobRegistry::reconcile(std::uint32_t sw, const std::vector<HeldTree>& held) {
  const std::string& sname = topo_->switches[sw].name;
  // What this registry has on the switch: tree id -> (job, that switch's install).
  std::map<std::uint16_t, std::pair<std::string, TreeInstall>> want;
  for (auto& [jname, j] : jobs_) {
    if (!j.tree) continue;
    for (std::size_t i = 0; i < j.tree->nodes.size(); ++i) {
      if (j.tree->nodes[i].sw != sw) continue;
      std::vector<Address> addr;
      for (const auto& [rank, r] : j.ranks) addr.push_back({topo_->hosts[r.host].data.ip, r.port});
      want[j.tree->tree_id] = {jname, installs_for(*j.tree, j.key, addr)[i]};
    }
  }
  Reconciled out;
  std::set<std::uint16_t> have;
  for (const HeldTree& h : held) {
    auto w = want.find(h.tree_id);
    if (w != want.end() && w->second.second.key == h.key) {
      have.insert(h.tree_id);
      continue;
    }
    if (w != want.end()) continue;  // another tree under a job's id: install_on replaces it
    Status r = agent_remove(sw, sname, h.tree_id);
    if (unreachable(r))
      return unavailable("Switch " + sname + " registered but its agent at " + sw_[sw].agent +
                         " does not answer: " + r.message());
    std::cerr << "treeduce-manager: switch " << sname << " held tree " << h.tree_id << " of job '"
              << h.job << "', which this manager does not know; "
              << (r.ok() || r.code() == Code::not_found ? "removed"
                                                        : "removal failed: " + r.message())
              << "\n";
    out.removed.push_back(h.tree_id);
  }
  for (auto& [id, w] : want) {
    if (have.count(id)) continue;
    Status r = install_on(sw, w.second);
    if (unreachable(r))
      return unavailable("Switch " + sname + " registered but its agent at " + sw_[sw].agent +
                         " does not answer: " + r.message());
    auto it = jobs_.find(w.first);
    if (!r.ok()) {
      std::cerr << "treeduce-manager: switch " << sname << " did not take tree " << id
                << " of job '" << w.first << "' back: " << r.message() << "\n";
      remove_tree(it->second);
      touch(w.first);
      it->second.state = JobState::failed;
      it->second.reason = "Switch " + sname + " of job '" + w.first +
                          "' lost its tree and did not take it back (" + r.message() +
                          "); the tree was removed: reduce on the hosts.";
      cv_.notify_all();
      continue;
    }
    std::cerr << "treeduce-manager: switch " << sname << " lacked tree " << id << " of job '"
              << w.first << "'; installed it again\n";
    out.reinstalled.push_back(id);
  }
  return out;
}

Status JobRegistry::switch_heartbeat(const std::string& name) {
  std::lock_guard lock(mu_);
  std::int64_t sw = topo_->find_switch(name);
  if (sw < 0) return not_found("Switch '" + name + "' is not in the topology.");
  Sw& s = sw_[std::size_t(sw)];
  if (!s.registered || !alloc_.switch_up(std::uint32_t(sw)))
    return failed_precondition("Switch '" + name +
                               "' is not registered (or was declared "
                               "failed): register again.");
  s.lease_until = now() + std::int64_t(opt_.switch_lease_ms);
  return Status::Ok();
}

Status JobRegistry::fail_switch(const std::string& name, const std::string& why) {
  std::lock_guard lock(mu_);
  std::int64_t sw = topo_->find_switch(name);
  if (sw < 0) return not_found("Switch '" + name + "' is not in the topology.");
  fail_jobs_on(std::uint32_t(sw), why);
  flush();
  return Status::Ok();
}

Status JobRegistry::drain_switch(const std::string& name, bool drain, const std::string& reason) {
  std::lock_guard lock(mu_);
  std::int64_t sw = topo_->find_switch(name);
  if (sw < 0) return not_found("Switch '" + name + "' is not in the topology.");
  // The reason goes into logs, tables and refusal sentences: one short line.
  if (reason.size() > 200 || !one_line_utf8(reason))
    return invalid_argument("The reason for draining switch '" + name +
                            "' must be one line of UTF-8 text of at most 200 bytes.");
  alloc_.set_drained(std::uint32_t(sw), drain, reason);
  std::cerr << "treeduce-manager: switch " << name
            << (drain ? " drained" + (reason.empty() ? std::string() : " (" + reason + ")") +
                            ": it takes no new trees"
                      : " undrained: it takes new trees again")
            << "\n";
  touch_switch(std::uint32_t(sw));
  flush();
  return Status::Ok();
}

void JobRegistry::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

std::vector<JobView> JobRegistry::jobs() const {
  std::lock_guard lock(mu_);
  std::vector<JobView> out;
  for (const auto& [n, j] : jobs_) {
    std::uint32_t joined = 0;
    for (const auto& kv : j.ranks) joined += kv.second.left ? 0 : 1;
    out.push_back({n, j.state, j.reason, j.params.world, joined, j.tree, {}});
    if (j.tree)
      for (const TreeNode& node : j.tree->nodes)
        out.back().tree_switches.push_back(topo_->switches[node.sw].name);
  }
  return out;
}

std::vector<SwitchView> JobRegistry::switches() const {
  std::lock_guard lock(mu_);
  std::vector<SwitchView> out;
  for (std::uint32_t i = 0; i < sw_.size(); ++i)
    out.push_back({i, topo_->switches[i].name, topo_->switches[i].level, topo_->switches[i].data,
                   alloc_.switch_up(i), sw_[i].registered, sw_[i].agent, alloc_.profile(i),
                   alloc_.usage(i), alloc_.drained(i), alloc_.drain_reason(i)});
  return out;
}

}  // namespace treeduce::ctl

namespace treeduce::ctl {

using nlohmann::json;

// ---- persistence -------------------------------------------------------------------------
// Documents name switches and hosts, not indices, so an edited topology file either still fits
// or fails loudly on restore.

std::string JobRegistry::job_doc(const Job& j) const {
  const JoinArgs& p = j.params;
  json d = {{"world", p.world},
            {"slots", p.slots},
            {"payload", p.payload_bytes},
            {"dtype_mask", p.dtype_mask},
            {"op_mask", p.op_mask},
            {"det", p.deterministic},
            {"state", int(j.state)},
            {"reason", j.reason},
            {"refusal_code", int(j.refusal.code())},
            {"refusal", j.refusal.message()},
            {"key", j.key},
            {"cred", j.credential},
            {"owner", j.owner}};
  json ranks = json::array();
  for (const auto& [rank, r] : j.ranks)
    ranks.push_back({rank, topo_->hosts[r.host].name, r.port, r.left});
  d["ranks"] = ranks;
  if (j.tree) {
    const Allocation& a = *j.tree;
    json nodes = json::array();
    for (const TreeNode& n : a.nodes) {
      json ch = json::array();
      for (const TreeChild& c : n.children) ch.push_back({c.is_rank ? 1 : 0, c.id});
      nodes.push_back({{"sw", topo_->switches[n.sw].name},
                       {"role", int(n.role)},
                       {"parent", n.parent},
                       {"idx", n.index_at_parent},
                       {"children", ch}});
    }
    json places = json::array();
    for (const RankPlace& rp : a.ranks) places.push_back({rp.node, rp.child_index});
    d["tree"] = {{"tree_id", a.tree_id},       {"slots", a.slots},     {"payload", a.payload_bytes},
                 {"dtype_mask", a.dtype_mask}, {"op_mask", a.op_mask}, {"det", a.deterministic},
                 {"depth", a.depth},           {"nodes", nodes},       {"ranks", places}};
  }
  return d.dump();
}

std::string JobRegistry::switch_doc(std::uint32_t sw) const {
  const ResourceProfile& p = alloc_.profile(sw);
  json d = {{"registered", sw_[sw].registered},
            {"agent", sw_[sw].agent},
            {"up", alloc_.switch_up(sw)},
            {"drained", alloc_.drained(sw)},
            {"drain_reason", alloc_.drain_reason(sw)},
            {"profile",
             {{"name", p.name},
              {"max_trees", p.max_trees},
              {"max_slots", p.max_slots},
              {"max_payload_bytes", p.max_payload_bytes},
              {"memory_bytes", p.memory_bytes},
              {"max_children", p.max_children},
              {"dtype_mask", p.dtype_mask},
              {"op_mask", p.op_mask},
              {"deterministic", p.deterministic}}}};
  return d.dump();
}

void JobRegistry::flush() {
  if (!opt_.store) {
    gone_sw_.clear();
    topology_doc_.reset();
  }
  if (!opt_.store ||
      (dirty_jobs_.empty() && dirty_sw_.empty() && gone_sw_.empty() && !topology_doc_))
    return;
  Store& st = *opt_.store;
  Status s = st.begin();
  for (const std::string& name : dirty_jobs_) {
    if (!s.ok()) break;
    auto it = jobs_.find(name);
    s = it == jobs_.end() ? st.erase("jobs", name) : st.put("jobs", name, job_doc(it->second));
  }
  for (std::uint32_t sw : dirty_sw_) {
    if (!s.ok()) break;
    s = st.put("switches", topo_->switches[sw].name, switch_doc(sw));
  }
  for (const std::string& name : gone_sw_) {
    if (!s.ok()) break;
    s = st.erase("switches", name);
  }
  if (s.ok() && topology_doc_) s = st.put(kTopologyTable, kAppliedTopologyKey, *topology_doc_);
  if (s.ok()) s = st.commit();
  if (!s.ok()) std::cerr << "treeduce-manager: state not saved: " << s.message() << "\n";
  dirty_jobs_.clear();
  dirty_sw_.clear();
  gone_sw_.clear();
  topology_doc_.reset();
}

Result<std::size_t> JobRegistry::restore() {
  std::lock_guard lock(mu_);
  if (!opt_.store) return std::size_t(0);
  const std::int64_t t = now();
  auto sws = opt_.store->load("switches");
  if (!sws.ok()) return sws.status();
  for (const auto& [name, doc] : *sws) {
    std::int64_t sw = topo_->find_switch(name);
    if (sw < 0) continue;  // no longer in the topology
    try {
      json d = json::parse(doc);
      const json& p = d.at("profile");
      ResourceProfile rp;
      rp.name = p.at("name");
      rp.max_trees = p.at("max_trees");
      rp.max_slots = p.at("max_slots");
      rp.max_payload_bytes = p.at("max_payload_bytes");
      rp.memory_bytes = p.at("memory_bytes");
      rp.max_children = p.at("max_children");
      rp.dtype_mask = p.at("dtype_mask");
      rp.op_mask = p.at("op_mask");
      rp.deterministic = p.at("deterministic");
      (void)alloc_.set_profile(std::uint32_t(sw), rp);
      Sw& s = sw_[std::size_t(sw)];
      s.registered = d.at("registered");
      s.agent = d.at("agent");
      s.lease_until = t + std::int64_t(std::max(opt_.switch_lease_ms, opt_.restore_grace_ms));
      alloc_.set_switch_up(std::uint32_t(sw), s.registered && d.at("up").get<bool>());
      // A database from before drains has none.
      alloc_.set_drained(std::uint32_t(sw), d.value("drained", false),
                         d.value("drain_reason", std::string()));
    } catch (const json::exception& e) {
      return internal_error("The saved state of switch '" + name + "' is damaged: " + e.what() +
                            ".");
    }
  }
  auto jobs = opt_.store->load("jobs");
  if (!jobs.ok()) return jobs.status();
  std::size_t n = 0;
  for (const auto& [name, doc] : *jobs) {
    Job j;
    try {
      json d = json::parse(doc);
      j.params.job = name;
      j.params.world = d.at("world");
      j.params.slots = d.at("slots");
      j.params.payload_bytes = d.at("payload");
      j.params.dtype_mask = d.at("dtype_mask");
      j.params.op_mask = d.at("op_mask");
      j.params.deterministic = d.at("det");
      j.state = static_cast<JobState>(d.at("state").get<int>());
      j.reason = d.at("reason");
      j.refusal = Status(static_cast<Code>(d.at("refusal_code").get<int>()), d.at("refusal"));
      j.key = d.at("key");
      // A database from before credentials: a new one (its ranks are then refused).
      j.credential = d.value("cred", std::string());
      if (j.credential.empty()) j.credential = new_credential();
      j.owner = d.value("owner", std::string());
      for (const json& r : d.at("ranks")) {
        std::int64_t h = topo_->find_host(r.at(1).get<std::string>());
        if (h < 0) throw std::runtime_error("host " + r.at(1).get<std::string>() + " is gone");
        j.ranks[r.at(0)] =
            Rank{std::uint32_t(h), r.at(2),
                 t + std::int64_t(std::max(opt_.lease_ms, opt_.restore_grace_ms)), r.at(3), 0};
      }
      if (d.contains("tree")) {
        const json& a = d.at("tree");
        Allocation al;
        al.job = name;
        al.tree_id = a.at("tree_id");
        al.slots = a.at("slots");
        al.payload_bytes = a.at("payload");
        al.dtype_mask = a.at("dtype_mask");
        al.op_mask = a.at("op_mask");
        al.deterministic = a.at("det");
        al.depth = a.at("depth");
        for (const json& nj : a.at("nodes")) {
          TreeNode tn;
          std::int64_t sw = topo_->find_switch(nj.at("sw").get<std::string>());
          if (sw < 0)
            throw std::runtime_error("switch " + nj.at("sw").get<std::string>() + " is gone");
          tn.sw = std::uint32_t(sw);
          tn.role = static_cast<NodeRole>(nj.at("role").get<int>());
          tn.parent = nj.at("parent");
          tn.index_at_parent = nj.at("idx");
          for (const json& c : nj.at("children"))
            tn.children.push_back({c.at(0).get<int>() != 0, c.at(1)});
          al.nodes.push_back(std::move(tn));
        }
        for (const json& rp : a.at("ranks")) al.ranks.push_back({rp.at(0), rp.at(1)});
        if (Status s = alloc_.adopt(al); !s.ok()) throw std::runtime_error(s.message());
        j.tree = std::move(al);
      }
    } catch (const std::exception& e) {
      // The job cannot come back as it was; keep it as failed so its ranks are told why.
      std::cerr << "treeduce-manager: job '" << name << "' not restored: " << e.what() << "\n";
      j.tree.reset();
      j.state = JobState::failed;
      j.reason = "The manager restarted and could not restore job '" + name + "' (" + e.what() +
                 "): reduce on the hosts.";
      touch(name);
    }
    jobs_[name] = std::move(j);
    ++n;
  }
  flush();
  return n;
}

}  // namespace treeduce::ctl

namespace treeduce::ctl {

// ---- changing the topology -----------------------------------------------------------------
// The registry owns its topology through a shared_ptr and every index it keeps (ranks' hosts,
// tree nodes, sw_, the allocator's per-switch state) refers to it. set_topology() builds the new
// one aside, checks that every live job's switches, hosts and links are still there unchanged,
// renumbers all indices by name into copies, and swaps everything under the lock: a reader
// never sees indices of one topology against the other. Snapshots handed out by topology()
// keep the old one alive for as long as a caller holds it.

std::shared_ptr<const Topology> JobRegistry::topology() const {
  std::lock_guard lock(mu_);
  return topo_;
}

namespace {

std::set<std::string> links_of(const Topology& t) {
  std::set<std::string> out;
  for (const Switch& s : t.switches)
    for (std::uint32_t u : s.up) out.insert(s.name + "-" + t.switches[u].name);
  return out;
}

bool same_switch(const Topology& a, const Switch& x, const Topology& b, const Switch& y) {
  return x.level == y.level && x.mgmt == y.mgmt && x.data == y.data && x.ports == y.ports &&
         a.profiles[x.profile] == b.profiles[y.profile];
}

}  // namespace

Result<TopologyChange> JobRegistry::set_topology(const std::string& yaml) {
  auto loaded = load_topology_yaml(yaml);
  if (!loaded.ok())
    return invalid_argument(loaded.status().message() + " The topology was not changed.");
  return set_topology(std::move(*loaded), yaml);
}

Result<TopologyChange> JobRegistry::set_topology(Topology loaded, const std::string& yaml) {
  auto next = std::make_shared<const Topology>(std::move(loaded));
  const Topology& nt = *next;
  std::lock_guard lock(mu_);
  const Topology& old = *topo_;

  std::vector<std::int64_t> sw_new(old.switches.size()), sw_old(nt.switches.size(), -1);
  for (std::uint32_t i = 0; i < old.switches.size(); ++i) {
    sw_new[i] = nt.find_switch(old.switches[i].name);
    if (sw_new[i] >= 0) sw_old[std::size_t(sw_new[i])] = i;
  }
  std::vector<std::int64_t> host_new(old.hosts.size());
  for (std::uint32_t h = 0; h < old.hosts.size(); ++h)
    host_new[h] = nt.find_host(old.hosts[h].name);

  // What a live job uses must stay as it is: its ranks' hosts (address, leaf), its tree's
  // switches (data address, level: parents and children are told addresses) and links.
  auto host_cut = [&](std::uint32_t h) -> std::string {
    const Host& x = old.hosts[h];
    if (host_new[h] < 0) return "host " + x.name + " is removed";
    const Host& y = nt.hosts[std::size_t(host_new[h])];
    if (!(x.data == y.data)) return "host " + x.name + " gets another data address";
    if (old.switches[x.leaf].name != nt.switches[y.leaf].name)
      return "host " + x.name + " moves to another leaf";
    return {};
  };
  auto switch_cut = [&](std::uint32_t s) -> std::string {
    const Switch& x = old.switches[s];
    if (sw_new[s] < 0) return "switch " + x.name + " is removed";
    const Switch& y = nt.switches[std::size_t(sw_new[s])];
    if (!(x.data == y.data)) return "switch " + x.name + " gets another data address";
    if (x.level != y.level) return "switch " + x.name + " moves to another level";
    return {};
  };
  std::vector<std::string> cuts;
  std::vector<std::string> forget;  // failed or refused jobs whose hosts are gone
  for (const auto& [name, j] : jobs_) {
    const bool live = j.tree || j.state == JobState::gathering || j.state == JobState::running;
    std::string why;
    // Left ranks too: a running tree still sends them results, the store names their hosts.
    for (const auto& [rank, r] : j.ranks) {
      if (!live) {
        if (host_new[r.host] < 0) why = "gone";
      } else if (why.empty()) {
        why = host_cut(r.host);
      }
    }
    if (!live) {
      if (!why.empty()) forget.push_back(name);
      continue;
    }
    if (j.tree)
      for (const TreeNode& n : j.tree->nodes) {
        if (why.empty()) why = switch_cut(n.sw);
        if (!why.empty() || n.parent < 0) continue;
        const std::uint32_t p = j.tree->nodes[std::size_t(n.parent)].sw;
        const auto& up = nt.switches[std::size_t(sw_new[n.sw])].up;
        if (std::find(up.begin(), up.end(), std::uint32_t(sw_new[p])) == up.end())
          why = "link " + old.switches[n.sw].name + "-" + old.switches[p].name + " is removed";
      }
    if (!why.empty())
      cuts.push_back("job '" + name + "' (" + std::string(ctl::name(j.state)) + "): " + why);
  }
  if (!cuts.empty()) {
    std::string list;
    for (std::size_t i = 0; i < cuts.size() && i < 5; ++i) list += (i ? "; " : "") + cuts[i];
    if (cuts.size() > 5) list += "; and " + std::to_string(cuts.size() - 5) + " more";
    return failed_precondition(
        "The new topology removes or changes what " + std::to_string(cuts.size()) +
        (cuts.size() == 1 ? " live job uses: " : " live jobs use: ") + list +
        ". The topology was not changed: drain the switches concerned (treeduce drain-switch), "
        "let those jobs leave, then set the topology again.");
  }
  Allocator alloc = alloc_;
  if (Status s = alloc.rebase(nt, sw_old, !opt_.require_registration); !s.ok())
    return failed_precondition(s.message() + " The topology was not changed.");

  // Nothing can fail from here on.
  TopologyChange ch;
  for (std::uint32_t i = 0; i < nt.switches.size(); ++i) {
    if (sw_old[i] < 0)
      ch.switches_added.push_back(nt.switches[i].name);
    else if (!same_switch(old, old.switches[std::size_t(sw_old[i])], nt, nt.switches[i]))
      ch.switches_changed.push_back(nt.switches[i].name);
  }
  for (std::uint32_t i = 0; i < old.switches.size(); ++i)
    if (sw_new[i] < 0) {
      ch.switches_removed.push_back(old.switches[i].name);
      gone_sw_.push_back(old.switches[i].name);
    }
  for (std::uint32_t h = 0; h < old.hosts.size(); ++h) {
    if (host_new[h] < 0) {
      ch.hosts_removed.push_back(old.hosts[h].name);
      continue;
    }
    const Host& x = old.hosts[h];
    const Host& y = nt.hosts[std::size_t(host_new[h])];
    if (!(x.data == y.data) || x.port != y.port ||
        old.switches[x.leaf].name != nt.switches[y.leaf].name)
      ch.hosts_changed.push_back(x.name);
  }
  for (const Host& y : nt.hosts)
    if (old.find_host(y.name) < 0) ch.hosts_added.push_back(y.name);
  const auto old_links = links_of(old), new_links = links_of(nt);
  std::set_difference(new_links.begin(), new_links.end(), old_links.begin(), old_links.end(),
                      std::back_inserter(ch.links_added));
  std::set_difference(old_links.begin(), old_links.end(), new_links.begin(), new_links.end(),
                      std::back_inserter(ch.links_removed));

  for (const std::string& name : forget) {
    std::cerr << "treeduce-manager: job '" << name << "' (" << ctl::name(jobs_[name].state)
              << ") forgotten: the new topology lacks a host of its ranks\n";
    touch(name);
    jobs_.erase(name);
  }
  for (auto& [name, j] : jobs_) {
    for (auto& [rank, r] : j.ranks)
      r.host = std::uint32_t(std::max<std::int64_t>(0, host_new[r.host]));
    if (j.tree)
      for (TreeNode& n : j.tree->nodes) n.sw = std::uint32_t(sw_new[n.sw]);
  }
  std::vector<Sw> sw(nt.switches.size());
  for (std::uint32_t i = 0; i < nt.switches.size(); ++i)
    if (sw_old[i] >= 0) sw[i] = sw_[std::size_t(sw_old[i])];
  sw_ = std::move(sw);
  dirty_sw_.clear();  // indices of the old topology; flush() ran at the end of every call
  topo_ = std::move(next);
  alloc_ = std::move(alloc);
  for (std::uint32_t i = 0; i < topo_->switches.size(); ++i)
    if (sw_old[i] < 0) touch_switch(i);
  topology_doc_ = applied_topology_doc(yaml, opt_.topology_file_hash);
  std::cerr << "treeduce-manager: topology changed: " << topo_->switches.size() << " switches (+"
            << ch.switches_added.size() << " -" << ch.switches_removed.size() << "), "
            << topo_->hosts.size() << " hosts (+" << ch.hosts_added.size() << " -"
            << ch.hosts_removed.size() << "), links +" << ch.links_added.size() << " -"
            << ch.links_removed.size() << "\n";
  flush();
  cv_.notify_all();
  return ch;
}

}  // namespace treeduce::ctl
