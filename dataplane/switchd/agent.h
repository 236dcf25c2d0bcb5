/// @file
/// The switch's side of the Aggregation Manager's API (control/api/manager.proto): it registers
/// with the manager's SwitchRegistry, heartbeats, and serves SwitchAgent (InstallTree,
/// RemoveTree) by calling a TreeControl. The gRPC edge of the switch: status codes are made here
/// and nowhere else.
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
