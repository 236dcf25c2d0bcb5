// The host library's manager client against a real in-process manager (JobRegistry +
// ManagerServer on 127.0.0.1:0) with switch agents backed by the dataplane core, on the fabric
// of docs/manager.md: h0, h1 under leaf0; h2, h3 under leaf1; two spines.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "../control/fake_agent.h"
#include "../support/test_support.h"
#include "manager_client.h"

using treeduce::ctl::GrpcSwitchClient;
using treeduce::ctl::JobRegistry;
using treeduce::ctl::load_topology_yaml;
using treeduce::ctl::ManagerServer;
using treeduce::ctl::RegistryOptions;
using treeduce::ctl::Topology;
using treeduce::ctl::testing::FakeSwitchAgent;
using treeduce::host::JoinOutcome;
using treeduce::host::JoinRequest;
using treeduce::host::ManagerClient;
using treeduce::host::Result;

namespace {

using treeduce::test_support::eventually;
std::string doc_yaml() { return treeduce::test_support::doc_yaml("manager.md"); }

JoinRequest request(const std::string& job, std::uint32_t rank, std::uint32_t world,
                    const std::string& host) {
  JoinRequest r;
  r.job = job;
  r.rank = rank;
  r.world_size = world;
  r.host = host;
  r.port = std::uint16_t(7000 + rank);
  r.wait_ms = 5000;
  return r;
}

struct ManagerClientTest : ::testing::Test {
  std::string yaml = doc_yaml();
  Topology topo;
  GrpcSwitchClient switches{1000};
  std::unique_ptr<JobRegistry> reg;
  std::unique_ptr<ManagerServer> server;
  std::map<std::string, std::unique_ptr<FakeSwitchAgent>> agents;
  std::string addr;

  // A manager with rank lease `lease_ms` (heartbeats every third of it) and a 400 ms switch
  // lease, both on a manual clock, and an agent for every switch. No lease expires unless a
  // test advances the clock: a loaded machine delaying a heartbeat cannot fail a test.
  static constexpr std::int64_t kSwitchLeaseMs = 400;
  treeduce::test_support::ManualClock clock;
  void start(std::uint64_t lease_ms = 600, std::uint32_t max_jobs = 16384) {
    topo = *load_topology_yaml(yaml);
    RegistryOptions o;
    o.lease_ms = lease_ms;
    o.switch_lease_ms = kSwitchLeaseMs;
    o.clock = clock.fn();
    o.max_jobs = max_jobs;
    reg = std::make_unique<JobRegistry>(topo, switches, o);
    server = std::make_unique<ManagerServer>(*reg, "127.0.0.1:0", 25);
    ASSERT_TRUE(server->ok());
    addr = "127.0.0.1:" + std::to_string(server->port());
    for (const auto& s : topo.switches) {
      agents[s.name] = std::make_unique<FakeSwitchAgent>(s.name, s.data);
      ASSERT_TRUE(agents[s.name]->register_with(addr, 50).ok());
    }
  }
  void TearDown() override {
    server.reset();
    agents.clear();
  }
  /// Waits until every client in `c` and every running agent has had two more heartbeats
  /// answered: the second was sent after this call began, so it renewed the lease at the
  /// manager's current time.
  bool heartbeats_arrived(const std::vector<std::unique_ptr<ManagerClient>>& c) {
    std::vector<std::uint64_t> rank0;
    for (const auto& x : c) rank0.push_back(x->heartbeats().answered);
    std::map<std::string, int> sw0;
    for (auto& [name, a] : agents) sw0[name] = a->heartbeats();
    return eventually([&] {
      for (std::size_t i = 0; i < c.size(); ++i)
        if (c[i]->heartbeats().answered < rank0[i] + 2) return false;
      for (auto& [name, a] : agents)
        if (!a->stopped() && a->heartbeats() < sw0[name] + 2) return false;
      return true;
    });
  }
  std::size_t trees() {
    std::size_t n = 0;
    for (auto& [name, a] : agents) n += a->tree_count();
    return n;
  }

  // Every rank of `hosts` joins `job` at once through its own client.
  std::vector<JoinOutcome> join_all(const std::string& job, const std::vector<std::string>& hosts,
                                    std::vector<std::unique_ptr<ManagerClient>>* clients) {
    std::vector<JoinOutcome> out(hosts.size());
    std::vector<std::thread> th;
    for (std::size_t r = 0; r < hosts.size(); ++r) clients->push_back(ManagerClient::make(addr));
    for (std::size_t r = 0; r < hosts.size(); ++r)
      th.emplace_back([&, r] {
        out[r] = (*clients)[r]->join(
            request(job, std::uint32_t(r), std::uint32_t(hosts.size()), hosts[r]));
      });
    for (auto& t : th) t.join();
    return out;
  }
};

}  // namespace

TEST_F(ManagerClientTest, TwoRanksGetConsistentAssignmentsAndLeaveRemovesTheTree) {
  start();
  std::vector<std::unique_ptr<ManagerClient>> c;
  auto out = join_all("train", {"h0", "h1"}, &c);
  for (const auto& o : out) ASSERT_EQ(o.result, Result::ok) << o.reason;
  EXPECT_EQ(out[0].tree.tree_id, out[1].tree.tree_id);
  EXPECT_EQ(out[0].tree.key, out[1].tree.key);
  EXPECT_NE(out[0].tree.key, 0u);
  EXPECT_EQ(out[0].tree.leaf_address, "10.0.0.1:4791");  // both under leaf0, the root
  EXPECT_EQ(out[1].tree.leaf_address, "10.0.0.1:4791");
  EXPECT_NE(out[0].tree.child_index, out[1].tree.child_index);
  EXPECT_EQ(out[0].tree.slots, 16u);
  EXPECT_EQ(out[0].tree.payload_bytes, 1024u);
  // leaf0 is small-q2, a Quantum-2: SHARP's pairs without FP8, and the rank learns its model.
  const std::uint32_t q2 = treeduce::kAllDTypesMask & ~(treeduce::bit(treeduce::DType::e4m3) |
                                                        treeduce::bit(treeduce::DType::e5m2));
  EXPECT_EQ(out[0].tree.dtype_mask, q2);
  EXPECT_EQ(out[0].tree.op_mask, treeduce::kAllOpsMask);
  ASSERT_EQ(out[0].tree.switches.size(), 1u);
  EXPECT_EQ(out[0].tree.switches[0].name, "leaf0");
  EXPECT_EQ(out[0].tree.switches[0].profile, "small-q2");
  EXPECT_EQ(out[0].tree.switches[0].dtype_mask, q2);
  EXPECT_EQ(out[0].tree.switches[0].op_mask, treeduce::kAllOpsMask);
  EXPECT_EQ(out[0].tree.lease_ms, 600u);
  EXPECT_EQ(agents["leaf0"]->tree_count(), 1u);
  // Heartbeats keep the job alive past its 600 ms lease: 900 ms pass on the manager's clock,
  // half a lease at a time, each half after both ranks' heartbeats renewed their leases.
  for (int i = 0; i < 3; ++i) {
    clock.advance(300);
    ASSERT_TRUE(heartbeats_arrived(c));
  }
  ASSERT_EQ(reg->jobs().size(), 1u);
  EXPECT_EQ(reg->jobs()[0].state, treeduce::ctl::JobState::running);
  std::string why;
  EXPECT_TRUE(c[0]->tree_usable(&why)) << why;
  EXPECT_EQ(trees(), 1u);
  c[0]->leave();
  EXPECT_EQ(trees(), 1u);  // the tree goes with the last rank
  c[1]->leave();
  EXPECT_TRUE(eventually([&] { return trees() == 0; }));
  EXPECT_TRUE(reg->jobs().empty());
}

TEST_F(ManagerClientTest, ATreeAcrossLeavesGivesEachRankItsOwnLeaf) {
  start();
  std::vector<std::unique_ptr<ManagerClient>> c;
  auto out = join_all("wide", {"h0", "h1", "h2", "h3"}, &c);
  for (const auto& o : out) ASSERT_EQ(o.result, Result::ok) << o.reason;
  for (const auto& o : out) EXPECT_EQ(o.tree.tree_id, out[0].tree.tree_id);
  EXPECT_EQ(out[1].tree.leaf_address, "10.0.0.1:4791");
  EXPECT_EQ(out[2].tree.leaf_address, "10.0.0.2:4791");
  for (auto& x : c) x->leave();
  EXPECT_TRUE(eventually([&] { return trees() == 0; }));
}

TEST_F(ManagerClientTest, MissingCapabilityIsRefusedWithTheManagersSentence) {
  // leaf0 becomes an integer-only (Tofino-like) switch.
  yaml.replace(yaml.find("profile: small-q2"), 17, "profile: tofino");
  start();
  std::vector<std::unique_ptr<ManagerClient>> c;
  c.push_back(ManagerClient::make(addr));
  JoinRequest r = request("floats", 0, 1, "h0");
  r.dtype_mask = 1u << unsigned(treeduce::DType::f32);
  JoinOutcome o = c[0]->join(r);
  EXPECT_EQ(o.result, Result::refused);
  EXPECT_NE(o.reason.find("leaf0"), std::string::npos) << o.reason;
  EXPECT_EQ(o.reason.back(), '.');
  c[0]->leave();
  EXPECT_TRUE(reg->jobs().empty());
}

TEST_F(ManagerClientTest, TooManyJobsIsRefused) {
  start(600, 1);
  std::vector<std::unique_ptr<ManagerClient>> c;
  ASSERT_EQ(join_all("first", {"h0"}, &c)[0].result, Result::ok);
  auto second = ManagerClient::make(addr);
  JoinOutcome o = second->join(request("second", 0, 1, "h2"));
  EXPECT_EQ(o.result, Result::refused);
  EXPECT_EQ(o.reason, "The manager already tracks 1 jobs; try again later.");
  c[0]->leave();
}

TEST_F(ManagerClientTest, BadRequestsAreInvalidArgumentsAndUnknownHostsAreRefused) {
  start();
  auto c = ManagerClient::make(addr);
  JoinOutcome o = c->join(request("bad", 3, 2, "h0"));
  EXPECT_EQ(o.result, Result::invalid_argument);
  EXPECT_EQ(o.reason, "Rank 3 does not exist in job 'bad' of world size 2.");
  o = c->join(request("bad", 0, 1, "nowhere"));
  EXPECT_EQ(o.result, Result::refused);
  EXPECT_NE(o.reason.find("not in the topology"), std::string::npos) << o.reason;
}

// A manager whose certificate names manager.example, dialled at 127.0.0.1: the handshake fails
// unless the client is given that name (Options::tls_server_name, TREEDUCE_TLS_SERVER_NAME). A
// request the manager answers (a rank outside the world) shows that the call got through.
TEST(ManagerClientTls, TheServerNameIsCheckedInsteadOfTheAddressWhenGiven) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("treeduce-mc-tls-" + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string make =
      std::string(TREEDUCE_SOURCE_ROOT) + "/deploy/examples/make-certs.sh " + dir.string() + " ";
  for (const std::string what : {"ca", "treeduce-manager DNS:manager.example", "job"})
    ASSERT_EQ(std::system((make + what + " >/dev/null").c_str()), 0) << what;
  const std::string d = dir.string() + "/";
  Topology topo = *load_topology_yaml(doc_yaml());
  GrpcSwitchClient switches{1000};
  RegistryOptions o;
  o.require_registration = false;
  JobRegistry reg(topo, switches, o);
  ManagerServer server(
      reg, "127.0.0.1:0", 25,
      {d + "ca.pem", d + "treeduce-manager.pem", d + "treeduce-manager.key", false});
  ASSERT_TRUE(server.ok()) << server.error();
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto join = [&](const std::string& server_name) {
    auto c = ManagerClient::make(addr, d + "ca.pem", d + "job.pem", d + "job.key", server_name);
    JoinRequest r = request("named", 3, 2, "h0");
    r.wait_ms = 2000;
    const JoinOutcome out = c->join(r);
    c->leave();
    return out;
  };
  JoinOutcome out = join("manager.example");
  EXPECT_EQ(out.result, Result::invalid_argument) << out.reason;
  EXPECT_EQ(out.reason, "Rank 3 does not exist in job 'named' of world size 2.");
  EXPECT_EQ(join("").result, Result::unavailable);
  EXPECT_EQ(join("other.example").result, Result::unavailable);
  fs::remove_all(dir);
}

TEST_F(ManagerClientTest, NoManagerIsUnavailableWithinTheDeadline) {
  auto c = ManagerClient::make("127.0.0.1:1");
  JoinRequest r = request("lonely", 0, 1, "h0");
  r.wait_ms = 1000;
  const auto t0 = std::chrono::steady_clock::now();
  JoinOutcome o = c->join(r);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(6500));
  EXPECT_EQ(o.result, Result::unavailable);
  // Not "gave the job no tree": nothing answered.
  EXPECT_EQ(o.reason.rfind("Rank 0 could not join job 'lonely' at the Aggregation Manager at "
                           "127.0.0.1:1: ",
                           0),
            0u)
      << o.reason;
  c->leave();  // nothing to tell a manager that was never reached; must not block or throw
}

TEST_F(ManagerClientTest, ADeadSwitchMakesTheTreeUnusableWithAReason) {
  start(300);
  std::vector<std::unique_ptr<ManagerClient>> c;
  auto out = join_all("train", {"h0", "h1"}, &c);
  for (const auto& o : out) ASSERT_EQ(o.result, Result::ok) << o.reason;
  agents["leaf0"]->stop();  // heartbeats stop
  // leaf0's lease runs out, no other: half a switch lease passes, every live switch and both
  // ranks renew their leases (300 ms), the second half passes.
  clock.advance(kSwitchLeaseMs / 2 + 1);
  ASSERT_TRUE(heartbeats_arrived(c));
  clock.advance(kSwitchLeaseMs / 2 + 1);
  std::string why;
  ASSERT_TRUE(eventually([&] { return !c[0]->tree_usable(&why); }));
  EXPECT_NE(why.find("leaf0"), std::string::npos) << why;
  std::string why1;
  EXPECT_TRUE(eventually([&] { return !c[1]->tree_usable(&why1); }));
  for (auto& x : c) x->leave();
}

TEST_F(ManagerClientTest, AnUnreachableManagerLeavesTheTreeInUseAndIsLoggedOnce) {
  start(300);
  std::vector<std::unique_ptr<ManagerClient>> c;
  auto out = join_all("train", {"h0", "h1"}, &c);
  for (const auto& o : out) ASSERT_EQ(o.result, Result::ok) << o.reason;
  ::testing::internal::CaptureStderr();
  server.reset();  // the manager goes away; the switches keep the tree
  // Eight unanswered heartbeats each: one every third of the 300 ms lease, so the outage
  // (over a lease without an answer) began by the fourth and was retried at least four times
  // after it, which must not log it again.
  std::vector<ManagerClient::HeartbeatCounts> at_reset;
  for (auto& x : c) at_reset.push_back(x->heartbeats());
  auto unanswered = [&](std::size_t i) {
    const auto now = c[i]->heartbeats();
    return (now.sent - at_reset[i].sent) - (now.answered - at_reset[i].answered);
  };
  ASSERT_TRUE(eventually([&] { return unanswered(0) >= 8 && unanswered(1) >= 8; }));
  std::string why;
  EXPECT_TRUE(c[0]->tree_usable(&why)) << why;
  EXPECT_TRUE(c[1]->tree_usable(&why)) << why;
  c.clear();  // stops heartbeats before the log is read
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string line = "has not answered job 'train' rank 0";
  const auto first = log.find(line);
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(line, first + 1), std::string::npos) << log;
  EXPECT_EQ(agents["leaf0"]->tree_count(), 1u);
}

namespace {

// Runs the fallback probe (fallback_probe.cpp) as a one-rank job with `env` added to this
// process's environment; its stdout and exit code.
std::pair<int, std::string> run_probe(const std::vector<std::string>& env,
                                      const std::vector<std::string>& args) {
  int out[2];
  if (pipe(out) != 0) return {-1, "pipe failed"};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv{const_cast<char*>(TREEDUCE_FALLBACK_PROBE)};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) text.append(buf, std::size_t(n));
  close(out[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, text};
}

}  // namespace

// End to end through the manager: leaf0 is a Tofino-like switch, so a rank under it is given a
// tree that offloads 32-bit integer sum/min/max only; an f64 sum runs on the host path, and the
// library says so naming the switch and its model (docs/host.md, section 2).
TEST_F(ManagerClientTest, HostPathCallNamesTheSwitchModelThatCannotReduceIt) {
  const std::string from = "data: \"10.0.0.1:4791\", profile: small-q2";
  const auto at = yaml.find(from);
  ASSERT_NE(at, std::string::npos) << "docs/manager.md's example changed";
  yaml.replace(at, from.size(), "data: \"10.0.0.1:4791\", profile: tofino");
  start();
  const std::string store = "/tmp/treeduce-test-probe-" + std::to_string(getpid());
  const std::vector<std::string> env = {
      "TREEDUCE_MANAGER=" + addr, "TREEDUCE_JOB=probe",    "TREEDUCE_INSECURE=1",
      "TREEDUCE_RANK=0",          "TREEDUCE_WORLD_SIZE=1", "TREEDUCE_HOST=h0",
      "TREEDUCE_PORT=29990",      "TREEDUCE_PATH=auto",    "TREEDUCE_FALLBACK_STORE=" + store};
  auto [rc, out] = run_probe(env, {"f64", "sum", "1024", "i32", "max", "u32", "sum", "i64", "sum"});
  std::filesystem::remove_all(store);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("path network\n"), std::string::npos) << out;
  EXPECT_NE(out.find("offloads f64 sum 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("offloads i32 max 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("offloads u32 sum 1\n"), std::string::npos) << out;
  EXPECT_NE(out.find("offloads i64 sum 0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("result ok\n"), std::string::npos) << out;
  EXPECT_NE(out.find("reason allreduce of 1024 f64 sum on the host path: switch 'leaf0' (profile "
                     "tofino) does not reduce f64 sum\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("fallback_ops 1\nnetwork_ops 0\n"), std::string::npos) << out;
}

// A rank whose environment is malformed (TREEDUCE_SLOTS=3) cannot make a communicator; it tells
// the manager before it gives up, and the manager fails the job: the good rank's creation,
// waiting in Join for the bad rank, ends at once with a sentence naming the rank and the
// variable (invalid_argument: a launcher's mistake is not a reason to fall back). Before the
// manager knew of it, the good rank waited its whole join timeout (30 s), then fell back to the
// host path, whose rendezvous waited for the bad rank until Gloo's timeout: no sentence named
// the rank or the variable. Either order of arrival.
TEST_F(ManagerClientTest, MalformedEnvironmentOnOneRankFailsCreationOnEveryRank) {
  start();
  for (const bool bad_first : {false, true}) {
    const std::string job = bad_first ? "bad-env-first" : "bad-env-last";
    const std::string store = "/tmp/treeduce-test-probe-" + job + std::to_string(getpid());
    const std::vector<std::string> common = {
        "TREEDUCE_MANAGER=" + addr, "TREEDUCE_INSECURE=1", "TREEDUCE_JOB=" + job,
        "TREEDUCE_WORLD_SIZE=2",    "TREEDUCE_PATH=auto",  "TREEDUCE_FALLBACK_STORE=" + store};
    std::vector<std::string> good = common, bad = common;
    for (const char* kv : {"TREEDUCE_RANK=0", "TREEDUCE_HOST=h0", "TREEDUCE_PORT=29980"})
      good.push_back(kv);
    for (const char* kv :
         {"TREEDUCE_RANK=1", "TREEDUCE_HOST=h1", "TREEDUCE_PORT=29981", "TREEDUCE_SLOTS=3"})
      bad.push_back(kv);
    std::pair<int, std::string> g, b;
    if (bad_first) {
      b = run_probe(bad, {"f32", "sum", "16"});
      g = run_probe(good, {"f32", "sum", "16"});
    } else {
      // The good rank first, so that it waits in Join when the report comes.
      std::thread t([&] { g = run_probe(good, {"f32", "sum", "16"}); });
      ASSERT_TRUE(eventually([&] {
        for (const auto& v : reg->jobs())
          if (v.job == job && v.joined == 1) return true;
        return false;
      }));
      b = run_probe(bad, {"f32", "sum", "16"});
      t.join();
    }
    std::filesystem::remove_all(store);
    const std::string why = "TREEDUCE_SLOTS is 3; it must be a power of two from 1 to 4096.";
    EXPECT_EQ(b.first, 2) << b.second;
    EXPECT_EQ(b.second, "environment " + why + " Rank 1 told the Aggregation Manager at " + addr +
                            ", which fails job '" + job + "' for every rank.\n");
    EXPECT_EQ(g.first, 1) << g.second;
    EXPECT_EQ(g.second, "create invalid_argument Rank 1 of job '" + job + "' cannot start: " + why +
                            " Fix its environment and start the job again.\n");
  }
}
