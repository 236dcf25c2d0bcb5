// Job registry without gRPC: joins, waits, hostile requests, leases, switch failures. Switches are
// a recording client that can refuse and die; the gRPC path is in test_grpc.cpp.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "../support/test_support.h"
#include "treeduce/control/registry.h"
#include "treeduce/control/topology_source.h"

using namespace treeduce;
using namespace treeduce::ctl;

namespace {

struct RecordingClient : SwitchClient {
  std::mutex mu;
  std::map<std::string, std::map<std::uint16_t, TreeInstall>> trees;
  std::set<std::string> dead;
  int installs = 0, removes = 0;
  std::atomic<std::int64_t>* clock = nullptr;  // when set, each call takes `slow_ms` of it
  std::int64_t slow_ms = 0;
  Status install(const std::string&, const TreeInstall& t) override {
    std::lock_guard l(mu);
    if (clock != nullptr) *clock += slow_ms;
    ++installs;
    if (dead.count(t.switch_name)) return unavailable("connection refused");
    if (!trees[t.switch_name].emplace(t.tree_id, t).second) return already_exists("id in use");
    return Status::Ok();
  }
  Status remove(const std::string&, const std::string& sw, std::uint16_t id) override {
    std::lock_guard l(mu);
    if (clock != nullptr) *clock += slow_ms;
    ++removes;
    if (dead.count(sw)) return unavailable("connection refused");
    return trees[sw].erase(id) ? Status::Ok() : not_found("no such tree");
  }
  std::size_t total() {
    std::lock_guard l(mu);
    std::size_t n = 0;
    for (auto& [s, m] : trees) n += m.size();
    return n;
  }
};

struct Fixture : ::testing::Test {
  Topology topo = *make_fat_tree2(4);  // leaves leaf0..3 with h<l>-0, h<l>-1; spine0, spine1
  RecordingClient client;
  std::atomic<std::int64_t> clock{1000};
  std::unique_ptr<JobRegistry> reg;
  void SetUp() override { make(false); }
  Store* store = nullptr;
  void make(bool require_registration) {
    reg.reset();
    RegistryOptions o;
    o.store = store;
    o.lease_ms = 1000;
    o.switch_lease_ms = 1000;
    o.require_registration = require_registration;
    o.clock = [this] { return clock.load(); };
    reg = std::make_unique<JobRegistry>(topo, client, o);
  }
  static JoinArgs args(const std::string& job, std::uint32_t rank, std::uint32_t world,
                       const std::string& host, std::uint16_t port = 5000) {
    JoinArgs a;
    a.job = job;
    a.rank = rank;
    a.world = world;
    a.host = host;
    a.port = port;
    return a;
  }
  // Joins all ranks of a job from threads; returns results by rank.
  std::vector<Result<RankAssignment>> join_all(const std::string& job,
                                               const std::vector<std::string>& hosts) {
    std::vector<std::optional<Result<RankAssignment>>> out(hosts.size());
    std::vector<std::thread> th;
    for (std::uint32_t r = 0; r < hosts.size(); ++r)
      th.emplace_back([&, r] {
        out[r] = reg->join(
            args(job, r, std::uint32_t(hosts.size()), hosts[r], std::uint16_t(5000 + r)), 5000);
      });
    for (auto& t : th) t.join();
    std::vector<Result<RankAssignment>> res;
    for (auto& o : out) res.push_back(*o);
    return res;
  }
};

}  // namespace

TEST_F(Fixture, AllRanksGetConsistentAssignmentsAndSwitchesGetTheTree) {
  auto res = join_all("j", {"h0-0", "h0-1", "h2-0", "10.0.0.8"});  // last is h3-1 by address
  std::set<std::pair<std::string, int>> places;
  for (auto& r : res) {
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(r->tree_id, res[0]->tree_id);
    EXPECT_EQ(r->key, res[0]->key);
    EXPECT_EQ(r->depth, 1u);
    EXPECT_TRUE(places.emplace(r->leaf_switch, r->child_index).second);
  }
  EXPECT_EQ(res[0]->leaf_switch, "leaf0");
  EXPECT_EQ(res[3]->leaf_switch, "leaf3");
  EXPECT_EQ(res[2]->leaf, topo.switches[std::size_t(topo.find_switch("leaf2"))].data);
  // Root + three leaves; the root's children count the ranks below them.
  ASSERT_EQ(client.total(), 4u);
  const TreeInstall* root = nullptr;
  for (auto& [sw, m] : client.trees)
    for (auto& [id, t] : m)
      if (t.role == NodeRole::root) root = &t;
  ASSERT_NE(root, nullptr);
  std::multiset<int> hosts_below;
  for (auto& c : root->children) hosts_below.insert(c.hosts);
  EXPECT_EQ(hosts_below, (std::multiset<int>{1, 1, 2}));
  const TreeInstall& leaf0 = client.trees["leaf0"].begin()->second;
  EXPECT_EQ(leaf0.role, NodeRole::leaf);
  EXPECT_EQ(leaf0.parent, topo.switches[std::size_t(topo.find_switch(root->switch_name))].data);
  ASSERT_EQ(leaf0.children.size(), 2u);
  EXPECT_EQ(leaf0.children[1].addr, (Address{topo.hosts[1].data.ip, 5001}));
  EXPECT_EQ(leaf0.key, res[0]->key);
  // Leaving: the tree goes with the last rank.
  for (std::uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(reg->leave("j", r).ok());
  EXPECT_EQ(client.total(), 4u);
  ASSERT_TRUE(reg->leave("j", 3).ok());
  EXPECT_EQ(client.total(), 0u);
  for (auto& s : reg->switches()) EXPECT_EQ(s.used, Usage{});
}

// Every rank learns what each switch of its tree offloads (root first) and what the tree as a
// whole does; a switch that registers as another model changes both.
TEST_F(Fixture, AssignmentsNameEachSwitchModelAndItsPairs) {
  ResourceProfile tofino = *find_builtin_profile("tofino");
  ASSERT_TRUE(reg->register_switch("spine0", "127.0.0.1:1", tofino).ok());
  ASSERT_TRUE(reg->register_switch("spine1", "127.0.0.1:2", tofino).ok());
  auto res = join_all("caps", {"h0-0", "h1-0"});
  for (auto& r : res) {
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    ASSERT_EQ(r->switches.size(), 3u);  // a spine, then the two leaves
    EXPECT_EQ(r->switches[0].profile, "tofino");
    EXPECT_EQ(r->switches[0].name.rfind("spine", 0), 0u);
    EXPECT_EQ(r->switches[0].dtype_mask, tofino.dtype_mask);
    EXPECT_EQ(r->switches[0].op_mask, tofino.op_mask);
    EXPECT_EQ(r->switches[1].profile, "quantum2");
    EXPECT_EQ(r->switches[1].name, "leaf0");
    EXPECT_EQ(r->switches[2].name, "leaf1");
    EXPECT_EQ(r->dtype_mask, tofino.dtype_mask);  // the intersection
    EXPECT_EQ(r->op_mask, tofino.op_mask);
  }
  // Under one leaf the tree is that leaf alone, a Quantum-2: f64 sum but no FP8.
  auto one = join_all("one", {"h2-0", "h2-1"});
  ASSERT_TRUE(one[0].ok());
  ASSERT_EQ(one[0]->switches.size(), 1u);
  EXPECT_TRUE(offloads(one[0]->dtype_mask, one[0]->op_mask, DType::f64, ReduceOp::sum));
  EXPECT_FALSE(offloads(one[0]->dtype_mask, one[0]->op_mask, DType::e5m2, ReduceOp::sum));
}

// A job that needs a pair the tree's switches lack is refused, the reason naming the model.
TEST_F(Fixture, RequiredPairsAreCheckedAgainstTheTreesModels) {
  ASSERT_TRUE(reg->register_switch("leaf3", "127.0.0.1:1", *find_builtin_profile("tofino")).ok());
  auto a = args("need-f64", 0, 1, "h3-0");
  a.dtype_mask = bit(DType::f64);
  a.op_mask = bit(ReduceOp::sum);
  auto r = reg->join(a, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::failed_precondition);
  EXPECT_NE(r.status().message().find("switch leaf3 (tofino) does not reduce f64 sum"),
            std::string::npos)
      << r.status().message();
  // Masks that make no defined pair are refused before anything is allocated.
  auto b = args("meaningless", 0, 1, "h0-0");
  b.dtype_mask = bit(DType::f64);
  b.op_mask = bit(ReduceOp::bxor);
  auto rb = reg->join(b, 1000);
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.status().code(), Code::invalid_argument);
  EXPECT_NE(rb.status().message().find("bxor (bitwise xor) is defined on integer types only"),
            std::string::npos)
      << rb.status().message();
}

TEST_F(Fixture, ManyJoinsAtOnce) {
  // 24 jobs of 4 ranks, all 96 joins concurrently; leaves hold 64 trees, so all fit.
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  std::mutex mu;
  std::map<std::string, std::set<std::uint16_t>> ids;
  for (int j = 0; j < 24; ++j)
    for (std::uint32_t r = 0; r < 4; ++r)
      th.emplace_back([&, j, r] {
        std::string host = "h" + std::to_string((j + r) % 4) + "-" + std::to_string(r % 2);
        auto a =
            reg->join(args("job" + std::to_string(j), r, 4, host, std::uint16_t(6000 + r)), 10000);
        if (a.ok()) {
          ++ok;
          std::lock_guard l(mu);
          ids["job" + std::to_string(j)].insert(a->tree_id);
        }
      });
  for (auto& t : th) t.join();
  EXPECT_EQ(ok.load(), 96);
  std::set<std::uint16_t> all;
  for (auto& [job, s] : ids) {
    EXPECT_EQ(s.size(), 1u) << job;
    all.insert(*s.begin());
  }
  EXPECT_EQ(all.size(), 24u);
}

TEST_F(Fixture, HostileJoinsAreRefused) {
  auto code = [&](JoinArgs a) { return reg->join(a, 10).status().code(); };
  EXPECT_EQ(code(args("j", 4, 4, "h0-0")), Code::invalid_argument);            // rank >= world
  EXPECT_EQ(code(args("j", 0, 0, "h0-0")), Code::invalid_argument);            // world 0
  EXPECT_EQ(code(args("j", 0, 4000000000u, "h0-0")), Code::invalid_argument);  // huge world
  EXPECT_EQ(code(args("j", 0, 1000, "h0-0")), Code::invalid_argument);         // > 8 hosts x 64
  EXPECT_EQ(code(args("bad name!", 0, 2, "h0-0")), Code::invalid_argument);
  EXPECT_EQ(code(args(std::string(200, 'x'), 0, 2, "h0-0")), Code::invalid_argument);
  EXPECT_EQ(code(args("j", 0, 2, "nohost")), Code::not_found);
  EXPECT_EQ(code(args("j", 0, 2, "h0-0", 0)), Code::invalid_argument);  // no port
  // Rank 0 joins (and times out waiting), then impostors.
  auto first = reg->join(args("j", 0, 2, "h0-0"), 10);
  EXPECT_EQ(first.status().code(), Code::deadline_exceeded);
  EXPECT_NE(first.status().message().find("1 of 2 ranks"), std::string::npos);
  EXPECT_EQ(code(args("j", 0, 2, "h1-0")), Code::already_exists);        // duplicate rank
  EXPECT_EQ(code(args("j", 0, 2, "h0-0", 5001)), Code::already_exists);  // other port
  EXPECT_EQ(code(args("j", 1, 3, "h1-0")), Code::invalid_argument);      // other world size
  auto other = args("j", 1, 2, "h1-0");
  other.slots = 32;
  EXPECT_EQ(code(other), Code::invalid_argument);  // other window
  // The same endpoint again is a retry, not a duplicate; with rank 1 the job starts.
  std::thread t([&] { EXPECT_TRUE(reg->join(args("j", 0, 2, "h0-0"), 5000).ok()); });
  EXPECT_TRUE(reg->join(args("j", 1, 2, "h1-0"), 5000).ok());
  t.join();
  EXPECT_EQ(code(args("j", 1, 2, "h1-1")), Code::already_exists);
  EXPECT_EQ(reg->leave("j", 7).code(), Code::not_found);
  EXPECT_EQ(reg->heartbeat("nojob", 0).status().code(), Code::not_found);
}

TEST_F(Fixture, RefusalReachesEveryRank) {
  // Fill leaf0's 64 trees with single-rank jobs, then a two-leaf job is refused with a reason.
  // Eight slots each: 64 trees use exactly the 512 slots of a Quantum-2-like switch.
  for (int j = 0; j < 64; ++j) {
    auto a = args("f" + std::to_string(j), 0, 1, "h0-0");
    a.slots = 8;
    auto r = reg->join(a, 1000);
    ASSERT_TRUE(r.ok()) << j << " " << r.status().to_string();
  }
  auto res = join_all("big", {"h0-1", "h1-0"});
  for (auto& r : res) {
    EXPECT_EQ(r.status().code(), Code::resource_exhausted);
    EXPECT_NE(r.status().message().find("leaf0"), std::string::npos) << r.status().message();
  }
  auto hb = reg->heartbeat("big", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::refused);
}

// A rank that cannot start (a malformed environment) aborts its job: a rank waiting in Join gets
// the reason at once, a rank that comes later gets it too, nothing is installed; the record
// lasts abort_hold_ms (default 60 s), and the reporting rank's own Join starts the job afresh.
TEST_F(Fixture, AbortFailsTheJobForEveryRankWithTheReason) {
  const std::string why = "TREEDUCE_SLOTS is 3; it must be a power of two from 1 to 4096.";
  const std::string sentence =
      "Rank 2 of job 'ab' cannot start: " + why + " Fix its environment and start the job again.";
  std::optional<Result<RankAssignment>> waiting;
  std::thread t([&] { waiting = reg->join(args("ab", 0, 3, "h0-0", 5000), 600000); });
  ASSERT_TRUE(treeduce::test_support::eventually([&] {
    auto j = reg->jobs();
    return j.size() == 1 && j[0].joined == 1;
  }));
  ASSERT_TRUE(reg->abort("ab", 2, why).ok());
  t.join();  // woken by the abort: its wait was 10 minutes
  ASSERT_TRUE(waiting.has_value());
  EXPECT_EQ(waiting->status().code(), Code::invalid_argument);
  EXPECT_EQ(waiting->status().message(), sentence);
  auto later = reg->join(args("ab", 1, 3, "h0-1", 5001), 600000);
  EXPECT_EQ(later.status().code(), Code::invalid_argument);
  EXPECT_EQ(later.status().message(), sentence);
  EXPECT_EQ(client.installs, 0);
  ASSERT_EQ(reg->jobs().size(), 1u);
  EXPECT_EQ(reg->jobs()[0].state, JobState::failed);
  EXPECT_EQ(reg->jobs()[0].reason, sentence);
  // Before any rank joined, and with the rank unknown (its own variable was the bad one).
  ASSERT_TRUE(reg->abort("early", std::nullopt, "TREEDUCE_RANK is 'x', not a whole number.").ok());
  EXPECT_EQ(reg->join(args("early", 0, 1, "h0-0"), 600000).status().message(),
            "A rank of job 'early' cannot start: TREEDUCE_RANK is 'x', not a whole number. Fix "
            "its environment and start the job again.");
  // Kept through sweeps within the hold, gone after it.
  clock += 1000 + 59000 - 1;
  reg->sweep();
  EXPECT_EQ(reg->jobs().size(), 2u);
  clock += 2;
  reg->sweep();
  EXPECT_TRUE(reg->jobs().empty());
  // The reporting rank joining again (fixed) clears the record and the job starts.
  ASSERT_TRUE(reg->abort("fixed", 0, why).ok());
  EXPECT_TRUE(reg->join(args("fixed", 0, 1, "h0-0"), 5000).ok());
  // A running job is not aborted by a stranger; bad requests are refused.
  EXPECT_EQ(reg->abort("fixed", 1, why).code(), Code::failed_precondition);
  EXPECT_EQ(reg->abort("bad name!", 0, why).code(), Code::invalid_argument);
  EXPECT_EQ(reg->abort("x", 0, "").code(), Code::invalid_argument);
}

// A job belongs to the identity of the join (or abort) that made it: another identity's join
// and abort are refused and change nothing; an abort held for a job not yet known applies to
// its own identity's joins only, and another identity's join starts the job afresh.
TEST_F(Fixture, AJobBelongsToTheIdentityThatMadeIt) {
  const std::string why = "TREEDUCE_SLOTS is 3.";
  auto as = [](JoinArgs a, const std::string& who) {
    a.owner = who;
    return a;
  };
  EXPECT_EQ(reg->join(as(args("o", 0, 2, "h0-0"), "ann"), 1).status().code(),
            Code::deadline_exceeded);
  auto r = reg->join(as(args("o", 1, 2, "h0-1"), "bob"), 1);
  EXPECT_EQ(r.status().code(), Code::permission_denied);
  EXPECT_EQ(r.status().message(),
            "Job 'o' belongs to identity 'ann'; identity 'bob' cannot join it (a job's ranks "
            "share one identity; pick another job name).");
  EXPECT_EQ(reg->join(as(args("o", 1, 2, "h0-1"), ""), 1).status().message(),
            "Job 'o' belongs to identity 'ann'; a caller without a certificate cannot join it (a "
            "job's ranks share one identity; pick another job name).");
  EXPECT_EQ(reg->abort("o", 1, why, "bob").code(), Code::permission_denied);
  ASSERT_EQ(reg->jobs().size(), 1u);
  EXPECT_EQ(reg->jobs()[0].state, JobState::gathering);
  EXPECT_EQ(reg->jobs()[0].joined, 1u);
  // bob's abort of a job not yet known does not reach ann's ranks; ann's own does.
  ASSERT_TRUE(reg->abort("p", 1, why, "bob").ok());
  EXPECT_EQ(reg->join(as(args("p", 0, 2, "h0-0", 5001), "ann"), 1).status().code(),
            Code::deadline_exceeded);
  ASSERT_TRUE(reg->abort("p", 1, why, "ann").ok());
  EXPECT_EQ(reg->join(as(args("p", 0, 2, "h0-0", 5001), "ann"), 1).status().code(),
            Code::invalid_argument);
  // The owner completes its job.
  EXPECT_TRUE(reg->join(as(args("o", 1, 2, "h0-1"), "ann"), 5000).ok());
}

TEST_F(Fixture, LeasesExpireAndFreeResources) {
  ASSERT_EQ(join_all("j", {"h0-0", "h1-0"}).size(), 2u);
  ASSERT_EQ(client.total(), 3u);
  clock += 600;
  ASSERT_TRUE(reg->heartbeat("j", 0).ok());  // rank 0 renews, rank 1 goes silent
  clock += 600;
  reg->sweep();
  EXPECT_EQ(client.total(), 0u) << "expired job's tree still installed";
  for (auto& s : reg->switches()) EXPECT_EQ(s.used, Usage{});
  auto hb = reg->heartbeat("j", 0);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::failed);
  EXPECT_NE(hb->reason.find("rank 1"), std::string::npos) << hb->reason;
  clock += 2000;
  reg->sweep();
  EXPECT_TRUE(reg->jobs().empty());
  // A rank that joined and gave up waiting leaves with its lease.
  EXPECT_EQ(reg->join(args("g", 0, 2, "h0-0"), 1).status().code(), Code::deadline_exceeded);
  EXPECT_EQ(reg->jobs().size(), 1u);
  clock += 2000;
  reg->sweep();
  EXPECT_TRUE(reg->jobs().empty());
}

// The manager calls switch agents with its lock held, and heartbeats wait for that lock: a slow
// agent (a loaded machine) must not make the ranks or the other switches look dead. Each call
// here takes 1.5 s of the registry's clock against leases of 1 s.
TEST_F(Fixture, TimeSpentInSwitchCallsDoesNotRunLeasesOut) {
  make(true);
  for (const char* sw : {"leaf0", "leaf1", "spine0", "spine1"})
    ASSERT_TRUE(reg->register_switch(sw, std::string(sw) + ":7000", std::nullopt, {}).ok()) << sw;
  client.clock = &clock;
  client.slow_ms = 1500;
  ASSERT_EQ(join_all("j", {"h0-0", "h1-0"}).size(), 2u);
  ASSERT_EQ(client.total(), 3u);  // leaf0, leaf1 and a spine: 4.5 s in install calls
  reg->sweep();
  ASSERT_EQ(reg->jobs().size(), 1u);
  EXPECT_EQ(reg->jobs()[0].state, JobState::running) << reg->jobs()[0].reason;
  for (const char* sw : {"leaf0", "leaf1", "spine0", "spine1"})
    EXPECT_TRUE(reg->switch_heartbeat(sw).ok()) << sw;
  // Silence while the manager could listen still counts: 1 s more and the leases are out.
  client.slow_ms = 0;
  clock += 1001;
  reg->sweep();
  EXPECT_TRUE(reg->jobs().empty());  // both ranks silent: the job and its tree are gone
  EXPECT_EQ(client.total(), 0u);
}

TEST_F(Fixture, FailedSwitchFailsItsJobsAndIsAvoided) {
  auto res = join_all("j", {"h0-0", "h1-0"});
  ASSERT_TRUE(res[0].ok());
  std::string spine;
  for (auto& [sw, m] : client.trees)
    if (!m.empty() && sw.rfind("spine", 0) == 0) spine = sw;
  ASSERT_FALSE(spine.empty());
  client.dead.insert(spine);
  ASSERT_TRUE(reg->fail_switch(spine, "test").ok());
  auto hb = reg->heartbeat("j", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::failed);
  EXPECT_NE(hb->reason.find(spine), std::string::npos);
  EXPECT_TRUE(client.trees["leaf0"].empty());  // the live switches were told to drop the tree
  EXPECT_TRUE(client.trees["leaf1"].empty());
  auto again = join_all("k", {"h0-0", "h1-0"});
  ASSERT_TRUE(again[0].ok()) << again[0].status().to_string();
  EXPECT_EQ(client.trees[spine].count(again[0]->tree_id), 0u);
}

TEST_F(Fixture, UnreachableSwitchDuringInstallIsRoutedAround) {
  client.dead.insert("spine0");
  client.dead.insert("spine1");
  auto res = join_all("j", {"h0-0", "h1-0"});
  EXPECT_EQ(res[0].status().code(), Code::resource_exhausted) << res[0].status().to_string();
  EXPECT_NE(res[0].status().message().find("down"), std::string::npos);
  EXPECT_EQ(client.total(), 0u);  // leaves installed before the failure were rolled back
}

TEST_F(Fixture, RegistrationGatesSwitches) {
  make(true);
  auto a = reg->join(args("j", 0, 1, "h0-0"), 100);
  EXPECT_EQ(a.status().code(), Code::failed_precondition);
  EXPECT_NE(a.status().message().find("not registered"), std::string::npos);
  // A refused job stays refused (every late rank learns the same) until its ranks leave.
  EXPECT_EQ(reg->join(args("j", 0, 1, "h0-0"), 100).status().code(), Code::failed_precondition);
  ASSERT_TRUE(reg->leave("j", 0).ok());
  EXPECT_EQ(reg->register_switch("nope", "127.0.0.1:1", {}).status().code(), Code::not_found);
  EXPECT_EQ(reg->register_switch("leaf0", "", {}).status().code(), Code::invalid_argument);
  ResourceProfile tiny = *find_builtin_profile("quantum2");
  tiny.max_trees = 1;
  ASSERT_TRUE(reg->register_switch("leaf0", "127.0.0.1:1", tiny).ok());
  auto j = reg->join(args("j", 0, 1, "h0-0"), 100);
  EXPECT_TRUE(j.ok()) << j.status().to_string();
  auto b = reg->join(args("k", 0, 1, "h0-1"), 100);
  EXPECT_EQ(b.status().code(), Code::resource_exhausted);
  EXPECT_NE(b.status().message().find("1/1 trees"), std::string::npos) << b.status().message();
  // Heartbeats keep it; silence fails it.
  clock += 800;
  EXPECT_TRUE(reg->switch_heartbeat("leaf0").ok());
  clock += 800;
  ASSERT_TRUE(reg->heartbeat("j", 0).ok());
  reg->sweep();
  EXPECT_EQ(reg->heartbeat("j", 0)->state, JobState::running);
  clock += 1200;
  ASSERT_TRUE(reg->heartbeat("j", 0).ok());
  reg->sweep();
  EXPECT_EQ(reg->heartbeat("j", 0)->state, JobState::failed);
  EXPECT_EQ(reg->switch_heartbeat("leaf0").code(), Code::failed_precondition);
}

TEST_F(Fixture, RegisteredPayloadLimitsAreProtocolPayloads) {
  make(true);
  ResourceProfile p = *find_builtin_profile("quantum2");
  for (std::uint32_t bad : {0u, 255u, 8193u}) {
    p.max_payload_bytes = bad;
    const auto r = reg->register_switch("leaf0", "127.0.0.1:1", p);
    EXPECT_EQ(r.status().code(), Code::invalid_argument) << bad;
    EXPECT_NE(r.status().message().find("leaf0"), std::string::npos) << r.status().message();
  }
  // A largest payload that is no power of two (found by fuzz-registry: a one-rank job then got
  // payload 0): trees through it take the power of two below.
  p.max_payload_bytes = 1000;
  ASSERT_TRUE(reg->register_switch("leaf0", "127.0.0.1:1", p).ok());
  JoinArgs a = args("j", 0, 1, "h0-0");
  a.payload_bytes = 4096;
  const auto j = reg->join(a, 100);
  ASSERT_TRUE(j.ok()) << j.status().to_string();
  EXPECT_EQ(j->payload_bytes, 512u);
}

TEST_F(Fixture, RestartKeepsJobsAndTreesWithoutTouchingSwitches) {
  const auto path =
      std::filesystem::temp_directory_path() / ("treeduce-reg-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(path);
  auto st = open_sqlite_store(path.string());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  store = st->get();
  make(false);
  auto res = join_all("j", {"h0-0", "h1-0", "h1-1"});
  ASSERT_TRUE(res[0].ok());
  const auto owned = [](JoinArgs a) {
    a.owner = "ann";  // the gathering job's identity: it survives the restart
    return a;
  };
  EXPECT_EQ(reg->join(owned(args("g", 0, 2, "h2-0")), 1).status().code(), Code::deadline_exceeded);
  std::vector<Usage> before;
  for (auto& s : reg->switches()) before.push_back(s.used);
  const int installs = client.installs, removes = client.removes;

  // Restart: a new registry over a reopened database.
  reg.reset();
  st.value().reset();
  st = open_sqlite_store(path.string());
  ASSERT_TRUE(st.ok());
  store = st->get();
  make(false);
  auto n = reg->restore();
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(client.installs, installs) << "restart re-installed trees";
  EXPECT_EQ(client.removes, removes) << "restart removed trees";
  auto sw = reg->switches();
  for (std::size_t i = 0; i < sw.size(); ++i) EXPECT_EQ(sw[i].used, before[i]);
  auto hb = reg->heartbeat("j", 2);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::running);
  // A rank that re-joins (same endpoint) gets the same assignment.
  auto again = reg->join(args("j", 2, 3, "h1-1", 5002), 100);
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->tree_id, res[2]->tree_id);
  EXPECT_EQ(again->key, res[2]->key);
  EXPECT_EQ(again->child_index, res[2]->child_index);
  // The gathering job resumes where it was, for its own identity only.
  EXPECT_EQ(reg->join(args("g", 1, 2, "h3-0"), 5000).status().code(), Code::permission_denied);
  std::thread t([&] { EXPECT_TRUE(reg->join(owned(args("g", 0, 2, "h2-0")), 5000).ok()); });
  EXPECT_TRUE(reg->join(owned(args("g", 1, 2, "h3-0")), 5000).ok());
  t.join();
  // A new tree never reuses a live id; leaving still removes the restored tree.
  auto k = reg->join(args("k", 0, 1, "h0-1"), 100);
  ASSERT_TRUE(k.ok());
  EXPECT_NE(k->tree_id, res[0]->tree_id);
  for (std::uint32_t r = 0; r < 3; ++r) ASSERT_TRUE(reg->leave("j", r).ok());
  EXPECT_EQ(client.removes, removes + 3);

  // A damaged record comes back as a failed job with a reason, not as a crash.
  ASSERT_TRUE(store->put("jobs", "broken", "{not json").ok());
  reg.reset();
  make(false);
  ASSERT_TRUE(reg->restore().ok());
  EXPECT_FALSE(reg->join(args("broken", 0, 1, "h0-0"), 1).ok());  // refused cleanly
  bool found = false;
  for (auto& v : reg->jobs())
    if (v.job == "broken") {
      found = true;
      EXPECT_EQ(v.state, JobState::failed);
      EXPECT_NE(v.reason.find("could not restore"), std::string::npos);
    }
  EXPECT_TRUE(found);
  reg.reset();
  st.value().reset();
  std::filesystem::remove(path);
}

// Reconciliation (docs/manager.md): a registering switch's unknown trees are removed, its jobs'
// missing or different trees installed again, and a stale tree under an id never blocks a job.
TEST_F(Fixture, RegistrationReconcilesTheSwitchsTrees) {
  TreeInstall stale;
  stale.switch_name = "leaf0";
  stale.key = 1;
  for (std::uint16_t id = 1; id <= 50; ++id) {  // left by a manager that forgot them
    stale.tree_id = id;
    client.trees["leaf0"][id] = stale;
  }
  // The switch reports one of them: it is removed before the registration returns.
  auto r = reg->register_switch("leaf0", "127.0.0.1:1", {}, {{50, "gone", 1}});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->removed, std::vector<std::uint16_t>{50});
  EXPECT_TRUE(r->reinstalled.empty());
  EXPECT_EQ(client.trees["leaf0"].count(50), 0u);
  // The others it did not report: an install under a stale id replaces the stale tree.
  auto a = reg->join(args("j", 0, 1, "h0-0"), 100);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  const std::uint16_t id = a->tree_id;
  EXPECT_EQ(client.trees["leaf0"].at(id).key, a->key);
  EXPECT_EQ(client.trees["leaf0"].at(id).job, "j");
  const TreeInstall want = client.trees["leaf0"].at(id);
  // Reported with its key: nothing to do.
  r = reg->register_switch("leaf0", "127.0.0.1:1", {}, {{id, "j", a->key}});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->removed.empty() && r->reinstalled.empty());
  // Missing, or another tree under the id: installed again, the job keeps running.
  client.trees["leaf0"].erase(id);
  for (std::uint64_t key : {std::uint64_t(0), a->key + 1}) {
    std::vector<HeldTree> held;
    if (key) {
      held.push_back({id, "other", key});
      client.trees["leaf0"][id].key = key;
    }
    r = reg->register_switch("leaf0", "127.0.0.1:1", {}, held);
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->removed.empty());
    EXPECT_EQ(r->reinstalled, std::vector<std::uint16_t>{id});
    EXPECT_EQ(client.trees["leaf0"].at(id), want);
  }
  EXPECT_EQ(reg->jobs().at(0).state, JobState::running);
  // An agent that does not answer: the registration is refused (the agent retries), and the
  // switch stays as it was.
  client.dead.insert("leaf0");
  r = reg->register_switch("leaf0", "127.0.0.1:2", {}, {{77, "gone", 3}});
  EXPECT_EQ(r.status().code(), Code::unavailable);
  EXPECT_EQ(reg->switches().at(0).agent, "127.0.0.1:1");
}

// Draining (docs/manager.md, "Admin"): a drained switch takes no new trees, routed around as if
// down, while the job it carries runs on until it leaves; a job that cannot do without it is
// refused with a sentence naming the drain; undraining makes it eligible again.
TEST_F(Fixture, DrainedSwitchTakesNoNewTreesButKeepsItsJobs) {
  auto a = join_all("a", {"h0-0", "h1-0"});
  ASSERT_TRUE(a[0].ok()) << a[0].status().to_string();
  ASSERT_EQ(a[0]->switches.size(), 3u);
  const std::string spine = a[0]->switches[0].name;  // the root
  const std::string other = spine == "spine0" ? "spine1" : "spine0";
  ASSERT_TRUE(reg->drain_switch(spine, true, "swap optics").ok());
  for (const SwitchView& v : reg->switches()) {
    const bool mine = topo.switches[v.index].name == spine;
    EXPECT_EQ(v.drained, mine) << topo.switches[v.index].name;
    EXPECT_EQ(v.drain_reason, mine ? "swap optics" : "");
    EXPECT_TRUE(v.up);
  }
  // Its job runs on, its tree in place.
  clock += 600;
  reg->sweep();
  auto hb = reg->heartbeat("a", 0);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::running);
  EXPECT_EQ(client.trees[spine].count(a[0]->tree_id), 1u);
  // A new job is routed around it.
  auto b = join_all("b", {"h2-0", "h3-0"});
  ASSERT_TRUE(b[0].ok()) << b[0].status().to_string();
  EXPECT_EQ(b[0]->switches[0].name, other);
  // With both spines drained, a job across leaves has no way and is told why.
  ASSERT_TRUE(reg->drain_switch(other, true, "").ok());
  auto c = join_all("c", {"h0-1", "h2-1"});
  EXPECT_EQ(c[1].status().code(), Code::failed_precondition);
  EXPECT_NE(c[1].status().message().find("is drained by an administrator"), std::string::npos)
      << c[1].status().message();
  // A job whose only leaf is drained, the sentence naming the switch and the reason.
  ASSERT_TRUE(reg->drain_switch("leaf3", true, "power is out of spec").ok());
  auto d = reg->join(args("d", 0, 1, "h3-1"), 100);
  EXPECT_EQ(d.status().code(), Code::failed_precondition);
  EXPECT_EQ(d.status().message(),
            "No tree for job 'd': switch leaf3 (" +
                topo.profile_of(std::uint32_t(topo.find_switch("leaf3"))).name +
                ") is drained by an administrator (power is out of spec) and takes no new trees.");
  // Undrained, it takes trees again.
  ASSERT_TRUE(reg->drain_switch(other, false, "").ok());
  ASSERT_TRUE(reg->drain_switch("leaf3", false, "").ok());
  auto e = join_all("e", {"h0-1", "h3-1"});
  ASSERT_TRUE(e[0].ok()) << e[0].status().to_string();
  EXPECT_EQ(e[0]->switches[0].name, other);
  // The drained switch's job leaves when it is done: its tree goes, the switch is empty.
  ASSERT_TRUE(reg->leave("a", 0).ok());
  ASSERT_TRUE(reg->leave("a", 1).ok());
  EXPECT_TRUE(client.trees[spine].empty());
  EXPECT_EQ(reg->switches().at(std::size_t(topo.find_switch(spine))).used, Usage{});
  // Bad requests change nothing.
  EXPECT_EQ(reg->drain_switch("nosuch", true, "").code(), Code::not_found);
  for (const char* bad : {"two\nlines", "\xff", "caf\xc3", "\xed\xa0\x80", "\xc0\xaf"})
    EXPECT_EQ(reg->drain_switch("leaf0", true, bad).code(), Code::invalid_argument) << bad;
  EXPECT_EQ(reg->drain_switch("leaf0", true, std::string(201, 'x')).code(), Code::invalid_argument);
  EXPECT_FALSE(reg->switches().at(std::size_t(topo.find_switch("leaf0"))).drained);
}

// A drain is stored: it survives a restart and a re-registration; an undrain too.
TEST_F(Fixture, DrainSurvivesRestartAndRegistration) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("treeduce-drain-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(path);
  auto st = open_sqlite_store(path.string());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  store = st->get();
  make(false);
  ASSERT_TRUE(reg->drain_switch("leaf0", true, "rack move").ok());
  ASSERT_TRUE(
      reg->drain_switch("leaf1", true, "câble ✓ \xf0\x9f\x94\x8c").ok());  // UTF-8 is stored
  ASSERT_TRUE(reg->drain_switch("leaf1", false, "").ok());
  const auto leaf0 = std::size_t(topo.find_switch("leaf0"));
  const auto leaf1 = std::size_t(topo.find_switch("leaf1"));
  for (int restart = 0; restart < 2; ++restart) {
    reg.reset();
    make(false);
    ASSERT_TRUE(reg->restore().ok());
    auto sw = reg->switches();
    EXPECT_TRUE(sw.at(leaf0).drained);
    EXPECT_EQ(sw.at(leaf0).drain_reason, "rack move");
    EXPECT_FALSE(sw.at(leaf1).drained);
    // Registering again (a switch restarted for its maintenance) does not lift the drain.
    ASSERT_TRUE(reg->register_switch("leaf0", "127.0.0.1:1", {}).ok());
    ASSERT_TRUE(reg->register_switch("leaf1", "127.0.0.1:2", {}).ok());
    const auto j = reg->join(args("j", 0, 1, "h0-0"), 100);
    EXPECT_EQ(j.status().code(), Code::failed_precondition) << j.status().to_string();
    EXPECT_NE(j.status().message().find("(rack move)"), std::string::npos);
    const auto k = reg->join(args("k", 0, 1, "h1-0"), 100);
    EXPECT_TRUE(k.ok()) << k.status().to_string();
    ASSERT_TRUE(reg->leave("j", 0).ok());
    ASSERT_TRUE(reg->leave("k", 0).ok());
    EXPECT_TRUE(reg->switches().at(leaf0).drained);
  }
  reg.reset();
  st.value().reset();
  std::filesystem::remove(path);
}

// ---- changing the topology at run time (JobRegistry::set_topology) ---------------------------

namespace {

// A leaf-spine fabric in YAML: leaf N at 10.0.0.N+1 with hosts hN-0, hN-1 (10.1.N.1, .2), spine N
// at 10.0.1.N+1, every leaf linked to every spine except the links "leafN-spineM" in `cut`.
// Switches are listed in the order given, so that indices differ between two fabrics.
std::string fabric(const std::vector<std::string>& switches, const std::set<std::string>& cut = {},
                   const std::string& spine_profile = "quantum2") {
  std::string sw = "switches:\n", hosts = "hosts:\n", links = "links:\n";
  for (const std::string& s : switches) {
    const bool leaf = s.rfind("leaf", 0) == 0;
    const std::string n = s.substr(leaf ? 4 : 5);
    sw += "  - {name: " + s + ", level: " + (leaf ? "0" : "1") + ", data: \"10.0." +
          (leaf ? "0." : "1.") + std::to_string(std::stoi(n) + 1) +
          ":4791\", profile: " + (leaf ? std::string("quantum2") : spine_profile) + "}\n";
    if (!leaf) continue;
    for (int k = 0; k < 2; ++k)
      hosts += "  - {name: h" + n + "-" + std::to_string(k) + ", address: 10.1." + n + "." +
               std::to_string(k + 1) + ", switch: " + s + "}\n";
    for (const std::string& t : switches)
      if (t.rfind("spine", 0) == 0 && !cut.count(s + "-" + t))
        links += "  - {a: " + s + ", b: " + t + "}\n";
  }
  return sw + hosts + links;
}

std::string tree_root(JobRegistry& reg, const std::string& job) {
  for (const JobView& v : reg.jobs())
    if (v.job == job && !v.tree_switches.empty()) return v.tree_switches.front();
  return "";
}

}  // namespace

// A new leaf (listed first, so every index shifts) takes a job at once; the running job keeps its
// tree untouched and leaving after the change removes it from the right switches.
TEST_F(Fixture, TopologyChangeAddsALeafAndIndicesShift) {
  topo = *load_topology_yaml(fabric({"leaf0", "leaf1", "spine0"}));
  make(false);
  auto res = join_all("j", {"h0-0", "h1-0"});
  ASSERT_TRUE(res[0].ok()) << res[0].status().to_string();
  const int installs = client.installs, removes = client.removes;
  const auto before = reg->topology();

  auto ch = reg->set_topology(fabric({"leaf2", "spine0", "leaf1", "leaf0"}));
  ASSERT_TRUE(ch.ok()) << ch.status().to_string();
  EXPECT_EQ(ch->switches_added, std::vector<std::string>{"leaf2"});
  EXPECT_TRUE(ch->switches_removed.empty());
  EXPECT_TRUE(ch->switches_changed.empty());
  EXPECT_EQ(ch->hosts_added, (std::vector<std::string>{"h2-0", "h2-1"}));
  EXPECT_EQ(ch->links_added, std::vector<std::string>{"leaf2-spine0"});
  EXPECT_TRUE(ch->links_removed.empty());
  EXPECT_EQ(client.installs, installs);
  EXPECT_EQ(client.removes, removes);
  EXPECT_EQ(before->switches.size(), 3u) << "a snapshot taken before stays as it was";
  EXPECT_EQ(reg->topology()->switches.size(), 4u);

  auto hb = reg->heartbeat("j", 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->state, JobState::running);
  EXPECT_EQ(tree_root(*reg, "j"), "spine0");
  auto again = reg->join(args("j", 1, 2, "h1-0", 5001), 100);  // a retried join: same place
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->leaf_switch, "leaf1");
  EXPECT_EQ(again->tree_id, res[1]->tree_id);

  auto k = join_all("k", {"h2-0", "h0-1"});
  ASSERT_TRUE(k[0].ok()) << k[0].status().to_string();
  EXPECT_EQ(k[0]->leaf_switch, "leaf2");
  EXPECT_EQ(client.trees["leaf2"].size(), 1u);
  for (const SwitchView& v : reg->switches()) {
    if (v.name == "spine0") {
      EXPECT_EQ(v.used.trees, 2u);
    }
  }

  for (std::uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(reg->leave("j", r).ok());
  EXPECT_TRUE(client.trees["leaf0"].size() == 1 && client.trees["leaf1"].empty())
      << "the old job's tree left the switches it was on";
  for (std::uint32_t r = 0; r < 2; ++r) ASSERT_TRUE(reg->leave("k", r).ok());
  EXPECT_EQ(client.total(), 0u);
  for (const SwitchView& v : reg->switches()) EXPECT_EQ(v.used, Usage{}) << v.name;
}

// An unused spine goes; a used switch, link or host is refused naming the job and the element,
// and nothing changes.
TEST_F(Fixture, TopologyChangeRefusesToCutALiveJob) {
  topo = *load_topology_yaml(fabric({"leaf0", "leaf1", "spine0", "spine1"}));
  make(false);
  ASSERT_TRUE(join_all("j", {"h0-0", "h1-0"})[0].ok());
  EXPECT_EQ(reg->join(args("g", 0, 2, "h1-1"), 1).status().code(), Code::deadline_exceeded);
  const std::string used = tree_root(*reg, "j");
  const std::string unused = used == "spine0" ? "spine1" : "spine0";
  const auto snap = reg->topology();

  auto refused = [&](const std::string& yaml, const std::string& what) {
    auto r = reg->set_topology(yaml);
    EXPECT_EQ(r.status().code(), Code::failed_precondition) << r.status().to_string();
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("drain"), std::string::npos) << r.status().message();
    EXPECT_EQ(reg->topology(), snap) << "nothing changes on a refusal";
  };
  refused(fabric({"leaf0", "leaf1", unused}), "job 'j' (running): switch " + used + " is removed");
  refused(fabric({"leaf0", "leaf1", "spine0", "spine1"}, {"leaf1-" + used}),
          "job 'j' (running): link leaf1-" + used + " is removed");
  std::string no_host = fabric({"leaf0", "leaf1", "spine0", "spine1"});
  no_host.erase(no_host.find("  - {name: h1-1"),
                no_host.find("links:") - no_host.find("  - {name: h1-1"));
  refused(no_host, "job 'g' (gathering): host h1-1 is removed");
  // A switch that moves keeps its name but not its address: the tree's children would send to
  // the old one.
  std::string moved = fabric({"leaf0", "leaf1", "spine0", "spine1"});
  moved.replace(moved.find("10.0.0.1:4791"), 13, "10.0.9.1:4791");
  refused(moved, "switch leaf0 gets another data address");
  EXPECT_EQ(reg->jobs().size(), 2u);

  auto ok = reg->set_topology(fabric({"leaf0", "leaf1", used}));
  ASSERT_TRUE(ok.ok()) << ok.status().to_string();
  EXPECT_EQ(ok->switches_removed, std::vector<std::string>{unused});
  EXPECT_EQ(ok->links_removed, (std::vector<std::string>{"leaf0-" + unused, "leaf1-" + unused}));
  EXPECT_EQ(reg->switches().size(), 3u);
  EXPECT_EQ(reg->heartbeat("j", 0)->state, JobState::running);
  EXPECT_EQ(reg->switch_heartbeat(unused).code(), Code::not_found);
}

// Bad text changes nothing and says what the loader says.
TEST_F(Fixture, TopologyChangeWithBadYamlChangesNothing) {
  ASSERT_TRUE(join_all("j", {"h0-0", "h1-0"})[0].ok());
  const auto snap = reg->topology();
  for (const std::string& bad :
       {std::string("switches: [\n  {name: leaf0"), std::string(""),
        fabric({"leaf0", "spine0"}) + "  - {name: hx, address: 10.9.9.9, switch: nosuch}\n",
        std::string("\xff\xfe garbage: [")}) {
    auto r = reg->set_topology(bad);
    EXPECT_EQ(r.status().code(), Code::invalid_argument) << bad;
    EXPECT_NE(r.status().message().find("The topology was not changed."), std::string::npos);
    EXPECT_EQ(reg->topology(), snap);
  }
  auto r = reg->set_topology("switches: [\n  {name: leaf0");
  EXPECT_EQ(r.status().message().rfind("line ", 0), 0u) << r.status().message();
  EXPECT_EQ(reg->heartbeat("j", 0)->state, JobState::running);
}

// Kept switches keep registration, drain, limits; a registered switch that is gone is forgotten
// and a new one registers as usual.
TEST_F(Fixture, TopologyChangeKeepsSwitchState) {
  topo = *load_topology_yaml(fabric({"leaf0", "leaf1", "spine0", "spine1"}));
  make(true);
  ResourceProfile small = *find_builtin_profile("quantum2");
  small.max_trees = 3;
  for (const char* s : {"leaf0", "leaf1", "spine0", "spine1"})
    ASSERT_TRUE(
        reg->register_switch(s, "127.0.0.1:1",
                             std::string(s) == "leaf0" ? std::optional(small) : std::nullopt)
            .ok());
  ASSERT_TRUE(reg->drain_switch("leaf1", true, "rack move").ok());
  ASSERT_TRUE(reg->fail_switch("spine0", "test").ok());
  auto ch = reg->set_topology(fabric({"spine0", "leaf2", "leaf1", "leaf0"}));
  ASSERT_TRUE(ch.ok()) << ch.status().to_string();
  std::map<std::string, SwitchView> by;
  for (const SwitchView& v : reg->switches()) by[v.name] = v;
  ASSERT_EQ(by.size(), 4u);
  EXPECT_TRUE(by["leaf1"].drained);
  EXPECT_EQ(by["leaf1"].drain_reason, "rack move");
  EXPECT_TRUE(by["leaf0"].registered && by["leaf0"].up);
  EXPECT_EQ(by["leaf0"].profile.max_trees, 3u) << "registered limits are kept";
  EXPECT_FALSE(by["spine0"].up) << "a failed switch stays failed";
  EXPECT_FALSE(by["leaf2"].registered || by["leaf2"].up);
  EXPECT_EQ(reg->register_switch("spine1", "127.0.0.1:1", {}).status().code(), Code::not_found);
  ASSERT_TRUE(reg->register_switch("leaf2", "127.0.0.1:1", {}).ok());
  ASSERT_TRUE(reg->register_switch("spine0", "127.0.0.1:1", {}).ok());
  auto j = join_all("j", {"h2-0", "h0-0"});
  ASSERT_TRUE(j[0].ok()) << j[0].status().to_string();
  // A profile the new file changes replaces the old limits, unless the trees would not fit.
  ch = reg->set_topology(fabric({"spine0", "leaf2", "leaf1", "leaf0"}, {}, "tofino"));
  EXPECT_EQ(ch.status().code(), Code::failed_precondition) << "tofino reduces no f32 sum";
  ASSERT_TRUE(reg->leave("j", 0).ok() && reg->leave("j", 1).ok());
}

// With a store, an applied topology survives a restart; the start-up rule (topology_source.h)
// tells an unchanged --topology file from an edited one.
TEST_F(Fixture, AppliedTopologySurvivesARestartByTheStartupRule) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("treeduce-topo-" + std::to_string(getpid()) + ".db");
  std::filesystem::remove(path);
  auto st = open_sqlite_store(path.string());
  ASSERT_TRUE(st.ok()) << st.status().to_string();
  store = st->get();
  const std::string file = fabric({"leaf0", "leaf1", "spine0"});
  auto start = [&](const std::string& text, TopologySource src = TopologySource::automatic) {
    auto s = startup_topology("fabric.yaml", text, store, src);
    if (s.ok()) {
      topo = s->topo;
      RegistryOptions o;
      o.store = store;
      o.require_registration = false;
      o.clock = [this] { return clock.load(); };
      o.topology_file_hash = s->file_hash;
      reg.reset();
      reg = std::make_unique<JobRegistry>(topo, client, o);
      EXPECT_TRUE(reg->restore().ok());
    }
    return s;
  };
  ASSERT_TRUE(start(file).ok());
  EXPECT_EQ(start(file)->note, "") << "no applied topology: simply the file";
  ASSERT_TRUE(reg->set_topology(fabric({"leaf0", "leaf1", "leaf2", "spine0"})).ok());
  ASSERT_TRUE(join_all("j", {"h2-0", "h0-0"})[0].ok());

  auto s = start(file);  // the file is unchanged: the applied topology wins
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_NE(s->note.find("unchanged"), std::string::npos) << s->note;
  EXPECT_GE(s->topo.find_switch("leaf2"), 0);
  EXPECT_EQ(reg->heartbeat("j", 0)->state, JobState::running) << "its job came back";

  const std::string edited = fabric({"leaf0", "leaf1", "leaf3", "spine0"});
  s = start(edited);
  EXPECT_EQ(s.status().code(), Code::failed_precondition);
  EXPECT_NE(s.status().message().find("--topology-source db"), std::string::npos);
  EXPECT_NE(s.status().message().find("--topology-source file"), std::string::npos);
  s = start(edited, TopologySource::db);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_GE(s->topo.find_switch("leaf2"), 0);
  s = start(edited);  // chosen once: the same file starts quietly on the applied topology
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_GE(s->topo.find_switch("leaf2"), 0);
  s = start(edited, TopologySource::file);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_GE(s->topo.find_switch("leaf3"), 0);
  EXPECT_LT(s->topo.find_switch("leaf2"), 0);
  ASSERT_EQ(reg->jobs().size(), 1u);
  EXPECT_EQ(reg->jobs()[0].state, JobState::failed) << "its leaf is gone: said so";
  s = start(file);  // the applied topology was dropped: the file rules again
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(s->note, "");
  EXPECT_LT(s->topo.find_switch("leaf2"), 0);
  reg.reset();
  st.value().reset();
  std::filesystem::remove(path);
}
