// An in-process simulated fabric: switches run the real dp::Core, hosts run the reference
// host::ProtocolEngine, links lose, duplicate, delay and reorder frames under a seeded RNG, and
// a virtual clock makes every run fast and reproducible.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <queue>
#include <random>
#include <vector>

#include "treeduce/dataplane/core.h"
#include "treeduce/host/protocol_engine.h"

namespace treeduce::sim {

/// Applied to every frame on every hop.
struct LinkModel {
  double loss = 0.0;              ///< probability a frame is lost
  double dup = 0.0;               ///< probability a frame is delivered twice
  std::uint64_t delay_ns = 2000;  ///< base one-way delay
  std::uint64_t jitter_ns = 0;    ///< extra uniform delay in [0, jitter]: reorders frames
  /// Switches read what arrived every this often, in bursts, as a polling switch drains its RX
  /// ring (0: each frame as it arrives).
  std::uint64_t switch_poll_ns = 0;
  /// The second copy of a duplicated frame comes this much later (a late copy, as after a path
  /// change), on top of its own delay.
  std::uint64_t dup_delay_ns = 0;
};

/// A tree shape: a switch (sw >= 0, an index from Fabric::add_switch) with children, or a host
/// (sw < 0, no children).
struct TopoNode {
  int sw = -1;
  std::vector<TopoNode> kids;
};

/// One job: a tree over existing switches and new hosts, and the collectives its hosts run.
struct JobSpec {
  std::uint16_t tree_id = 1;
  std::uint64_t key = 0x1234;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  bool deterministic = false;
  std::uint32_t slots = 8;
  std::uint32_t payload_bytes = 256;
  TopoNode root;
  /// inputs[collective][host] = wire-type bytes; hosts are the leaves in depth-first order.
  std::vector<std::vector<std::vector<std::uint8_t>>> inputs;
  /// expected[collective]: the result computed without the kernels (exact::Inputs), when the
  /// inputs have one; empty otherwise.
  std::vector<std::vector<std::uint8_t>> expected;
  std::uint64_t rto_initial_ns = 50'000;
  std::uint64_t rto_max_ns = 1'000'000;
  /// The adaptive timer (EngineConfig::adaptive_rto) with `rto`, scaled to the simulated links;
  /// false: the fixed rto_initial_ns.
  bool adaptive_rto = true;
  host::RtoConfig rto{100'000, 50'000, 1'000'000, 100'000'000};
  /// Pipelining: each host keeps up to this many collectives queued in its engine
  /// (ProtocolEngine::enqueue), so that they stream back to back; 0 or 1: one at a time.
  std::uint32_t pipeline = 0;
};

struct HostNode {
  int job = 0;
  std::uint16_t index = 0;  // within the job
  dp::Endpoint addr;
  std::unique_ptr<host::ProtocolEngine> engine;
  std::size_t collective = 0;                      // next one to start (or queue)
  std::vector<std::vector<std::uint8_t>> outputs;  // per collective
  bool finished = false;                           // all collectives done (or failed)
  host::Status final_status = host::Status::idle;
  std::uint64_t deadline = 0;
};

struct FabricStats {
  std::uint64_t sent = 0, lost = 0, duplicated = 0, delivered = 0, unroutable = 0;
  /// With check_results_in_flight(): RESULT frames the switches sent, and those whose payload
  /// was not the reference result of the chunk their header names.
  std::uint64_t results_checked = 0, wrong_results = 0;
};

class Fabric {
 public:
  Fabric(std::uint64_t seed, LinkModel link);

  /// A new switch; returns its index (for TopoNode::sw).
  int add_switch();
  /// Install the job's tree on its switches and create its hosts. Returns the job index, or -1
  /// when a switch refused the tree.
  int add_job(const JobSpec& spec);
  /// Run until every host finished every collective or virtual time passes `limit_ns`. Returns
  /// true when all hosts completed all collectives successfully.
  bool run(std::uint64_t limit_ns = 10'000'000'000ULL);
  /// Check every RESULT a switch sends, at any level, as a receiver that trusts headers would:
  /// its payload must be the reference result (reference()) of the chunk and collective its
  /// header names. Valid where reference() is exact (exact data, or deterministic trees).
  void check_results_in_flight(bool on) { check_results_ = on; }
  /// Deliver a frame to a switch at virtual time `at_ns` (for injected bad traffic).
  void inject(int sw, std::vector<std::uint8_t> frame, std::uint64_t at_ns);
  /// Deliver a frame to the node that has its IPv4 destination address (a host too) at virtual
  /// time `at_ns`, over no link (for spoofed traffic to hosts).
  void inject_to_address(std::vector<std::uint8_t> frame, std::uint64_t at_ns);

  dp::Core& core(int sw) { return *switches_[static_cast<std::size_t>(sw)].core; }
  const dp::Endpoint& switch_addr(int sw) const {
    return switches_[static_cast<std::size_t>(sw)].addr;
  }
  /// Hosts of a job in leaf order.
  std::vector<const HostNode*> hosts(int job) const;
  const JobSpec& job(int j) const { return jobs_[static_cast<std::size_t>(j)]; }
  const FabricStats& stats() const { return stats_; }
  std::uint64_t now() const { return now_; }
  /// Address a frame may come from without belonging to any node (its replies are dropped).
  static dp::Endpoint rogue_addr();

 private:
  struct SwitchNode {
    dp::Endpoint addr;
    std::unique_ptr<dp::Core> core;
  };
  struct Ev {
    std::uint64_t t;
    std::uint64_t order;
    int node;  // index into nodes_
    std::vector<std::uint8_t> frame;
    bool operator>(const Ev& o) const { return t != o.t ? t > o.t : order > o.order; }
  };
  struct NodeRef {
    bool is_switch;
    std::size_t index;
  };

  dp::Endpoint make_addr(std::size_t node_id, std::uint16_t port) const;
  void send(const std::uint8_t* frame, std::size_t len);
  void send_raw(int node, std::vector<std::uint8_t> frame, std::uint64_t at);
  int install(const JobSpec& spec, const TopoNode& n, int job, bool is_root,
              const dp::Endpoint& parent, std::uint16_t index_at_parent, std::uint16_t* hosts);
  void host_step(HostNode& h);
  void check_result(const std::uint8_t* frame, std::size_t len);
  void start_collective(HostNode& h);

  std::mt19937_64 rng_;
  LinkModel link_;
  std::uint64_t now_ = 0;
  std::uint64_t order_ = 0;
  std::vector<NodeRef> nodes_;
  std::map<std::uint32_t, int> by_ip_;
  std::vector<SwitchNode> switches_;
  std::vector<HostNode> hosts_;
  std::vector<dp::Endpoint> leaf_of_;  // per host: its leaf switch
  std::vector<JobSpec> jobs_;
  std::priority_queue<Ev, std::vector<Ev>, std::greater<>> queue_;
  std::vector<dp::TxFrame> tx_;
  FabricStats stats_;
  bool check_results_ = false;
  /// Per job: reference results per collective, computed on first use.
  std::vector<std::vector<std::vector<std::uint8_t>>> refs_;
};

/// Reference result of one collective of a job: each switch folds its children's payloads in child
/// order with the scalar kernels and narrows once, as the core does (exactly so in deterministic
/// mode, and in normal mode whenever the accumulation is exact, e.g. integer-valued data).
std::vector<std::uint8_t> reference(const JobSpec& spec, std::size_t collective);

}  // namespace treeduce::sim
