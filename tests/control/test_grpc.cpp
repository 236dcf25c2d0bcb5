// The manager over real gRPC on 127.0.0.1 with ephemeral ports: in-process manager server and
// switch agents backed by the dataplane core, and the treeduce-manager daemon as a process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "../support/test_support.h"
#include "fake_agent.h"

using namespace treeduce;
using namespace treeduce::ctl;
using treeduce::ctl::testing::FakeSwitchAgent;
namespace pb = treeduce::control::v1;

namespace {

using treeduce::test_support::eventually;
std::string doc_yaml() { return treeduce::test_support::doc_yaml("manager.md"); }

// docs/manager.md's fabric with one more leaf, leaf9 (host h9), under spine0.
std::string doc_yaml_plus_leaf9() {
  std::string y = doc_yaml();
  y.insert(y.find("\n", y.find("switches:")) + 1,
           "  - {name: leaf9, level: 0, data: \"10.0.0.9:4791\"}\n");
  y.insert(y.find("\n", y.find("hosts:")) + 1,
           "  - {name: h9, address: 10.1.0.9, switch: leaf9}\n");
  return y + "\n  - {a: leaf9, b: spine0}\n";
}

pb::JoinRequest join_req(const std::string& job, std::uint32_t rank, std::uint32_t world,
                         const std::string& host, std::uint32_t wait_ms = 5000) {
  pb::JoinRequest r;
  r.set_job(job);
  r.set_rank(rank);
  r.set_world_size(world);
  r.set_host(host);
  r.set_port(7000 + rank);
  r.set_wait_ms(wait_ms);
  return r;
}

// Agents for the four switches of the doc example, registered with `manager`.
struct Fabric {
  std::map<std::string, std::unique_ptr<FakeSwitchAgent>> agents;
  Fabric(const Topology& t, const std::string& manager) {
    for (const auto& s : t.switches) {
      agents[s.name] = std::make_unique<FakeSwitchAgent>(s.name, s.data);
      EXPECT_TRUE(agents[s.name]->register_with(manager, 50).ok());
    }
  }
  std::size_t trees() {
    std::size_t n = 0;
    for (auto& [name, a] : agents) n += a->tree_count();
    return n;
  }
  /// Waits until every running agent has had two more heartbeats accepted: the second was
  /// sent after this call began, so the manager saw it after anything done before.
  bool heartbeats_arrived() {
    std::map<std::string, int> before;
    for (auto& [name, a] : agents) before[name] = a->heartbeats();
    return eventually([&] {
      for (auto& [name, a] : agents)
        if (!a->stopped() && a->heartbeats() < before[name] + 2) return false;
      return true;
    });
  }
};

// Leases are measured on a manual clock: no rank or switch lease expires because the machine is
// loaded and a heartbeat came late (ManyJoinsAtOnceUntilTheLeavesAreFull failed that way under
// ASan), and the tests that want an expiry advance the clock past it.
struct Grpc : ::testing::Test {
  static constexpr std::uint64_t kSwitchLeaseMs = 400;
  Topology topo = *load_topology_yaml(doc_yaml());
  treeduce::test_support::ManualClock clock;
  GrpcSwitchClient client{1000};
  std::unique_ptr<JobRegistry> reg;
  std::unique_ptr<ManagerServer> server;
  std::string addr;
  std::unique_ptr<pb::JobService::Stub> jobs;

  void start(std::uint64_t lease_ms) {
    RegistryOptions o;
    o.lease_ms = lease_ms;
    o.switch_lease_ms = kSwitchLeaseMs;
    o.clock = clock.fn();
    reg = std::make_unique<JobRegistry>(topo, client, o);
    server = std::make_unique<ManagerServer>(*reg, "127.0.0.1:0", 25);
    ASSERT_TRUE(server->ok());
    addr = "127.0.0.1:" + std::to_string(server->port());
    jobs = pb::JobService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  }
  void SetUp() override { start(5000); }
  /// Expires the lease of every switch whose agent was stopped, and of no other: half a lease
  /// passes, every running agent's heartbeat renews its lease, and the second half passes.
  void expire_stopped_switches(Fabric& f) {
    clock.advance(kSwitchLeaseMs / 2 + 1);
    ASSERT_TRUE(f.heartbeats_arrived());
    clock.advance(kSwitchLeaseMs / 2 + 1);
  }
  void TearDown() override { server.reset(); }

  grpc::Status join(const pb::JoinRequest& r, pb::JoinReply* rep) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return jobs->Join(&ctx, r, rep);
  }
  std::vector<std::pair<grpc::Status, pb::JoinReply>> join_all(const std::string& job) {
    std::vector<std::pair<grpc::Status, pb::JoinReply>> out(4);
    std::vector<std::thread> th;
    for (std::uint32_t r = 0; r < 4; ++r)
      th.emplace_back([&, r] {
        out[r].first = join(join_req(job, r, 4, "h" + std::to_string(r)), &out[r].second);
      });
    for (auto& t : th) t.join();
    return out;
  }
  grpc::Status heartbeat(const std::string& job, std::uint32_t rank, pb::HeartbeatReply* rep) {
    grpc::ClientContext ctx;
    pb::HeartbeatRequest r;
    r.set_job(job);
    r.set_rank(rank);
    r.set_credential(reg->credential_of(job));  // as the job's ranks do
    return jobs->Heartbeat(&ctx, r, rep);
  }
};

}  // namespace

TEST_F(Grpc, JoinInstallsOnRealSwitchCoresAndLeaveRemoves) {
  Fabric f(topo, addr);
  auto res = join_all("train");
  for (auto& [s, rep] : res) {
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.assignment().tree_id(), res[0].second.assignment().tree_id());
    EXPECT_EQ(rep.assignment().job_key(), res[0].second.assignment().job_key());
    EXPECT_EQ(rep.assignment().depth(), 1u);
  }
  EXPECT_EQ(res[2].second.assignment().leaf_switch(), "leaf1");
  EXPECT_EQ(res[2].second.assignment().leaf_address(), "10.0.0.2:4791");
  EXPECT_EQ(res[3].second.assignment().child_index(), 1u);
  // Both leaves and one spine hold the tree in their dataplane core.
  EXPECT_EQ(f.agents["leaf0"]->tree_count(), 1u);
  EXPECT_EQ(f.agents["leaf1"]->tree_count(), 1u);
  EXPECT_EQ(f.agents["spine0"]->tree_count() + f.agents["spine1"]->tree_count(), 1u);
  auto leaf1 = f.agents["leaf1"]->trees().begin()->second;
  EXPECT_EQ(leaf1.children.size(), 2u);
  EXPECT_EQ(to_string(leaf1.children[0].addr), "10.1.0.3:7002");

  auto q = pb::Query::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c1;
  pb::JobList jl;
  ASSERT_TRUE(q->ListJobs(&c1, pb::ListRequest(), &jl).ok());
  ASSERT_EQ(jl.jobs_size(), 1);
  EXPECT_EQ(jl.jobs(0).state(), pb::JOB_STATE_RUNNING);
  EXPECT_EQ(jl.jobs(0).switches_size(), 3);
  grpc::ClientContext c2;
  pb::SwitchList sl;
  ASSERT_TRUE(q->ListSwitches(&c2, pb::ListRequest(), &sl).ok());
  ASSERT_EQ(sl.switches_size(), 4);
  EXPECT_EQ(sl.switches(0).resources().max_trees(), 8u);  // small-q2
  EXPECT_EQ(sl.switches(0).trees_used(), 1u);

  for (std::uint32_t r = 0; r < 4; ++r) {
    grpc::ClientContext ctx;
    pb::LeaveRequest lr;
    lr.set_job("train");
    lr.set_rank(r);
    lr.set_credential(res[r].second.assignment().credential());
    pb::LeaveReply rep;
    ASSERT_TRUE(jobs->Leave(&ctx, lr, &rep).ok());
  }
  EXPECT_EQ(f.trees(), 0u);
}

TEST_F(Grpc, ManyJoinsAtOnceUntilTheLeavesAreFull) {
  // The example's leaves (small-q2) hold 8 trees: 8 four-rank jobs joining at once (32 blocked
  // Join calls) all get a tree, the 9th is refused with the reason.
  Fabric f(topo, addr);
  std::vector<std::thread> th;
  std::vector<grpc::Status> st(32);
  std::vector<pb::JoinReply> reps(32);
  for (std::uint32_t j = 0; j < 8; ++j)
    for (std::uint32_t r = 0; r < 4; ++r)
      th.emplace_back([&, j, r] {
        st[j * 4 + r] = join(join_req("job" + std::to_string(j), r, 4, "h" + std::to_string(r)),
                             &reps[j * 4 + r]);
      });
  for (auto& t : th) t.join();
  std::set<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < 32; ++i) {
    ASSERT_TRUE(st[i].ok()) << st[i].error_message();
    ids.insert(reps[i].assignment().tree_id());
  }
  EXPECT_EQ(ids.size(), 8u);
  EXPECT_EQ(f.agents["leaf0"]->tree_count(), 8u);
  EXPECT_EQ(f.agents["spine0"]->tree_count(), 4u);  // balanced across the spines
  EXPECT_EQ(f.agents["spine1"]->tree_count(), 4u);
  pb::JoinReply rep;
  grpc::Status late = join(join_req("late", 0, 1, "h0"), &rep);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(late.error_message().find("leaf0"), std::string::npos) << late.error_message();
}

TEST_F(Grpc, HostileRpcsAreRefusedWithCodeAndSentence) {
  Fabric f(topo, addr);
  auto expect = [&](const pb::JoinRequest& r, grpc::StatusCode code) {
    pb::JoinReply rep;
    grpc::Status s = join(r, &rep);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_GT(s.error_message().size(), 10u);
    EXPECT_EQ(s.error_message().back(), '.') << s.error_message();
  };
  expect(pb::JoinRequest(), grpc::StatusCode::INVALID_ARGUMENT);
  expect(join_req("j", 4, 4, "h0"), grpc::StatusCode::INVALID_ARGUMENT);
  expect(join_req("j", 0, 4000000000u, "h0"), grpc::StatusCode::INVALID_ARGUMENT);
  expect(join_req("j", 0, 2, "nowhere"), grpc::StatusCode::NOT_FOUND);
  auto bad_port = join_req("j", 0, 2, "h0");
  bad_port.set_port(70000);
  expect(bad_port, grpc::StatusCode::INVALID_ARGUMENT);
  auto bad_slots = join_req("k", 0, 2, "h0");
  bad_slots.set_slots(3);
  expect(bad_slots, grpc::StatusCode::INVALID_ARGUMENT);
  auto bad_payload = join_req("k", 0, 2, "h0");
  bad_payload.set_payload_bytes(100000);
  expect(bad_payload, grpc::StatusCode::INVALID_ARGUMENT);
  auto bad_mask = join_req("k", 0, 2, "h0");
  bad_mask.set_dtype_mask(1u << treeduce::kNumDTypes);  // no such type
  expect(bad_mask, grpc::StatusCode::INVALID_ARGUMENT);
  expect(join_req("j", 0, 2, "h0", 20), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto dup = join_req("j", 0, 2, "h1", 20);
  expect(dup, grpc::StatusCode::ALREADY_EXISTS);
  expect(join_req("j", 1, 3, "h1", 20), grpc::StatusCode::INVALID_ARGUMENT);
  pb::HeartbeatReply hb;
  EXPECT_EQ(heartbeat("nojob", 0, &hb).error_code(), grpc::StatusCode::NOT_FOUND);
  auto sr =
      pb::SwitchRegistry::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  pb::RegisterRequest rr;
  rr.set_name("leaf9");
  rr.set_agent_address("127.0.0.1:1");
  pb::RegisterReply rrep;
  EXPECT_EQ(sr->Register(&ctx, rr, &rrep).error_code(), grpc::StatusCode::NOT_FOUND);
  // A reported tree id outside 1..65535 is refused with a sentence, not truncated.
  for (std::uint32_t id : {0u, 65536u}) {
    grpc::ClientContext c;
    pb::RegisterRequest bad;
    bad.set_name("leaf0");
    bad.set_agent_address("127.0.0.1:1");
    bad.add_trees()->set_tree_id(id);
    const grpc::Status st = sr->Register(&c, bad, &rrep);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_EQ(st.error_message(), "Switch 'leaf0' reports tree id " + std::to_string(id) +
                                      "; tree ids are 1 to 65535.");
  }
}

TEST_F(Grpc, CrashedSwitchFailsTheJobAndRanksAreTold) {
  Fabric f(topo, addr);
  auto res = join_all("train");
  ASSERT_TRUE(res[0].first.ok()) << res[0].first.error_message();
  std::string spine = f.agents["spine0"]->tree_count() ? "spine0" : "spine1";
  f.agents[spine]->stop();
  expire_stopped_switches(f);
  pb::HeartbeatReply hb;
  ASSERT_TRUE(eventually(
      [&] { return heartbeat("train", 0, &hb).ok() && hb.state() == pb::JOB_STATE_FAILED; }));
  EXPECT_NE(hb.reason().find(spine), std::string::npos) << hb.reason();
  EXPECT_EQ(f.agents["leaf0"]->tree_count(), 0u);  // the live switches dropped the tree
  EXPECT_EQ(f.agents["leaf1"]->tree_count(), 0u);
}

TEST_F(Grpc, ExpiredLeasesRemoveTrees) {
  server.reset();
  start(300);
  Fabric f(topo, addr);
  auto res = join_all("train");
  ASSERT_TRUE(res[0].first.ok()) << res[0].first.error_message();
  EXPECT_EQ(f.trees(), 3u);
  clock.advance(301);  // past the ranks' lease (300 ms), within the switches' (400 ms)
  EXPECT_TRUE(eventually([&] { return f.trees() == 0; }));
  EXPECT_TRUE(reg->jobs().empty());
}

namespace {

// Runs the treeduce CLI; returns exit status and output (stdout and stderr).
std::pair<int, std::string> cli(const std::string& args) {
  // The in-process manager runs without TLS.
  std::string cmd = "TREEDUCE_INSECURE=1 " + std::string(TREEDUCE_CLI_BIN) + " " + args + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  int st = pclose(f);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace

TEST_F(Grpc, CliPrintsTablesAndJson) {
  Fabric f(topo, addr);
  for (auto& [s, rep] : join_all("train")) ASSERT_TRUE(s.ok());
  const std::string m = "--manager " + addr + " ";
  auto [rc, jobs_out] = cli(m + "jobs");
  EXPECT_EQ(rc, 0) << jobs_out;
  EXPECT_EQ(jobs_out.rfind("JOB", 0), 0u) << jobs_out;
  EXPECT_NE(jobs_out.find("train  running  4/4"), std::string::npos) << jobs_out;
  auto [rc2, res_out] = cli(m + "resources");
  EXPECT_EQ(rc2, 0);
  EXPECT_NE(res_out.find("small-q2"), std::string::npos) << res_out;
  EXPECT_NE(res_out.find("1/8"), std::string::npos) << res_out;
  auto [rc3, trees_json] = cli(m + "--json trees");
  ASSERT_EQ(rc3, 0) << trees_json;
  auto t = nlohmann::json::parse(trees_json);
  ASSERT_EQ(t.size(), 1u);
  EXPECT_EQ(t[0]["job"], "train");
  EXPECT_EQ(t[0]["switches"].size(), 3u);
  EXPECT_EQ(t[0]["offloads"],
            "f32,f16,bf16,i32,i8,u8,i16,u16,u32,i64,u64,f64,f32_i32,f64_i32,i32_i32 with "
            "sum,min,max,prod,band,bor,bxor,land,lor,lxor,minloc,maxloc (102 pairs)");
  auto [rc4, sw_json] = cli(m + "--json switches");
  ASSERT_EQ(rc4, 0);
  auto sw = nlohmann::json::parse(sw_json);
  ASSERT_EQ(sw.size(), 4u);
  EXPECT_EQ(sw[0]["state"], "up");
  // Draining through the CLI: `switches` shows it, the running job is untouched.
  const std::string name0 = sw[0]["switch"];
  auto [rc7, drained] = cli(m + "drain-switch " + name0 + " --reason 'new optics'");
  ASSERT_EQ(rc7, 0) << drained;
  EXPECT_EQ(drained, "switch " + name0 +
                         " drained: it takes no new trees; its jobs run on until they leave "
                         "(treeduce resources shows its trees)\n");
  auto [rc8, sw_table] = cli(m + "switches");
  EXPECT_EQ(rc8, 0);
  EXPECT_NE(sw_table.find("drained"), std::string::npos) << sw_table;
  EXPECT_NE(sw_table.find("new optics"), std::string::npos) << sw_table;
  sw = nlohmann::json::parse(cli(m + "--json switches").second);
  EXPECT_EQ(sw[0]["state"], "drained");
  EXPECT_EQ(sw[0]["drain_reason"], "new optics");
  EXPECT_NE(cli(m + "jobs").second.find("train  running  4/4"), std::string::npos);
  auto [rc9, undrained] = cli(m + "undrain-switch " + name0);
  ASSERT_EQ(rc9, 0) << undrained;
  EXPECT_EQ(undrained, "switch " + name0 + " undrained: it takes new trees again\n");
  sw = nlohmann::json::parse(cli(m + "--json switches").second);
  EXPECT_EQ(sw[0]["state"], "up");
  EXPECT_EQ(cli(m + "drain-switch nosuch").first, 1);
  // Changing the topology: what changed, a refusal that names the job, a bad file.
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("treeduce-cli-topo-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/plus.yaml") << doc_yaml_plus_leaf9();
  auto [rc10, changed] = cli(m + "set-topology " + dir + "/plus.yaml");
  EXPECT_EQ(rc10, 0) << changed;
  EXPECT_EQ(changed,
            "topology changed:\n  switches added (1): leaf9\n  hosts added (1): h9\n"
            "  links added (1): leaf9-spine0\n");
  EXPECT_EQ(cli(m + "set-topology " + dir + "/plus.yaml").second,
            "topology unchanged: " + dir + "/plus.yaml describes the topology the manager has\n");
  std::ofstream(dir + "/cut.yaml")
      << doc_yaml().substr(0, doc_yaml().find("  - {name: spine0")) +
             doc_yaml().substr(doc_yaml().find("hosts:"),
                               doc_yaml().find("links:") - doc_yaml().find("hosts:"));
  auto [rc11, cut] = cli(m + "set-topology " + dir + "/cut.yaml");
  EXPECT_EQ(rc11, 1);
  EXPECT_NE(cut.find("job 'train' (running): switch spine"), std::string::npos) << cut;
  EXPECT_NE(cut.find("drain"), std::string::npos) << cut;
  std::ofstream(dir + "/bad.yaml") << "switches: [\n";
  auto [rc12, bad] = cli(m + "set-topology " + dir + "/bad.yaml");
  EXPECT_EQ(rc12, 1);
  EXPECT_EQ(bad.rfind("treeduce: " + dir + "/bad.yaml: line ", 0), 0u) << bad;
  EXPECT_EQ(cli(m + "set-topology " + dir + "/nosuch.yaml").first, 2);
  std::filesystem::remove_all(dir);
  auto [rc5, down] = cli("--manager 127.0.0.1:1 jobs");
  EXPECT_NE(rc5, 0);
  EXPECT_NE(down.find("cannot reach the manager"), std::string::npos) << down;
  auto [rc6, usage] = cli("");
  EXPECT_NE(rc6, 0);
}

namespace {

struct Daemon {
  pid_t pid = -1;
  int port = 0;
  // Starts treeduce-manager and waits for its port file.
  Daemon(const std::string& yaml, const std::string& dir, const std::string& listen,
         const std::string& db) {
    namespace fs = std::filesystem;
    const std::string pf = dir + "/port";
    fs::remove(pf);
    pid = fork();
    if (pid == 0) {
      std::vector<const char*> argv = {"treeduce-manager", "--topology", yaml.c_str(), "--listen",
                                       listen.c_str(), "--port-file", pf.c_str(),
                                       // Leases on the daemon's real clock: long enough
                                       // that a loaded machine delaying heartbeats cannot
                                       // expire one during a test.
                                       "--switch-lease-ms", "10000", "--restore-grace-ms", "10000",
                                       "--insecure"};
      if (!db.empty()) {
        argv.push_back("--db");
        argv.push_back(db.c_str());
      }
      argv.push_back(nullptr);
      execv(TREEDUCE_MANAGER_BIN, const_cast<char* const*>(argv.data()));
      _exit(127);
    }
    if (eventually([&] { return fs::exists(pf); }, 10000)) std::ifstream(pf) >> port;
  }
  // A test that fails half-way must not leave the daemon running: it holds the test's stdout,
  // and meson would wait for it until the test's timeout.
  ~Daemon() {
    if (pid > 0) stop(SIGKILL);
  }
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;
  std::string addr() const { return "127.0.0.1:" + std::to_string(port); }
  int stop(int sig) {
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return status;
  }
};

std::string temp_dir(const std::string& tag) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("treeduce-" + tag + "-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// The four ranks' Join statuses; `*credential` gets the job's credential from them.
std::vector<grpc::Status> join_four(const std::string& addr, const std::string& job,
                                    std::string* credential = nullptr) {
  auto stub =
      pb::JobService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  std::vector<grpc::Status> st(4);
  std::vector<pb::JoinReply> rep(4);
  std::vector<std::thread> th;
  for (std::uint32_t r = 0; r < 4; ++r)
    th.emplace_back([&, r] {
      grpc::ClientContext ctx;
      st[r] = stub->Join(&ctx, join_req(job, r, 4, "10.1.0." + std::to_string(r + 1)), &rep[r]);
    });
  for (auto& t : th) t.join();
  if (credential) *credential = rep[0].assignment().credential();
  return st;
}

}  // namespace

TEST(ManagerProcess, DaemonServesJoinsAndStopsOnSigterm) {
  const std::string dir = temp_dir("mgr");
  const std::string yaml = dir + "/fabric.yaml";
  std::ofstream(yaml) << doc_yaml();
  Daemon d(yaml, dir, "127.0.0.1:0", "");
  ASSERT_GT(d.port, 0);
  Topology topo = *load_topology_yaml(doc_yaml());
  {
    Fabric f(topo, d.addr());
    for (auto& s : join_four(d.addr(), "p")) EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(f.trees(), 3u);
  }
  int status = d.stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::filesystem::remove_all(dir);
}

TEST(ManagerProcess, KilledDaemonRestartsWithoutDisturbingTrees) {
  const std::string dir = temp_dir("restart");
  const std::string yaml = dir + "/fabric.yaml", db = dir + "/state.db";
  std::ofstream(yaml) << doc_yaml();
  Topology topo = *load_topology_yaml(doc_yaml());
  auto first = std::make_unique<Daemon>(yaml, dir, "127.0.0.1:0", db);
  ASSERT_GT(first->port, 0);
  const std::string addr = first->addr();
  Fabric f(topo, addr);
  std::string credential;
  for (auto& s : join_four(addr, "train", &credential)) ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(credential.size(), 32u);
  std::map<std::string, std::pair<int, int>> calls;
  for (auto& [n, a] : f.agents) calls[n] = {a->installs(), a->removes()};
  EXPECT_EQ(f.trees(), 3u);

  first->stop(SIGKILL);  // no goodbye: the state must already be on disk
  Daemon second(yaml, dir, addr, db);
  ASSERT_EQ(second.port, first->port);
  auto stub =
      pb::JobService::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  // The restored manager knows the switches as registered: it accepts their agents'
  // heartbeats (it would answer FAILED_PRECONDITION to a switch it had forgotten), so their
  // leases are renewed and will not run out when the restart grace ends.
  ASSERT_TRUE(f.heartbeats_arrived());
  for (std::uint32_t r = 0; r < 4; ++r) {
    grpc::ClientContext ctx;
    pb::HeartbeatRequest hr;
    hr.set_job("train");
    hr.set_rank(r);
    // The credential survives the restart with the job (--db).
    hr.set_credential(credential);
    pb::HeartbeatReply rep;
    grpc::Status s = stub->Heartbeat(&ctx, hr, &rep);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(rep.state(), pb::JOB_STATE_RUNNING) << rep.reason();
  }
  for (auto& [n, a] : f.agents) {
    EXPECT_EQ(a->installs(), calls[n].first) << n << " was re-installed";
    EXPECT_EQ(a->removes(), calls[n].second) << n << " lost a tree";
  }
  EXPECT_EQ(f.trees(), 3u);
  auto q = pb::Query::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c2;
  pb::SwitchList sl;
  ASSERT_TRUE(q->ListSwitches(&c2, pb::ListRequest(), &sl).ok());
  std::uint32_t used = 0;
  for (const auto& s : sl.switches()) {
    used += s.trees_used();
    EXPECT_TRUE(s.up()) << s.name();
  }
  EXPECT_EQ(used, 3u);
  // Leaving after the restart removes the trees the first manager installed.
  for (std::uint32_t r = 0; r < 4; ++r) {
    grpc::ClientContext ctx;
    pb::LeaveRequest lr;
    lr.set_job("train");
    lr.set_rank(r);
    lr.set_credential(credential);
    pb::LeaveReply rep;
    ASSERT_TRUE(stub->Leave(&ctx, lr, &rep).ok());
  }
  EXPECT_EQ(f.trees(), 0u);
  for (auto& [n, a] : f.agents) a->stop();
  second.stop(SIGTERM);
  std::filesystem::remove_all(dir);
}

// `treeduce doctor`: exit 0 when a job would be reduced in the network, 1 with the reasons when
// not, 2 on usage errors; it reads the Query service and never creates a job.
TEST_F(Grpc, DoctorSaysWhetherAJobWouldBeOffloadedAndWhyNot) {
  Fabric f(topo, addr);
  // The topology's leaves (10.0.0.x) are not on this machine: no ping may leave it.
  setenv("TREEDUCE_DOCTOR_PING", "0", 1);
  const std::string m = "--manager " + addr + " doctor ";
  auto [rc, out] = cli(m + "--job train --world 4 --host h0");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Job 'train' (4 ranks, f32 sum) would be reduced in the network."),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("4 of 4 switches (2 of 2 leaves) are up"), std::string::npos) << out;
  EXPECT_TRUE(reg->jobs().empty());

  // The library's variables stand in for the options.
  setenv("TREEDUCE_JOB", "envjob", 1);
  setenv("TREEDUCE_WORLD_SIZE", "2", 1);
  std::tie(rc, out) = cli(m);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("Job 'envjob' (2 ranks, f32 sum)"), std::string::npos) << out;
  setenv("TREEDUCE_WORLD_SIZE", "two", 1);
  EXPECT_EQ(cli(m).first, 2);
  unsetenv("TREEDUCE_JOB");
  unsetenv("TREEDUCE_WORLD_SIZE");

  // Usage errors.
  std::tie(rc, out) = cli(m + "--job x");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("--world"), std::string::npos) << out;
  EXPECT_EQ(cli(m + "--world 0").first, 2);
  std::tie(rc, out) = cli(m + "--world 2 --dtype f33");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("'f33' is not an element type"), std::string::npos) << out;
  EXPECT_EQ(cli(m + "--world 2 --slots 3").first, 2);
  std::tie(rc, out) = cli(m + "--world 2 --dtype f64 --op bxor");
  EXPECT_EQ(rc, 2) << out;
  EXPECT_NE(out.find("f64 bxor is not a reduction: bxor (bitwise xor) is defined on integer "
                     "types only"),
            std::string::npos)
      << out;
  // What each model offloads, once per profile.
  std::tie(rc, out) = cli(m + "--world 2 --dtype u64 --op prod");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("note     Profile small-q2 (leaf0,leaf1) offloads f32,f16,bf16,i32,i8,u8,"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("note     Profile quantum2 (spine0,spine1) offloads"), std::string::npos)
      << out;
  std::tie(rc, out) = cli(m + "--world 2 --dtype e5m2 --op sum");
  EXPECT_EQ(rc, 1) << out;  // Quantum-2 has no FP8
  EXPECT_NE(out.find("Switch leaf0 (small-q2) does not reduce e5m2 sum; it reduces"),
            std::string::npos)
      << out;

  // No manager.
  std::tie(rc, out) = cli("--manager 127.0.0.1:1 doctor --world 2");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("blocked  The manager at 127.0.0.1:1 cannot be reached"), std::string::npos)
      << out;

  // A name in use, and a bad name.
  for (auto& [s, rep] : join_all("train")) ASSERT_TRUE(s.ok());
  std::tie(rc, out) = cli(m + "--job train --world 4");
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("Job 'train' already exists on the manager (running, 4/4 ranks)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("Job 'train''s tree ("), std::string::npos) << out;
  EXPECT_NE(out.find("(102 pairs); f32 sum is one of them."), std::string::npos) << out;
  EXPECT_EQ(cli(m + "--job 'a b' --world 4").first, 1);
  EXPECT_EQ(cli(m + "--job other --world 4").first, 0);

  // A leaf that reduces integers only: a warning for f32; both such leaves block it.
  auto sr =
      pb::SwitchRegistry::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  auto ints_only = [&](const std::string& name) {
    grpc::ClientContext ctx;
    pb::RegisterRequest rr;
    rr.set_name(name);
    rr.set_agent_address(f.agents[name]->address());
    auto* r = rr.mutable_resources();
    r->set_profile("ints");
    r->set_max_trees(8);
    r->set_max_slots(512);
    r->set_max_payload_bytes(1024);
    r->set_max_children(64);
    r->set_dtype_mask(1u << unsigned(treeduce::DType::i32));
    r->set_op_mask(0x07);
    pb::RegisterReply rrep;
    return sr->Register(&ctx, rr, &rrep);
  };
  ASSERT_TRUE(ints_only("leaf0").ok());
  std::tie(rc, out) = cli(m + "--job other --world 4");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("warning  Switch leaf0 (ints) does not reduce f32 sum; it reduces i32 with "
                     "sum,min,max (3 pairs)."),
            std::string::npos)
      << out;
  ASSERT_TRUE(ints_only("leaf1").ok());
  std::tie(rc, out) = cli(m + "--job other --world 4");
  EXPECT_EQ(rc, 1) << out;
  // Without --slots, the window libtreeduce would ask for the payload (1024 bytes: 64 slots).
  EXPECT_NE(out.find("No leaf switch can serve job 'other' (64 slots of 1024 bytes for f32 sum)"),
            std::string::npos)
      << out;
  EXPECT_EQ(cli(m + "--job other --world 4 --dtype i32 --op max").first, 0);

  // A switch whose agent died.
  f.agents["spine0"]->stop();
  expire_stopped_switches(f);
  EXPECT_TRUE(eventually([&] {
    return cli(m + "--job other --world 4 --dtype i32")
               .second.find("Switch spine0 (quantum2) is down") != std::string::npos;
  }));
  EXPECT_EQ(reg->jobs().size(), 1u);  // only 'train': doctor created nothing
  unsetenv("TREEDUCE_DOCTOR_PING");
}

// `treeduce doctor` pings the leaf's data address from the host (ICMP echo, which treeduce
// switches answer for it): the manager lists every switch's data address; a leaf that answers
// is an `ok` line, one that does not or has no route is a `warning` naming the address and what
// to check. Nothing leaves this machine: the answering leaf is 127.0.0.1, the others are tried
// in a network namespace of the command's own (unshare -n), on a veth pair nobody answers on and
// with no route at all.
TEST_F(Grpc, DoctorPingsTheLeafSwitch) {
  Fabric f(topo, addr);
  auto q = pb::Query::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext c;
  pb::SwitchList sl;
  ASSERT_TRUE(q->ListSwitches(&c, pb::ListRequest(), &sl).ok());
  for (const auto& s : sl.switches())
    EXPECT_EQ(s.data_address(),
              treeduce::ctl::to_string(topo.switches[std::size_t(topo.find_switch(s.name()))].data))
        << s.name();
  const auto run = [](const std::string& cmd) {
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    pclose(p);
    return out;
  };
  const std::string bin = TREEDUCE_CLI_BIN;
  std::string out = run("TREEDUCE_INSECURE=1 TREEDUCE_STATIC_LEAF=127.0.0.1:47110 " + bin +
                        " --manager " + addr + " doctor --job reach --world 4");
  EXPECT_NE(out.find("\nok       The leaf switch at 127.0.0.1 answers ICMP echo from this host.\n"),
            std::string::npos)
      << out;
  // --leaf wins over the variable; --no-ping skips it (no ok and no warning line about it).
  out = run("TREEDUCE_INSECURE=1 TREEDUCE_STATIC_LEAF=10.98.0.1:47110 " + bin + " --manager " +
            addr + " doctor --job reach --world 4 --leaf 127.0.0.1:47110");
  EXPECT_NE(out.find("\nok       The leaf switch at 127.0.0.1 answers ICMP echo from this host.\n"),
            std::string::npos)
      << out;
  out = run("TREEDUCE_INSECURE=1 TREEDUCE_STATIC_LEAF=127.0.0.1:47110 " + bin + " --manager " +
            addr + " doctor --job reach --world 4 --no-ping");
  EXPECT_EQ(out.find("ICMP echo"), std::string::npos) << out;
  EXPECT_EQ(out.find("route to"), std::string::npos) << out;
  if (run("unshare -n true") != "") GTEST_SKIP() << "no network namespace of our own (root)";
  out = run(
      "unshare -n sh -c 'ip link add a0 type veth peer name b0 && ip addr add 10.99.0.1/24 dev "
      "a0 && ip link set a0 up && ip link set b0 up && TREEDUCE_STATIC_LEAF=10.99.0.2:47110 " +
      bin + " --insecure --manager 127.0.0.1:1 doctor --world 2; TREEDUCE_STATIC_LEAF=10.98.0.1 " +
      bin + " --insecure --manager 127.0.0.1:1 doctor --world 2'");
  EXPECT_NE(out.find("warning  The leaf switch's data address 10.99.0.2 did not answer 3 ICMP "
                     "echo requests from this host: check the route to it (ip route get "
                     "10.99.0.2), that 10.99.0.2 is the leaf's data address (data: in its "
                     "configuration), and that the switch runs with a port on this host's link "
                     "(ip neigh show 10.99.0.2 says whether it answered ARP); without it the "
                     "in-network path fails and the ranks fall back.\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("warning  This host has no route to the leaf switch's data address "
                     "10.98.0.1 (Network is unreachable): add one (ip route add 10.98.0.1 dev "
                     "IFACE, or via a gateway) on the interface that faces the leaf; without it "
                     "the in-network path fails and the ranks fall back.\n"),
            std::string::npos)
      << out;
}

// ---- Security (docs/manager.md, "Security") -----------------------------------------------

// Heartbeat, Leave, a job's ListJobs and Abort with a credential refuse a call with none
// (UNAUTHENTICATED), a wrong one and another job's (PERMISSION_DENIED), each with a sentence
// naming the call and the job; the job's own credential is taken, and every answer to Join, a
// refusal too, carries it in the trailing metadata.
TEST_F(Grpc, JobCallsNeedTheJobsCredential) {
  Fabric f(topo, addr);
  auto a = join_all("a");
  for (auto& [s, rep] : a) ASSERT_TRUE(s.ok()) << s.error_message();
  const std::string cred_a = a[0].second.assignment().credential();
  EXPECT_EQ(cred_a.size(), 32u);
  for (auto& [s, rep] : a) EXPECT_EQ(rep.assignment().credential(), cred_a);
  // Job b: one rank that is refused (its world size does not fit the first rank's) still learns
  // b's credential, from the trailing metadata.
  pb::JoinReply rb;
  ASSERT_TRUE(join(join_req("b", 0, 1, "h0", 5000), &rb).ok());
  const std::string cred_b = rb.assignment().credential();
  ASSERT_FALSE(cred_b.empty());
  EXPECT_NE(cred_b, cred_a);
  {
    grpc::ClientContext ctx;
    pb::JoinReply rep;
    pb::JoinRequest bad = join_req("a", 0, 3, "h0");
    EXPECT_FALSE(jobs->Join(&ctx, bad, &rep).ok());
    auto it = ctx.GetServerTrailingMetadata().find(tls::kCredentialMetadata);
    ASSERT_NE(it, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), cred_a);
  }

  auto q = pb::Query::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  const auto call = [&](const std::string& which, const std::string& cred) {
    grpc::ClientContext ctx;
    if (which == "Heartbeat") {
      pb::HeartbeatRequest r;
      r.set_job("a");
      r.set_rank(0);
      r.set_credential(cred);
      pb::HeartbeatReply rep;
      return jobs->Heartbeat(&ctx, r, &rep);
    }
    if (which == "Leave") {
      pb::LeaveRequest r;
      r.set_job("a");
      r.set_rank(0);
      r.set_credential(cred);
      pb::LeaveReply rep;
      return jobs->Leave(&ctx, r, &rep);
    }
    if (which == "Abort") {
      pb::AbortRequest r;
      r.set_job("a");
      r.set_reason("TREEDUCE_SLOTS is 3.");
      r.set_credential(cred);
      pb::AbortReply rep;
      return jobs->Abort(&ctx, r, &rep);
    }
    pb::ListRequest r;
    r.set_job("a");
    r.set_credential(cred);
    pb::JobList rep;
    return q->ListJobs(&ctx, r, &rep);
  };
  for (const std::string which : {"Heartbeat", "Leave", "ListJobs", "Abort"}) {
    SCOPED_TRACE(which);
    grpc::Status s;
    if (which != "Abort") {  // a rank that cannot start has none: Abort takes none
      s = call(which, "");
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_EQ(s.error_message(),
                which +
                    " of job 'a' carries no job credential; only the job's ranks, with the "
                    "credential Join gave them, may make it.");
    }
    for (const std::string& wrong : {std::string(32, '0'), std::string("x"), cred_b}) {
      s = call(which, wrong);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << wrong;
      EXPECT_EQ(s.error_message(),
                which +
                    " of job 'a' carries a credential that is not the job's (another job's, "
                    "or one from before the job started again).");
    }
  }
  // Nothing of job a changed; with its credential, each is taken.
  pb::HeartbeatReply hb;
  ASSERT_TRUE(heartbeat("a", 0, &hb).ok());
  EXPECT_EQ(hb.state(), pb::JOB_STATE_RUNNING);
  {
    grpc::ClientContext ctx;
    pb::ListRequest r;
    r.set_job("a");
    r.set_credential(cred_a);
    pb::JobList jl;
    ASSERT_TRUE(q->ListJobs(&ctx, r, &jl).ok());
    ASSERT_EQ(jl.jobs_size(), 1);  // only its own job
    EXPECT_EQ(jl.jobs(0).job(), "a");
  }
  // Abort with the right credential reaches the registry's rule: a running job is not aborted.
  EXPECT_EQ(call("Abort", cred_a).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(call("Leave", cred_a).ok());
}

namespace {

// Certificates made as docs/deploy.md says (deploy/examples/make-certs.sh), once per process.
const std::string& certs() {
  static const std::string dir = [] {
    const std::string d = temp_dir("tls");
    const std::string make =
        std::string(TREEDUCE_SOURCE_ROOT) + "/deploy/examples/make-certs.sh " + d + " ";
    for (const std::string what : {"ca", "treeduce-manager IP:127.0.0.1", "treeduce-admin", "leaf0",
                                   "job", "job2", "named DNS:manager.example"})
      EXPECT_EQ(std::system((make + what + " >/dev/null").c_str()), 0) << what;
    return d;
  }();
  return dir;
}

tls::TlsOptions identity(const std::string& who) {
  return {certs() + "/ca.pem", certs() + "/" + who + ".pem", certs() + "/" + who + ".key", false};
}

// A manager with mutual TLS (its registry needs no agents).
struct TlsManager : ::testing::Test {
  Topology topo = *load_topology_yaml(doc_yaml());
  GrpcSwitchClient client{1000, identity("treeduce-manager")};
  std::unique_ptr<JobRegistry> reg;
  std::unique_ptr<ManagerServer> server;
  std::string addr;
  void SetUp() override {
    RegistryOptions o;
    o.require_registration = false;
    reg = std::make_unique<JobRegistry>(topo, client, o);
    server = std::make_unique<ManagerServer>(*reg, "127.0.0.1:0", 25, identity("treeduce-manager"));
    ASSERT_TRUE(server->ok()) << server->error();
    addr = "127.0.0.1:" + std::to_string(server->port());
  }
  std::shared_ptr<grpc::Channel> channel(const std::string& who) {
    std::string error;
    auto c = tls::channel_credentials(identity(who), &error);
    EXPECT_TRUE(c) << error;
    return grpc::CreateChannel(addr, c);
  }
  static grpc::Status list_switches(const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::SwitchList sl;
    return pb::Query::NewStub(ch)->ListSwitches(&ctx, pb::ListRequest(), &sl);
  }
};

}  // namespace

// A client without a certificate of the CA is refused in the handshake; with one, the caller's
// identity decides: the admin lists every job and fails a switch, a job's certificate may not,
// and a switch registers only under its own name.
TEST_F(TlsManager, IdentitiesDecideWhoMayDoWhat) {
  EXPECT_EQ(
      list_switches(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials())).error_code(),
      grpc::StatusCode::UNAVAILABLE);
  grpc::SslCredentialsOptions no_cert;  // trusts the CA, presents nothing
  std::ifstream ca(certs() + "/ca.pem");
  no_cert.pem_root_certs.assign(std::istreambuf_iterator<char>(ca), {});
  EXPECT_EQ(list_switches(grpc::CreateChannel(addr, grpc::SslCredentials(no_cert))).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(list_switches(channel("job")).ok());

  const auto list_jobs = [&](const std::string& who) {
    grpc::ClientContext ctx;
    pb::JobList jl;
    return pb::Query::NewStub(channel(who))->ListJobs(&ctx, pb::ListRequest(), &jl);
  };
  const auto fail_switch = [&](const std::string& who, const std::string& name) {
    grpc::ClientContext ctx;
    pb::FailSwitchRequest r;
    r.set_name(name);
    pb::AdminReply rep;
    return pb::Admin::NewStub(channel(who))->FailSwitch(&ctx, r, &rep);
  };
  grpc::Status s = list_jobs("job");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Listing every job needs the admin identity (the caller's certificate names 'job', "
            "not the admin identity 'treeduce-admin'); a job's ranks list their own job with "
            "its name and credential.");
  EXPECT_TRUE(list_jobs("treeduce-admin").ok());
  s = fail_switch("job", "leaf0");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Declaring switch 'leaf0' failed needs the admin identity (the caller's certificate "
            "names 'job', not the admin identity 'treeduce-admin').");
  EXPECT_EQ(fail_switch("leaf0", "leaf0").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(fail_switch("treeduce-admin", "nosuch").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(fail_switch("treeduce-admin", "leaf0").ok());
  for (const SwitchView& v : reg->switches())
    EXPECT_EQ(v.up, topo.switches[v.index].name != "leaf0") << topo.switches[v.index].name;
  const auto drain_switch = [&](const std::string& who, const std::string& name, bool drain) {
    grpc::ClientContext ctx;
    pb::DrainSwitchRequest r;
    r.set_name(name);
    r.set_drain(drain);
    r.set_reason("maintenance");
    pb::AdminReply rep;
    return pb::Admin::NewStub(channel(who))->DrainSwitch(&ctx, r, &rep);
  };
  s = drain_switch("job", "leaf1", true);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Draining switch 'leaf1' needs the admin identity (the caller's certificate names "
            "'job', not the admin identity 'treeduce-admin').");
  EXPECT_EQ(drain_switch("leaf0", "leaf1", true).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_FALSE(reg->switches().at(std::size_t(topo.find_switch("leaf1"))).drained);
  EXPECT_EQ(drain_switch("treeduce-admin", "nosuch", true).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(drain_switch("treeduce-admin", "leaf1", true).ok());
  EXPECT_EQ(reg->switches().at(std::size_t(topo.find_switch("leaf1"))).drain_reason, "maintenance");
  s = drain_switch("leaf0", "leaf1", false);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Undraining switch 'leaf1' needs the admin identity (the caller's certificate names "
            "'leaf0', not the admin identity 'treeduce-admin').");
  EXPECT_TRUE(reg->switches().at(std::size_t(topo.find_switch("leaf1"))).drained);
  ASSERT_TRUE(drain_switch("treeduce-admin", "leaf1", false).ok());
  EXPECT_FALSE(reg->switches().at(std::size_t(topo.find_switch("leaf1"))).drained);

  const auto register_as = [&](const std::string& who, const std::string& name) {
    grpc::ClientContext ctx;
    pb::RegisterRequest r;
    r.set_name(name);
    r.set_agent_address("127.0.0.1:1");
    pb::RegisterReply rep;
    return pb::SwitchRegistry::NewStub(channel(who))->Register(&ctx, r, &rep);
  };
  s = register_as("leaf0", "leaf1");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "A certificate for 'leaf0' cannot register as switch 'leaf1'; a switch's "
            "certificate names the switch (CN).");
  EXPECT_EQ(register_as("job", "leaf0").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(register_as("leaf0", "leaf0").ok());
}

// A job belongs to the identity of its first Join: another certificate of the CA can neither
// join it nor abort it without its credential; an abort it makes for a job not yet known does not
// touch the job another identity then starts; the owner's own abort works.
TEST_F(TlsManager, AJobBelongsToTheIdentityThatStartedIt) {
  const auto join_as = [&](const std::string& who, const std::string& job, std::uint32_t rank) {
    grpc::ClientContext ctx;
    pb::JoinRequest r;
    r.set_job(job);
    r.set_rank(rank);
    r.set_world_size(3);  // rank 2 never comes: the job stays gathering (no switch to install on)
    r.set_host("h" + std::to_string(rank));
    r.set_port(5000);
    r.set_wait_ms(1);  // returns DEADLINE_EXCEEDED at once; the rank stays joined
    pb::JoinReply rep;
    return pb::JobService::NewStub(channel(who))->Join(&ctx, r, &rep);
  };
  const auto abort_as = [&](const std::string& who, const std::string& job) {
    grpc::ClientContext ctx;
    pb::AbortRequest r;
    r.set_job(job);
    r.set_reason("TREEDUCE_SLOTS is 3.");
    pb::AbortReply rep;
    return pb::JobService::NewStub(channel(who))->Abort(&ctx, r, &rep);
  };
  EXPECT_EQ(join_as("job", "j", 0).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  grpc::Status s = join_as("job2", "j", 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Job 'j' belongs to identity 'job'; identity 'job2' cannot join it (a job's ranks "
            "share one identity; pick another job name).");
  s = abort_as("job2", "j");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Job 'j' belongs to identity 'job'; identity 'job2' cannot abort it (a job's ranks "
            "share one identity; pick another job name).");
  EXPECT_EQ(join_as("job", "j", 1).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the refused calls left the job gathering";

  // job2 aborts a job not yet known; the ranks of 'job' that then start 'k' never see it.
  ASSERT_TRUE(abort_as("job2", "k").ok());
  EXPECT_EQ(join_as("job", "k", 0).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The owner's abort without a credential fails its gathering job for every rank.
  ASSERT_TRUE(abort_as("job", "k").ok());
  s = join_as("job", "k", 1);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "A rank of job 'k' cannot start: TREEDUCE_SLOTS is 3. Fix its environment and start "
            "the job again.");
}

// Renewed certificates take effect without a restart: the manager's CA, certificate and key are
// replaced by those of another CA (each file renamed into place, as docs/deploy.md says); new
// connections then need the new CA's certificates and the old ones are refused.
TEST(TlsRenewal, AManagerUsesReplacedCertificatesWithoutARestart) {
  namespace fs = std::filesystem;
  const std::string dir = temp_dir("renew");
  const std::string make = std::string(TREEDUCE_SOURCE_ROOT) + "/deploy/examples/make-certs.sh ";
  for (const std::string ca : {"old", "new"})
    for (const std::string what : {"ca", "treeduce-manager IP:127.0.0.1", "job"})
      ASSERT_EQ(std::system((make + dir + "/" + ca + " " + what + " >/dev/null").c_str()), 0);
  const auto place = [&](const std::string& ca) {  // the manager's files, each renamed in place
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"ca.pem", "ca.pem"},
                                   {"treeduce-manager.key", "manager.key"},
                                   {"treeduce-manager.pem", "manager.pem"}}) {
      fs::copy_file(dir + "/" + ca + "/" + from, dir + "/tmp",
                    fs::copy_options::overwrite_existing);
      fs::rename(dir + "/tmp", dir + "/" + to);
    }
  };
  place("old");
  Topology topo = *load_topology_yaml(doc_yaml());
  GrpcSwitchClient client{1000, {}};
  RegistryOptions o;
  o.require_registration = false;
  JobRegistry reg(topo, client, o);
  tls::TlsOptions mine{dir + "/ca.pem", dir + "/manager.pem", dir + "/manager.key", false};
  mine.reload_seconds = 1;
  ManagerServer server(reg, "127.0.0.1:0", 25, mine);
  ASSERT_TRUE(server.ok()) << server.error();
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  const auto list_as = [&](const std::string& ca) {  // a new channel: a new handshake
    const std::string d = dir + "/" + ca + "/";
    std::string error;
    auto c = tls::channel_credentials({d + "ca.pem", d + "job.pem", d + "job.key", false}, &error);
    EXPECT_TRUE(c) << error;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    pb::SwitchList sl;
    return pb::Query::NewStub(grpc::CreateChannel(addr, c))
        ->ListSwitches(&ctx, pb::ListRequest(), &sl);
  };
  EXPECT_TRUE(list_as("old").ok());
  EXPECT_EQ(list_as("new").error_code(), grpc::StatusCode::UNAVAILABLE);
  place("new");
  EXPECT_TRUE(eventually([&] { return list_as("new").ok(); }, 120000))
      << "the manager never took the new certificates";
  EXPECT_EQ(list_as("old").error_code(), grpc::StatusCode::UNAVAILABLE);
  fs::remove_all(dir);
}

// The daemon refuses to start without certificates unless told --insecure, in one sentence.
TEST(ManagerProcess, RefusesToStartWithoutCertificatesOrInsecure) {
  const std::string dir = temp_dir("notls");
  const std::string yaml = dir + "/fabric.yaml";
  std::ofstream(yaml) << doc_yaml();
  FILE* p = popen(
      (std::string(TREEDUCE_MANAGER_BIN) + " --topology " + yaml + " --listen 127.0.0.1:0 2>&1")
          .c_str(),
      "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << st;
  EXPECT_EQ(out,
            "treeduce-manager: no TLS certificates: give --tls-ca, --tls-cert and --tls-key "
            "(docs/deploy.md, \"TLS\"), or --insecure to run without authentication in a lab or "
            "test.\n");
  std::filesystem::remove_all(dir);
}

// A manager whose certificate names a host (DNS:manager.example) and not the address dialled:
// refused in the handshake, unless the client says the name to expect (TlsOptions::server_name,
// TREEDUCE_TLS_SERVER_NAME); another name is refused still.
TEST_F(TlsManager, AServerNameOtherThanTheAddressDialled) {
  tls::TlsOptions named = identity("named");
  ManagerServer by_name(*reg, "127.0.0.1:0", 25, named);
  ASSERT_TRUE(by_name.ok()) << by_name.error();
  const std::string at = "127.0.0.1:" + std::to_string(by_name.port());
  const auto list_with = [&](const std::string& server_name) {
    tls::TlsOptions o = identity("job");
    o.server_name = server_name;
    std::string error;
    auto creds = tls::channel_credentials(o, &error);
    EXPECT_TRUE(creds) << error;
    return list_switches(tls::channel(at, creds, o));
  };
  EXPECT_EQ(list_with("").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_TRUE(list_with("manager.example").ok());
  EXPECT_EQ(list_with("other.example").error_code(), grpc::StatusCode::UNAVAILABLE);
  setenv("TREEDUCE_TLS_SERVER_NAME", "manager.example", 1);
  EXPECT_EQ(tls::from_environment().server_name, "manager.example");
  unsetenv("TREEDUCE_TLS_SERVER_NAME");
}

// Only the admin identity changes the topology; bad text says the loader's sentence.
TEST_F(TlsManager, OnlyTheAdminChangesTheTopology) {
  const auto set_topology = [&](const std::string& who, const std::string& yaml) {
    grpc::ClientContext ctx;
    pb::SetTopologyRequest r;
    r.set_yaml(yaml);
    pb::SetTopologyReply rep;
    return pb::Admin::NewStub(channel(who))->SetTopology(&ctx, r, &rep);
  };
  for (const char* who : {"job", "leaf0"}) {
    const grpc::Status s = set_topology(who, doc_yaml_plus_leaf9());
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(s.error_message(),
              "Changing the topology needs the admin identity (the caller's "
              "certificate names '" +
                  std::string(who) + "', not the admin identity 'treeduce-admin').");
  }
  EXPECT_EQ(reg->topology()->switches.size(), 4u);
  const grpc::Status bad = set_topology("treeduce-admin", "switches: [\n");
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad.error_message().rfind("line ", 0), 0u) << bad.error_message();
  ASSERT_TRUE(set_topology("treeduce-admin", doc_yaml_plus_leaf9()).ok());
  EXPECT_GE(reg->topology()->find_switch("leaf9"), 0);
}

// With --db, a topology applied at run time survives a restart with the same --topology file;
// an edited file stops the start with one sentence until --topology-source says which wins.
TEST(ManagerProcess, AppliedTopologySurvivesARestart) {
  const std::string dir = temp_dir("settopo");
  const std::string yaml = dir + "/fabric.yaml", db = dir + "/state.db";
  std::ofstream(yaml) << doc_yaml();
  std::ofstream(dir + "/plus.yaml") << doc_yaml_plus_leaf9();
  const auto switch_names = [](const std::string& addr) {
    std::set<std::string> out;
    for (const auto& s :
         nlohmann::json::parse(cli("--manager " + addr + " --json switches").second))
      out.insert(s["switch"].get<std::string>());
    return out;
  };
  {
    Daemon d(yaml, dir, "127.0.0.1:0", db);
    ASSERT_GT(d.port, 0);
    auto [rc, out] = cli("--manager " + d.addr() + " set-topology " + dir + "/plus.yaml");
    ASSERT_EQ(rc, 0) << out;
  }
  {
    Daemon d(yaml, dir, "127.0.0.1:0", db);  // killed above: what was applied is on disk
    ASSERT_GT(d.port, 0);
    EXPECT_EQ(switch_names(d.addr()).count("leaf9"), 1u);
  }
  std::ofstream(yaml, std::ios::app) << "# edited\n";
  const auto start = [&](const std::string& extra) {
    FILE* p = popen((std::string(TREEDUCE_MANAGER_BIN) + " --insecure --topology " + yaml +
                     " --db " + db + " --listen 127.0.0.1:0 " + extra + " 2>&1")
                        .c_str(),
                    "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int st = pclose(p);
    return std::pair{WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
  };
  auto [rc, out] = start("");
  EXPECT_EQ(rc, 2);
  EXPECT_NE(out.find("was edited after a topology was applied at run time"), std::string::npos)
      << out;
  EXPECT_NE(out.find("--topology-source db"), std::string::npos) << out;
  EXPECT_NE(start("--topology-source nonsense").first, 0);
  std::filesystem::remove_all(dir);
}
