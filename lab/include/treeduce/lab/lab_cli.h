/// @file
/// `treeduce lab`: the emulated fabric as a testbed that outlives the command (docs/lab.md).
///
/// `lab up` turns a topology of the Aggregation Manager's format (docs/manager.md) into real
/// processes: one `treeduce-switch` per switch (memif between switches, af_packet on veth pairs to
/// the hosts), one network namespace per host, a `treeduce-manager` that knows the topology, all
/// detached, and a state directory per lab (/run/treeduce/lab/NAME) that lists everything made, so
/// that `lab down` can undo it whatever happened since. `status`, `exec` and `run` use a lab that
/// is up. The `treeduce` command line registers these subcommands with add_lab_commands().
#pragma once

#include <memory>

namespace CLI {
class App;
}

namespace treeduce::lab {

/// The `lab` subcommand and its subcommands, registered on a CLI11 app.
class LabCommands {
 public:
  virtual ~LabCommands() = default;
  /// True when the command line chose `lab` (after parsing).
  virtual bool parsed() const = 0;
  /// Runs the chosen `lab` subcommand; its exit status.
  virtual int run() = 0;
};

/// Adds `lab` (up, status, exec, run, down) to `app`; call before app.parse().
std::unique_ptr<LabCommands> add_lab_commands(CLI::App& app);

}  // namespace treeduce::lab
