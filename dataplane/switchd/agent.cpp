#include "agent.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "grpc_tls.h"
#include "manager.grpc.pb.h"

namespace treeduce::switchd {

namespace pb = treeduce::control::v1;

namespace {

using Clock = std::chrono::system_clock;
using std::chrono::milliseconds;

constexpr milliseconds kRpcDeadline{1000};
constexpr milliseconds kFirstBackoff{50};
constexpr milliseconds kMaxBackoff{1000};
constexpr std::uint32_t kMax16 = 65535;

grpc::Status invalid(const std::string& sentence) {
  return {grpc::StatusCode::INVALID_ARGUMENT, sentence};
}

/// Checks every value that is narrowed on the way into dp::TreeConfig, so a manager bug shows up
/// as a refusal instead of a silently different tree.
grpc::Status to_config(const pb::TreeInstall& p, dp::TreeConfig* c) {
  const std::string tree = "tree " + std::to_string(p.tree_id());
  if (p.tree_id() > kMax16)
    return invalid("Tree id " + std::to_string(p.tree_id()) + " is above " +
                   std::to_string(kMax16) + ".");
  switch (p.role()) {
    case pb::TreeInstall::ROLE_LEAF:
      c->role = dp::Role::leaf;
      break;
    case pb::TreeInstall::ROLE_INNER:
      c->role = dp::Role::inner;
      break;
    case pb::TreeInstall::ROLE_ROOT:
      c->role = dp::Role::root;
      break;
    default:
      return invalid("Role " + std::to_string(p.role()) + " of " + tree +
                     " is not leaf, inner or root.");
  }
  if (p.parent().port() > kMax16)
    return invalid("The parent port " + std::to_string(p.parent().port()) + " of " + tree +
                   " is above " + std::to_string(kMax16) + ".");
  if (p.index_at_parent() > kMax16)
    return invalid("The index at parent " + std::to_string(p.index_at_parent()) + " of " + tree +
                   " is above " + std::to_string(kMax16) + ".");
  if ((p.dtype_mask() & ~kAllDTypesMask) != 0 || (p.op_mask() & ~kAllOpsMask) != 0)
    return invalid("The dtype or op mask of " + tree + " names types that do not exist.");
  c->tree_id = std::uint16_t(p.tree_id());
  c->key = p.key();
  c->parent.ip = p.parent().ip();
  c->parent.port = std::uint16_t(p.parent().port());
  c->index_at_parent = std::uint16_t(p.index_at_parent());
  c->children.clear();
  for (int i = 0; i < p.children_size(); ++i) {
    const auto& ch = p.children(i);
    if (ch.addr().port() > kMax16)
      return invalid("Child " + std::to_string(i) + " of " + tree + " has port " +
                     std::to_string(ch.addr().port()) + ", above " + std::to_string(kMax16) + ".");
    if (ch.hosts() > kMax16)
      return invalid("Child " + std::to_string(i) + " of " + tree + " has " +
                     std::to_string(ch.hosts()) + " hosts below it; at most " +
                     std::to_string(kMax16) + " fit.");
    dp::ChildConfig cc;
    cc.addr.ip = ch.addr().ip();
    cc.addr.port = std::uint16_t(ch.addr().port());
    cc.hosts = std::uint16_t(ch.hosts());
    c->children.push_back(cc);
  }
  c->slots = p.slots();
  c->payload_bytes = p.payload_bytes();
  c->dtype_mask = p.dtype_mask();
  c->op_mask = p.op_mask();
  c->deterministic = p.deterministic();
  return grpc::Status::OK;
}

class Service final : public pb::SwitchAgent::Service {
 public:
  Service(std::string name, TreeControl& trees, PortControl* ports,
          std::vector<std::string> callers)
      : name_(std::move(name)), trees_(trees), ports_(ports), callers_(std::move(callers)) {}

  grpc::Status InstallTree(grpc::ServerContext* ctx, const pb::TreeInstall* req,
                           pb::AgentReply*) override {
    if (grpc::Status s = check_switch(*ctx, req->switch_name()); !s.ok()) return s;
    dp::TreeConfig c;
    if (grpc::Status s = to_config(*req, &c); !s.ok()) {
      log("refused tree " + std::to_string(req->tree_id()) + ": " + s.error_message());
      return s;
    }
    const std::string id = std::to_string(c.tree_id);
    const grpc::Status out = install_status(trees_.install(c, req->job()), id);
    // Installs and removals are logged by the TreeControl, static trees alike; refusals here.
    if (!out.ok()) {
      log("refused tree " + id + " of job '" + req->job() + "' as " +
          std::string(proto::name(c.role)) + " with " + std::to_string(c.children.size()) +
          " children: " + out.error_message());
    }
    return out;
  }

  grpc::Status RemoveTree(grpc::ServerContext* ctx, const pb::TreeRemove* req,
                          pb::AgentReply*) override {
    if (grpc::Status s = check_switch(*ctx, req->switch_name()); !s.ok()) return s;
    if (req->tree_id() > kMax16)
      return invalid("Tree id " + std::to_string(req->tree_id()) + " is above " +
                     std::to_string(kMax16) + ".");
    const std::string id = std::to_string(req->tree_id());
    const Status st = trees_.remove(std::uint16_t(req->tree_id()));
    if (st.code() == Code::not_found) {
      log("cannot remove tree " + id + ": not installed");
      return {grpc::StatusCode::NOT_FOUND, "Tree " + id + " is not installed on " + name_ + "."};
    }
    if (!st.ok())
      return {static_cast<grpc::StatusCode>(st.code()),
              st.message().empty() ? "Switch " + name_ + " failed to remove tree " + id + "."
                                   : st.message()};
    return grpc::Status::OK;
  }

  grpc::Status SetPortFault(grpc::ServerContext* ctx, const pb::PortFault* req,
                            pb::AgentReply*) override {
    if (grpc::Status s = check_switch(*ctx, req->switch_name()); !s.ok()) return s;
    if (ports_ == nullptr)
      return {grpc::StatusCode::PERMISSION_DENIED,
              "Switch " + name_ +
                  " takes no faults over the network; start it with faults: true (labs and tests "
                  "only)."};
    PortFault f;
    f.rx_loss = req->rx_loss();
    f.down = req->down();
    f.delay_us = req->delay_us();
    f.rate_mbps = req->rate_mbps();
    // NaN fails both comparisons: refused too.
    if (!(f.rx_loss >= 0 && f.rx_loss <= 1))
      return invalid("rx_loss is " + std::to_string(f.rx_loss) + "; it must be from 0 to 1.");
    if (f.delay_us > kMaxFaultDelayUs)
      return invalid("delay_us is " + std::to_string(f.delay_us) + "; at most " +
                     std::to_string(kMaxFaultDelayUs) + ".");
    if (f.rate_mbps > kMaxFaultRateMbps)
      return invalid("rate_mbps is " + std::to_string(f.rate_mbps) + "; at most " +
                     std::to_string(kMaxFaultRateMbps) + ".");
    const Status st = ports_->set_port_fault(req->port(), f);
    if (!st.ok()) return {static_cast<grpc::StatusCode>(st.code()), st.message()};
    return grpc::Status::OK;
  }

  grpc::Status SetPortCapture(grpc::ServerContext* ctx, const pb::PortCapture* req,
                              pb::PortCaptureReply* rep) override {
    if (grpc::Status s = check_switch(*ctx, req->switch_name()); !s.ok()) return s;
    if (ports_ == nullptr)
      return {grpc::StatusCode::PERMISSION_DENIED,
              "Switch " + name_ +
                  " takes no captures over the network; start it with faults: true (labs and "
                  "tests only)."};
    Status st;
    if (req->path().empty()) {
      std::uint64_t frames = 0;
      st = ports_->stop_capture(req->port(), &frames);
      rep->set_frames(frames);
    } else {
      st = ports_->start_capture(req->port(), req->path());
    }
    if (!st.ok()) return {static_cast<grpc::StatusCode>(st.code()), st.message()};
    return grpc::Status::OK;
  }

  void log(const std::string& what) const {
    std::fprintf(stderr, "treeduce-switch %s: %s\n", name_.c_str(), what.c_str());
  }

 private:
  /// The TreeControl's answer as a gRPC status (the codes share their numbering), with a
  /// sentence of its own when the answer has none.
  grpc::Status install_status(const Status& st, const std::string& id) const {
    if (st.ok()) return grpc::Status::OK;
    if (!st.message().empty()) return {static_cast<grpc::StatusCode>(st.code()), st.message()};
    std::string sentence;
    switch (st.code()) {
      case Code::already_exists:
        sentence = "Tree " + id + " is installed with another configuration.";
        break;
      case Code::invalid_argument:
        sentence = "Switch " + name_ + " refused the configuration of tree " + id + ".";
        break;
      case Code::resource_exhausted:
        sentence = "Switch " + name_ + " has no memory left for tree " + id + ".";
        break;
      default:
        sentence = "Switch " + name_ + " failed to install tree " + id + " (" +
                   std::string(code_name(st.code())) + ").";
    }
    return {static_cast<grpc::StatusCode>(st.code()), sentence};
  }

  /// With TLS, only the identities in callers_ (the manager's, an admin's) may change the
  /// switch: a job's host certificate is from the same CA but must not install trees.
  grpc::Status check_switch(const grpc::ServerContext& ctx, const std::string& asked) const {
    if (tls::peer_authenticated(ctx)) {
      const std::string who = tls::peer_name(ctx);
      if (std::find(callers_.begin(), callers_.end(), who) == callers_.end()) {
        std::string known;
        for (const std::string& c : callers_) known += (known.empty() ? "'" : ", '") + c + "'";
        return {grpc::StatusCode::PERMISSION_DENIED,
                "Switch " + name_ + " takes calls only from " + known +
                    "; the caller's certificate names '" + who + "'."};
      }
    }
    if (asked == name_) return grpc::Status::OK;
    return invalid("This agent serves switch '" + name_ + "', not '" + asked + "'.");
  }

  std::string name_;
  TreeControl& trees_;
  PortControl* ports_;
  std::vector<std::string> callers_;
};

/// True for "host:port" with a port in 0..65535: gRPC itself silently wraps larger ports.
bool good_listen(const std::string& a) {
  const auto colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size() || a.size() - colon > 6)
    return false;
  const std::string port = a.substr(colon + 1);
  return std::all_of(port.begin(), port.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) &&
         std::stoul(port) <= kMax16;
}

}  // namespace

struct Agent::Impl {
  Impl(const AgentOptions& o, TreeControl& t)
      : opt(o), trees(t), service(o.switch_name, t, o.ports, o.callers) {}

  /// Registers, then heartbeats; registers again whenever the manager no longer knows us.
  void run() {
    std::unique_ptr<pb::SwitchRegistry::Stub> stub;
    milliseconds backoff = kFirstBackoff;
    milliseconds interval{opt.heartbeat_ms};
    bool heartbeat_failing = false;
    std::unique_lock lock(mu);
    while (!stop) {
      if (!registered) {
        stub = connect();
        std::uint64_t lease = 0;
        pb::RegisterReply rep;
        // What the switch holds goes with the registration: the manager removes what it does
        // not know and installs again what is missing before it answers.
        const std::vector<TreeControl::Held> held = trees.held();
        grpc::Status s = call(
            [&](grpc::ClientContext* ctx) {
              pb::RegisterRequest req;
              req.set_name(opt.switch_name);
              req.set_agent_address(advertise);
              for (const TreeControl::Held& h : held) {
                pb::InstalledTree* t = req.add_trees();
                t->set_tree_id(h.tree_id);
                t->set_job(h.job);
                t->set_key(h.key);
              }
              if (const auto& res = opt.resources) {
                auto* r = req.mutable_resources();
                r->set_max_trees(res->max_trees);
                r->set_max_slots(res->max_slots);
                r->set_max_payload_bytes(res->max_payload_bytes);
                r->set_memory_bytes(res->memory_bytes);
                r->set_max_children(res->max_children);
                r->set_dtype_mask(res->dtype_mask);
                r->set_op_mask(res->op_mask);
                r->set_deterministic(res->deterministic);
              }
              grpc::Status st = stub->Register(ctx, req, &rep);
              lease = rep.lease_ms();
              return st;
            },
            lock);
        if (stop) break;
        if (s.ok()) {
          registered = true;
          heartbeat_failing = false;
          backoff = kFirstBackoff;
          interval = heartbeat_interval(lease);
          report("registered with the manager at " + opt.manager + " as " + advertise +
                 reconciled(held.size(), rep));
          continue;
        }
        report("cannot register with the manager at " + opt.manager + ": " + s.error_message());
        wait(lock, backoff);
        backoff = std::min(backoff * 2, kMaxBackoff);
        continue;
      }
      if (wait(lock, interval)) break;
      std::uint64_t lease = 0;
      grpc::Status s = call(
          [&](grpc::ClientContext* ctx) {
            pb::SwitchHeartbeatRequest req;
            req.set_name(opt.switch_name);
            pb::SwitchHeartbeatReply rep;
            grpc::Status st = stub->SwitchHeartbeat(ctx, req, &rep);
            lease = rep.lease_ms();
            return st;
          },
          lock);
      if (stop) break;
      if (s.ok()) {
        interval = heartbeat_interval(lease);
        if (heartbeat_failing) report("heartbeats reach the manager at " + opt.manager + " again");
        heartbeat_failing = false;
      } else if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                 s.error_code() == grpc::StatusCode::NOT_FOUND) {
        // The manager restarted without its database, declared us failed, or lost us from its
        // topology: only a new registration brings trees back to this switch.
        registered = false;
        report("the manager forgot this switch: " + s.error_message());
      } else {
        // Unreachable is not forgotten: a manager back within the lease still knows us.
        heartbeat_failing = true;
        report("heartbeat to the manager at " + opt.manager + " failed: " + s.error_message());
      }
    }
  }

  /// A channel of its own for every registration attempt: a channel that failed to connect
  /// refuses calls until its own reconnect backoff ends, which would add up to a second to ours
  /// after the manager comes back.
  std::unique_ptr<pb::SwitchRegistry::Stub> connect() const {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // else the failed connection is shared
    // Heartbeats reuse the channel: gRPC's default reconnect backoff (1 s growing to 120 s)
    // would keep them from a restarted manager for minutes, and leases are seconds. The "min"
    // backoff is also how long a connection attempt may take (gRPC's min_connect_timeout):
    // below the RPC deadline it would fail handshakes with a distant or busy manager.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, int(kFirstBackoff.count()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, int(kRpcDeadline.count()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, int(kMaxBackoff.count()));
    return pb::SwitchRegistry::NewStub(tls::channel(opt.manager, creds, opt.tls, args));
  }

  /// ", reporting N trees; it removed [..] and installed again [..]" for the log.
  static std::string reconciled(std::size_t reported, const pb::RegisterReply& rep) {
    const auto ids = [](const auto& list) {
      std::string out;
      for (std::uint32_t id : list) out += (out.empty() ? "" : " ") + std::to_string(id);
      return out;
    };
    std::string out = " (" + std::to_string(reported) + " trees reported";
    if (rep.removed_tree_ids_size())
      out += "; it removed stale trees " + ids(rep.removed_tree_ids());
    if (rep.reinstalled_tree_ids_size())
      out += "; it installed again trees " + ids(rep.reinstalled_tree_ids());
    return out + ")";
  }

  /// Waits `d` on the agent's clock or until stopped; true when stopped.
  bool wait(std::unique_lock<std::mutex>& lock, milliseconds d) {
    const auto stopped = [this] { return stop; };
    if (opt.clock) return opt.clock->wait(lock, cv, d, stopped);
    return cv.wait_for(lock, d, stopped);
  }

  milliseconds heartbeat_interval(std::uint64_t lease_ms) const {
    std::uint64_t ms = opt.heartbeat_ms;
    if (lease_ms) ms = std::min<std::uint64_t>(ms, lease_ms / 3);
    return milliseconds(std::max<std::uint64_t>(ms, 1));
  }

  /// Runs one RPC with the lock released, cancellable by the destructor.
  template <typename F>
  grpc::Status call(F rpc, std::unique_lock<std::mutex>& lock) {
    grpc::ClientContext ctx;
    ctx.set_deadline(Clock::now() + kRpcDeadline);
    inflight = &ctx;
    lock.unlock();
    grpc::Status s = rpc(&ctx);
    lock.lock();
    inflight = nullptr;
    return s;
  }

  /// Logs a change of state once, however often a retry repeats it.
  void report(const std::string& what) {
    if (what == last_report) return;
    last_report = what;
    service.log(what);
  }

  void stop_thread() {
    {
      std::lock_guard l(mu);
      stop = true;
      if (inflight) inflight->TryCancel();
    }
    cv.notify_all();
    if (thread.joinable()) thread.join();
  }

  AgentOptions opt;
  TreeControl& trees;
  Service service;
  std::unique_ptr<grpc::Server> server;
  std::shared_ptr<grpc::ChannelCredentials> creds;  ///< to the manager
  int port = 0;
  std::string advertise;
  std::atomic<bool> registered{false};

  std::mutex mu;  // guards stop, inflight, last_report
  std::condition_variable cv;
  bool stop = false;
  grpc::ClientContext* inflight = nullptr;
  std::string last_report;
  std::thread thread;
};

std::unique_ptr<Agent> Agent::start(const AgentOptions& opt, TreeControl& trees,
                                    std::string* error) {
  if (!good_listen(opt.listen)) {
    if (error) *error = "agent: cannot listen on " + opt.listen + ": not a host:port address.";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>(opt, trees);
  std::string tls_error;
  const auto server_creds = tls::server_credentials(opt.tls, &tls_error);
  impl->creds = tls::channel_credentials(opt.tls, &tls_error);
  if (!server_creds || !impl->creds) {
    if (error) *error = "agent: " + tls_error;
    return nullptr;
  }
  grpc::ServerBuilder b;
  // Two switch daemons must not share one agent port (gRPC allows it by default on Linux).
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.AddListeningPort(opt.listen, server_creds, &impl->port);
  b.RegisterService(&impl->service);
  impl->server = b.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    if (error) *error = "agent: cannot listen on " + opt.listen + ".";
    return nullptr;
  }
  impl->advertise = opt.advertise;
  if (impl->advertise.empty())
    impl->advertise =
        opt.listen.substr(0, opt.listen.rfind(':')) + ":" + std::to_string(impl->port);
  if (!opt.manager.empty()) impl->thread = std::thread([p = impl.get()] { p->run(); });
  return std::unique_ptr<Agent>(new Agent(std::move(impl)));
}

Agent::Agent(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Agent::~Agent() {
  impl_->stop_thread();
  impl_->server->Shutdown(Clock::now() + kRpcDeadline);
}

int Agent::port() const noexcept { return impl_->port; }

bool Agent::registered() const noexcept { return impl_->registered; }

}  // namespace treeduce::switchd
