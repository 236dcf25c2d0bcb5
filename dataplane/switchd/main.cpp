// treeduce-switch: the DPDK switch daemon (docs/switch.md).
//   treeduce-switch [EAL arguments] -- [--config FILE] [treeduce arguments]
#include <fcntl.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "datapath.h"

using namespace treeduce::switchd;
using treeduce::Result;

namespace {

void on_signal(int) { g_stop.store(true); }

int fail(const std::string& sentence, int code) {
  std::fprintf(stderr, "treeduce-switch: %s\n", sentence.c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // Our arguments are checked before the EAL starts, so a mistake in them costs one sentence and
  // no DPDK start-up noise.
  int split = argc;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }
  std::vector<const char*> ours{argv[0]};
  for (int i = split + 1; i < argc; ++i) ours.push_back(argv[i]);
  if (split == argc) {
    for (int i = 1; i < argc; ++i) {
      if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
        ours.push_back("--help");
        break;
      }
    }
  }
  ConfigResult parsed = parse_args(static_cast<int>(ours.size()), ours.data());
  if (parsed.help) {
    std::printf("Usage: treeduce-switch [EAL arguments] -- [treeduce arguments]\n\n%s\n",
                parsed.error.c_str());
    return 0;
  }
  if (!parsed.config) return fail(parsed.error, 2);
  const SwitchConfig& cfg = *parsed.config;

  // On a bad EAL argument the EAL prints its whole usage (a hundred lines) on stdout; stderr
  // already names the argument, and our sentence follows.
  std::fflush(stdout);
  const int saved_stdout = dup(STDOUT_FILENO);
  const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (devnull >= 0) dup2(devnull, STDOUT_FILENO);
  const int eal = rte_eal_init(split, argv);
  std::fflush(stdout);
  if (saved_stdout >= 0) {
    dup2(saved_stdout, STDOUT_FILENO);
    close(saved_stdout);
  }
  if (devnull >= 0) close(devnull);
  if (eal < 0) {
    return fail(std::string("DPDK EAL initialisation failed (") + rte_strerror(rte_errno) +
                    "); check the EAL arguments before '--'.",
                2);
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  int rc = 0;
  {
    std::string error;
    Result<std::unique_ptr<Switch>> created = Switch::create(cfg);
    if (!created.ok()) {
      rc = fail(created.status().message(), 1);
    } else {
      std::unique_ptr<Switch>& sw = *created;
      register_telemetry(sw.get());
      std::unique_ptr<MetricsServer> metrics;
      if (!cfg.metrics_listen.empty()) {
        metrics = MetricsServer::start(
            cfg.metrics_listen, [&sw] { return sw->snapshot(); }, &error);
        if (!metrics) rc = fail(error, 1);
      }
      std::unique_ptr<Agent> agent;
      if (rc == 0) {
        AgentOptions ao;
        ao.switch_name = cfg.name;
        ao.listen = cfg.agent_listen;
        ao.advertise = cfg.agent_advertise;
        ao.manager = cfg.manager;
        ao.heartbeat_ms = cfg.heartbeat_ms;
        if (cfg.faults) ao.ports = sw.get();
        ao.tls = {cfg.tls_ca, cfg.tls_cert, cfg.tls_key, cfg.insecure};
        ao.tls.server_name = cfg.tls_server_name;
        ao.callers = {cfg.tls_manager_name, cfg.tls_admin_name};
        agent = Agent::start(ao, *sw, &error);
        if (!agent) rc = fail(error, 1);
      }
      if (rc == 0) {
        std::fprintf(stderr,
                     "treeduce-switch: %s ready: data %s:%u, %zu port(s), metrics port %d, agent "
                     "port %d%s%s\n",
                     cfg.name.c_str(), format_ipv4(cfg.data.ip).c_str(), cfg.data.port,
                     cfg.ports.size(), metrics ? metrics->port() : 0, agent->port(),
                     cfg.manager.empty() ? "" : ", manager ", cfg.manager.c_str());
        sw->run();
        // The datapath has stopped: stop heartbeats so the manager does not count on it.
        agent.reset();
        const Snapshot last = sw->snapshot();
        std::fprintf(stderr, "treeduce-switch: %s stopping; final counters:\n%s", cfg.name.c_str(),
                     render_summary(last).c_str());
        if (!cfg.final_stats.empty()) {
          std::ofstream out(cfg.final_stats);
          out << render_prometheus(last);
          if (!out) rc = fail("cannot write " + cfg.final_stats + ".", 1);
        }
      }
      agent.reset();
      metrics.reset();
      register_telemetry(nullptr);
    }
  }
  // The EAL leaves its runtime directory (config, memory maps, telemetry socket) behind; a
  // switch has no secondary processes that could still need it.
  const std::string runtime_dir = rte_eal_get_runtime_dir();
  rte_eal_cleanup();
  std::error_code ec;
  std::filesystem::remove_all(runtime_dir, ec);
  return rc;
}
