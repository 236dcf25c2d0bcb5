/// @file
/// The switch's side of the Aggregation Manager's API (control/api/manager.proto): it registers
/// with the manager's SwitchRegistry, heartbeats, and serves SwitchAgent (InstallTree,
/// RemoveTree) by calling a TreeControl, and SetPortFault (labs) by calling a PortControl. The gRPC
/// edge of the switch: status codes are made here and nowhere else.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "grpc_tls.h"
#include "treeduce/common/status.h"
#include "treeduce/dataplane/core.h"
#include "treeduce/protocol/tree.h"

namespace treeduce::switchd {

/// What the switch can do with trees; implemented by the daemon (and by fakes in tests).
/// Calls may come from several threads at once; implementations serialise them.
class TreeControl {
 public:
  virtual ~TreeControl() = default;
  /// Ok (an identical re-install too), or: already_exists (the id is in use with another
  /// configuration), invalid_argument (the configuration is refused), resource_exhausted (no
  /// memory for its slots); the sentence says why.
  virtual Status install(const proto::TreeConfig& t, const std::string& job) = 0;
  /// Ok, or not_found when no tree has the id.
  virtual Status remove(std::uint16_t tree_id) = 0;
  /// One tree the switch holds, as the agent reports it when it registers.
  struct Held {
    std::uint16_t tree_id = 0;
    std::string job;
    std::uint64_t key = 0;
  };
  /// The trees installed through install() other than the configuration's static ones, by id:
  /// what the manager reconciles at registration (docs/manager.md, "Reconciliation").
  virtual std::vector<Held> held() const = 0;
};

/// Faults injected on one port, for labs and tests (this kernel has no netem): what `treeduce lab
/// fault` and a port's configuration set. All zero: a healthy port.
struct PortFault {
  double rx_loss = 0;  ///< drop this fraction (0..1) of the frames received, pseudo-randomly
  bool down = false;   ///< drop every frame received on the port and every frame sent on it
  /// Hold each received frame this long before the switch processes it (a long link).
  std::uint32_t delay_us = 0;
  /// Release received frames no faster than this many megabits per second (a slow link: frames
  /// queue behind each other, up to a queue of kFaultQueueFrames, then drop). 0: line rate.
  std::uint32_t rate_mbps = 0;
  bool operator==(const PortFault&) const = default;
};
inline constexpr std::uint32_t kMaxFaultDelayUs = 1'000'000;
/// Frames a delayed or slowed port holds per datapath lcore; more are dropped (fault_queue_full).
inline constexpr std::uint32_t kFaultQueueFrames = 512;
inline constexpr std::uint32_t kMaxFaultRateMbps = 1'000'000;

/// Faults at run time; implemented by the daemon when its configuration allows it (`faults`).
class PortControl {
 public:
  virtual ~PortControl() = default;
  /// Replaces port `port`'s faults with `f` (PortConfig::name). Ok, or not_found (no such port,
  /// the sentence lists them), invalid_argument (a value out of range).
  virtual Status set_port_fault(const std::string& port, const PortFault& f) = 0;
  /// Starts copying every frame received on or sent to `port` into a new pcap file `path` (an
  /// absolute path on the switch's machine, overwritten). not_found, failed_precondition (one
  /// runs there already, or the switch takes no captures), invalid_argument (cannot write it).
  virtual Status start_capture(const std::string& port, const std::string& path) = 0;
  /// Stops it: every frame the port saw before the call is in the file, which is closed;
  /// `*frames` is how many it holds. failed_precondition when none runs.
  virtual Status stop_capture(const std::string& port, std::uint64_t* frames) = 0;
};

/// Limits advertised to the manager at registration (manager.proto Resources).
struct AgentResources {
  std::uint32_t max_trees = 4096;
  std::uint32_t max_slots = 1u << 20;
  std::uint32_t max_payload_bytes = 8192;
  std::uint64_t memory_bytes = 1ull << 30;
  std::uint32_t max_children = 64;
  std::uint32_t dtype_mask = kAllDTypesMask;  ///< a software switch reduces every type
  std::uint32_t op_mask = kAllOpsMask;        ///< and every operation
  bool deterministic = true;
};

/// How the agent waits between registration attempts and between heartbeats. The default waits
/// on the real clock; tests substitute a clock they advance themselves, so that they observe
/// every wait (the backoff, the interval the lease implies) and need not sleep through them.
class AgentClock {
 public:
  virtual ~AgentClock() = default;
  /// Waits on `cv` (its mutex held by `lock`) until `d` has passed on this clock or `stopped()`
  /// is true; returns stopped(). The agent notifies `cv` when it stops.
  virtual bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv,
                    std::chrono::milliseconds d, const std::function<bool()>& stopped) = 0;
};

struct AgentOptions {
  std::string switch_name;
  std::string listen = "127.0.0.1:0";  ///< SwitchAgent server address
  std::string advertise;               ///< empty: listen's address with the bound port
  std::string manager;                 ///< empty: serve SwitchAgent without registering
  std::uint32_t heartbeat_ms = 1000;
  /// Limits to register with. Unset: the manager keeps the switch's profile from its topology
  /// (an emulated Quantum-2 stays one; a registration with limits would replace the profile).
  std::optional<AgentResources> resources;
  /// nullptr: the real clock. Must outlive the agent.
  AgentClock* clock = nullptr;
  /// Serves SetPortFault through this (must outlive the agent); nullptr: SetPortFault is refused
  /// with PERMISSION_DENIED (a production switch takes no faults from the network).
  PortControl* ports = nullptr;
  /// Certificates for the SwitchAgent server and the registration client; none: no TLS (the
  /// daemon checks that this was asked for explicitly, SwitchConfig::insecure).
  tls::TlsOptions tls;
  /// With TLS, the certificate names (CN) SwitchAgent takes calls from; others get
  /// PERMISSION_DENIED.
  std::vector<std::string> callers = {tls::kDefaultManagerName, tls::kDefaultAdminName};
};

/// Serves SwitchAgent and keeps the switch registered: registration is retried (with backoff,
/// 50 ms to 1 s) until the manager answers, and again whenever a heartbeat says the manager does
/// not know the switch (a manager restart), so neither may start first.
class Agent {
 public:
  /// nullptr and a sentence in `*error` when `listen` cannot be bound or is malformed.
  static std::unique_ptr<Agent> start(const AgentOptions& opt, TreeControl& trees,
                                      std::string* error);
  ~Agent();  ///< stops heartbeats and the server
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;
  int port() const noexcept;
  /// True once the manager accepted the registration (and has not forgotten it since).
  bool registered() const noexcept;

 private:
  struct Impl;
  explicit Agent(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace treeduce::switchd
