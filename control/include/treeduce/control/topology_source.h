/// @file
/// Where the manager's topology comes from at start: the --topology file, or the topology an
/// administrator applied at run time (JobRegistry::set_topology) and the store kept.
///
/// The rule (docs/manager.md, "Changing the topology"): the store keeps the applied topology
/// with the hash of the --topology file the manager ran with when it was applied. At the next
/// start, an unchanged file means the applied topology is the newer truth and is used; a file
/// that now holds the applied topology is used; a file edited since is refused, with a sentence
/// saying to choose with --topology-source, so that a restart never silently reverts an applied
/// change nor silently ignores an edited file.
#pragma once

#include <string>
#include <string_view>

#include "treeduce/common/status.h"
#include "treeduce/control/store.h"
#include "treeduce/control/topology.h"

namespace treeduce::ctl {

/// Store table and key of the applied topology.
inline constexpr std::string_view kTopologyTable = "topology";
inline constexpr const char* kAppliedTopologyKey = "applied";

/// FNV-1a 64 of the text, 16 hex digits: tells an edited file from an unchanged one (not a
/// defence against anyone: who can edit the file runs the manager).
std::string topology_hash(std::string_view text);

/// The stored document of an applied topology: its YAML and the hash of the --topology file
/// the manager ran with.
std::string applied_topology_doc(const std::string& yaml, const std::string& file_hash);

/// --topology-source: auto follows the rule above; file and db are an administrator's choice.
enum class TopologySource { automatic, file, db };

/// The topology the manager starts with.
struct StartupTopology {
  Topology topo;
  std::string file_hash;  ///< of the --topology file: RegistryOptions::topology_file_hash
  std::string note;       ///< what was chosen and why, for the log; "" when simply the file
};

/// Chooses by the rule above (`store` may be null: the file). With `file`, an applied topology
/// is dropped from the store (the file is the truth from then on); with `db`, it is kept and
/// marked as chosen over this file, so the next start with the same file is quiet.
/// failed_precondition, one sentence naming both and the flag, when the file was edited since a
/// topology was applied; invalid_argument (the loader's sentence) for a bad file or stored text.
Result<StartupTopology> startup_topology(const std::string& path, const std::string& file_text,
                                         Store* store,
                                         TopologySource source = TopologySource::automatic);

}  // namespace treeduce::ctl
