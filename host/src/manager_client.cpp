// The host library's JobService client: Join, a heartbeat thread, Leave (manager_client.h).
//
// Join's status codes become a Result the communicator can act on:
//   OK                                      ok, with the assignment
//   RESOURCE_EXHAUSTED, FAILED_PRECONDITION refused: the manager has no tree for the job
//   NOT_FOUND                               refused: the host is not in the topology, so no switch
//                                           can serve it; host-side reduction still can
//   ABORTED                                 refused: the job ended while this rank waited
//   INVALID_ARGUMENT, ALREADY_EXISTS        invalid_argument: the request itself is wrong (bad
//                                           rank or sizes, a rank started twice); falling back
//                                           would hide a launcher mistake
//   UNAVAILABLE, DEADLINE_EXCEEDED, other   unavailable: no manager, a manager that is stopping,
//                                           ranks that did not all come in time, or something
//                                           that is not a manager at the address
// refused and unavailable both let the communicator fall back; only the wording differs.
//
// Heartbeats: a manager that answers FAILED or REFUSED (a switch of the tree died, or a rank's
// lease lapsed) or no longer knows the job makes the tree unusable. A manager that does not
// answer at all does not: the switches keep forwarding without it, and a restarted manager
// restores the job (docs/manager.md, "Persistence and restart"), so a job must not abandon a
// working tree because the control plane blinked. That is logged once per outage.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "grpc_tls.h"
#include "manager.grpc.pb.h"
#include "manager_client.h"

namespace treeduce::host {
namespace {

// One whole line on stderr in one write: the heartbeat threads of several clients in one process
// (ranks of a test, or of a multi-rank launcher) must not interleave their words.
void log_line(const std::string& line) {
  const std::string out = line + "\n";
  std::fwrite(out.data(), 1, out.size(), stderr);
}

namespace pb = treeduce::control::v1;
using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kDefaultLeaseMs = 10000;
constexpr auto kJoinMargin = std::chrono::seconds(5);
constexpr auto kLeaveDeadline = std::chrono::seconds(2);

std::string sentence(std::string s) {
  if (s.empty()) return "no reason was given.";
  if (s.back() != '.') s += '.';
  return s;
}

Result join_result(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK:
      return Result::ok;
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ABORTED:
      return Result::refused;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      return Result::invalid_argument;
    default:
      return Result::unavailable;
  }
}

class GrpcManagerClient final : public ManagerClient {
 public:
  GrpcManagerClient(const std::string& address, const tls::TlsOptions& tls) : address_(address) {
    // A restarted manager must see this rank's heartbeats again well within its restore grace
    // (15 s): gRPC's default reconnect backoff grows to 120 s. The "min" backoff is also how
    // long one connection attempt may take (gRPC's min_connect_timeout): at 100 ms, Joins on a
    // busy machine failed with "tcp handshaker shutdown" against a manager that was up.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    auto creds = tls::channel_credentials(tls, &tls_error_);
    // Unreadable files: a channel that can never connect, whose calls fail; join() and abort()
    // say why instead.
    if (!creds) creds = grpc::InsecureChannelCredentials();
    stub_ = pb::JobService::NewStub(tls::channel(address, creds, tls, args));
  }

  ~GrpcManagerClient() override { stop_heartbeats(); }

  JoinOutcome join(const JoinRequest& req) override {
    stop_heartbeats();  // a second join replaces the first
    if (!tls_error_.empty()) {
      JoinOutcome out;
      out.result = Result::invalid_argument;
      out.reason = "Cannot reach the Aggregation Manager at " + address_ + ": " + tls_error_;
      return out;
    }
    pb::JoinRequest r;
    r.set_job(req.job);
    r.set_rank(req.rank);
    r.set_world_size(req.world_size);
    r.set_host(req.host);
    r.set_port(req.port);
    r.set_slots(req.slots);
    r.set_payload_bytes(req.payload_bytes);
    r.set_dtype_mask(req.dtype_mask);
    r.set_op_mask(req.op_mask);
    r.set_deterministic(req.deterministic);
    r.set_wait_ms(req.wait_ms);
    grpc::ClientContext ctx;
    // The manager waits up to wait_ms for the other ranks; the margin covers the install.
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(req.wait_ms) +
                     kJoinMargin);
    pb::JoinReply rep;
    const grpc::Status s = stub_->Join(&ctx, r, &rep);
    job_ = req.job;
    rank_ = req.rank;
    // The job's credential (manager.proto JobService.Join), for heartbeats and Leave; refusals
    // carry it too.
    credential_.clear();
    const auto& trailers = ctx.GetServerTrailingMetadata();
    if (auto c = trailers.find(tls::kCredentialMetadata); c != trailers.end())
      credential_.assign(c->second.data(), c->second.size());
    if (s.ok() && !rep.assignment().credential().empty())
      credential_ = rep.assignment().credential();
    joined_ = true;
    JoinOutcome out;
    out.result = join_result(s.error_code());
    reached_ = s.error_code() != grpc::StatusCode::UNAVAILABLE;
    if (!s.ok()) {
      out.reason = out.result == Result::unavailable
                       ? "Rank " + std::to_string(req.rank) + " could not join job '" + req.job +
                             "' at the Aggregation Manager at " + address_ + ": " +
                             sentence(s.error_message())
                       : sentence(s.error_message());
      return out;
    }
    const pb::Assignment& a = rep.assignment();
    out.tree.leaf_address = a.leaf_address();
    out.tree.tree_id = std::uint16_t(a.tree_id());
    out.tree.key = a.job_key();
    out.tree.child_index = std::uint16_t(a.child_index());
    out.tree.slots = a.slots();
    out.tree.payload_bytes = a.payload_bytes();
    // Bits past the codes this library knows (a newer manager) are not ours to use.
    out.tree.dtype_mask = a.dtype_mask() & kAllDTypesMask;
    out.tree.op_mask = a.op_mask() & kAllOpsMask;
    for (const pb::TreeSwitch& ts : a.switches())
      out.tree.switches.push_back(
          {ts.name(), ts.profile(), ts.dtype_mask() & kAllDTypesMask, ts.op_mask() & kAllOpsMask});
    out.tree.deterministic = a.deterministic();
    out.tree.lease_ms = a.lease_ms() ? a.lease_ms() : kDefaultLeaseMs;
    {
      std::lock_guard lock(mu_);
      usable_ = true;
      reason_.clear();
      lease_ms_ = out.tree.lease_ms;
      stop_ = false;
      counts_ = {};
    }
    heartbeats_ = std::thread([this] { heartbeat_loop(); });
    return out;
  }

  bool tree_usable(std::string* reason) const override {
    std::lock_guard lock(mu_);
    if (!usable_ && reason) *reason = reason_;
    return usable_;
  }

  std::string abort(const std::string& job, std::optional<std::uint32_t> rank,
                    const std::string& why) override {
    if (!tls_error_.empty()) return tls_error_;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kLeaveDeadline);
    pb::AbortRequest r;
    r.set_job(job);
    r.set_rank_known(rank.has_value());
    r.set_rank(rank.value_or(0));
    r.set_reason(why);
    pb::AbortReply rep;
    const grpc::Status s = stub_->Abort(&ctx, r, &rep);
    if (s.ok()) return {};
    std::string m = s.error_message().empty() ? "no reason was given" : s.error_message();
    if (m.back() == '.') m.pop_back();
    return m;
  }

  HeartbeatCounts heartbeats() const override {
    std::lock_guard lock(mu_);
    return counts_;
  }

  void leave() override {
    stop_heartbeats();
    if (!joined_) return;
    joined_ = false;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kLeaveDeadline);
    pb::LeaveRequest r;
    r.set_job(job_);
    r.set_rank(rank_);
    r.set_credential(credential_);
    pb::LeaveReply rep;
    const grpc::Status s = stub_->Leave(&ctx, r, &rep);
    // Unknown job: the manager already dropped it. Never reached: nothing to tell it.
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND && reached_)
      log_line("treeduce: rank " + std::to_string(rank_) + " of job '" + job_ +
               "' could not leave at the Aggregation Manager at " + address_ + ": " +
               sentence(s.error_message()));
  }

 private:
  void stop_heartbeats() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (heartbeats_.joinable()) heartbeats_.join();
  }

  void heartbeat_loop() {
    auto last_answer = Clock::now();
    bool logged_outage = false;
    std::unique_lock lock(mu_);
    while (!stop_) {
      const auto interval = std::chrono::milliseconds(std::max<std::uint64_t>(lease_ms_ / 3, 1));
      const std::uint64_t lease = lease_ms_;
      if (cv_.wait_for(lock, interval, [this] { return stop_; })) break;
      lock.unlock();
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::clamp<std::chrono::milliseconds>(
                           interval, std::chrono::milliseconds(100), std::chrono::seconds(2)));
      pb::HeartbeatRequest r;
      r.set_job(job_);
      r.set_rank(rank_);
      r.set_credential(credential_);
      pb::HeartbeatReply rep;
      const grpc::Status s = stub_->Heartbeat(&ctx, r, &rep);
      lock.lock();
      ++counts_.sent;
      // A refused credential is an answer too: the manager holds the job under another one.
      const bool refused = s.error_code() == grpc::StatusCode::NOT_FOUND ||
                           s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
                           s.error_code() == grpc::StatusCode::UNAUTHENTICATED;
      if (s.ok() || refused) ++counts_.answered;
      if (s.ok()) {
        last_answer = Clock::now();
        logged_outage = false;
        if (rep.lease_ms()) lease_ms_ = rep.lease_ms();
        if (usable_ &&
            (rep.state() == pb::JOB_STATE_FAILED || rep.state() == pb::JOB_STATE_REFUSED)) {
          usable_ = false;
          reason_ = sentence(rep.reason().empty() ? "The Aggregation Manager says job '" + job_ +
                                                        "' has no working tree any more."
                                                  : rep.reason());
        }
      } else if (refused) {
        // The manager is up but has dropped the job (a lapsed lease): its tree is gone.
        if (usable_) {
          usable_ = false;
          reason_ = "The Aggregation Manager no longer knows job '" + job_ +
                    "': " + sentence(s.error_message());
        }
      } else if (!logged_outage && Clock::now() - last_answer > std::chrono::milliseconds(lease)) {
        logged_outage = true;
        log_line("treeduce: the Aggregation Manager at " + address_ + " has not answered job '" +
                 job_ + "' rank " + std::to_string(rank_) + " for over " + std::to_string(lease) +
                 " ms (" + s.error_message() +
                 "); the tree stays in use, as the switches work without the manager.");
      }
    }
  }

  const std::string address_;
  std::string tls_error_;  ///< a TLS file could not be read: every call says so
  std::unique_ptr<pb::JobService::Stub> stub_;
  // Set by join(), read by leave() and the heartbeat thread (which join() starts after them).
  std::string job_;
  std::uint32_t rank_ = 0;
  std::string credential_;  ///< the job's, from Join
  bool joined_ = false;
  bool reached_ = false;   // the last join got past the transport
  mutable std::mutex mu_;  // guards what follows
  std::condition_variable cv_;
  bool stop_ = false;
  bool usable_ = true;
  std::string reason_;
  std::uint64_t lease_ms_ = kDefaultLeaseMs;
  HeartbeatCounts counts_;
  std::thread heartbeats_;
};

}  // namespace

std::unique_ptr<ManagerClient> ManagerClient::make(const std::string& address,
                                                   const std::string& ca, const std::string& cert,
                                                   const std::string& key,
                                                   const std::string& server_name) {
  tls::TlsOptions o{ca, cert, key, false};
  o.server_name = server_name;
  return std::make_unique<GrpcManagerClient>(address, o);
}

}  // namespace treeduce::host
