// The switch agent over real gRPC on 127.0.0.1: SwitchAgent calls straight from a stub (conversion
// and status codes), then against the real manager (ManagerServer + JobRegistry) started before,
// after and again during the agent's life. Trees land in a recording TreeControl.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <map>
#include <mutex>
#include <thread>

#include "agent.h"
#include "grpc_edge.h"
#include "treeduce/control/topology.h"

namespace pb = treeduce::control::v1;
namespace ctl = treeduce::ctl;
namespace dp = treeduce::dp;
using std::chrono::milliseconds;
using treeduce::switchd::Agent;
using treeduce::switchd::AgentClock;
using treeduce::switchd::AgentOptions;
using treeduce::switchd::TreeControl;

namespace {

/// Records every call and answers with what the test chose.
class FakeTrees final : public TreeControl {
 public:
  struct Install {
    dp::TreeConfig cfg;
    std::string job;
  };
  treeduce::Status install(const dp::TreeConfig& t, const std::string& job) override {
    std::lock_guard l(mu_);
    installs_.push_back({t, job});
    if (install_answer_.ok()) held_[t.tree_id] = {t.tree_id, job, t.key};
    return install_answer_;
  }
  treeduce::Status remove(std::uint16_t tree_id) override {
    std::lock_guard l(mu_);
    removes_.push_back(tree_id);
    if (remove_answer_.ok()) held_.erase(tree_id);
    return remove_answer_;
  }
  std::vector<Held> held() const override {
    std::lock_guard l(mu_);
    std::vector<Held> out;
    for (const auto& [id, h] : held_) out.push_back(h);
    return out;
  }
  void answer(treeduce::Status install, treeduce::Status remove) {
    std::lock_guard l(mu_);
    install_answer_ = std::move(install);
    remove_answer_ = std::move(remove);
  }
  std::vector<Install> installs() {
    std::lock_guard l(mu_);
    return installs_;
  }
  std::vector<std::uint16_t> removes() {
    std::lock_guard l(mu_);
    return removes_;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::uint16_t, Held> held_;  // what install/remove left, as a switch reports it
  std::vector<Install> installs_;
  std::vector<std::uint16_t> removes_;
  treeduce::Status install_answer_, remove_answer_;
};

template <typename Pred>
bool eventually(Pred p, int ms = 3000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p();
}

/// A clock that moves only when the test says so, shared by the agent (its waits) and the
/// manager (its leases). Every wait the agent begins is recorded; step() lets the oldest one
/// not yet let go end by advancing the clock to its end.
class StepClock final : public AgentClock {
 public:
  bool wait(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, milliseconds d,
            const std::function<bool()>& stopped) override {
    std::int64_t until;
    {
      std::lock_guard l(mu_);
      waits_.push_back(d);
      until = now_ + d.count();
    }
    while (!stopped() && now() < until)
      cv.wait_for(lock, milliseconds(1));  // polls: advance() comes from the test's thread
    return stopped();
  }
  std::int64_t now() const {
    std::lock_guard l(mu_);
    return now_;
  }
  void advance(std::int64_t ms) {
    std::lock_guard l(mu_);
    now_ += ms;
  }
  /// If the agent has begun a wait not let go yet, ends it; true if it did.
  bool step_pending() {
    std::lock_guard l(mu_);
    if (stepped_ >= waits_.size()) return false;
    now_ += waits_[stepped_++].count();
    return true;
  }
  /// Waits (real time) until the agent begins its next wait, ends it, and returns its length;
  /// 0 if it did not begin one within 5 s.
  milliseconds step() {
    if (!eventually([&] { return step_pending(); }, 5000)) return milliseconds(0);
    std::lock_guard l(mu_);
    return waits_[stepped_ - 1];
  }
  std::size_t waits() const {
    std::lock_guard l(mu_);
    return waits_.size();
  }

 private:
  mutable std::mutex mu_;
  std::int64_t now_ = 1000;
  std::vector<milliseconds> waits_;
  std::size_t stepped_ = 0;
};

std::string local(int port) { return "127.0.0.1:" + std::to_string(port); }

/// A port nobody listens on yet, so an agent can be pointed at a manager that does not exist.
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

pb::TreeInstall full_install() {
  pb::TreeInstall p;
  p.set_switch_name("leaf0");
  p.set_tree_id(65535);
  p.set_key(0x0123456789ABCDEFull);
  p.set_role(pb::TreeInstall::ROLE_INNER);
  p.mutable_parent()->set_ip(0x0A000003);
  p.mutable_parent()->set_port(4791);
  p.set_index_at_parent(65535);
  auto* c0 = p.add_children();
  c0->mutable_addr()->set_ip(0x0A010001);
  c0->mutable_addr()->set_port(7000);
  c0->set_hosts(1);
  auto* c1 = p.add_children();
  c1->mutable_addr()->set_ip(0x0A010002);
  c1->mutable_addr()->set_port(65535);
  c1->set_hosts(65535);
  p.set_slots(64);
  p.set_payload_bytes(2048);
  p.set_dtype_mask(0x05 | 1u << 16);  // i32_i32: a code above 8 bits
  p.set_op_mask(0x03 | 1u << 11);     // maxloc
  p.set_deterministic(true);
  p.set_job("train");
  return p;
}

// ---------------------------------------------------------------------------------------------
// SwitchAgent called directly.

struct Direct : ::testing::Test {
  FakeTrees trees;
  std::unique_ptr<Agent> agent;
  std::unique_ptr<pb::SwitchAgent::Stub> stub;

  void SetUp() override {
    AgentOptions o;
    o.switch_name = "leaf0";
    std::string err;
    agent = Agent::start(o, trees, &err);
    ASSERT_TRUE(agent) << err;
    stub = pb::SwitchAgent::NewStub(
        grpc::CreateChannel(local(agent->port()), grpc::InsecureChannelCredentials()));
  }
  grpc::Status install(const pb::TreeInstall& p) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::AgentReply rep;
    return stub->InstallTree(&ctx, p, &rep);
  }
  grpc::Status remove(const std::string& sw, std::uint32_t id) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::TreeRemove r;
    r.set_switch_name(sw);
    r.set_tree_id(id);
    pb::AgentReply rep;
    return stub->RemoveTree(&ctx, r, &rep);
  }
};

}  // namespace

TEST_F(Direct, InstallConvertsEveryField) {
  ASSERT_TRUE(install(full_install()).ok());
  auto got = trees.installs();
  ASSERT_EQ(got.size(), 1u);
  const dp::TreeConfig& c = got[0].cfg;
  EXPECT_EQ(got[0].job, "train");
  EXPECT_EQ(c.tree_id, 65535);
  EXPECT_EQ(c.key, 0x0123456789ABCDEFull);
  EXPECT_EQ(c.role, dp::Role::inner);
  EXPECT_EQ(c.parent.ip, 0x0A000003u);
  EXPECT_EQ(c.parent.port, 4791);
  EXPECT_EQ(c.index_at_parent, 65535);
  ASSERT_EQ(c.children.size(), 2u);
  EXPECT_EQ(c.children[0].addr.ip, 0x0A010001u);
  EXPECT_EQ(c.children[0].addr.port, 7000);
  EXPECT_EQ(c.children[0].hosts, 1);
  EXPECT_EQ(c.children[1].addr.ip, 0x0A010002u);
  EXPECT_EQ(c.children[1].addr.port, 65535);
  EXPECT_EQ(c.children[1].hosts, 65535);
  EXPECT_EQ(c.slots, 64u);
  EXPECT_EQ(c.payload_bytes, 2048u);
  EXPECT_EQ(c.dtype_mask, 0x05 | 1u << 16);
  EXPECT_EQ(c.op_mask, 0x03 | 1u << 11);
  EXPECT_TRUE(c.deterministic);
}

TEST_F(Direct, EveryRoleMapsToItsOwn) {
  const std::pair<pb::TreeInstall::Role, dp::Role> roles[] = {
      {pb::TreeInstall::ROLE_LEAF, dp::Role::leaf},
      {pb::TreeInstall::ROLE_INNER, dp::Role::inner},
      {pb::TreeInstall::ROLE_ROOT, dp::Role::root}};
  for (auto [p, d] : roles) {
    auto m = full_install();
    m.set_role(p);
    ASSERT_TRUE(install(m).ok());
    EXPECT_EQ(trees.installs().back().cfg.role, d) << p;
  }
}

TEST_F(Direct, TreeControlStatusesBecomeGrpcStatuses) {
  using treeduce::Code;
  using treeduce::Status;
  const Status ok;
  auto m = full_install();
  m.set_tree_id(7);
  // The TreeControl's sentence reaches the manager unchanged, under the same code.
  trees.answer(Status(Code::already_exists, "Tree 7 is installed with another configuration."), ok);
  grpc::Status s = install(m);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(s.error_message(), "Tree 7 is installed with another configuration.");

  trees.answer(Status(Code::invalid_argument, "A window of 3 slots is not a power of two."), ok);
  s = install(m);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "A window of 3 slots is not a power of two.");

  trees.answer(Status(Code::resource_exhausted, "tree 7: no memory for its slots."), ok);
  s = install(m);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(s.error_message(), "tree 7: no memory for its slots.");

  // An answer without a sentence still gets one, naming the tree.
  for (auto [code, want] :
       {std::pair{Code::already_exists, grpc::StatusCode::ALREADY_EXISTS},
        std::pair{Code::invalid_argument, grpc::StatusCode::INVALID_ARGUMENT},
        std::pair{Code::resource_exhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
        std::pair{Code::internal, grpc::StatusCode::INTERNAL}}) {
    trees.answer(Status(code, ""), ok);
    s = install(m);
    EXPECT_EQ(s.error_code(), want) << s.error_message();
    EXPECT_NE(s.error_message().find("ree 7"), std::string::npos) << s.error_message();
  }

  trees.answer(Status(Code::internal, "The core is on fire."),
               Status(Code::internal, "The core is on fire."));
  EXPECT_EQ(install(m).error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(remove("leaf0", 7).error_code(), grpc::StatusCode::INTERNAL);

  trees.answer(ok, Status(Code::not_found, "Tree 7 is not installed."));
  s = remove("leaf0", 7);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "Tree 7 is not installed on leaf0.");

  trees.answer(ok, ok);
  EXPECT_TRUE(remove("leaf0", 65535).ok());
  EXPECT_EQ(trees.removes(), (std::vector<std::uint16_t>{7, 7, 65535}));
  EXPECT_EQ(trees.installs().size(), 8u);
}

TEST_F(Direct, AnotherSwitchsTreeIsRefused) {
  auto m = full_install();
  m.set_switch_name("leaf1");
  grpc::Status s = install(m);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "This agent serves switch 'leaf0', not 'leaf1'.");
  EXPECT_EQ(remove("leaf1", 1).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(trees.installs().empty());
  EXPECT_TRUE(trees.removes().empty());
}

TEST_F(Direct, ValuesTooWideForTheSwitchAreRefusedNotTruncated) {
  const std::pair<const char*, void (*)(pb::TreeInstall&)> cases[] = {
      {"Tree id", [](pb::TreeInstall& m) { m.set_tree_id(65536); }},
      {"Role 3", [](pb::TreeInstall& m) { m.set_role(pb::TreeInstall::Role(3)); }},
      {"parent port", [](pb::TreeInstall& m) { m.mutable_parent()->set_port(65536); }},
      {"index at parent", [](pb::TreeInstall& m) { m.set_index_at_parent(65536); }},
      {"Child 1", [](pb::TreeInstall& m) { m.mutable_children(1)->set_hosts(65536); }},
      {"port 70000",
       [](pb::TreeInstall& m) { m.mutable_children(0)->mutable_addr()->set_port(70000); }},
      {"mask", [](pb::TreeInstall& m) { m.set_dtype_mask(1u << 17); }},
      {"mask", [](pb::TreeInstall& m) { m.set_op_mask(1u << 12); }},
  };
  for (auto [what, mutate] : cases) {
    auto m = full_install();
    mutate(m);
    grpc::Status s = install(m);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what;
    EXPECT_NE(s.error_message().find(what), std::string::npos) << s.error_message();
    EXPECT_EQ(s.error_message().back(), '.') << s.error_message();
  }
  EXPECT_EQ(remove("leaf0", 65536).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(trees.installs().empty());
  EXPECT_TRUE(trees.removes().empty());
}

TEST(AgentStart, ABusyOrMalformedAddressIsASentence) {
  FakeTrees trees;
  AgentOptions o;
  o.switch_name = "leaf0";
  std::string err;
  auto first = Agent::start(o, trees, &err);
  ASSERT_TRUE(first) << err;
  EXPECT_GT(first->port(), 0);
  EXPECT_FALSE(first->registered());  // no manager: serve only

  o.listen = local(first->port());
  EXPECT_EQ(Agent::start(o, trees, &err), nullptr);
  EXPECT_EQ(err, "agent: cannot listen on " + o.listen + ".");

  // gRPC alone would bind 127.0.0.1:99999 as port 34463.
  for (const char* bad : {"127.0.0.1:99999", "127.0.0.1", "127.0.0.1:", "127.0.0.1:http", ":80"}) {
    o.listen = bad;
    EXPECT_EQ(Agent::start(o, trees, &err), nullptr) << bad;
    EXPECT_EQ(err, "agent: cannot listen on " + o.listen + ": not a host:port address.");
  }
}

// ---------------------------------------------------------------------------------------------
// Against the real manager.

namespace {

constexpr const char* kFabric = R"(
switches:
  - {name: leaf0, level: 0, mgmt: "-", data: "10.0.0.1:4791", profile: quantum2, ports: 8}
  - {name: leaf1, level: 0, mgmt: "-", data: "10.0.0.2:4791", profile: quantum2, ports: 8}
hosts:
  - {name: h0, address: 10.1.0.1, switch: leaf0, port: 1}
  - {name: h1, address: 10.1.0.2, switch: leaf0, port: 2}
)";

struct WithManager : ::testing::Test {
  ctl::Topology topo = *ctl::load_topology_yaml(kFabric);
  ctl::GrpcSwitchClient client{1000};
  int manager_port = free_port();
  std::unique_ptr<ctl::JobRegistry> reg;
  std::unique_ptr<ctl::ManagerServer> server;
  FakeTrees trees;
  StepClock clock;  // declared before the agent, which uses it until destroyed
  std::unique_ptr<Agent> agent;

  void TearDown() override {
    agent.reset();
    server.reset();
  }

  /// A manager without a database on manager_port; the previous one, if any, is gone first.
  void start_manager(std::uint64_t rank_lease_ms = 5000) {
    server.reset();
    reg.reset();
    ctl::RegistryOptions o;
    o.lease_ms = rank_lease_ms;
    o.switch_lease_ms = 600;
    o.clock = [this] { return clock.now(); };
    reg = std::make_unique<ctl::JobRegistry>(topo, client, o);
    server = std::make_unique<ctl::ManagerServer>(*reg, local(manager_port), 25);
    ASSERT_TRUE(server->ok());
  }
  void start_agent(const std::string& name = "leaf0", std::uint32_t heartbeat_ms = 50) {
    AgentOptions o;
    o.switch_name = name;
    o.manager = local(manager_port);
    o.heartbeat_ms = heartbeat_ms;
    o.resources = treeduce::switchd::AgentResources{};
    o.resources->max_trees = 123;
    o.clock = &clock;
    std::string err;
    agent = Agent::start(o, trees, &err);
    ASSERT_TRUE(agent) << err;
  }
  ctl::SwitchView leaf0() { return reg->switches().at(0); }
  bool leaf0_registered() {
    auto v = leaf0();
    return v.registered && v.up;
  }

  std::unique_ptr<pb::JobService::Stub> jobs() {
    return pb::JobService::NewStub(
        grpc::CreateChannel(local(manager_port), grpc::InsecureChannelCredentials()));
  }
  /// Both ranks of a job on h0 and h1 (both under leaf0, which is then the root).
  std::vector<pb::JoinReply> join_both(const std::string& job) {
    auto stub = jobs();
    std::vector<pb::JoinReply> rep(2);
    std::vector<std::thread> th;
    for (std::uint32_t r = 0; r < 2; ++r)
      th.emplace_back([&, r] {
        pb::JoinRequest q;
        q.set_job(job);
        q.set_rank(r);
        q.set_world_size(2);
        q.set_host("h" + std::to_string(r));
        q.set_port(7000 + r);
        q.set_slots(32);
        q.set_payload_bytes(512);
        q.set_wait_ms(5000);
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        grpc::Status s = stub->Join(&ctx, q, &rep[r]);
        EXPECT_TRUE(s.ok()) << s.error_message();
      });
    for (auto& t : th) t.join();
    return rep;
  }
  grpc::Status leave(pb::JobService::Stub& stub, const std::string& job, std::uint32_t rank,
                     const std::string& credential) {
    grpc::ClientContext ctx;
    pb::LeaveRequest q;
    q.set_job(job);
    q.set_rank(rank);
    q.set_credential(credential);
    pb::LeaveReply rep;
    return stub.Leave(&ctx, q, &rep);
  }
};

}  // namespace

TEST_F(WithManager, RegistersOnceTheManagerAppears) {
  start_agent();
  // Refused registrations back off from 50 ms, doubling, and stay at the 1 s cap.
  for (int ms : {50, 100, 200, 400, 800, 1000, 1000}) EXPECT_EQ(clock.step(), milliseconds(ms));
  EXPECT_FALSE(agent->registered());
  start_manager();
  // The next attempt (at most one backoff later) registers.
  ASSERT_TRUE(eventually([&] {
    clock.step_pending();
    return agent->registered();
  }));
  auto v = leaf0();
  EXPECT_TRUE(v.registered);
  EXPECT_TRUE(v.up);
  EXPECT_EQ(v.agent, local(agent->port()));
  EXPECT_EQ(v.profile.max_trees, 123u);  // the agent's limits replace the topology's profile
  EXPECT_FALSE(reg->switches().at(1).registered);
}

TEST_F(WithManager, AdvertisedAddressIsWhatTheManagerDials) {
  start_manager();
  AgentOptions o;
  o.switch_name = "leaf0";
  o.manager = local(manager_port);
  o.advertise = "localhost:1";  // an address the agent cannot check, sent as given
  std::string err;
  agent = Agent::start(o, trees, &err);
  ASSERT_TRUE(agent) << err;
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  EXPECT_EQ(leaf0().agent, "localhost:1");
}

TEST_F(WithManager, JoinInstallsOnTheAgentAndLeaveRemoves) {
  start_manager();
  // Heartbeats every 10 s would lose a 600 ms lease: the agent must follow the manager's lease,
  // heartbeating every third of it.
  start_agent("leaf0", 10000);
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  EXPECT_EQ(clock.step(), milliseconds(200));
  auto rep = join_both("train");
  const auto& a = rep[0].assignment();
  auto got = trees.installs();
  ASSERT_EQ(got.size(), 1u);
  const dp::TreeConfig& c = got[0].cfg;
  EXPECT_EQ(got[0].job, "train");
  EXPECT_EQ(c.tree_id, a.tree_id());
  EXPECT_EQ(c.key, a.job_key());
  EXPECT_EQ(c.role, dp::Role::root);
  ASSERT_EQ(c.children.size(), 2u);
  EXPECT_EQ(c.children[0].addr.ip, 0x0A010001u);
  EXPECT_EQ(c.children[0].addr.port, 7000);
  EXPECT_EQ(c.children[1].addr.ip, 0x0A010002u);
  EXPECT_EQ(c.children[1].addr.port, 7001);
  EXPECT_EQ(c.children[1].hosts, 1);
  EXPECT_EQ(c.slots, 32u);
  EXPECT_EQ(c.payload_bytes, 512u);

  // Several switch leases later on the manager's clock, each 200 ms of it after a heartbeat,
  // the switch is still up and the job still runs.
  for (int i = 0; i < 8; ++i) ASSERT_EQ(clock.step(), milliseconds(200));
  const std::size_t waits = clock.waits();
  ASSERT_TRUE(eventually([&] { return clock.waits() > waits; }));  // the last heartbeat is done
  EXPECT_TRUE(leaf0_registered());
  EXPECT_EQ(reg->jobs().at(0).state, ctl::JobState::running);
  EXPECT_TRUE(trees.removes().empty());

  auto stub = jobs();
  ASSERT_TRUE(leave(*stub, "train", 0, a.credential()).ok());
  EXPECT_TRUE(trees.removes().empty());  // the tree goes with the last rank
  ASSERT_TRUE(leave(*stub, "train", 1, a.credential()).ok());
  EXPECT_EQ(trees.removes(), std::vector<std::uint16_t>{c.tree_id});
}

TEST_F(WithManager, AnExpiredRankLeaseRemovesTheTree) {
  start_manager(300);
  start_agent();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  auto rep = join_both("quiet");
  const std::uint16_t id = std::uint16_t(rep[0].assignment().tree_id());
  ASSERT_EQ(trees.installs().size(), 1u);
  // No rank heartbeats; the rank lease (300 ms) passes, not the switch's (600 ms).
  clock.advance(301);
  ASSERT_TRUE(eventually([&] { return !trees.removes().empty(); }));
  EXPECT_EQ(trees.removes(), std::vector<std::uint16_t>{id});
}

TEST_F(WithManager, RegistersAgainWithARestartedManager) {
  start_manager();
  start_agent();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  server.reset();
  reg.reset();
  start_manager();  // same port, no database: it knows no switch
  // The next heartbeat is refused (the switch is not registered) and the agent registers again;
  // the agent knows once the manager's answer is back, which is after the manager knows.
  ASSERT_TRUE(eventually([&] {
    clock.step_pending();
    return leaf0_registered() && agent->registered();
  }));
  EXPECT_EQ(leaf0().agent, local(agent->port()));
  join_both("after");
  EXPECT_EQ(trees.installs().size(), 1u);
}

// Reconciliation: a manager restarted without its database does not know the switch's tree; the
// agent reports it when it registers again, the manager removes it, and a new job gets a tree
// (its id the stale one's: the fresh allocator starts over) without ALREADY_EXISTS.
TEST_F(WithManager, ARestartedManagerRemovesTheTreesItDoesNotKnow) {
  start_manager();
  start_agent();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  const std::uint32_t old_id = join_both("before")[0].assignment().tree_id();
  ASSERT_EQ(trees.held().size(), 1u);
  server.reset();
  reg.reset();
  start_manager();  // same port, no database
  ASSERT_TRUE(eventually([&] {
    clock.step_pending();
    return leaf0_registered() && agent->registered();
  }));
  // Removed before the registration was answered.
  EXPECT_EQ(trees.removes(), std::vector<std::uint16_t>{std::uint16_t(old_id)});
  EXPECT_TRUE(trees.held().empty());
  const auto rep = join_both("after");
  EXPECT_EQ(rep[0].assignment().tree_id(), old_id);
  ASSERT_EQ(trees.held().size(), 1u);
  EXPECT_EQ(trees.held()[0].job, "after");
  EXPECT_EQ(trees.held()[0].key, rep[0].assignment().job_key());
}

// A switch that lost its trees (a restart within its lease) and registers again gets its jobs'
// trees back from the manager, which still counts them as installed.
TEST_F(WithManager, ASwitchThatLostItsTreesGetsThemBack) {
  start_manager();
  start_agent();
  ASSERT_TRUE(eventually([&] { return agent->registered(); }));
  const auto rep = join_both("kept");
  agent.reset();
  const dp::TreeConfig first = trees.installs().at(0).cfg;
  ASSERT_TRUE(trees.remove(first.tree_id).ok());  // what a restarted switch holds: nothing
  start_agent();
  ASSERT_TRUE(eventually([&] {
    clock.step_pending();
    return agent->registered();
  }));
  const auto got = trees.installs();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[1].cfg == first);
  EXPECT_EQ(got[1].job, "kept");
  EXPECT_EQ(reg->jobs().at(0).state, ctl::JobState::running);
}

TEST_F(WithManager, AnUnknownSwitchIsReportedOnceNotPerRetry) {
  start_manager();
  ::testing::internal::CaptureStderr();
  start_agent("ghost");
  // Five refused registrations: the agent backs off after each (and only after a refusal).
  for (int ms : {50, 100, 200, 400}) ASSERT_EQ(clock.step(), milliseconds(ms));
  ASSERT_TRUE(eventually([&] { return clock.waits() == 5; }));
  EXPECT_FALSE(agent->registered());
  agent.reset();
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string refusal = "Switch 'ghost' is not in the topology.";
  const auto first = log.find(refusal);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find(refusal, first + 1), std::string::npos) << log;
}

TEST_F(WithManager, StopsPromptlyWhileTheManagerHangs) {
  // A manager that takes the connection and never answers: each RPC would wait out its deadline.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(std::uint16_t(manager_port));
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  start_agent();
  // The agent's connection arrives: its registration RPC is under way (deadline 1 s).
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  const int conn = accept(fd, nullptr, nullptr);
  ASSERT_GE(conn, 0);
  const auto t0 = std::chrono::steady_clock::now();
  agent.reset();
  // Cancelled, not waited out: well under the RPC's 1 s deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  EXPECT_EQ(clock.waits(), 0u);  // it never got past that first RPC
  close(conn);
  close(fd);
}

// ---------------------------------------------------------------------------------------------
// SetPortFault: refused unless the switch lets the agent inject faults; values checked here.

namespace {

class FakePorts final : public treeduce::switchd::PortControl {
 public:
  treeduce::Status set_port_fault(const std::string& port,
                                  const treeduce::switchd::PortFault& f) override {
    std::lock_guard l(mu_);
    if (port != "net_memif0")
      return treeduce::not_found("Switch leaf0 has no port '" + port +
                                 "' (its ports: net_memif0).");
    last_ = f;
    ++calls_;
    return {};
  }
  treeduce::Status start_capture(const std::string& port, const std::string& path) override {
    std::lock_guard l(mu_);
    if (!capture_.empty())
      return treeduce::failed_precondition("Port " + port + " of leaf0 is already captured to " +
                                           capture_ + ".");
    capture_ = path;
    return {};
  }
  treeduce::Status stop_capture(const std::string& port, std::uint64_t* frames) override {
    std::lock_guard l(mu_);
    if (capture_.empty())
      return treeduce::failed_precondition("Port " + port + " of leaf0 is not captured.");
    capture_.clear();
    *frames = 42;
    return {};
  }
  std::pair<int, treeduce::switchd::PortFault> last() {
    std::lock_guard l(mu_);
    return {calls_, last_};
  }

 private:
  std::mutex mu_;
  int calls_ = 0;
  treeduce::switchd::PortFault last_;
  std::string capture_;
};

grpc::Status set_fault(pb::SwitchAgent::Stub& stub, const pb::PortFault& f) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  pb::AgentReply rep;
  return stub.SetPortFault(&ctx, f, &rep);
}

pb::PortFault fault(const std::string& port) {
  pb::PortFault f;
  f.set_switch_name("leaf0");
  f.set_port(port);
  f.set_rx_loss(0.25);
  f.set_down(true);
  f.set_delay_us(1000000);
  f.set_rate_mbps(100);
  return f;
}

}  // namespace

TEST_F(Direct, SetPortFaultIsRefusedUnlessTheSwitchAllowsIt) {
  const grpc::Status s = set_fault(*stub, fault("net_memif0"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Switch leaf0 takes no faults over the network; start it with faults: true (labs "
            "and tests only).");
}

TEST(SetPortFault, ReachesThePortControlOrSaysWhyNot) {
  FakeTrees trees;
  FakePorts ports;
  AgentOptions o;
  o.switch_name = "leaf0";
  o.ports = &ports;
  std::string err;
  auto agent = Agent::start(o, trees, &err);
  ASSERT_TRUE(agent) << err;
  auto stub = pb::SwitchAgent::NewStub(
      grpc::CreateChannel(local(agent->port()), grpc::InsecureChannelCredentials()));

  ASSERT_TRUE(set_fault(*stub, fault("net_memif0")).ok());
  auto [calls, f] = ports.last();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(f, (treeduce::switchd::PortFault{0.25, true, 1000000, 100}));

  grpc::Status s = set_fault(*stub, fault("net_tap9"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), "Switch leaf0 has no port 'net_tap9' (its ports: net_memif0).");

  pb::PortFault bad = fault("net_memif0");
  bad.set_switch_name("leaf1");
  s = set_fault(*stub, bad);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "This agent serves switch 'leaf0', not 'leaf1'.");

  const std::pair<pb::PortFault, std::string> out_of_range[] = {
      {[] {
         auto b = fault("net_memif0");
         b.set_rx_loss(1.5);
         return b;
       }(),
       "rx_loss is 1.500000; it must be from 0 to 1."},
      {[] {
         auto b = fault("net_memif0");
         b.set_rx_loss(std::nan(""));
         return b;
       }(),
       "rx_loss is nan; it must be from 0 to 1."},
      {[] {
         auto b = fault("net_memif0");
         b.set_delay_us(1000001);
         return b;
       }(),
       "delay_us is 1000001; at most 1000000."},
      {[] {
         auto b = fault("net_memif0");
         b.set_rate_mbps(1000001);
         return b;
       }(),
       "rate_mbps is 1000001; at most 1000000."},
  };
  for (const auto& [msg, why] : out_of_range) {
    s = set_fault(*stub, msg);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << why;
    EXPECT_EQ(s.error_message(), why);
  }
  EXPECT_EQ(ports.last().first, 1);  // none of the refused ones reached the switch
}

TEST(SetPortCapture, StartsAndStopsOrSaysWhyNot) {
  FakeTrees trees;
  FakePorts ports;
  AgentOptions o;
  o.switch_name = "leaf0";
  o.ports = &ports;
  std::string err;
  auto agent = Agent::start(o, trees, &err);
  ASSERT_TRUE(agent) << err;
  auto stub = pb::SwitchAgent::NewStub(
      grpc::CreateChannel(local(agent->port()), grpc::InsecureChannelCredentials()));
  auto call = [&](const std::string& path, std::uint64_t* frames) {
    pb::PortCapture c;
    c.set_switch_name("leaf0");
    c.set_port("net_memif0");
    c.set_path(path);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    pb::PortCaptureReply rep;
    grpc::Status s = stub->SetPortCapture(&ctx, c, &rep);
    *frames = rep.frames();
    return s;
  };
  std::uint64_t frames = 0;
  ASSERT_TRUE(call("/tmp/a.pcap", &frames).ok());
  grpc::Status s = call("/tmp/b.pcap", &frames);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "Port net_memif0 of leaf0 is already captured to /tmp/a.pcap.");
  ASSERT_TRUE(call("", &frames).ok());
  EXPECT_EQ(frames, 42u);
  s = call("", &frames);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(Direct, SetPortCaptureIsRefusedUnlessTheSwitchAllowsIt) {
  pb::PortCapture c;
  c.set_switch_name("leaf0");
  c.set_port("net_memif0");
  c.set_path("/tmp/a.pcap");
  grpc::ClientContext ctx;
  pb::PortCaptureReply rep;
  const grpc::Status s = stub->SetPortCapture(&ctx, c, &rep);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(),
            "Switch leaf0 takes no captures over the network; start it with faults: true (labs "
            "and tests only).");
}
