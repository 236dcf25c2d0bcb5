// A 2-level tree of three treeduce-switch processes (two leaves, one spine) linked by memif, four
// host processes (treeduce-refhost, the reference host logic on the kernel's UDP stack) in their
// own network namespaces, each on a veth pair to its leaf's net_af_packet port. Hosts reach the
// switch by ARP through their default route: no static neighbour entries anywhere.
//
//   h0 h1 -- leaf0 (10.0.0.1) --memif--+
//                                      spine (10.0.0.3, root)
//   h2 h3 -- leaf1 (10.0.0.2) --memif--+
//
// The switches run in the test's own network namespace (their host-facing veth ends are named
// after the test's pid), so that they and the Aggregation Manager meet on 127.0.0.1.
//
// Every dtype x op, exact results, with and without loss injected on links; trees static or
// installed by a real treeduce-manager; the switches' final counters must match the traffic.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "../support/pcap_file.h"
#include "manager.grpc.pb.h"
#include "treeduce/lab/emulated_fabric.h"
#include "treeduce/lab/exact_inputs.h"

namespace treeduce::lab {
namespace {

namespace pb = treeduce::control::v1;

struct Options {
  FabricOptions fabric{TREEDUCE_SWITCH_BIN, ""};
  /// Trees from a treeduce-manager process (the test joins the job for the four ranks, or the
  /// ranks' libtreeduce does) instead of static trees in the switches' configuration.
  bool manager = false;
  /// The ranks are treeduce-perf on libtreeduce, which join through the manager themselves over
  /// a management network (implies manager).
  bool library = false;
  bool manager_db = false;
  std::string dtypes = "f32,f16,bf16,e4m3,e5m2,i32";
  std::string ops = "sum,min,max";
  std::string counts = "1,255,256,1000,20000";
  int iters = 1;
};

/// Parses `name{...labels...} value` lines of Prometheus text into label-string -> value.
std::map<std::string, std::uint64_t> parse_prom(std::istream& f) {
  std::map<std::string, std::uint64_t> m;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto sp = line.rfind(' ');
    m[line.substr(0, sp)] = std::strtoull(line.c_str() + sp + 1, nullptr, 10);
  }
  return m;
}
std::map<std::string, std::uint64_t> read_prom(const std::string& path) {
  std::ifstream f(path);
  return parse_prom(f);
}

/// A running switch's counters, from its metrics port (which its "ready" line names; the
/// switches run in the test's network namespace). Empty when it cannot be read.
std::map<std::string, std::uint64_t> scrape(const Proc& sw) {
  std::smatch m;
  const std::string log = Lab::read_log(sw);
  if (!std::regex_search(log, m, std::regex("metrics port ([0-9]+)"))) return {};
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(std::stoi(m[1])));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      char buf[8192];
      for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;)
        reply.append(buf, static_cast<std::size_t>(n));
    }
  }
  close(fd);
  const auto body = reply.find("\r\n\r\n");
  if (body == std::string::npos) return {};
  std::istringstream in(reply.substr(body + 4));
  return parse_prom(in);
}

/// Waits (up to 60 s) until the root switch has sent `n` multicast RESULTs, scraping it every
/// 20 ms: progress that proves the job reduces in the network; the count reached.
std::uint64_t wait_results(const Proc& root, std::uint64_t n) {
  std::uint64_t got = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    const auto m = scrape(root);
    for (const auto& [k, v] : m)
      if (k.rfind("treeduce_switch_events_total{", 0) == 0 &&
          k.find("event=\"result_multicast\"") != std::string::npos)
        got = v;
    if (got >= n) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return got;
}

std::uint64_t counter(const std::map<std::string, std::uint64_t>& m, const std::string& family,
                      const std::string& label) {
  for (const auto& [k, v] : m) {
    if (k.rfind(family + "{", 0) == 0 && k.find(label) != std::string::npos) return v;
  }
  ADD_FAILURE() << "no sample " << family << " with " << label;
  return 0;
}

/// The lab's emulated fabric plus what a test does with it: four treeduce-refhost ranks.
class TestFabric {
 public:
  explicit TestFabric(const Options& o) : opt_(o), lab_("f"), fab_(lab_, with_manager(o)) {}

  /// Brings the fabric up and gives every rank its tree (static, or joined through the manager);
  /// false with a test failure otherwise.
  bool up() {
    if (const std::string e = fab_.up(); !e.empty()) {
      ADD_FAILURE() << e;
      return false;
    }
    if (opt_.library) return true;
    if (opt_.manager) return join("fabric-test");
    for (int h = 0; h < Fabric::kHosts; ++h) {
      ranks_.push_back({Fabric::leaf_address(h), 1, kStaticKey, static_cast<std::uint32_t>(h % 2),
                        kStaticSlots, kStaticPayload});
    }
    return true;
  }

  /// Joins `job` for the four ranks, as their host library would, and keeps their assignments.
  /// First every switch says it registered (its own log, not a clock); a refusal after that
  /// (a switch whose heartbeat was late on a busy machine registers again) is retried. The
  /// deadlines only keep a broken fabric from hanging the test.
  bool join(const std::string& job) {
    for (std::size_t i = 0; i < fab_.switches().size(); ++i) {
      if (!lab_.wait_log(switch_proc(i), "registered with the manager",
                         std::chrono::seconds(120))) {
        ADD_FAILURE() << "switch " << i << " did not register:\n" << Lab::read_log(switch_proc(i));
        return false;
      }
    }
    auto stub = pb::JobService::NewStub(
        grpc::CreateChannel(fab_.manager_address(), grpc::InsecureChannelCredentials()));
    std::vector<pb::JoinReply> rep(4);
    std::vector<grpc::Status> st(4);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    do {
      std::vector<std::thread> t;
      for (int h = 0; h < 4; ++h) {
        t.emplace_back([&, h] {
          pb::JoinRequest req;
          req.set_job(job);
          req.set_rank(static_cast<std::uint32_t>(h));
          req.set_world_size(4);
          req.set_host("h" + std::to_string(h));
          req.set_port(kHostPort);
          req.set_slots(kStaticSlots);
          req.set_payload_bytes(kStaticPayload);
          req.set_wait_ms(10000);
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(15));
          st[h] = stub->Join(&ctx, req, &rep[h]);
        });
      }
      for (auto& x : t) x.join();
      if (std::all_of(st.begin(), st.end(), [](const grpc::Status& x) { return x.ok(); })) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (std::chrono::steady_clock::now() < deadline);
    for (int h = 0; h < 4; ++h) {
      if (!st[h].ok()) {
        std::string logs;
        for (std::size_t i = 0; i < fab_.switches().size(); ++i)
          logs += "--- switch " + std::to_string(i) + ":\n" + Lab::read_log(switch_proc(i));
        ADD_FAILURE() << "rank " << h << " join: " << st[h].error_message() << "\n" << logs;
        return false;
      }
      const pb::Assignment& a = rep[h].assignment();
      credentials_[job] = a.credential();
      ranks_.push_back({a.leaf_address(), a.tree_id(), a.job_key(), a.child_index(), a.slots(),
                        a.payload_bytes()});
    }
    return true;
  }

  /// Joins `job` afresh: the ranks run on its tree from then on.
  bool rejoin(const std::string& job) {
    ranks_.clear();
    return join(job);
  }

  /// Starts treeduce-perf (libtreeduce) on the four hosts with `args`.
  std::vector<Proc*> start_perf(const std::string& job, const std::vector<std::string>& args) {
    std::vector<Proc*> ranks;
    for (int h = 0; h < Fabric::kHosts; ++h) {
      std::vector<std::string> argv = fab_.rank_env(h, job);
      argv.push_back(TREEDUCE_PERF_BIN);
      argv.insert(argv.end(), args.begin(), args.end());
      ranks.push_back(&lab_.spawn("perf" + std::to_string(h), fab_.host_netns(h), argv));
    }
    return ranks;
  }

  /// Every rank leaves `job`; the manager then removes the tree from every switch.
  void leave(const std::string& job) {
    auto stub = pb::JobService::NewStub(
        grpc::CreateChannel(fab_.manager_address(), grpc::InsecureChannelCredentials()));
    for (std::uint32_t h = 0; h < 4; ++h) {
      pb::LeaveRequest req;
      req.set_job(job);
      req.set_rank(h);
      req.set_credential(credentials_[job]);
      pb::LeaveReply rep;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      EXPECT_TRUE(stub->Leave(&ctx, req, &rep).ok());
    }
  }

  std::uint32_t tree_id() const { return ranks_.at(0).tree; }
  std::map<std::string, std::string> credentials_;  ///< each joined job's, from Join
  Proc& switch_proc(std::size_t i) { return *fab_.switches().at(i); }
  Fabric& fabric() { return fab_; }

  /// Runs the four ranks to completion; true when every one passed. `cases` gets the number of
  /// cases each rank ran.
  bool run_hosts(int* cases) {
    std::vector<Proc*> hosts;
    for (int h = 0; h < 4; ++h) {
      const Rank& r = ranks_[h];
      hosts.push_back(&lab_.spawn("host" + std::to_string(h), fab_.host_netns(h),
                                  {TREEDUCE_REFHOST_BIN,
                                   "--leaf",
                                   r.leaf,
                                   "--bind",
                                   Fabric::host_ip(h) + ":" + std::to_string(kHostPort),
                                   "--tree",
                                   std::to_string(r.tree),
                                   "--key",
                                   std::to_string(r.key),
                                   "--child",
                                   std::to_string(r.child),
                                   "--world",
                                   "4",
                                   "--rank",
                                   std::to_string(h),
                                   "--slots",
                                   std::to_string(r.slots),
                                   "--payload",
                                   std::to_string(r.payload),
                                   "--dtypes",
                                   opt_.dtypes,
                                   "--ops",
                                   opt_.ops,
                                   "--counts",
                                   opt_.counts,
                                   "--iters",
                                   std::to_string(opt_.iters),
                                   "--seed",
                                   "7",
                                   "--rto-us",
                                   "2000",
                                   "--rto-max-us",
                                   "50000",
                                   "--max-retries",
                                   "200",
                                   "--timeout-ms",
                                   "240000"}));
    }
    bool ok = true;
    const std::regex summary(R"(refhost: (\d+) passed, (\d+) failed)");
    for (Proc* p : hosts) {
      if (!lab_.wait(*p, std::chrono::seconds(300))) {
        ADD_FAILURE() << p->name << " did not finish";
        lab_.stop(*p);
      }
      const std::string log = Lab::read_log(*p);
      std::smatch m;
      if (p->status != 0 || !std::regex_search(log, m, summary) || m[2] != "0") {
        ADD_FAILURE() << p->name << " exit " << p->status << ":\n" << log.substr(0, 6000);
        ok = false;
      } else {
        *cases = std::stoi(m[1]);
      }
    }
    return ok;
  }

  /// Stops the switches (SIGTERM) and returns their final counters.
  std::vector<std::map<std::string, std::uint64_t>> stop_switches() {
    std::vector<std::map<std::string, std::uint64_t>> out;
    const std::vector<int> status = fab_.stop();
    for (std::size_t i = 0; i < status.size(); ++i) {
      EXPECT_EQ(status[i], 0) << Lab::read_log(*fab_.switches()[i]);
      out.push_back(read_prom(fab_.final_stats(i)));
    }
    return out;
  }

  Lab& lab() { return lab_; }
  const std::string& host_netns(int h) const { return fab_.host_netns(h); }

 private:
  /// What a rank needs to know of its tree (what the manager's Join answers).
  struct Rank {
    std::string leaf;
    std::uint32_t tree;
    std::uint64_t key;
    std::uint32_t child, slots, payload;
  };

  static FabricOptions with_manager(const Options& o) {
    FabricOptions f = o.fabric;
    if (o.manager || o.library) f.manager_bin = TREEDUCE_MANAGER_BIN;
    f.management_network = o.library;
    // The test joins for refhost ranks, which do not heartbeat: the tree must outlive a slow run.
    if (o.manager && !o.library) f.rank_lease_ms = 300000;
    f.manager_db = o.manager_db;
    return f;
  }

  Options opt_;
  Lab lab_;
  Fabric fab_;
  std::vector<Rank> ranks_;
};

/// The (dtype, op) cases of the options, as refhost runs them: the defined pairs of the two lists.
std::vector<std::pair<DType, ReduceOp>> pairs_of(const Options& o) {
  std::vector<DType> dtypes;
  std::vector<ReduceOp> ops;
  std::stringstream ds(o.dtypes), os(o.ops);
  for (std::string x; std::getline(ds, x, ',');) dtypes.push_back(parse_dtype(x).value());
  for (std::string x; std::getline(os, x, ',');) ops.push_back(parse_op(x).value());
  std::vector<std::pair<DType, ReduceOp>> pairs;
  EXPECT_EQ(exact::defined_pairs(dtypes, ops, &pairs), "");
  return pairs;
}

/// Chunks of one rank's collectives: what every switch must complete exactly once.
std::uint64_t chunks(const Options& o) {
  std::uint64_t total = 0;
  for (const auto& [d, op] : pairs_of(o)) {
    const std::size_t per = kStaticPayload / dtype_size(d);
    std::stringstream cs(o.counts);
    for (std::string c; std::getline(cs, c, ',');) total += (std::stoull(c) + per - 1) / per;
  }
  return total * static_cast<std::uint64_t>(o.iters);
}

void check_counters(const Options& o, const std::vector<std::map<std::string, std::uint64_t>>& sw) {
  const std::uint64_t c = chunks(o);
  for (std::size_t i = 0; i < sw.size(); ++i) {
    SCOPED_TRACE(i == 2 ? "spine" : "leaf" + std::to_string(i));
    // Never added twice, whatever was lost or retransmitted: two children per switch, each
    // contributing once per chunk; one completion (multicast) per chunk.
    EXPECT_EQ(counter(sw[i], "treeduce_tree_events_total", "event=\"contrib_accepted\""), 2 * c);
    EXPECT_EQ(counter(sw[i], "treeduce_tree_events_total", "event=\"result_multicast\""), c);
    EXPECT_EQ(counter(sw[i], "treeduce_switch_drops_total", "reason=\"wrong_shard\""), 0u);
    EXPECT_EQ(counter(sw[i], "treeduce_switch_drops_total", "reason=\"bad_key\""), 0u);
    EXPECT_EQ(counter(sw[i], "treeduce_switch_drops_total", "reason=\"chunk_mismatch\""), 0u);
    EXPECT_EQ(counter(sw[i], "treeduce_switch_drops_total", "reason=\"unknown_tree\""), 0u);
  }
  for (int l = 0; l < 2; ++l) {
    EXPECT_EQ(counter(sw[l], "treeduce_tree_events_total", "event=\"partial_sent\""), c);
    // Partials up plus one RESULT per child and chunk, at the least.
    EXPECT_GE(counter(sw[l], "treeduce_tree_events_total", "event=\"tx_frames\""), 3 * c);
    EXPECT_GT(counter(sw[l], "treeduce_switch_daemon_total", "counter=\"arp_replies_out\""), 0u);
  }
}

/// Runs the refhost ranks on a fabric that is up, expects `cases` exact cases per rank, stops the
/// switches and checks their counters against the traffic; their final counters.
std::vector<std::map<std::string, std::uint64_t>> run_exact(TestFabric& f, const Options& o,
                                                            int cases) {
  int ran = 0;
  EXPECT_TRUE(f.run_hosts(&ran));
  EXPECT_EQ(ran, cases);
  auto sw = f.stop_switches();
  check_counters(o, sw);
  return sw;
}

TEST(Fabric, EveryDtypeAndOpExact) {
  Options o;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  // The switch answers ping on its port address (ICMP echo through the daemon's slow path).
  EXPECT_EQ(f.lab().in(f.host_netns(0), "ping -c 1 -W 2 10.1.0.254 >/dev/null"), 0);
  const auto sw = run_exact(f, o, 6 * 3 * 5);
  for (const auto& m : sw) {
    EXPECT_EQ(counter(m, "treeduce_switch_daemon_total", "counter=\"injected_loss\""), 0u);
  }
}

/// The switch agent of switch process `sw` (its port from the "agent port N" of its log); null
/// when its log has none.
std::unique_ptr<pb::SwitchAgent::Stub> agent_of(const Proc& sw) {
  std::smatch m;
  const std::string log = Lab::read_log(sw);
  if (!std::regex_search(log, m, std::regex("agent port ([0-9]+)"))) return nullptr;
  return pb::SwitchAgent::NewStub(
      grpc::CreateChannel("127.0.0.1:" + m[1].str(), grpc::InsecureChannelCredentials()));
}

/// An RPC context with a deadline that only keeps a dead switch from hanging the test.
std::unique_ptr<grpc::ClientContext> rpc_context() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

const grpc::Status kNoAgent{grpc::StatusCode::UNAVAILABLE, "no agent port in the switch's log"};

/// SetPortFault on switch `sw`.
grpc::Status set_fault(const Proc& sw, const std::string& name, const std::string& port,
                       double loss, bool down, std::uint32_t delay_us, std::uint32_t rate_mbps) {
  const auto stub = agent_of(sw);
  if (stub == nullptr) return kNoAgent;
  pb::PortFault f;
  f.set_switch_name(name);
  f.set_port(port);
  f.set_rx_loss(loss);
  f.set_down(down);
  f.set_delay_us(delay_us);
  f.set_rate_mbps(rate_mbps);
  pb::AgentReply rep;
  return stub->SetPortFault(rpc_context().get(), f, &rep);
}

/// SetPortCapture on switch `sw`: starts a capture to `path`, or stops it ("") and sets *frames.
grpc::Status set_capture(const Proc& sw, const std::string& name, const std::string& port,
                         const std::string& path, std::uint64_t* frames = nullptr) {
  const auto stub = agent_of(sw);
  if (stub == nullptr) return kNoAgent;
  pb::PortCapture c;
  c.set_switch_name(name);
  c.set_port(port);
  c.set_path(path);
  pb::PortCaptureReply rep;
  grpc::Status s = stub->SetPortCapture(rpc_context().get(), c, &rep);
  if (frames != nullptr) *frames = rep.frames();
  return s;
}

// Faults changed at run time through the switch agent (what `treeduce lab fault` does): a host
// port set down cuts its host off and comes back; loss, a delay and a rate limit on a leaf's
// uplink hold and drop frames, the results stay exact; the gauges show each state.
TEST(Fabric, FaultsAtRunTimeAreExactAndReversible) {
  Options o;
  o.counts = "1,1000,20000";
  o.ops = "sum";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  Proc& leaf0 = f.switch_proc(0);
  // h0 is on leaf0's net_af_packet0 (10.1.0.254).
  const std::string ping = "ping -c 1 -W 2 10.1.0.254 >/dev/null";
  ASSERT_EQ(f.lab().in(f.host_netns(0), ping), 0);
  ASSERT_TRUE(set_fault(leaf0, "leaf0", "net_af_packet0", 0, true, 0, 0).ok());
  EXPECT_EQ(counter(scrape(leaf0), "treeduce_port_fault_down", "port=\"net_af_packet0\""), 1u);
  EXPECT_NE(f.lab().in(f.host_netns(0), ping), 0);
  EXPECT_GT(counter(scrape(leaf0), "treeduce_switch_daemon_total", "counter=\"injected_down\""),
            0u);
  ASSERT_TRUE(set_fault(leaf0, "leaf0", "net_af_packet0", 0, false, 0, 0).ok());
  EXPECT_EQ(f.lab().in(f.host_netns(0), "ping -c 3 -W 2 10.1.0.254 >/dev/null"), 0);

  const grpc::Status unknown = set_fault(leaf0, "leaf0", "net_tap7", 0, true, 0, 0);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(unknown.error_message(),
            "Switch leaf0 has no port 'net_tap7' (its ports: net_af_packet0, net_af_packet1, "
            "net_memif0).");

  // A long, slow, lossy uplink: RESULTs coming down to leaf0 are lost, held 3 ms and released
  // at 200 Mb/s; the hosts' retransmissions repair it, exactly.
  ASSERT_TRUE(set_fault(leaf0, "leaf0", "net_memif0", 0.05, false, 3000, 200).ok());
  // The uplink's frames, both ways, into a pcap file the switch writes.
  const std::string pcap = f.lab().dir() + "/uplink.pcap";
  ASSERT_TRUE(set_capture(leaf0, "leaf0", "net_memif0", pcap).ok());
  EXPECT_EQ(set_capture(leaf0, "leaf0", "net_memif0", pcap).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(counter(scrape(leaf0), "treeduce_port_capturing", "port=\"net_memif0\""), 1u);
  const auto during = scrape(leaf0);
  EXPECT_EQ(counter(during, "treeduce_port_fault_delay_us", "port=\"net_memif0\""), 3000u);
  EXPECT_EQ(counter(during, "treeduce_port_fault_rate_mbps", "port=\"net_memif0\""), 200u);
  int ran = 0;
  EXPECT_TRUE(f.run_hosts(&ran));
  EXPECT_EQ(ran, 6 * 3);
  // Two stops at once: one stops it, the other is told there is none; the switch lives on.
  std::uint64_t captured = 0, other = 0;
  grpc::Status second;
  std::thread t([&] { second = set_capture(leaf0, "leaf0", "net_memif0", "", &other); });
  const grpc::Status first = set_capture(leaf0, "leaf0", "net_memif0", "", &captured);
  t.join();
  ASSERT_NE(first.ok(), second.ok()) << first.error_message() << " / " << second.error_message();
  if (!first.ok()) {
    std::swap(captured, other);
    EXPECT_EQ(first.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  } else {
    EXPECT_EQ(second.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }
  const auto after = scrape(leaf0);
  EXPECT_EQ(counter(after, "treeduce_port_capturing", "port=\"net_memif0\""), 0u);
  std::vector<treeduce::testing::PcapFrame> frames;
  std::string error;
  ASSERT_TRUE(treeduce::testing::read_pcap(pcap, &frames, &error)) << error;
  EXPECT_EQ(frames.size(), captured);
  // Partials up and RESULTs down: every frame UDP between the two switches' data addresses
  // (10.0.0.1, 10.0.0.3) on port 47110, with a treeduce header after it.
  // An ARP exchange may cross the link too (a neighbour refreshed): only IPv4 is checked.
  std::size_t up = 0, down = 0, ipv4 = 0;
  for (const auto& fr : frames) {
    ASSERT_GE(fr.size(), 42u);
    if (fr[12] != 0x08 || fr[13] != 0x00) continue;
    ++ipv4;
    ASSERT_GE(fr.size(), 74u);  // Ethernet, IPv4, UDP and the treeduce header
    EXPECT_EQ(fr[23], 17);      // UDP
    up += fr[29] == 1 && fr[33] == 3;
    down += fr[29] == 3 && fr[33] == 1;
  }
  EXPECT_GT(up, 0u);
  EXPECT_GT(down, 0u);
  EXPECT_EQ(up + down, ipv4);
  EXPECT_EQ(counter(after, "treeduce_switch_daemon_total", "counter=\"capture_dropped\""), 0u);
  EXPECT_GT(counter(after, "treeduce_switch_daemon_total", "counter=\"fault_delayed\""), 0u);
  EXPECT_GT(counter(after, "treeduce_switch_daemon_total", "counter=\"injected_loss\""), 0u);
  ASSERT_TRUE(set_fault(leaf0, "leaf0", "net_memif0", 0, false, 0, 0).ok());
  const auto healed = scrape(leaf0);
  for (const char* g : {"treeduce_port_fault_delay_us", "treeduce_port_fault_rate_mbps",
                        "treeduce_port_fault_down"}) {
    EXPECT_EQ(counter(healed, g, "port=\"net_memif0\""), 0u) << g;
  }
  const auto sw = f.stop_switches();
  check_counters(o, sw);
}

// Every defined pair of every type and operation (110), exact through the real switches: one
// refhost process per rank loops over them, a few thousand elements each (1 to 47 chunks), with
// loss on the host ports so that retransmissions and unicast RESULTs of 8- and 16-byte elements
// happen too.
TEST(Fabric, EveryTypeAndOperationExact) {
  Options o;
  o.dtypes = "f32";
  for (std::size_t d = 1; d < kNumDTypes; ++d) {
    o.dtypes += ',';
    o.dtypes += name(kAllDTypes[d]);
  }
  o.ops = "sum";
  for (std::size_t op = 1; op < kNumReduceOps; ++op) {
    o.ops += ',';
    o.ops += name(kAllReduceOps[op]);
  }
  o.counts = "3000";
  o.fabric.host_port_loss = 0.01;
  ASSERT_EQ(pairs_of(o).size(), 110u);
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  run_exact(f, o, 110);
}

TEST(Fabric, ExactUnderLossOnEveryLink) {
  Options o;
  o.fabric.leaf_uplink_loss = 0.03;
  o.fabric.spine_loss = 0.03;
  o.fabric.host_port_loss = 0.03;
  o.counts = "1,1000,20000";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  const auto sw = run_exact(f, o, 6 * 3 * 3);
  for (const auto& m : sw) {
    EXPECT_GT(counter(m, "treeduce_switch_daemon_total", "counter=\"injected_loss\""), 0u);
  }
  // Recovery happened where the loss was: re-sent partials and unicast RESULTs.
  std::uint64_t resent = 0, unicast = 0;
  for (const auto& m : sw) {
    resent += counter(m, "treeduce_tree_events_total", "event=\"partial_resent\"");
    unicast += counter(m, "treeduce_tree_events_total", "event=\"result_unicast\"");
  }
  EXPECT_GT(resent, 0u);
  EXPECT_GT(unicast, 0u);
}

TEST(Fabric, DeterministicTreeExactUnderLoss) {
  Options o;
  o.fabric.deterministic = true;
  o.fabric.leaf_uplink_loss = 0.02;
  o.fabric.host_port_loss = 0.02;
  o.counts = "1000,20000";
  o.ops = "sum";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  run_exact(f, o, 6 * 2);
}

// Two datapath lcores per switch: frames arrive on either queue (af_packet: kernel fanout; memif:
// the peer's lcore), and the slot's owner must do the adding; the other lcore hands them over.
TEST(Fabric, TwoLcoresPerSwitchShardSlots) {
  Options o;
  o.fabric.lcores = 2;
  o.fabric.host_port_loss = 0.02;
  o.counts = "1,1000,20000";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  const auto sw = run_exact(f, o, 6 * 3 * 3);
  for (std::size_t i = 0; i < sw.size(); ++i) {
    // Both lcores worked everywhere.
    EXPECT_GT(counter(sw[i], "treeduce_lcore_busy_polls_total", "lcore=\"0\""), 0u);
    EXPECT_GT(counter(sw[i], "treeduce_lcore_busy_polls_total", "lcore=\"1\""), 0u);
  }
  // The leaves' host ports spread frames by the kernel's hash, so some reach the wrong lcore and
  // are handed over. A leaf's lcore w sends its partials on memif queue w, which is the spine's
  // lcore w, the owner of the same slots: nothing to steer there.
  EXPECT_GT(counter(sw[0], "treeduce_switch_daemon_total", "counter=\"steered\""), 0u);
  EXPECT_GT(counter(sw[1], "treeduce_switch_daemon_total", "counter=\"steered\""), 0u);
  EXPECT_EQ(counter(sw[2], "treeduce_switch_daemon_total", "counter=\"steered\""), 0u);
}

// The trees come from a real treeduce-manager: the switches register with it, a Join of the four
// ranks makes it install a 2-level tree over gRPC (the leaves under the spine), the ranks run on
// what it assigned, and their Leave makes it remove the tree from every switch.
TEST(Fabric, ManagerInstallsAndRemovesTheTree) {
  Options o;
  o.manager = true;
  o.counts = "1,1000,20000";
  o.fabric.host_port_loss = 0.02;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  int cases = 0;
  EXPECT_TRUE(f.run_hosts(&cases));
  EXPECT_EQ(cases, 6 * 3 * 3);
  f.leave("fabric-test");
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(f.lab().wait_log(f.switch_proc(i),
                                 "tree " + std::to_string(f.tree_id()) + " removed",
                                 std::chrono::seconds(10)))
        << Lab::read_log(f.switch_proc(i));
  }
  const auto sw = f.stop_switches();
  for (const auto& m : sw) {
    EXPECT_EQ(counter(m, "treeduce_switch_trees", ""), 0u);
    // The tree's counters went with it; the switch-wide ones keep its traffic.
    const std::uint64_t c = chunks(o);
    EXPECT_EQ(counter(m, "treeduce_switch_events_total", "event=\"result_multicast\""), c);
    EXPECT_EQ(counter(m, "treeduce_switch_events_total", "event=\"contrib_accepted\""), 2 * c);
  }
}

// Reconciliation: the manager is killed and started again without a database while the switches
// hold a job's tree. Each switch registers again reporting the tree, the new manager, which does
// not know it, removes it (the switches log it), and a new job gets a tree under the same id
// (a fresh allocator starts over) and reduces in the network.
TEST(Fabric, ManagerRestartedWithoutItsStateRemovesStaleTrees) {
  Options o;
  o.manager = true;
  o.dtypes = "f32,i32";
  o.ops = "sum";
  o.counts = "1,1000";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  const std::string old = std::to_string(f.tree_id());
  ASSERT_EQ(f.fabric().restart_manager(), "");
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(
        f.lab().wait_log(f.switch_proc(i), "removed stale trees " + old, std::chrono::seconds(60)))
        << Lab::read_log(f.switch_proc(i));
    EXPECT_NE(Lab::read_log(f.switch_proc(i)).find("tree " + old + " removed"), std::string::npos);
  }
  ASSERT_TRUE(f.rejoin("after-restart"));
  EXPECT_EQ(std::to_string(f.tree_id()), old);
  int cases = 0;
  EXPECT_TRUE(f.run_hosts(&cases));
  EXPECT_EQ(cases, 2 * 1 * 2);
}

/// How often `text` is in `log`.
std::size_t occurrences(const std::string& log, const std::string& text) {
  std::size_t n = 0;
  for (std::size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// Links: the spine, the memif server of both leaves' uplinks, is killed and started again. Each
// leaf sees its uplink go down (logged), restarts its memif client port until the new server
// takes it, sees the link up again, and the ranks' allreduces cross the spine again, exactly.
TEST(Fabric, MemifClientsComeBackAfterTheirServerRestarts) {
  Options o;
  o.dtypes = "f32";
  o.ops = "sum";
  o.counts = "1,1000";
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  int cases = 0;
  EXPECT_TRUE(f.run_hosts(&cases));
  ASSERT_EQ(f.fabric().restart_switch(2), "");
  for (std::size_t i = 0; i < 2; ++i) {
    // Up at start (possibly after a first "down"), down, up again: two "up" lines. The deadline
    // only keeps a broken switch from hanging the test.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (occurrences(Lab::read_log(f.switch_proc(i)), "port net_memif0 link up") < 2 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::string log = Lab::read_log(f.switch_proc(i));
    EXPECT_EQ(occurrences(log, "port net_memif0 link up"), 2u) << log;
    EXPECT_NE(log.find("port net_memif0 link down"), std::string::npos) << log;
    EXPECT_NE(log.find("port net_memif0: memif client link down for"), std::string::npos) << log;
  }
  EXPECT_TRUE(f.run_hosts(&cases));
  EXPECT_EQ(cases, 2);
  const auto sw = f.stop_switches();
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(counter(sw[i], "treeduce_port_link_up", "port=\"net_memif0\""), 1u);
    EXPECT_EQ(counter(sw[i], "treeduce_port_link_up", "port=\"net_af_packet0\""), 1u);
    EXPECT_GE(counter(sw[i], "treeduce_port_link_changes_total", "port=\"net_memif0\""), 2u);
    EXPECT_GE(counter(sw[i], "treeduce_port_link_restarts_total", "port=\"net_memif0\""), 1u);
  }
}

/// What a treeduce-perf rank said of itself at the end: failed operations and wrong elements
/// (-1, -1 when the line is missing).
std::pair<int, long long> perf_account(const std::string& log) {
  const std::regex line(R"(rank \d+: (\d+) failed operations, (\d+) wrong elements)");
  std::smatch m;
  if (!std::regex_search(log, m, line)) return {-1, -1};
  return {std::stoi(m[1]), std::stoll(m[2])};
}

// The host library end to end: four treeduce-perf ranks join through the manager (over the
// management network), the manager installs the tree, and every dtype x op is reduced in the
// network and checked element by element.
TEST(Fabric, LibraryRanksReduceInTheNetwork) {
  Options o;
  o.library = true;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  auto ranks = f.start_perf(
      "lib", {"-b", "1024", "-e", "65536", "-f", "64", "-d", "f32,f16,bf16,e4m3,e5m2,i32", "-o",
              "sum,min,max", "-n", "2", "-w", "0"});
  for (Proc* p : ranks) {
    ASSERT_TRUE(f.lab().wait(*p, std::chrono::seconds(120))) << Lab::read_log(*p);
    const std::string log = Lab::read_log(*p);
    EXPECT_EQ(p->status, 0) << log;
    EXPECT_EQ(perf_account(log), std::make_pair(0, 0LL)) << log;
    EXPECT_EQ(log.find("falls back"), std::string::npos) << log;
  }
  // 36 rows (2 sizes x 6 types x 3 operations), each the barrier (i32 sum), 2 allreduces and the
  // sum of the wrong counts.
  EXPECT_NE(Lab::read_log(*ranks[0]).find("# verified: 0 wrong elements, 144 ops in the network, 0 "
                                          "on the hosts"),
            std::string::npos)
      << Lab::read_log(*ranks[0]);
  // Then rank 0's retransmissions, in the rows and outside them (the barriers, the sums).
  EXPECT_TRUE(std::regex_search(
      Lab::read_log(*ranks[0]),
      std::regex(R"(# retransmissions: \d+ in the rows, \d+ outside them \(the barriers before )"
                 R"(the rows and the sums of the ranks' counts after them\)\n)")))
      << Lab::read_log(*ranks[0]);
}

// The spine is killed in the middle of a run: every rank ends within a bounded time, having
// fallen back to host-side reduction (said out loud) or, when the ranks lost the switch at
// different collectives, with an error; never with a wrong element, never hanging.
// Every type and operation through the host library: one treeduce-perf process per rank loops
// over the 110 defined pairs (-d all -o all, 4 KiB each), the manager's tree takes every one of
// them into the network (the lab's switches have the server profile), and every element of
// treeduce's and the Gloo baseline's results is checked exactly.
TEST(Fabric, LibraryRanksReduceEveryTypeAndOperation) {
  Options o;
  o.library = true;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  auto ranks = f.start_perf("all", {"-b", "4096", "-e", "4096", "-d", "all", "-o", "all", "-n", "1",
                                    "-w", "0", "--compare", "gloo"});
  for (Proc* p : ranks) {
    ASSERT_TRUE(f.lab().wait(*p, std::chrono::seconds(300))) << Lab::read_log(*p);
    const std::string log = Lab::read_log(*p);
    EXPECT_EQ(p->status, 0) << log;
    EXPECT_EQ(perf_account(log), std::make_pair(0, 0LL)) << log;
    EXPECT_EQ(log.find("falls back"), std::string::npos) << log;
  }
  // 110 rows, each the barrier (i32 sum), one allreduce and the one that sums the wrong counts
  // (i32 sum).
  const std::string log = Lab::read_log(*ranks[0]);
  EXPECT_NE(log.find("# verified: 0 wrong elements, 330 ops in the network, 0 on the hosts"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("# gloo: verified: 0 wrong elements, 0 failed operations"), std::string::npos)
      << log;
  for (const char* row : {R"( f64_i32 +maxloc .* network )", R"( u64 +lxor .* network )",
                          R"( i8 +prod .* network )", R"( e4m3 +prod .* network )"})
    EXPECT_TRUE(std::regex_search(log, std::regex(row))) << row << "\n" << log;
}

TEST(Fabric, SwitchKilledMidJobFallsBackOrFailsNeverWrong) {
  Options o;
  o.library = true;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  auto ranks = f.start_perf(
      "kill", {"-b", "262144", "-e", "262144", "-d", "f32", "-o", "sum", "-n", "400", "-w", "1"});
  // Once the job reduces on the network path (the root has multicast two allreduces' RESULTs:
  // 256 chunks of 1 KiB each) and before it ends (400 allreduces), kill the root of the tree.
  const std::uint64_t results = wait_results(f.switch_proc(2), 2 * 256);
  ASSERT_GE(results, 2u * 256) << Lab::read_log(*ranks[0]);
  ASSERT_LT(results, 400u * 256);
  kill(f.switch_proc(2).pid, SIGKILL);
  const auto t0 = std::chrono::steady_clock::now();
  int fell_back = 0;
  for (Proc* p : ranks) {
    ASSERT_TRUE(f.lab().wait(*p, std::chrono::seconds(120))) << "rank hangs:\n"
                                                             << Lab::read_log(*p);
    const std::string log = Lab::read_log(*p);
    const auto [failed, wrong] = perf_account(log);
    EXPECT_EQ(wrong, 0) << log;
    EXPECT_GE(failed, 0) << log;
    if (log.find("falls back to host-side reduction") != std::string::npos) ++fell_back;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(90));
  EXPECT_EQ(fell_back, Fabric::kHosts);  // every rank said so
}

// The manager is killed in the middle of a run and restarted from its database: the switches keep
// their trees, the ranks keep reducing in the network (their heartbeats fail for a while, which
// is logged, not a reason to fall back), and every element is right.
TEST(Fabric, ManagerRestartMidJobKeepsTheJobInTheNetwork) {
  Options o;
  o.library = true;
  o.manager_db = true;
  TestFabric f(o);
  ASSERT_TRUE(f.up());
  auto ranks = f.start_perf("restart", {"-b", "262144", "-e", "262144", "-d", "f32", "-o", "sum",
                                        "-n", "400", "-w", "1"});
  // Restart the manager once the job reduces in the network (two allreduces' RESULTs from the
  // root) and before it ends.
  const std::uint64_t results = wait_results(f.switch_proc(2), 2 * 256);
  ASSERT_GE(results, 2u * 256) << Lab::read_log(*ranks[0]);
  ASSERT_LT(results, 400u * 256);
  ASSERT_EQ(f.fabric().restart_manager(), "");
  for (Proc* p : ranks) {
    ASSERT_TRUE(f.lab().wait(*p, std::chrono::seconds(120))) << Lab::read_log(*p);
    const std::string log = Lab::read_log(*p);
    EXPECT_EQ(p->status, 0) << log;
    EXPECT_EQ(perf_account(log), std::make_pair(0, 0LL)) << log;
    EXPECT_EQ(log.find("falls back"), std::string::npos) << log;
  }
  EXPECT_NE(Lab::read_log(*ranks[0]).find(", 0 on the hosts"), std::string::npos)
      << Lab::read_log(*ranks[0]);
}

}  // namespace
}  // namespace treeduce::lab
