#include "grpc_edge.h"

#include <algorithm>
#include <chrono>

namespace treeduce::ctl {

namespace pb = treeduce::control::v1;

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), s.message());
}

Status from_grpc(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  return Status(static_cast<Code>(s.error_code()), s.error_message());
}

void to_proto(const TreeInstall& t, pb::TreeInstall* p) {
  p->set_switch_name(t.switch_name);
  p->set_job(t.job);
  p->set_tree_id(t.tree_id);
  p->set_key(t.key);
  p->set_role(static_cast<pb::TreeInstall::Role>(t.role));
  if (t.role != NodeRole::root) {
    p->mutable_parent()->set_ip(t.parent.ip);
    p->mutable_parent()->set_port(t.parent.port);
  }
  p->set_index_at_parent(t.index_at_parent);
  for (const auto& c : t.children) {
    auto* pc = p->add_children();
    pc->mutable_addr()->set_ip(c.addr.ip);
    pc->mutable_addr()->set_port(c.addr.port);
    pc->set_hosts(c.hosts);
  }
  p->set_slots(t.slots);
  p->set_payload_bytes(t.payload_bytes);
  p->set_dtype_mask(t.dtype_mask);
  p->set_op_mask(t.op_mask);
  p->set_deterministic(t.deterministic);
}

TreeInstall from_proto(const pb::TreeInstall& p) {
  TreeInstall t;
  t.switch_name = p.switch_name();
  t.job = p.job();
  t.tree_id = std::uint16_t(p.tree_id());
  t.key = p.key();
  t.role = static_cast<NodeRole>(p.role());
  t.parent = {p.parent().ip(), std::uint16_t(p.parent().port())};
  t.index_at_parent = std::uint16_t(p.index_at_parent());
  for (const auto& c : p.children())
    t.children.push_back(
        {{c.addr().ip(), std::uint16_t(c.addr().port())}, std::uint16_t(c.hosts())});
  t.slots = p.slots();
  t.payload_bytes = p.payload_bytes();
  t.dtype_mask = p.dtype_mask();
  t.op_mask = p.op_mask();
  t.deterministic = p.deterministic();
  return t;
}

// ---------------------------------------------------------------------------------------------

GrpcSwitchClient::GrpcSwitchClient(int deadline_ms, const tls::TlsOptions& tls)
    : deadline_ms_(deadline_ms), creds_(tls::channel_credentials(tls, &creds_error_)) {}

pb::SwitchAgent::Stub* GrpcSwitchClient::stub(const std::string& agent) {
  std::lock_guard lock(mu_);
  auto& s = stubs_[agent];
  if (!s) s = pb::SwitchAgent::NewStub(grpc::CreateChannel(agent, creds_));
  return s.get();
}

Status GrpcSwitchClient::install(const std::string& agent, const TreeInstall& t) {
  if (agent.empty()) return unavailable("the switch has no agent address");
  if (!creds_) return unavailable(creds_error_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms_));
  pb::TreeInstall req;
  to_proto(t, &req);
  pb::AgentReply rep;
  return from_grpc(stub(agent)->InstallTree(&ctx, req, &rep));
}

Status GrpcSwitchClient::remove(const std::string& agent, const std::string& switch_name,
                                std::uint16_t tree_id) {
  if (agent.empty()) return unavailable("the switch has no agent address");
  if (!creds_) return unavailable(creds_error_);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms_));
  pb::TreeRemove req;
  req.set_switch_name(switch_name);
  req.set_tree_id(tree_id);
  pb::AgentReply rep;
  return from_grpc(stub(agent)->RemoveTree(&ctx, req, &rep));
}

// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::uint32_t kDefaultWaitMs = 30000;
constexpr std::uint32_t kMaxWaitMs = 600000;

pb::JobState to_proto(JobState s) { return static_cast<pb::JobState>(s); }

void to_proto(const ResourceProfile& p, pb::Resources* r) {
  r->set_profile(p.name);
  r->set_max_trees(p.max_trees);
  r->set_max_slots(p.max_slots);
  r->set_max_payload_bytes(p.max_payload_bytes);
  r->set_memory_bytes(p.memory_bytes);
  r->set_max_children(p.max_children);
  r->set_dtype_mask(p.dtype_mask);
  r->set_op_mask(p.op_mask);
  r->set_deterministic(p.deterministic);
}

/// The caller's certificate name with TLS, "" without (--insecure: every caller is alike).
std::string caller_identity(const grpc::ServerContext& ctx) {
  return tls::peer_authenticated(ctx) ? tls::peer_name(ctx) : std::string();
}

}  // namespace

class ManagerServer::Jobs final : public pb::JobService::Service {
 public:
  explicit Jobs(JobRegistry& r) : reg_(r) {}

  grpc::Status Join(grpc::ServerContext* ctx, const pb::JoinRequest* req,
                    pb::JoinReply* rep) override {
    if (req->port() == 0 || req->port() > 65535)
      return to_grpc(invalid_argument("Port " + std::to_string(req->port()) +
                                      " is not a UDP port (1..65535)."));
    if (req->dtype_mask() > kAllDTypesMask || req->op_mask() > kAllOpsMask)
      return to_grpc(invalid_argument("The dtype or op mask names types that do not exist."));
    JoinArgs a;
    a.job = req->job();
    a.rank = req->rank();
    a.world = req->world_size();
    a.host = req->host();
    a.port = std::uint16_t(req->port());
    a.slots = req->slots() ? req->slots() : 16;
    a.payload_bytes = req->payload_bytes() ? req->payload_bytes() : 1024;
    a.dtype_mask = req->dtype_mask();
    a.op_mask = req->op_mask();
    a.deterministic = req->deterministic();
    a.owner = caller_identity(*ctx);
    // Wait no longer than the caller will listen.
    std::uint64_t wait = std::min(req->wait_ms() ? req->wait_ms() : kDefaultWaitMs, kMaxWaitMs);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    ctx->deadline() - std::chrono::system_clock::now())
                    .count();
    if (left > 0) wait = std::min<std::uint64_t>(wait, std::uint64_t(left));
    auto r = reg_.join(a, wait);
    // Refused ranks get it too: they still Leave.
    if (const std::string cred = reg_.credential_of(a.job); !cred.empty())
      ctx->AddTrailingMetadata(tls::kCredentialMetadata, cred);
    if (!r.ok()) return to_grpc(r.status());
    auto* as = rep->mutable_assignment();
    as->set_tree_id(r->tree_id);
    as->set_leaf_switch(r->leaf_switch);
    as->set_leaf_address(to_string(r->leaf));
    as->set_child_index(r->child_index);
    as->set_slots(r->slots);
    as->set_payload_bytes(r->payload_bytes);
    as->set_job_key(r->key);
    as->set_dtype_mask(r->dtype_mask);
    as->set_op_mask(r->op_mask);
    as->set_deterministic(r->deterministic);
    as->set_depth(r->depth);
    as->set_lease_ms(r->lease_ms);
    as->set_credential(r->credential);
    for (const SwitchCaps& c : r->switches) {
      auto* ts = as->add_switches();
      ts->set_name(c.name);
      ts->set_profile(c.profile);
      ts->set_dtype_mask(c.dtype_mask);
      ts->set_op_mask(c.op_mask);
    }
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* req,
                         pb::HeartbeatReply* rep) override {
    if (Status s = reg_.check_credential(req->job(), req->credential(), "Heartbeat"); !s.ok())
      return to_grpc(s);
    auto v = reg_.heartbeat(req->job(), req->rank());
    if (!v.ok()) return to_grpc(v.status());
    rep->set_state(to_proto(v->state));
    rep->set_reason(v->reason);
    rep->set_lease_ms(reg_.lease_ms());
    return grpc::Status::OK;
  }

  grpc::Status Leave(grpc::ServerContext*, const pb::LeaveRequest* req, pb::LeaveReply*) override {
    if (Status s = reg_.check_credential(req->job(), req->credential(), "Leave"); !s.ok())
      return to_grpc(s);
    return to_grpc(reg_.leave(req->job(), req->rank()));
  }

  grpc::Status Abort(grpc::ServerContext* ctx, const pb::AbortRequest* req,
                     pb::AbortReply*) override {
    // A credential, when given, must be the job's; without one only a gathering job of the
    // caller's own identity can be aborted (the registry's rule): the rank that cannot start
    // never joined.
    if (!req->credential().empty() && !reg_.credential_of(req->job()).empty())
      if (Status s = reg_.check_credential(req->job(), req->credential(), "Abort"); !s.ok())
        return to_grpc(s);
    std::optional<std::uint32_t> rank;
    if (req->rank_known()) rank = req->rank();
    return to_grpc(reg_.abort(req->job(), rank, req->reason(), caller_identity(*ctx)));
  }

 private:
  JobRegistry& reg_;
};

class ManagerServer::Switches final : public pb::SwitchRegistry::Service {
 public:
  explicit Switches(JobRegistry& r) : reg_(r) {}

  grpc::Status Register(grpc::ServerContext* ctx, const pb::RegisterRequest* req,
                        pb::RegisterReply* rep) override {
    if (grpc::Status s = same_switch(*ctx, req->name(), "register"); !s.ok()) return s;
    std::optional<ResourceProfile> limits;
    if (req->has_resources()) {
      const auto& r = req->resources();
      if (r.dtype_mask() > kAllDTypesMask || r.op_mask() > kAllOpsMask)
        return to_grpc(
            invalid_argument("The switch reports element types or operations that "
                             "do not exist."));
      ResourceProfile p;
      p.name = r.profile().empty() ? "reported" : r.profile();
      p.max_trees = r.max_trees();
      p.max_slots = r.max_slots();
      p.max_payload_bytes = r.max_payload_bytes();
      p.memory_bytes = r.memory_bytes();
      p.max_children = r.max_children();
      p.dtype_mask = r.dtype_mask();
      p.op_mask = r.op_mask();
      p.deterministic = r.deterministic();
      limits = p;
    }
    std::vector<HeldTree> held;
    for (const pb::InstalledTree& t : req->trees()) {
      if (t.tree_id() == 0 || t.tree_id() > 65535)
        return to_grpc(invalid_argument("Switch '" + req->name() + "' reports tree id " +
                                        std::to_string(t.tree_id()) +
                                        "; tree ids are 1 to 65535."));
      held.push_back({std::uint16_t(t.tree_id()), t.job(), t.key()});
    }
    auto done = reg_.register_switch(req->name(), req->agent_address(), limits, held);
    if (!done.ok()) return to_grpc(done.status());
    rep->set_lease_ms(reg_.switch_lease_ms());
    for (std::uint16_t id : done->removed) rep->add_removed_tree_ids(id);
    for (std::uint16_t id : done->reinstalled) rep->add_reinstalled_tree_ids(id);
    return grpc::Status::OK;
  }

  grpc::Status SwitchHeartbeat(grpc::ServerContext* ctx, const pb::SwitchHeartbeatRequest* req,
                               pb::SwitchHeartbeatReply* rep) override {
    if (grpc::Status st = same_switch(*ctx, req->name(), "heartbeat"); !st.ok()) return st;
    Status s = reg_.switch_heartbeat(req->name());
    if (!s.ok()) return to_grpc(s);
    rep->set_lease_ms(reg_.switch_lease_ms());
    return grpc::Status::OK;
  }

 private:
  /// With TLS, a switch speaks only for the switch its certificate names.
  static grpc::Status same_switch(const grpc::ServerContext& ctx, const std::string& name,
                                  const char* what) {
    if (!tls::peer_authenticated(ctx)) return grpc::Status::OK;
    const std::string who = tls::peer_name(ctx);
    if (who == name) return grpc::Status::OK;
    return to_grpc(permission_denied("A certificate for '" + who + "' cannot " + what +
                                     " as switch '" + name +
                                     "'; a switch's certificate names the switch (CN)."));
  }

  JobRegistry& reg_;
};

/// "" when the call may do what only the admin identity may; else why not. Without TLS every
/// caller may (the manager runs with --insecure).
std::string not_admin(const grpc::ServerContext& ctx, const std::string& admin) {
  if (!tls::peer_authenticated(ctx)) return {};
  const std::string who = tls::peer_name(ctx);
  if (who == admin) return {};
  return "the caller's certificate names '" + who + "', not the admin identity '" + admin + "'";
}

class ManagerServer::Queries final : public pb::Query::Service {
 public:
  Queries(JobRegistry& r, std::string admin) : reg_(r), admin_(std::move(admin)) {}

  grpc::Status ListJobs(grpc::ServerContext* ctx, const pb::ListRequest* req,
                        pb::JobList* rep) override {
    // Every job for the admin (or without TLS); a job's own ranks name it with its credential.
    if (!req->job().empty() || !req->credential().empty()) {
      if (Status s = reg_.check_credential(req->job(), req->credential(), "ListJobs"); !s.ok())
        return to_grpc(s);
    } else if (const std::string why = not_admin(*ctx, admin_); !why.empty()) {
      return to_grpc(
          permission_denied("Listing every job needs the admin identity (" + why +
                            "); a job's ranks list their own job with its name and credential."));
    }
    for (const JobView& v : reg_.jobs()) {
      if (!req->job().empty() && v.job != req->job()) continue;
      auto* j = rep->add_jobs();
      j->set_job(v.job);
      j->set_state(to_proto(v.state));
      j->set_reason(v.reason);
      j->set_world_size(v.world);
      j->set_joined(v.joined);
      if (v.tree) {
        j->set_tree_id(v.tree->tree_id);
        j->set_depth(v.tree->depth);
        j->set_slots(v.tree->slots);
        j->set_payload_bytes(v.tree->payload_bytes);
        j->set_dtype_mask(v.tree->dtype_mask);
        j->set_op_mask(v.tree->op_mask);
        for (const std::string& n : v.tree_switches) j->add_switches(n);
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status ListSwitches(grpc::ServerContext*, const pb::ListRequest*,
                            pb::SwitchList* rep) override {
    for (const SwitchView& v : reg_.switches()) {
      auto* s = rep->add_switches();
      s->set_name(v.name);
      s->set_level(v.level);
      s->set_up(v.up);
      s->set_registered(v.registered);
      s->set_agent_address(v.agent);
      s->set_data_address(to_string(v.data));
      to_proto(v.profile, s->mutable_resources());
      s->set_trees_used(v.used.trees);
      s->set_slots_used(v.used.slots);
      s->set_bytes_used(v.used.bytes);
      s->set_drained(v.drained);
      s->set_drain_reason(v.drain_reason);
    }
    return grpc::Status::OK;
  }

 private:
  JobRegistry& reg_;
  std::string admin_;
};

class ManagerServer::Admins final : public pb::Admin::Service {
 public:
  Admins(JobRegistry& r, std::string admin) : reg_(r), admin_(std::move(admin)) {}

  grpc::Status FailSwitch(grpc::ServerContext* ctx, const pb::FailSwitchRequest* req,
                          pb::AdminReply*) override {
    if (const std::string why = not_admin(*ctx, admin_); !why.empty())
      return to_grpc(permission_denied("Declaring switch '" + req->name() +
                                       "' failed needs the admin identity (" + why + ")."));
    const std::string reason =
        req->reason().empty() ? "declared failed by an admin" : req->reason();
    return to_grpc(reg_.fail_switch(req->name(), reason));
  }

  grpc::Status DrainSwitch(grpc::ServerContext* ctx, const pb::DrainSwitchRequest* req,
                           pb::AdminReply*) override {
    if (const std::string why = not_admin(*ctx, admin_); !why.empty())
      return to_grpc(permission_denied((req->drain() ? "Draining" : "Undraining") +
                                       std::string(" switch '") + req->name() +
                                       "' needs the admin identity (" + why + ")."));
    return to_grpc(reg_.drain_switch(req->name(), req->drain(), req->reason()));
  }

  grpc::Status SetTopology(grpc::ServerContext* ctx, const pb::SetTopologyRequest* req,
                           pb::SetTopologyReply* rep) override {
    if (const std::string why = not_admin(*ctx, admin_); !why.empty())
      return to_grpc(
          permission_denied("Changing the topology needs the admin identity (" + why + ")."));
    auto ch = reg_.set_topology(req->yaml());
    if (!ch.ok()) return to_grpc(ch.status());
    auto add = [](const std::vector<std::string>& from, auto* to) {
      for (const std::string& s : from) to->Add(std::string(s));
    };
    add(ch->switches_added, rep->mutable_switches_added());
    add(ch->switches_removed, rep->mutable_switches_removed());
    add(ch->switches_changed, rep->mutable_switches_changed());
    add(ch->hosts_added, rep->mutable_hosts_added());
    add(ch->hosts_removed, rep->mutable_hosts_removed());
    add(ch->hosts_changed, rep->mutable_hosts_changed());
    add(ch->links_added, rep->mutable_links_added());
    add(ch->links_removed, rep->mutable_links_removed());
    return grpc::Status::OK;
  }

 private:
  JobRegistry& reg_;
  std::string admin_;
};

ManagerServer::ManagerServer(JobRegistry& reg, const std::string& listen, int sweep_ms,
                             const tls::TlsOptions& tls, const std::string& admin_name)
    : reg_(reg),
      jobs_(std::make_unique<Jobs>(reg)),
      switches_(std::make_unique<Switches>(reg)),
      queries_(std::make_unique<Queries>(reg, admin_name)),
      admins_(std::make_unique<Admins>(reg, admin_name)) {
  auto creds = tls::server_credentials(tls, &error_);
  if (!creds) return;
  grpc::ServerBuilder b;
  b.AddListeningPort(listen, creds, &port_);
  b.RegisterService(jobs_.get());
  b.RegisterService(switches_.get());
  b.RegisterService(queries_.get());
  b.RegisterService(admins_.get());
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    error_ = "cannot listen on " + listen + ".";
    return;
  }
  sweeper_ = std::thread([this, sweep_ms] {
    std::unique_lock lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(sweep_ms));
      if (stop_) break;
      lock.unlock();
      reg_.sweep();
      lock.lock();
    }
  });
}

void ManagerServer::shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stop_.exchange(true)) return;
  }
  cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
  reg_.close();  // joins blocked in the registry return now
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

ManagerServer::~ManagerServer() { shutdown(); }

}  // namespace treeduce::ctl
