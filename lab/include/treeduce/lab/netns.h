// The lab's building blocks: network namespaces, veth pairs, bridges and the processes run in
// them, for the emulated fabric (emulated_fabric.h) of the main job, the benchmarks and the
// integration tests. All are created by their user and removed by it (also when it fails). Names
// carry the creating process's pid, so parallel runs never collide and leftovers of a killed run
// are recognisable and reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace treeduce::lab {

/// Runs a command with /bin/sh; returns its exit status (-1 if it could not run).
int sh(const std::string& cmd);

/// A process started by a Lab, with stdout and stderr in a log file.
struct Proc {
  pid_t pid = -1;
  std::string name;
  std::string log;
  int status = -1;  ///< exit status once reaped (128 + signal for a signal)
  bool done = false;
};

class Lab {
 public:
  /// `tag` names this lab's namespaces and temp dir (td<pid><tag>-...).
  explicit Lab(const std::string& tag);
  ~Lab();  ///< kills every process still running, deletes namespaces and the temp dir
  Lab(const Lab&) = delete;
  Lab& operator=(const Lab&) = delete;

  const std::string& dir() const { return dir_; }
  std::string prefix() const { return prefix_; }

  /// Creates namespace `<prefix>-<name>` with lo up; returns its full name.
  std::string netns(const std::string& name);
  /// A veth pair: `a` in namespace `ns_a` and `b` in `ns_b` (full names; "" is this process's
  /// namespace), both up. Returns false with the failing command logged. An end in another
  /// namespace goes when that namespace is deleted, and takes its peer with it.
  bool veth(const std::string& ns_a, const std::string& a, const std::string& ns_b,
            const std::string& b);
  /// A bridge `name` in this process's namespace with address `cidr` ("a.b.c.d/p"), up; removed
  /// with the lab. False with the failing command logged.
  bool bridge(const std::string& name, const std::string& cidr);
  /// Puts interface `dev` of this process's namespace on bridge `br`.
  bool attach(const std::string& dev, const std::string& br);
  /// Runs `cmd` inside namespace `ns` (ip netns exec; "" is this one); returns its exit status.
  int in(const std::string& ns, const std::string& cmd);

  /// Starts argv inside namespace `ns` (empty: this one); output goes to <dir>/<name>.log.
  Proc& spawn(const std::string& name, const std::string& ns, const std::vector<std::string>& argv);
  /// Waits for `p` to exit; false on timeout (the process keeps running).
  bool wait(Proc& p, std::chrono::milliseconds timeout);
  /// SIGTERM, then SIGKILL after `grace`. Returns the exit status.
  int stop(Proc& p, std::chrono::milliseconds grace = std::chrono::milliseconds(3000));
  /// Waits until `p`'s log contains `text`; false on timeout or if `p` exits first.
  bool wait_log(Proc& p, const std::string& text, std::chrono::milliseconds timeout);
  /// The whole log of `p`.
  static std::string read_log(const Proc& p);
  /// Writes a file under dir(); returns its path.
  std::string write(const std::string& name, const std::string& text);

 private:
  bool reap(Proc& p, bool block);
  std::string prefix_;
  std::string dir_;
  std::vector<std::string> namespaces_;
  std::vector<std::string> bridges_;  ///< in this namespace: not removed with the namespaces
  std::vector<Proc*> procs_;
};

}  // namespace treeduce::lab
