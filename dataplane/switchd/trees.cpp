// treeduce-switch's trees: install in every worker's core and publish, remove by unpublishing,
// waiting for an RCU grace period and freeing (docs/switch.md, "Trees"). Called by the gRPC
// agent and for the configuration's static trees, serialised by `mu`.
#include "datapath_impl.h"

namespace treeduce::switchd {

Status Switch::install(const proto::TreeConfig& t, const std::string& job) {
  Impl& s = *impl_;
  std::lock_guard l(s.mu);
  if (const proto::TreeConfig* have = s.workers[0]->core->tree_config(t.tree_id)) {
    if (*have == t) return Status::Ok();  // an identical re-install
    return already_exists("Tree " + std::to_string(t.tree_id) +
                          " is installed with another configuration.");
  }
  if (Status st = s.admit_tree(t); !st.ok()) return st;
  if (Status st = s.install_in_cores(t); !st.ok()) return st;
  s.jobs[t.tree_id] = job;
  s.want_next_hops(t);
  std::vector<dp::TreeHops*> old;
  s.resolve_hops(t.tree_id, &old);
  s.synchronize();  // no lcore still builds a frame from the unresolved templates
  for (dp::TreeHops* h : old) dp::Core::destroy_hops(h);
  log("tree %u installed (job '%s', %s, %zu children, %u slots x %u B%s)", t.tree_id, job.c_str(),
      std::string(proto::name(t.role)).c_str(), t.children.size(), t.slots, t.payload_bytes,
      t.deterministic ? ", deterministic" : "");
  return Status::Ok();
}

/// Whether this switch takes the tree at all: the protocol's rules, and its own policy.
Status Switch::Impl::admit_tree(const proto::TreeConfig& t) const {
  if (Status bad = dp::Core::check_config(t); !bad.ok()) return bad;
  if (t.deterministic && !cfg.deterministic_allowed)
    return invalid_argument(
        "Deterministic trees are not allowed on this switch (deterministic_allowed: false).");
  return Status::Ok();
}

/// Builds and publishes the tree in every worker's core; when one refuses (no memory), the
/// cores that took it unpublish it, and it is freed after a grace period.
Status Switch::Impl::install_in_cores(const proto::TreeConfig& t) {
  for (std::size_t i = 0; i < workers.size(); ++i) {
    if (Status st = workers[i]->core->install_tree(t); !st.ok()) {
      std::vector<dp::Tree*> undo;
      for (std::size_t k = 0; k < i; ++k)
        undo.push_back(workers[k]->core->unpublish_tree(t.tree_id));
      synchronize();
      for (dp::Tree* u : undo) dp::Core::destroy_tree(u);
      return st;
    }
  }
  return Status::Ok();
}

Status Switch::remove(std::uint16_t tree_id) {
  Impl& s = *impl_;
  std::lock_guard l(s.mu);
  std::vector<dp::Tree*> gone;
  for (auto& w : s.workers) {
    if (dp::Tree* t = w->core->unpublish_tree(tree_id)) gone.push_back(t);
  }
  if (gone.empty()) return not_found("Tree " + std::to_string(tree_id) + " is not installed.");
  s.synchronize();  // no lcore still holds a pointer into the tree's slots
  for (dp::Tree* t : gone) dp::Core::destroy_tree(t);
  s.jobs.erase(tree_id);
  s.static_trees.erase(tree_id);
  log("tree %u removed", tree_id);
  return Status::Ok();
}

std::vector<TreeControl::Held> Switch::held() const {
  Impl& s = *impl_;
  std::lock_guard l(s.mu);
  std::vector<Held> out;
  for (const auto& [id, job] : s.jobs) {
    if (s.static_trees.count(id)) continue;
    if (const proto::TreeConfig* c = s.workers[0]->core->tree_config(id))
      out.push_back({id, job, c->key});
  }
  return out;
}

}  // namespace treeduce::switchd
