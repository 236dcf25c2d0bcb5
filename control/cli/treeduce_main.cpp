// treeduce: the manager's command line. Reads the Query service and prints tables or JSON.
#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "manager.grpc.pb.h"
#include "treeduce/aggregation/dtype.h"

namespace pb = treeduce::control::v1;
using nlohmann::json;

namespace {

using Row = std::vector<std::string>;

// Left-aligned columns two spaces apart; the header is upper case, like kubectl and docker.
void print_table(const Row& header, const std::vector<Row>& rows) {
  std::vector<std::size_t> w(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const Row& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const Row& r) {
    std::string s;
    for (std::size_t c = 0; c < r.size(); ++c) {
      s += r[c];
      if (c + 1 < r.size()) s += std::string(w[c] - r[c].size() + 2, ' ');
    }
    std::cout << s << "\n";
  };
  line(header);
  for (const Row& r : rows) line(r);
}

std::string state_name(pb::JobState s) {
  switch (s) {
    case pb::JOB_STATE_GATHERING:
      return "gathering";
    case pb::JOB_STATE_RUNNING:
      return "running";
    case pb::JOB_STATE_REFUSED:
      return "refused";
    case pb::JOB_STATE_FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

std::string dtypes(std::uint32_t mask) {
  std::string s;
  for (auto d : treeduce::kAllDTypes)
    if (mask >> unsigned(d) & 1) s += (s.empty() ? "" : ",") + std::string(treeduce::name(d));
  return s.empty() ? "-" : s;
}

std::string join(const google::protobuf::RepeatedPtrField<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "-" : s;
}

std::string human_bytes(std::uint64_t b) {
  if (b >= (1ull << 30)) return std::to_string(b >> 30) + "Gi";
  if (b >= (1ull << 20)) return std::to_string(b >> 20) + "Mi";
  if (b >= (1ull << 10)) return std::to_string(b >> 10) + "Ki";
  return std::to_string(b);
}

int fail(const grpc::Status& s, const std::string& manager) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
    std::cerr << "treeduce: cannot reach the manager at " << manager << ": " << s.error_message()
              << "\n";
  else
    std::cerr << "treeduce: " << s.error_message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"treeduce: jobs, trees, switches and resources of a treeduce Aggregation Manager"};
  std::string manager = "127.0.0.1:9300";
  if (const char* env = std::getenv("TREEDUCE_MANAGER")) manager = env;
  bool as_json = false;
  app.add_option("-m,--manager", manager, "manager address (or $TREEDUCE_MANAGER)")
      ->capture_default_str();
  app.add_flag("--json", as_json, "print JSON instead of a table");
  app.require_subcommand(1);
  auto* jobs_cmd = app.add_subcommand("jobs", "jobs and their state");
  auto* trees_cmd = app.add_subcommand("trees", "installed aggregation trees");
  auto* sw_cmd = app.add_subcommand("switches", "switches, their state and agents");
  auto* res_cmd = app.add_subcommand("resources", "per-switch resources: used / limit");
  CLI11_PARSE(app, argc, argv);

  auto stub = pb::Query::NewStub(grpc::CreateChannel(manager, grpc::InsecureChannelCredentials()));
  auto ctx = [] {
    auto c = std::make_unique<grpc::ClientContext>();
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return c;
  };

  if (jobs_cmd->parsed() || trees_cmd->parsed()) {
    pb::JobList jl;
    auto c = ctx();
    if (auto s = stub->ListJobs(c.get(), pb::ListRequest(), &jl); !s.ok()) return fail(s, manager);
    json out = json::array();
    std::vector<Row> rows;
    for (const auto& j : jl.jobs()) {
      const bool has_tree = j.switches_size() > 0;
      if (trees_cmd->parsed() && !has_tree) continue;
      if (jobs_cmd->parsed()) {
        out.push_back({{"job", j.job()},
                       {"state", state_name(j.state())},
                       {"joined", j.joined()},
                       {"world_size", j.world_size()},
                       {"tree_id", has_tree ? json(j.tree_id()) : json(nullptr)},
                       {"reason", j.reason()}});
        rows.push_back({j.job(), state_name(j.state()),
                        std::to_string(j.joined()) + "/" + std::to_string(j.world_size()),
                        has_tree ? std::to_string(j.tree_id()) : "-",
                        j.reason().empty() ? "-" : j.reason()});
      } else {
        std::vector<std::string> sws(j.switches().begin(), j.switches().end());
        out.push_back({{"tree_id", j.tree_id()},
                       {"job", j.job()},
                       {"depth", j.depth()},
                       {"slots", j.slots()},
                       {"payload_bytes", j.payload_bytes()},
                       {"switches", sws}});
        rows.push_back({std::to_string(j.tree_id()), j.job(), std::to_string(j.depth()),
                        std::to_string(j.slots()), std::to_string(j.payload_bytes()),
                        join(j.switches())});
      }
    }
    if (as_json)
      std::cout << out.dump(2) << "\n";
    else if (jobs_cmd->parsed())
      print_table({"JOB", "STATE", "RANKS", "TREE", "REASON"}, rows);
    else
      print_table({"TREE", "JOB", "DEPTH", "SLOTS", "PAYLOAD", "SWITCHES (ROOT FIRST)"}, rows);
    return 0;
  }

  pb::SwitchList sl;
  auto c = ctx();
  if (auto s = stub->ListSwitches(c.get(), pb::ListRequest(), &sl); !s.ok())
    return fail(s, manager);
  json out = json::array();
  std::vector<Row> rows;
  for (const auto& s : sl.switches()) {
    const auto& r = s.resources();
    const std::string state = !s.registered() ? "unregistered" : s.up() ? "up" : "down";
    if (sw_cmd->parsed()) {
      out.push_back({{"switch", s.name()},
                     {"level", s.level()},
                     {"state", state},
                     {"agent", s.agent_address()},
                     {"profile", r.profile()}});
      rows.push_back({s.name(), std::to_string(s.level()), state,
                      s.agent_address().empty() ? "-" : s.agent_address(), r.profile()});
    } else {
      out.push_back({{"switch", s.name()},
                     {"profile", r.profile()},
                     {"trees_used", s.trees_used()},
                     {"max_trees", r.max_trees()},
                     {"slots_used", s.slots_used()},
                     {"max_slots", r.max_slots()},
                     {"bytes_used", s.bytes_used()},
                     {"memory_bytes", r.memory_bytes()},
                     {"max_payload_bytes", r.max_payload_bytes()},
                     {"max_children", r.max_children()},
                     {"dtypes", dtypes(r.dtype_mask())},
                     {"deterministic", r.deterministic()}});
      rows.push_back({s.name(), r.profile(),
                      std::to_string(s.trees_used()) + "/" + std::to_string(r.max_trees()),
                      std::to_string(s.slots_used()) + "/" + std::to_string(r.max_slots()),
                      r.memory_bytes()
                          ? human_bytes(s.bytes_used()) + "/" + human_bytes(r.memory_bytes())
                          : "-",
                      std::to_string(r.max_payload_bytes()), std::to_string(r.max_children()),
                      dtypes(r.dtype_mask())});
    }
  }
  if (as_json)
    std::cout << out.dump(2) << "\n";
  else if (sw_cmd->parsed())
    print_table({"SWITCH", "LEVEL", "STATE", "AGENT", "PROFILE"}, rows);
  else
    print_table({"SWITCH", "PROFILE", "TREES", "SLOTS", "MEMORY", "PAYLOAD", "FAN-IN", "TYPES"},
                rows);
  (void)res_cmd;
  return 0;
}
