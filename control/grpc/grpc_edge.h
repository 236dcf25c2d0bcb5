/// @file
/// The gRPC edge of the manager: JobService, SwitchRegistry and Query over a JobRegistry, and
/// the SwitchClient that reaches switch agents. Status codes are translated here and nowhere
/// else.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "grpc_tls.h"
#include "manager.grpc.pb.h"
#include "treeduce/control/registry.h"

namespace treeduce::ctl {

/// treeduce::Status -> grpc::Status (the codes share their numbering).
grpc::Status to_grpc(const Status& s);
/// grpc::Status -> treeduce::Status.
Status from_grpc(const grpc::Status& s);

/// Reaches switch agents over gRPC; one channel per agent address, every call bounded by
/// `deadline_ms`. With certificates in `tls` the manager presents its own to the agents (they
/// accept calls from the manager's identity only) and verifies theirs.
class GrpcSwitchClient final : public SwitchClient {
 public:
  explicit GrpcSwitchClient(int deadline_ms = 2000, const tls::TlsOptions& tls = {});
  Status install(const std::string& agent, const TreeInstall& t) override;
  Status remove(const std::string& agent, const std::string& switch_name,
                std::uint16_t tree_id) override;

 private:
  treeduce::control::v1::SwitchAgent::Stub* stub(const std::string& agent);
  int deadline_ms_;
  std::shared_ptr<grpc::ChannelCredentials> creds_;
  std::string creds_error_;  ///< why creds_ is null
  std::mutex mu_;
  std::unordered_map<std::string, std::unique_ptr<treeduce::control::v1::SwitchAgent::Stub>> stubs_;
};

/// TreeInstall <-> protobuf.
void to_proto(const TreeInstall& t, treeduce::control::v1::TreeInstall* p);
TreeInstall from_proto(const treeduce::control::v1::TreeInstall& p);

/// The manager's gRPC server: the four services plus a thread that expires leases.
class ManagerServer {
 public:
  /// Starts listening on `listen` ("127.0.0.1:0" picks a port; see port()), with mutual TLS
  /// when `tls` has certificates (tls::check() is the caller's business).
  /// With TLS, `admin_name` is the certificate name (CN) of the admin identity (Admin, ListJobs
  /// of every job).
  ManagerServer(JobRegistry& reg, const std::string& listen, int sweep_ms,
                const tls::TlsOptions& tls = {},
                const std::string& admin_name = tls::kDefaultAdminName);
  ~ManagerServer();
  ManagerServer(const ManagerServer&) = delete;
  ManagerServer& operator=(const ManagerServer&) = delete;
  /// False when the address could not be bound or a TLS file read (error() says which).
  bool ok() const noexcept { return server_ != nullptr; }
  const std::string& error() const noexcept { return error_; }
  int port() const noexcept { return port_; }
  void shutdown();
  void wait() { server_->Wait(); }

 private:
  class Jobs;
  class Switches;
  class Queries;
  class Admins;
  JobRegistry& reg_;
  std::unique_ptr<Jobs> jobs_;
  std::unique_ptr<Switches> switches_;
  std::unique_ptr<Queries> queries_;
  std::unique_ptr<Admins> admins_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string error_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread sweeper_;
};

}  // namespace treeduce::ctl
