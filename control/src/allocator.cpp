#include "treeduce/control/allocator.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <bit>
#include <queue>
#include <tuple>

#include "treeduce/protocol/tree.h"

namespace treeduce::ctl {

namespace {

// A switch takes at most proto::kMaxChildren children per tree (its contribution bitmap is one
// 64-bit word); windows and payloads follow proto::check_slots() and check_payload_bytes().
constexpr std::uint32_t kMaxChildren = proto::kMaxChildren;
constexpr std::uint32_t kMaxWorld = 1u << 20;

/// The payload a tree through a switch of profile `p` uses when `requested` is asked for: a
/// protocol payload is a power of two, so a switch whose largest is not one (9000 bytes, say)
/// takes the power of two below it.
std::uint32_t payload_on(std::uint32_t requested, const ResourceProfile& p) {
  return std::bit_floor(std::min(requested, p.max_payload_bytes));
}

std::uint32_t popcount_and(const std::uint64_t* a, const std::uint64_t* b, std::size_t n) {
  std::uint32_t c = 0;
  for (std::size_t i = 0; i < n; ++i) c += std::uint32_t(std::popcount(a[i] & b[i]));
  return c;
}

bool any(const std::vector<std::uint64_t>& v) {
  for (auto w : v)
    if (w) return true;
  return false;
}

std::string fmt_usage(const ResourceProfile& p, const Usage& u) {
  std::string s = std::to_string(u.trees) + "/" + std::to_string(p.max_trees) + " trees, " +
                  std::to_string(u.slots) + "/" + std::to_string(p.max_slots) + " slots";
  if (p.memory_bytes)
    s += ", " + std::to_string(u.bytes >> 10) + "/" + std::to_string(p.memory_bytes >> 10) +
         " KiB of slot memory";
  return s;
}

// Which resource stops `add` from fitting: the refusal names it.
std::string short_of(const ResourceProfile& p, const Usage& used, const Usage& add) {
  if (used.trees + add.trees > p.max_trees) return "out of trees";
  if (used.slots + add.slots > p.max_slots) return "out of slots";
  return "out of memory";
}

}  // namespace

struct Allocator::Ctx {
  const JobRequest* req = nullptr;
  std::vector<std::vector<std::uint32_t>> leaf_ranks;  // by leaf number
  std::vector<std::uint64_t> need;                     // leaves of the job
};

struct Allocator::Plan {
  bool ok = false;
  std::vector<TreeNode> nodes;
  double worst = 0, sum = 0;  // utilisation after the job, non-leaf switches
  std::string why;
};

Allocator::Allocator(const Topology& topo, AllocatorOptions opt)
    : topo_(&topo),
      opt_(opt),
      used_(topo.switches.size()),
      up_(topo.switches.size(), 1),
      drained_(topo.switches.size(), 0),
      drain_reason_(topo.switches.size()),
      tree_ids_(65536, 0) {
  tree_ids_[0] = 1;
  for (std::uint32_t i = 0; i < topo.switches.size(); ++i) prof_.push_back(topo.profile_of(i));
}

Status Allocator::set_profile(std::uint32_t sw, const ResourceProfile& p) {
  if (!fits(p, Usage{}, used_[sw]))
    return failed_precondition("Switch " + topo_->switches[sw].name +
                               " reports limits below what is in use: " + fmt_usage(p, used_[sw]) +
                               ".");
  prof_[sw] = p;
  return Status::Ok();
}

bool Allocator::admits(const Ctx& c, std::uint32_t sw, std::string* why) const {
  const Switch& s = topo_->switches[sw];
  const ResourceProfile& p = profile(sw);
  const JobRequest& r = *c.req;
  auto no = [&](const std::string& m) {
    if (why && why->empty()) *why = "switch " + s.name + " (" + p.name + ") " + m;
    return false;
  };
  if (!up_[sw]) return no("is down (failed, or not registered yet).");
  if (drained_[sw])
    return no("is drained by an administrator" +
              (drain_reason_[sw].empty() ? std::string() : " (" + drain_reason_[sw] + ")") +
              " and takes no new trees.");
  if (r.dtype_mask != 0 || r.op_mask != 0) {
    if (auto m = first_missing(p, r.dtype_mask, r.op_mask))
      return no("does not reduce " + pair_name(m->dtype, m->op) + ", which the job needs.");
  }
  if (r.deterministic && !p.deterministic) return no("has no deterministic mode.");
  const std::uint32_t payload = payload_on(r.payload_bytes, p);
  const Usage cost = tree_cost(r.slots, payload, r.deterministic, 1);
  if (!fits(p, used_[sw], cost))
    return no("is " + short_of(p, used_[sw], cost) + ": " + fmt_usage(p, used_[sw]) +
              " in use, the job needs one tree of " + std::to_string(r.slots) + " slots.");
  return true;
}

bool Allocator::build(const Ctx& c, std::uint32_t sw, std::int32_t parent,
                      std::uint16_t index_at_parent, std::vector<std::uint64_t> need,
                      Plan* plan) const {
  if (!admits(c, sw, &plan->why)) return false;
  const Switch& s = topo_->switches[sw];
  const ResourceProfile& p = profile(sw);
  const std::uint32_t max_children = std::min(p.max_children, kMaxChildren);
  const auto me = std::uint32_t(plan->nodes.size());
  {
    TreeNode n;
    n.sw = sw;
    n.parent = parent;
    n.index_at_parent = index_at_parent;
    n.role = parent < 0 ? NodeRole::root : (s.level == 0 ? NodeRole::leaf : NodeRole::inner);
    plan->nodes.push_back(std::move(n));
  }
  std::uint32_t nchildren = 0;
  if (s.level == 0) {
    const auto& ranks = c.leaf_ranks[topo_->leaf_number(sw)];
    if (ranks.size() > max_children) {
      if (plan->why.empty())
        plan->why = "leaf " + s.name + " would have " + std::to_string(ranks.size()) +
                    " ranks of the job, more than its fan-in of " + std::to_string(max_children) +
                    ".";
      plan->nodes.pop_back();
      return false;
    }
    for (std::uint32_t r : ranks) plan->nodes[me].children.push_back({true, r});
    nchildren = std::uint32_t(ranks.size());
  } else {
    // Lazy greedy set cover: a child's stale count is an upper bound of its current one, so the
    // top of the heap, once refreshed and still on top, is the true maximum.
    // Scan only the words where the job has leaves below this switch: under an aggregation
    // switch that is one pod, a word or two of a 32-word bitset at 64k hosts.
    std::size_t lo = 0, hi = need.size();
    while (lo < hi && !need[lo]) ++lo;
    while (hi > lo && !need[hi - 1]) --hi;
    const std::size_t W = hi - lo;
    struct Cand {
      std::uint32_t count;
      double util;
      std::uint32_t sw;
      bool operator<(const Cand& o) const {  // max-heap: most leaves, then least used, low index
        return std::tie(count, o.util, o.sw) < std::tie(o.count, util, sw);
      }
    };
    std::priority_queue<Cand> heap;
    for (std::uint32_t d : s.down) {
      std::uint32_t n = popcount_and(topo_->below(d) + lo, need.data() + lo, W);
      if (n) heap.push({n, utilisation(profile(d), used_[d]), d});
    }
    std::vector<std::uint64_t> sub(need.size());
    while (any(need)) {
      if (heap.empty()) {
        if (plan->why.empty())
          plan->why = "switch " + s.name +
                      " cannot reach every leaf of the job through switches "
                      "with room.";
        plan->nodes.resize(me);
        return false;
      }
      Cand top = heap.top();
      heap.pop();
      std::uint32_t n = popcount_and(topo_->below(top.sw) + lo, need.data() + lo, W);
      if (n == 0) continue;
      if (n != top.count) {
        top.count = n;
        heap.push(top);
        continue;
      }
      if (nchildren == max_children) {
        if (plan->why.empty())
          plan->why = "switch " + s.name + " would need more than its fan-in of " +
                      std::to_string(max_children) + " children.";
        plan->nodes.resize(me);
        return false;
      }
      const std::uint64_t* b = topo_->below(top.sw);
      for (std::size_t w = lo; w < hi; ++w) sub[w] = b[w] & need[w];
      const auto child = std::uint32_t(plan->nodes.size());
      if (!build(c, top.sw, std::int32_t(me), std::uint16_t(nchildren), sub, plan)) continue;
      for (std::size_t w = lo; w < hi; ++w) need[w] &= ~sub[w];
      plan->nodes[me].children.push_back({false, child});
      ++nchildren;
    }
  }
  // Deterministic mode costs memory per child: check again now that the fan-in is known.
  const std::uint32_t payload = payload_on(c.req->payload_bytes, p);
  const Usage cost = tree_cost(c.req->slots, payload, c.req->deterministic, nchildren);
  if (!fits(p, used_[sw], cost)) {
    if (plan->why.empty())
      plan->why = "switch " + s.name + " (" + p.name + ") is out of memory for " +
                  std::to_string(nchildren) +
                  " children in deterministic mode: " + fmt_usage(p, used_[sw]) + " in use.";
    plan->nodes.resize(me);
    return false;
  }
  return true;
}

bool Allocator::plan_from(const Ctx& c, std::uint32_t root, Plan* plan) const {
  plan->ok = build(c, root, -1, 0, c.need, plan);
  if (!plan->ok) return false;
  // Score on the switches that differ between candidates: every tree holds the same leaves.
  for (const TreeNode& n : plan->nodes) {
    if (topo_->switches[n.sw].level == 0) continue;
    Usage after = used_[n.sw];
    after += tree_cost(c.req->slots, payload_on(c.req->payload_bytes, profile(n.sw)),
                       c.req->deterministic, std::uint32_t(n.children.size()));
    const double u = utilisation(profile(n.sw), after);
    plan->worst = std::max(plan->worst, u);
    plan->sum += u;
  }
  return true;
}

Result<std::uint16_t> Allocator::take_tree_id() {
  for (std::uint32_t i = 0; i < 65535; ++i) {
    std::uint32_t id = (next_id_ + i - 1) % 65535 + 1;
    if (!tree_ids_[id]) {
      next_id_ = id % 65535 + 1;  // rotate: a freed id is reused as late as possible
      return std::uint16_t(id);
    }
  }
  return resource_exhausted("All 65535 tree ids are in use.");
}

void Allocator::commit(const Allocation& a, int sign) {
  for (const TreeNode& n : a.nodes) {
    Usage cost =
        tree_cost(a.slots, a.payload_bytes, a.deterministic, std::uint32_t(n.children.size()));
    if (sign > 0)
      used_[n.sw] += cost;
    else
      used_[n.sw] -= cost;
  }
  tree_ids_[a.tree_id] = sign > 0 ? 1 : 0;
}

Result<Allocation> Allocator::allocate(const JobRequest& req) {
  if (req.job.empty() || req.job.size() > 128)
    return invalid_argument("A job name must be 1 to 128 characters long.");
  if (jobs_.count(req.job)) return already_exists("Job '" + req.job + "' already has a tree.");
  if (req.rank_host.empty() || req.rank_host.size() > kMaxWorld)
    return invalid_argument("Job '" + req.job + "' has a world size of " +
                            std::to_string(req.rank_host.size()) + "; it must be 1 to " +
                            std::to_string(kMaxWorld) + ".");
  if (auto bad = proto::check_slots(req.slots))
    return invalid_argument("Job '" + req.job + "': " + *bad);
  if (auto bad = proto::check_payload_bytes(req.payload_bytes))
    return invalid_argument("Job '" + req.job + "': " + *bad);
  if (req.dtype_mask > proto::kAllDTypesMask || req.op_mask > proto::kAllOpsMask)
    return invalid_argument("The job asks for an element type or operation that does not exist.");
  if ((req.dtype_mask != 0 || req.op_mask != 0) &&
      count_pairs(req.dtype_mask ? req.dtype_mask : kAllDTypesMask,
                  req.op_mask ? req.op_mask : kAllOpsMask) == 0)
    return invalid_argument(
        "Job '" + req.job + "' asks for types and operations that make no defined pair (" +
        std::string(
            op_refusal(static_cast<DType>(std::countr_zero(req.dtype_mask ? req.dtype_mask : 1u)),
                       static_cast<ReduceOp>(std::countr_zero(req.op_mask ? req.op_mask : 1u)))) +
        ").");

  Ctx c;
  c.req = &req;
  c.leaf_ranks.resize(topo_->num_leaves());
  c.need.assign(topo_->leaf_words(), 0);
  for (std::uint32_t r = 0; r < req.rank_host.size(); ++r) {
    std::uint32_t h = req.rank_host[r];
    if (h >= topo_->hosts.size())
      return invalid_argument("Rank " + std::to_string(r) + " is on a host the topology lacks.");
    std::uint32_t leaf = topo_->leaf_number(topo_->hosts[h].leaf);
    c.leaf_ranks[leaf].push_back(r);
    c.need[leaf / 64] |= 1ull << (leaf % 64);
  }
  std::uint32_t nleaves = 0, lowest = 0;
  for (std::uint32_t l = 0; l < topo_->num_leaves(); ++l) {
    if (c.leaf_ranks[l].empty()) continue;
    ++nleaves;
    lowest = l;
    // Every leaf of the job is in every tree: a full leaf refuses the job whatever the root.
    std::string why;
    if (!admits(c, topo_->leaf_switch(l), &why)) {
      const std::uint32_t leaf = topo_->leaf_switch(l);
      // Not by the sentence alone: a drain's reason is free text.
      bool capacity = up_[leaf] && !drained_[leaf] && why.find(" is out of ") != std::string::npos;
      return Status(capacity ? Code::resource_exhausted : Code::failed_precondition,
                    "No tree for job '" + req.job + "': " + why);
    }
  }

  std::string first_why;
  bool reachable = false;
  for (std::uint32_t h = (nleaves == 1 ? 0 : 1); h < topo_->levels(); ++h) {
    std::vector<std::uint32_t> cands;
    if (h == 0) {
      cands.push_back(topo_->leaf_switch(lowest));
    } else {
      for (std::uint32_t sw : topo_->at_level(h))
        if (popcount_and(topo_->below(sw), c.need.data(), topo_->leaf_words()) == nleaves)
          cands.push_back(sw);
    }
    if (cands.empty()) continue;
    reachable = true;
    // Least-used roots first (balance across spines). Plans are built a round at a time and the
    // best plan of the first round that has any wins: on a big fabric most roots are alike, and
    // building all of them cost 200 ms per job at 64k hosts (docs/manager.md).
    std::vector<double> root_util(cands.size());
    for (std::size_t i = 0; i < cands.size(); ++i)
      root_util[i] = utilisation(profile(cands[i]), used_[cands[i]]);
    std::vector<std::size_t> order(cands.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      return std::tie(root_util[x], cands[x]) < std::tie(root_util[y], cands[y]);
    });
    std::vector<Plan> plans(cands.size());
    auto eval = [&](std::size_t i) { plan_from(c, cands[order[i]], &plans[i]); };
    const std::size_t round = std::max<std::uint32_t>(1, opt_.round);
    std::size_t best = cands.size();
    for (std::size_t from = 0; from < cands.size() && best == cands.size(); from += round) {
      const std::size_t to = std::min(cands.size(), from + round);
      if (opt_.parallel_threshold && to - from >= opt_.parallel_threshold) {
        tbb::parallel_for(tbb::blocked_range<std::size_t>(from, to, 1),
                          [&](const tbb::blocked_range<std::size_t>& r) {
                            for (std::size_t i = r.begin(); i < r.end(); ++i) eval(i);
                          });
      } else {
        for (std::size_t i = from; i < to; ++i) eval(i);
      }
      for (std::size_t i = from; i < to; ++i) {
        if (!plans[i].ok) {
          if (first_why.empty()) first_why = plans[i].why;
          continue;
        }
        if (best == cands.size() || std::tie(plans[i].worst, plans[i].sum, i) <
                                        std::tie(plans[best].worst, plans[best].sum, best))
          best = i;
      }
    }
    if (best == cands.size()) continue;  // all full at this level: a deeper tree may still fit

    Allocation a;
    auto id = take_tree_id();
    if (!id.ok()) return id.status();
    a.job = req.job;
    a.tree_id = *id;
    a.slots = req.slots;
    a.deterministic = req.deterministic;
    a.depth = h;
    a.nodes = std::move(plans[best].nodes);
    a.payload_bytes = req.payload_bytes;
    a.dtype_mask = kAllDTypesMask;
    a.op_mask = kAllOpsMask;
    for (const TreeNode& n : a.nodes) {
      const ResourceProfile& p = profile(n.sw);
      a.payload_bytes = payload_on(a.payload_bytes, p);
      a.dtype_mask &= p.dtype_mask;
      a.op_mask &= p.op_mask;
    }
    // Masks are a product, so this is the set of pairs every switch of the tree offloads.
    if (count_pairs(a.dtype_mask, a.op_mask) == 0)
      return failed_precondition("No tree for job '" + req.job +
                                 "': its switches have no element type and operation in common.");
    a.ranks.resize(req.rank_host.size());
    for (std::uint32_t ni = 0; ni < a.nodes.size(); ++ni)
      for (std::uint32_t ci = 0; ci < a.nodes[ni].children.size(); ++ci)
        if (a.nodes[ni].children[ci].is_rank)
          a.ranks[a.nodes[ni].children[ci].id] = {ni, std::uint16_t(ci)};
    commit(a, +1);
    jobs_.emplace(a.job, a);
    return a;
  }
  if (!reachable)
    return failed_precondition("No tree for job '" + req.job + "': no switch reaches all " +
                               std::to_string(nleaves) +
                               " leaf switches of its ranks; the fabric is partitioned.");
  // A switch that lacks a capability refuses whatever is free elsewhere: not a capacity matter.
  // Nor is a drain: it lasts until an administrator undrains the switch.
  const bool capability = first_why.find(" does not reduce ") != std::string::npos ||
                          first_why.find(" has no deterministic mode") != std::string::npos ||
                          first_why.find(" is drained by an administrator") != std::string::npos;
  return Status(capability ? Code::failed_precondition : Code::resource_exhausted,
                "No tree for job '" + req.job + "': " + first_why);
}

Status Allocator::release(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return not_found("Job '" + job + "' has no tree.");
  commit(it->second, -1);
  jobs_.erase(it);
  return Status::Ok();
}

Status Allocator::adopt(const Allocation& a) {
  if (a.job.empty()) return invalid_argument("An allocation without a job name cannot be adopted.");
  if (jobs_.count(a.job)) return already_exists("Job '" + a.job + "' already has a tree.");
  if (a.tree_id == 0 || tree_ids_[a.tree_id])
    return already_exists("Tree id " + std::to_string(a.tree_id) + " of job '" + a.job +
                          "' is in use or invalid.");
  if (a.nodes.empty()) return invalid_argument("The tree of job '" + a.job + "' has no switches.");
  for (std::size_t i = 0; i < a.nodes.size(); ++i) {
    const TreeNode& n = a.nodes[i];
    if (n.sw >= topo_->switches.size())
      return invalid_argument("The tree of job '" + a.job + "' names a switch the topology lacks.");
    if ((i == 0) != (n.parent < 0) || (n.parent >= 0 && std::size_t(n.parent) >= i))
      return invalid_argument("The tree of job '" + a.job + "' is not a tree.");
    const ResourceProfile& p = profile(n.sw);
    Usage cost =
        tree_cost(a.slots, a.payload_bytes, a.deterministic, std::uint32_t(n.children.size()));
    if (!fits(p, used_[n.sw], cost))
      return resource_exhausted("The tree of job '" + a.job + "' no longer fits on switch " +
                                topo_->switches[n.sw].name + ": " + fmt_usage(p, used_[n.sw]) +
                                " in use.");
  }
  commit(a, +1);
  jobs_.emplace(a.job, a);
  return Status::Ok();
}

Status Allocator::rebase(const Topology& next, const std::vector<std::int64_t>& old_of,
                         bool new_up) {
  const std::size_t n = next.switches.size();
  std::vector<std::int64_t> new_of(topo_->switches.size(), -1);
  for (std::size_t i = 0; i < n && i < old_of.size(); ++i)
    if (old_of[i] >= 0) new_of[std::size_t(old_of[i])] = std::int64_t(i);
  std::vector<ResourceProfile> prof(n);
  std::vector<Usage> used(n);
  std::vector<std::uint8_t> up(n, new_up ? 1 : 0), drained(n, 0);
  std::vector<std::string> reason(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t o = i < old_of.size() ? old_of[i] : -1;
    if (o < 0) {
      prof[i] = next.profile_of(std::uint32_t(i));
      continue;
    }
    const auto k = std::size_t(o);
    // The file's profile wins only when the file changed it; else what the switch registered.
    prof[i] = next.profile_of(std::uint32_t(i)) == topo_->profile_of(std::uint32_t(k))
                  ? prof_[k]
                  : next.profile_of(std::uint32_t(i));
    up[i] = up_[k];
    drained[i] = drained_[k];
    reason[i] = drain_reason_[k];
  }
  std::map<std::string, Allocation> jobs;
  for (const auto& [name, a0] : jobs_) {
    Allocation a = a0;
    for (TreeNode& node : a.nodes) {
      if (new_of[node.sw] < 0)
        return failed_precondition("The tree of job '" + name + "' uses switch " +
                                   topo_->switches[node.sw].name +
                                   ", which the new topology lacks.");
      node.sw = std::uint32_t(new_of[node.sw]);
      const ResourceProfile& p = prof[node.sw];
      // The tree's switches were told what it reduces and how big it is: a new profile must
      // still carry it.
      if ((a.dtype_mask & ~p.dtype_mask) != 0 || (a.op_mask & ~p.op_mask) != 0 ||
          (a.deterministic && !p.deterministic) || a.payload_bytes > p.max_payload_bytes ||
          node.children.size() > p.max_children)
        return failed_precondition("Switch " + next.switches[node.sw].name + " would get profile " +
                                   p.name + ", which cannot carry the tree of job '" + name +
                                   "' (its types and operations, mode, payload or fan-in).");
      used[node.sw] +=
          tree_cost(a.slots, a.payload_bytes, a.deterministic, std::uint32_t(node.children.size()));
    }
    jobs.emplace(name, std::move(a));
  }
  for (std::size_t i = 0; i < n; ++i)
    if (!fits(prof[i], Usage{}, used[i]))
      return failed_precondition(
          "Switch " + next.switches[i].name + " would get profile " + prof[i].name +
          ", below what its trees use: " + fmt_usage(prof[i], used[i]) + ".");
  topo_ = &next;
  prof_ = std::move(prof);
  used_ = std::move(used);
  up_ = std::move(up);
  drained_ = std::move(drained);
  drain_reason_ = std::move(reason);
  jobs_ = std::move(jobs);
  return Status::Ok();
}

void Allocator::set_drained(std::uint32_t sw, bool drained, const std::string& reason) {
  drained_[sw] = drained ? 1 : 0;
  drain_reason_[sw] = drained ? reason : std::string();
}

std::vector<std::string> Allocator::set_switch_up(std::uint32_t sw, bool up) {
  up_[sw] = up ? 1 : 0;
  std::vector<std::string> jobs;
  for (const auto& [name, a] : jobs_)
    for (const TreeNode& n : a.nodes)
      if (n.sw == sw) {
        jobs.push_back(name);
        break;
      }
  return jobs;
}

}  // namespace treeduce::ctl
