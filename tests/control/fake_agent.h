// An in-process switch agent for tests: a real gRPC SwitchAgent server on 127.0.0.1 that applies
// every install to a real dataplane Core (so configurations the switch would reject fail here
// too), records what it was told, registers with the manager and heartbeats until stopped.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "grpc_edge.h"
#include "manager.grpc.pb.h"
#include "treeduce/dataplane/core.h"

namespace treeduce::ctl::testing {

namespace pb = treeduce::control::v1;

class FakeSwitchAgent final : public pb::SwitchAgent::Service {
 public:
  FakeSwitchAgent(std::string name, Address data) : name_(std::move(name)), core_(cfg(data)) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(this);
    server_ = b.BuildAndStart();
  }
  ~FakeSwitchAgent() override { stop(); }

  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  /// Registers and heartbeats every `hb_ms`.
  grpc::Status register_with(const std::string& manager, int hb_ms) {
    // Reconnect quickly when the manager restarts (gRPC's default backoff starts at 1 s and
    // grows to 120 s); a real agent wants the same.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
    auto chan = grpc::CreateCustomChannel(manager, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::SwitchRegistry::NewStub(chan);
    grpc::ClientContext ctx;
    // Wait for the channel rather than fail fast: under load the first connection attempt to a
    // manager that has just started can still be in progress.
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::RegisterRequest req;
    req.set_name(name_);
    req.set_agent_address(address());
    pb::RegisterReply rep;
    grpc::Status s = stub_->Register(&ctx, req, &rep);
    if (!s.ok()) return s;
    hb_ = std::thread([this, hb_ms] {
      for (;;) {
        {
          std::unique_lock l(hb_mu_);
          if (hb_cv_.wait_for(l, std::chrono::milliseconds(hb_ms), [this] { return stop_.load(); }))
            break;
        }
        grpc::ClientContext c;
        c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
        pb::SwitchHeartbeatRequest r;
        r.set_name(name_);
        pb::SwitchHeartbeatReply p;
        if (stub_->SwitchHeartbeat(&c, r, &p).ok()) ++heartbeats_;
      }
    });
    return s;
  }

  /// A crash: heartbeats stop and the server goes away.
  void stop() {
    {
      std::lock_guard l(hb_mu_);
      if (stop_.exchange(true)) return;
    }
    hb_cv_.notify_all();
    if (hb_.joinable()) hb_.join();
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  bool stopped() const { return stop_; }

  std::size_t tree_count() {
    std::lock_guard l(mu_);
    return core_.tree_count();
  }
  /// Heartbeats the manager accepted: a test that needs a heartbeat to have reached the
  /// manager after some point waits for this to grow by two (the first may have been in flight).
  int heartbeats() const { return heartbeats_; }
  /// Calls received, accepted or not.
  int installs() const { return installs_; }
  int removes() const { return removes_; }
  std::map<std::uint16_t, TreeInstall> trees() {
    std::lock_guard l(mu_);
    return trees_;
  }

  grpc::Status InstallTree(grpc::ServerContext*, const pb::TreeInstall* req,
                           pb::AgentReply*) override {
    ++installs_;
    if (req->switch_name() != name_)
      return {grpc::StatusCode::INVALID_ARGUMENT, "This agent serves " + name_ + "."};
    TreeInstall t = from_proto(*req);
    dp::TreeConfig c;
    c.tree_id = t.tree_id;
    c.key = t.key;
    c.role = static_cast<dp::Role>(t.role);
    c.parent.ip = t.parent.ip;
    c.parent.port = t.parent.port;
    c.index_at_parent = t.index_at_parent;
    for (const auto& ch : t.children) {
      dp::ChildConfig cc;
      cc.addr.ip = ch.addr.ip;
      cc.addr.port = ch.addr.port;
      cc.hosts = ch.hosts;
      c.children.push_back(cc);
    }
    c.slots = t.slots;
    c.payload_bytes = t.payload_bytes;
    c.dtype_mask = t.dtype_mask;
    c.op_mask = t.op_mask;
    c.deterministic = t.deterministic;
    std::lock_guard l(mu_);
    const Status st = core_.install_tree(c);
    if (st.code() == Code::already_exists) {
      if (trees_.count(t.tree_id) && trees_[t.tree_id] == t) return grpc::Status::OK;
      return {grpc::StatusCode::ALREADY_EXISTS, "Tree id in use with another config."};
    }
    if (!st.ok()) return {grpc::StatusCode::INVALID_ARGUMENT, st.message()};
    trees_[t.tree_id] = t;
    return grpc::Status::OK;
  }

  grpc::Status RemoveTree(grpc::ServerContext*, const pb::TreeRemove* req,
                          pb::AgentReply*) override {
    ++removes_;
    std::lock_guard l(mu_);
    if (!core_.remove_tree(std::uint16_t(req->tree_id())).ok())
      return {grpc::StatusCode::NOT_FOUND, "No such tree."};
    trees_.erase(std::uint16_t(req->tree_id()));
    return grpc::Status::OK;
  }

 private:
  static dp::CoreConfig cfg(Address data) {
    dp::CoreConfig c;
    c.self.ip = data.ip;
    c.self.port = data.port;
    return c;
  }
  std::string name_;
  std::mutex mu_;
  dp::Core core_;
  std::map<std::uint16_t, TreeInstall> trees_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::SwitchRegistry::Stub> stub_;
  std::atomic<bool> stop_{false};
  std::mutex hb_mu_;  // with hb_cv_: stop() wakes the heartbeat thread at once
  std::condition_variable hb_cv_;
  std::atomic<int> installs_{0}, removes_{0}, heartbeats_{0};
  std::thread hb_;
};

}  // namespace treeduce::ctl::testing
