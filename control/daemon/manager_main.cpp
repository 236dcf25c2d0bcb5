// treeduce-manager: the Aggregation Manager daemon (docs/manager.md).
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

#include "treeduce/control/topology_source.h"

#include "grpc_edge.h"

using namespace treeduce::ctl;

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"treeduce-manager: allocates and installs in-network aggregation trees"};
  std::string topo_path, listen = "127.0.0.1:9300", port_file, db_path;
  std::uint64_t lease_ms = 10000, switch_lease_ms = 10000, restore_grace_ms = 15000;
  bool no_registration = false;
  treeduce::tls::TlsOptions tls;
  app.add_option("-t,--topology", topo_path, "topology YAML file (docs/manager.md)")->required();
  app.add_option("-l,--listen", listen, "gRPC address; port 0 picks one")->capture_default_str();
  app.add_option("--port-file", port_file, "write the bound port here once listening");
  app.add_option("--db", db_path,
                 "SQLite file for jobs, trees and switches; without it a restart forgets them");
  app.add_option("--lease-ms", lease_ms, "rank lease")->capture_default_str();
  app.add_option("--switch-lease-ms", switch_lease_ms, "switch heartbeat lease")
      ->capture_default_str();
  app.add_option("--restore-grace-ms", restore_grace_ms,
                 "after a restart, how long ranks and switches have to check in again")
      ->capture_default_str();
  app.add_flag("--no-registration", no_registration,
               "allocate on switches that have not registered (installs then fail unless an "
               "agent address is known)");
  app.add_option("--tls-ca", tls.ca, "CA certificate (PEM) that clients' certificates chain to");
  app.add_option("--tls-cert", tls.cert, "the manager's certificate (PEM)");
  app.add_option("--tls-key", tls.key, "the manager's private key (PEM)");
  std::string admin_name = treeduce::tls::kDefaultAdminName;
  app.add_option("--admin-name", admin_name,
                 "with TLS, the certificate name (CN) of the admin identity")
      ->capture_default_str();
  TopologySource topo_source = TopologySource::automatic;
  app.add_option("--topology-source", topo_source,
                 "with --db, after a topology was applied at run time (treeduce set-topology) and "
                 "the --topology file was edited too: 'db' keeps the applied one, 'file' takes the "
                 "file's; 'auto' refuses to start in that case (docs/manager.md)")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, TopologySource>{{"auto", TopologySource::automatic},
                                                {"file", TopologySource::file},
                                                {"db", TopologySource::db}}))
      ->default_str("auto");
  app.add_flag("--insecure", tls.insecure,
               "no TLS and no client authentication (labs and tests only)");
  CLI11_PARSE(app, argc, argv);

  if (const std::string bad =
          treeduce::tls::check(tls, "--tls-ca, --tls-cert and --tls-key", "--insecure");
      !bad.empty()) {
    std::cerr << "treeduce-manager: " << bad << "\n";
    return 2;
  }

  const auto topo_text = read_topology_text(topo_path);
  if (!topo_text.ok()) {
    std::cerr << "treeduce-manager: " << topo_text.status().message() << "\n";
    return 2;
  }
  std::unique_ptr<Store> store;
  if (!db_path.empty()) {
    auto st = open_sqlite_store(db_path);
    if (!st.ok()) {
      std::cerr << "treeduce-manager: " << st.status().message() << "\n";
      return 2;
    }
    store = std::move(st.value());
  } else {
    std::cerr << "treeduce-manager: no --db: jobs and trees will not survive a restart\n";
  }
  // The file, or the topology applied at run time that the database keeps (topology_source.h).
  auto topo = startup_topology(topo_path, *topo_text, store.get(), topo_source);
  if (!topo.ok()) {
    std::cerr << "treeduce-manager: " << topo.status().message() << "\n";
    return 2;
  }
  if (!topo->note.empty()) std::cerr << "treeduce-manager: topology: " << topo->note << "\n";
  GrpcSwitchClient client(2000, tls);
  RegistryOptions opt;
  opt.store = store.get();
  opt.lease_ms = lease_ms;
  opt.switch_lease_ms = switch_lease_ms;
  opt.restore_grace_ms = restore_grace_ms;
  opt.require_registration = !no_registration;
  opt.topology_file_hash = topo->file_hash;
  JobRegistry reg(topo->topo, client, opt);
  // Restore before listening: a rank's heartbeat must never find its job missing.
  auto restored = reg.restore();
  if (!restored.ok()) {
    std::cerr << "treeduce-manager: " << restored.status().message() << "\n";
    return 2;
  }
  if (*restored) std::cerr << "treeduce-manager: restored " << *restored << " jobs\n";
  const int sweep_ms = int(std::max<std::uint64_t>(10, std::min(lease_ms, switch_lease_ms) / 4));
  ManagerServer server(reg, listen, sweep_ms, tls, admin_name);
  if (!server.ok()) {
    std::cerr << "treeduce-manager: " << server.error() << "\n";
    return 1;
  }
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so a reader never sees half a number; before the
    // "listening" line, so a reader that waits for the line finds the file.
    std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::cerr << "treeduce-manager: " << topo->topo.switches.size() << " switches, "
            << topo->topo.hosts.size() << " hosts; listening on port " << server.port()
            << (tls.insecure ? " without TLS (--insecure)" : " with mutual TLS") << "\n";
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  server.shutdown();
  std::cerr << "treeduce-manager: stopped\n";
  return 0;
}
