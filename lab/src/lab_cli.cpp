// `treeduce lab`: up, status, exec, run, down (docs/lab.md). Every step of `up` is recorded in the
// lab's state file before it is taken (lab_state.h), so that `down` (and a failed `up`) removes
// exactly what the lab made and nothing else.
#include "treeduce/lab/lab_cli.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "grpc_tls.h"
#include "lab_state.h"
#include "manager.grpc.pb.h"
#include "treeduce/control/topology.h"
#include "treeduce/lab/emulated_fabric.h"

namespace treeduce::lab {

namespace {

namespace fs = std::filesystem;
namespace pb = treeduce::control::v1;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

/// One sentence for the user; exit status 1 (2 for usage).
struct Error : std::runtime_error {
  explicit Error(const std::string& s, int c = 1) : std::runtime_error(s), code(c) {}
  int code;
};

std::atomic<bool> g_interrupted{false};
void on_signal(int) { g_interrupted = true; }

void check_interrupted() {
  if (g_interrupted) throw Error("interrupted; what the lab had made is removed.");
}

// ---- small helpers ------------------------------------------------------------------------------

std::string lab_root() {
  const char* r = std::getenv("TREEDUCE_LAB_ROOT");
  return r != nullptr && *r != '\0' ? r : "/run/treeduce/lab";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// The last `lines` lines of a file, indented, for an error message.
std::string tail(const std::string& path, int lines = 12) {
  std::vector<std::string> all;
  std::istringstream in(read_file(path));
  for (std::string l; std::getline(in, l);) all.push_back(l);
  std::string out;
  for (std::size_t i = all.size() > std::size_t(lines) ? all.size() - std::size_t(lines) : 0;
       i < all.size(); ++i) {
    out += "    " + all[i] + "\n";
  }
  return out.empty() ? "    (empty log " + path + ")\n" : out;
}

std::string ip_str(std::uint32_t ip) { return ctl::to_string(ctl::Address{ip, 0}); }

/// Runs argv (no shell), stdout and stderr captured together. The exit status, or -1.
int run_capture(const std::vector<std::string>& argv, std::string* out) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    const int null = open("/dev/null", O_RDONLY);
    dup2(null, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    std::fprintf(stderr, "cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  std::string o;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    o.append(buf, std::size_t(n));
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (out != nullptr) *out = o;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string join(const std::vector<std::string>& v, const std::string& sep = " ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

/// The lab's certificates (docs/lab.md, "TLS"): in <state>/tls/, made by make_pki().
tls::TlsOptions lab_tls(const std::string& dir, const std::string& who) {
  const std::string d = dir + "/tls/";
  return {d + "ca.pem", d + who + ".pem", d + who + ".key", false};
}

/// The lab's own CA and a certificate for each identity: the manager (for the lab's management
/// address and loopback), each switch (named after it: the manager takes its registration under
/// that name only), the admin (the lab's own calls: queries, faults, captures) and the job (the
/// ranks of `lab run`). P-256 keys, valid ten years: a lab is not a deployment.
void make_pki(const std::string& dir, const std::string& mgmt_ip,
              const std::vector<std::string>& switches) {
  const std::string d = dir + "/tls";
  if (mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
    throw Error("cannot make " + d + ": " + std::strerror(errno));
  const auto openssl = [](std::vector<std::string> args) {
    args.insert(args.begin(), "openssl");
    std::string out;
    if (run_capture(args, &out) != 0)
      throw Error("cannot make the lab's certificates: " + join(args) + " said: " + out +
                  " (openssl is package openssl)");
  };
  openssl({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", d + "/ca.key", "-out", d + "/ca.pem", "-days", "3650", "-subj",
           "/CN=treeduce lab CA"});
  std::vector<std::pair<std::string, std::string>> ids = {
      {"manager", tls::kDefaultManagerName}, {"admin", tls::kDefaultAdminName}, {"job", "job"}};
  for (const std::string& sw : switches) ids.push_back({"switch-" + sw, sw});
  const std::string ext = d + "/leaf.ext";
  std::ofstream(ext) << "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
                     << "subjectAltName=IP:127.0.0.1,IP:" << mgmt_ip << ",DNS:localhost\n";
  for (const auto& [file, cn] : ids) {
    const std::string base = d + "/" + file;
    openssl({"req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=" + cn});
    openssl({"x509", "-req", "-in", base + ".csr", "-CA", d + "/ca.pem", "-CAkey", d + "/ca.key",
             "-CAserial", d + "/ca.srl", "-CAcreateserial", "-days", "3650", "-out", base + ".pem",
             "-extfile", ext});
    std::remove((base + ".csr").c_str());
  }
}

/// Channel credentials of the lab's admin identity (its queries, faults and captures).
std::shared_ptr<grpc::ChannelCredentials> admin_creds(const std::string& dir) {
  std::string error;
  auto c = tls::channel_credentials(lab_tls(dir, "admin"), &error);
  if (!c) throw Error(error);
  return c;
}

/// `ip ARGS...`; a failure is an Error naming the command and what ip said.
void ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  if (run_capture(argv, &out) != 0) {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    throw Error("`" + join(argv) + "` failed: " + (out.empty() ? "no message" : out) + ".");
  }
}

/// `ip ARGS...`, failures ignored (removal of what may already be gone).
void ip_quiet(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  run_capture(argv, nullptr);
}

std::vector<std::string> proc_cmdline(pid_t pid) {
  const std::string s = read_file("/proc/" + std::to_string(pid) + "/cmdline");
  std::vector<std::string> v;
  std::size_t b = 0;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\0') {
      v.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return v;
}

/// Start time of `pid` (field 22 of /proc/<pid>/stat), 0 if gone; *zombie set for state Z.
unsigned long long proc_start(pid_t pid, bool* zombie = nullptr) {
  const std::string s = read_file("/proc/" + std::to_string(pid) + "/stat");
  const std::size_t rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream in(s.substr(rp + 2));
  std::string f;
  std::vector<std::string> fields;
  while (in >> f) fields.push_back(f);
  // After the comm: state is field 3, starttime field 22, so index 0 and 19 here.
  if (fields.size() < 20) return 0;
  if (zombie != nullptr) *zombie = fields[0] == "Z";
  return std::strtoull(fields[19].c_str(), nullptr, 10);
}

/// Resident memory of `pid` in KiB (VmRSS), 0 if gone.
long rss_kib(pid_t pid) {
  std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("VmRSS:", 0) == 0) return std::atol(l.c_str() + 6);
  }
  return 0;
}

std::string mib(long kib) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MiB", double(kib) / 1024);
  return b;
}

/// 1 while `pid` is a running child of this process, 0 once it has exited (reaped here), -1 when
/// it is not our child. During `lab up` the lab's processes are its children: a child's pid
/// cannot be recycled before it is reaped, and its cmdline is not yet argv before it has exec'd.
int child_state(pid_t pid) {
  int st = 0;
  const pid_t r = waitpid(pid, &st, WNOHANG);
  if (r == 0) return 1;
  if (r == pid) return 0;
  return -1;
}

/// True while `p` runs and is the process the lab started (not a recycled pid).
bool ours(const ProcRec& p) {
  if (p.pid <= 0) return false;
  if (const int c = child_state(p.pid); c >= 0) return c == 1;
  bool zombie = false;
  const unsigned long long st = proc_start(p.pid, &zombie);
  if (st == 0 || zombie) return false;
  if (p.start != 0 && st != p.start) return false;
  return proc_cmdline(p.pid) == p.argv;
}

/// Reaps `pid` if it is our child and has exited (during `up`, the lab's processes are).
void reap_child(pid_t pid) { child_state(pid); }

/// Starts argv detached from this process (a process group of its own, SIGHUP ignored, stdin
/// /dev/null, stdout and stderr to `log`): it outlives `lab up` and the terminal.
///
/// It stays in the caller's session, hence in the caller's scheduling group: the kernel gives
/// each session a group of its own (autogroup) and shares the CPUs between groups first. The
/// ranks of `lab run` are in the caller's session; in a session of its own, a switch or the
/// manager was a group against theirs, and on a busy 2-CPU machine ranks that spin in MPI while
/// their other threads wake and sleep got both CPUs for up to 12 s while every other group got
/// nothing: the manager answered no heartbeat, the switch forwarded nothing, leases lapsed
/// (docs/lab.md, "A busy machine").
ProcRec spawn_detached(const std::string& role, const std::string& name,
                       const std::vector<std::string>& argv, const std::string& log) {
  const pid_t pid = fork();
  if (pid < 0) throw Error("cannot fork: " + std::string(std::strerror(errno)) + ".");
  if (pid == 0) {
    setpgid(0, 0);            // Ctrl-C in the terminal does not reach it
    signal(SIGHUP, SIG_IGN);  // nor the terminal's hangup
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    const int null = open("/dev/null", O_RDONLY);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(null, 0);
    dup2(fd, 1);
    dup2(fd, 2);
    close_range(3, ~0u, 0);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    std::fprintf(stderr, "cannot run %s: %s\n", a[0], std::strerror(errno));
    _exit(127);
  }
  ProcRec p{role, name, pid, argv, 0, log};
  // The child's /proc entry exists from fork on; its cmdline is argv once it has exec'd. The
  // start time is the same before and after exec.
  p.start = proc_start(pid);
  return p;
}

/// Enters network namespace `ns` as `ip netns exec` does: the namespace, and a mount namespace
/// of our own with /sys for it (so that /sys/class/net lists its interfaces).
std::string enter_netns(const std::string& ns) {
  const std::string path = "/run/netns/" + ns;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  if (setns(fd, CLONE_NEWNET) != 0) return "cannot enter " + path + ": " + std::strerror(errno);
  close(fd);
  if (unshare(CLONE_NEWNS) == 0 && mount("", "/", "none", MS_SLAVE | MS_REC, nullptr) == 0) {
    umount2("/sys", MNT_DETACH);
    mount(ns.c_str(), "/sys", "sysfs", 0, nullptr);
  }
  return "";
}

/// Letters, digits, '-' and '_': no '.', which separates the lab's name from a host's in the
/// namespace names (tdlab-<lab>.<host>), so that two labs' namespaces never meet.
bool good_lab_name(const std::string& s) {
  if (s.empty() || s.size() > 32 || s[0] == '-') return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

// ---- state --------------------------------------------------------------------------------------

std::string lab_dir(const std::string& name) { return lab_root() + "/" + name; }

void save(const State& s) {
  const std::string dir = lab_dir(s.name);
  const std::string tmp = dir + "/state.json.tmp";
  {
    std::ofstream f(tmp);
    f << json(s).dump(1) << "\n";
    if (!f) throw Error("cannot write " + tmp + ".");
  }
  fs::rename(tmp, dir + "/state.json");
}

std::optional<State> load(const std::string& name) {
  const std::string path = lab_dir(name) + "/state.json";
  if (!fs::exists(path)) return std::nullopt;
  try {
    return json::parse(read_file(path)).get<State>();
  } catch (const std::exception& e) {
    throw Error(path + " is not a lab state file (" + e.what() +
                "); remove the lab's resources by hand.");
  }
}

/// The `lab up` making it still runs (the same process: pid and start time; never this one).
/// Its processes may outlive it (`lab up` killed with -9): they do not count.
bool up_alive(const State& s) {
  return s.phase == "starting" && s.up_pid != getpid() && s.up_start != 0 &&
         ours(ProcRec{"", "", s.up_pid, proc_cmdline(s.up_pid), s.up_start, ""});
}

/// The `lab up` making it, or one of its processes, still runs.
bool alive(const State& s) {
  return up_alive(s) ||
         std::any_of(s.procs.begin(), s.procs.end(), [](const ProcRec& p) { return ours(p); });
}

State need_lab(const std::string& name) {
  auto s = load(name);
  if (!s) {
    throw Error("no lab named '" + name + "' is up (`treeduce lab up" +
                (name == "default" ? std::string() : " --name " + name) + "` brings one up).");
  }
  if (s->phase != "up") {
    throw Error("lab '" + name + "' is not up (" +
                (up_alive(*s) ? "it is being brought up" : "a `lab up` of it failed half-way") +
                "); `treeduce lab down --name " + name + "` removes what it made.");
  }
  return *s;
}

/// Removes everything `s` records, then its directory. Returns what could not be removed.
std::vector<std::string> teardown(const State& s) {
  std::vector<std::string> problems;
  // Switches first (they talk to the manager), then the manager. SIGTERM lets a switch close its
  // ports and write its final counters; a loaded machine can take seconds to unmap af_packet
  // rings, hence the long grace before SIGKILL.
  std::vector<ProcRec> procs(s.procs.rbegin(), s.procs.rend());
  for (const ProcRec& p : procs) {
    if (ours(p)) kill(p.pid, SIGTERM);
  }
  const auto end = Clock::now() + std::chrono::seconds(20);
  for (const ProcRec& p : procs) {
    while (ours(p) && Clock::now() < end) {
      reap_child(p.pid);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (ours(p)) {
      kill(p.pid, SIGKILL);
      for (int i = 0; i < 250 && ours(p); ++i) {
        reap_child(p.pid);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (ours(p)) problems.push_back("process " + std::to_string(p.pid) + " (" + p.name + ")");
    }
  }
  // Whatever still runs in a host's namespace (a `lab exec` shell, a rank) is the lab's too.
  for (const std::string& ns : s.namespaces) {
    std::string pids;
    if (run_capture({"ip", "netns", "pids", ns}, &pids) == 0) {
      std::istringstream in(pids);
      for (pid_t pid; in >> pid;) kill(pid, SIGKILL);
    }
    ip_quiet({"netns", "del", ns});
    if (fs::exists("/run/netns/" + ns)) problems.push_back("namespace " + ns);
  }
  for (const std::string& l : s.links) {
    if (fs::exists("/sys/class/net/" + l)) ip_quiet({"link", "del", l});
  }
  if (!s.bridge.empty() && fs::exists("/sys/class/net/" + s.bridge)) {
    ip_quiet({"link", "del", s.bridge});
  }
  for (const std::string& l : s.links) {
    if (fs::exists("/sys/class/net/" + l)) problems.push_back("interface " + l);
  }
  if (!s.bridge.empty() && fs::exists("/sys/class/net/" + s.bridge)) {
    problems.push_back("bridge " + s.bridge);
  }
  std::error_code ec;
  for (const std::string& p : s.dpdk_prefixes) fs::remove_all("/var/run/dpdk/" + p, ec);
  for (const std::string& p : s.sockets) fs::remove(p, ec);
  if (problems.empty()) fs::remove_all(lab_dir(s.name), ec);
  return problems;
}

/// An exclusive lock on the labs' root while slots are handed out.
class RootLock {
 public:
  RootLock() {
    fs::create_directories(lab_root());
    fd_ = open((lab_root() + "/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~RootLock() {
    if (fd_ >= 0) close(fd_);
  }

 private:
  int fd_ = -1;
};

// ---- binaries -----------------------------------------------------------------------------------

bool executable_file(const std::string& p) {
  struct stat st {};
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0;
}

/// `name` from $VAR, next to this program, in the build tree it was built in, or on $PATH.
std::string find_binary(const std::string& name, const char* var, const std::string& built) {
  if (const char* v = std::getenv(var); v != nullptr && *v != '\0') {
    if (!executable_file(v)) {
      throw Error(std::string(var) + " is '" + v + "', which is not an executable file.");
    }
    return v;
  }
  std::vector<std::string> tried;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) tried.push_back((self.parent_path() / name).string());
  if (!built.empty()) tried.push_back(built);
  if (const char* path = std::getenv("PATH")) {
    std::istringstream in(path);
    for (std::string d; std::getline(in, d, ':');) {
      if (!d.empty()) tried.push_back(d + "/" + name);
    }
  }
  for (const std::string& t : tried) {
    if (executable_file(t)) return t;
  }
  throw Error("cannot find " + name + " (next to this program, in " +
              (built.empty() ? std::string("the build tree") : built) +
              ", or on PATH); build it "
              "or name it with " +
              var + ".");
}

#ifndef TREEDUCE_LAB_SWITCH_BIN
#define TREEDUCE_LAB_SWITCH_BIN ""
#endif
#ifndef TREEDUCE_LAB_MANAGER_BIN
#define TREEDUCE_LAB_MANAGER_BIN ""
#endif
#ifndef TREEDUCE_LAB_PERF_BIN
#define TREEDUCE_LAB_PERF_BIN ""
#endif

// ---- topology -----------------------------------------------------------------------------------

/// The manager's YAML for a generated topology (built-in profiles only; the generators use them).
std::string to_yaml(const ctl::Topology& t) {
  std::ostringstream y;
  y << "switches:\n";
  for (const ctl::Switch& s : t.switches) {
    y << "  - {name: " << s.name << ", level: " << s.level << ", data: \"" << ctl::to_string(s.data)
      << "\", profile: " << t.profiles[s.profile].name << ", ports: " << s.ports << "}\n";
  }
  y << "hosts:\n";
  for (const ctl::Host& h : t.hosts) {
    y << "  - {name: " << h.name << ", address: " << ip_str(h.data.ip)
      << ", switch: " << t.switches[h.leaf].name << "}\n";
  }
  bool any = false;
  for (std::size_t i = 0; i < t.switches.size(); ++i) {
    for (std::uint32_t u : t.switches[i].up) {
      if (!any) y << "links:\n";
      any = true;
      y << "  - {a: " << t.switches[i].name << ", b: " << t.switches[u].name << "}\n";
    }
  }
  return y.str();
}

std::string leaf_yaml(int n) {
  std::ostringstream y;
  y << "# treeduce lab up --leaf " << n << ": one switch, " << n << " hosts.\nswitches:\n"
    << "  - {name: leaf0, level: 0, data: \"10.0.0.1:47110\", profile: server, ports: " << n
    << "}\nhosts:\n";
  for (int h = 0; h < n; ++h) {
    y << "  - {name: h" << h << ", address: 10.1.0." << h + 1 << ", switch: leaf0, port: " << h + 1
      << "}\n";
  }
  return y.str();
}

// ---- up -----------------------------------------------------------------------------------------

struct UpArgs {
  std::string name = "default";
  std::string topology_file;
  std::uint32_t fat_tree = 0;
  std::string rail;  ///< "GROUPS,SERVERS,RAILS,SPINES": make_rail_optimised
  int leaf = 0;
  int mtu = 1500;
  int dpdk_mem_mb = 0;  ///< 0: by port count (dpdk_mem_for)
  int idle_sleep_us = 200;
  double loss = 0;                         ///< rx_loss on every switch port
  std::string switch_ports = "af_packet";  ///< the hosts' veths read with net_<this>
};

/// A switch port on a host's veth read with net_af_xdp (`lab up --switch-ports af_xdp`).
bool is_af_xdp(const PortRec& p) { return p.name.rfind("net_af_xdp", 0) == 0; }

void wait_until(const std::function<bool()>& done, std::chrono::seconds bound,
                const std::function<std::string()>& why) {
  const auto end = Clock::now() + bound;
  while (!done()) {
    check_interrupted();
    if (Clock::now() > end) throw Error(why());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

class Up {
 public:
  Up(const UpArgs& a) : a_(a) {}

  int run() {
    const auto t0 = Clock::now();
    ctl::Topology t = topology();
    check_fits(t);
    switch_bin_ = find_binary("treeduce-switch", "TREEDUCE_SWITCH_BIN", TREEDUCE_LAB_SWITCH_BIN);
    manager_bin_ =
        find_binary("treeduce-manager", "TREEDUCE_MANAGER_BIN", TREEDUCE_LAB_MANAGER_BIN);
    claim();
    try {
      build(t);
    } catch (const std::exception& e) {
      const Error* err = dynamic_cast<const Error*>(&e);
      const auto problems = teardown(s_);
      std::string left;
      if (!problems.empty()) {
        left = " Could not remove: " + join(problems, ", ") + "; state kept in " + dir() + ".";
      }
      throw Error(std::string(e.what()) + left, err != nullptr ? err->code : 1);
    }
    s_.phase = "up";
    s_.up_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    save(s_);
    print_usage();
    return 0;
  }

 private:
  std::string dir() const { return lab_dir(a_.name); }
  std::string pfx() const { return "tl" + std::to_string(s_.slot); }

  ctl::Topology topology() {
    const int given =
        !a_.topology_file.empty() + (a_.fat_tree != 0) + !a_.rail.empty() + (a_.leaf != 0);
    if (given > 1)
      throw Error("give one of TOPOLOGY.yaml, --fat-tree K, --rail G,S,R,P and --leaf N.", 2);
    if (!a_.rail.empty()) {
      std::uint32_t v[4] = {};
      std::vector<std::string> parts;
      std::istringstream in(a_.rail);
      for (std::string x; std::getline(in, x, ',');) parts.push_back(x);
      bool good = parts.size() == 4;
      for (std::size_t i = 0; good && i < 4; ++i) {
        const char* b = parts[i].data();
        const char* e = b + parts[i].size();
        auto [p, ec] = std::from_chars(b, e, v[i]);
        good = ec == std::errc{} && p == e && b != e;
      }
      if (!good)
        throw Error(
            "--rail takes GROUPS,SERVERS,RAILS,SPINES, four numbers (for example 1,4,2,1), "
            "not '" +
                a_.rail + "'.",
            2);
      auto t = ctl::make_rail_optimised(v[0], v[1], v[2], v[3], "server");
      if (!t.ok()) throw Error("--rail " + a_.rail + ": " + t.status().message(), 2);
      manager_yaml_ = to_yaml(*t);
      return std::move(*t);
    }
    if (a_.fat_tree != 0) {
      auto t = ctl::make_fat_tree2(a_.fat_tree, "server");
      if (!t.ok()) throw Error(t.status().message(), 2);
      manager_yaml_ = to_yaml(*t);
      return std::move(*t);
    }
    if (!a_.topology_file.empty()) {
      if (!fs::exists(a_.topology_file))
        throw Error("there is no file " + a_.topology_file + ".", 2);
      auto t = ctl::load_topology_file(a_.topology_file);
      if (!t.ok()) throw Error(t.status().message(), 2);
      manager_yaml_ = read_file(a_.topology_file);
      return std::move(*t);
    }
    const int n = a_.leaf != 0 ? a_.leaf : 4;
    manager_yaml_ = leaf_yaml(n);
    auto t = ctl::load_topology_yaml(manager_yaml_);
    if (!t.ok()) throw Error(t.status().message(), 2);
    return std::move(*t);
  }

  /// What the lab cannot build, refused before anything is made.
  void check_fits(const ctl::Topology& t) {
    if (t.hosts.empty()) throw Error("the topology has no hosts; the lab needs at least one.", 2);
    if (t.hosts.size() > 240) {
      throw Error("the topology has " + std::to_string(t.hosts.size()) +
                      " hosts; a lab has at most 240 (one management /24).",
                  2);
    }
    // The names go into file paths, YAML and namespace names: only safe characters.
    for (const ctl::Switch& s : t.switches) {
      if (!good_lab_name(s.name)) {
        throw Error("switch name '" + s.name +
                        "' does not fit a lab (1 to 32 letters, digits, '-' or '_').",
                    2);
      }
    }
    for (const ctl::Host& h : t.hosts) {
      if (!good_lab_name(h.name)) {
        throw Error(
            "host name '" + h.name + "' does not fit a lab (1 to 32 letters, digits, '-' or '_').",
            2);
      }
    }
    std::map<std::uint32_t, std::string> ips;
    for (const ctl::Switch& s : t.switches) {
      const std::size_t ports = s.hosts.size() + s.up.size() + s.down.size();
      // RTE_MAX_ETHPORTS of Debian's DPDK 22.11.
      if (ports > 32) {
        throw Error("switch '" + s.name + "' has " + std::to_string(ports) +
                        " links (hosts and switches); a lab switch has at most 32 ports (DPDK's "
                        "RTE_MAX_ETHPORTS).",
                    2);
      }
      if (!ips.emplace(s.data.ip, "switch '" + s.name + "'").second) {
        throw Error("switch '" + s.name + "' has the data address " + ip_str(s.data.ip) +
                        ", which " + ips[s.data.ip] + " has too; the lab needs one per switch.",
                    2);
      }
    }
    for (const ctl::Host& h : t.hosts) {
      if (h.data.ip == 0) throw Error("host '" + h.name + "' has no data address.", 2);
      if (!ips.emplace(h.data.ip, "host '" + h.name + "'").second) {
        throw Error("host '" + h.name + "' has the address " + ip_str(h.data.ip) + ", which " +
                        ips[h.data.ip] + " has too.",
                    2);
      }
    }
  }

  /// Refuses a live lab of this name, reaps a dead one, and takes a free slot (the management
  /// subnet and the interface prefix), all under the root lock so that two `up`s never share one.
  void claim() {
    RootLock lock;
    if (auto old = load(a_.name)) {
      if (alive(*old)) {
        throw Error("lab '" + a_.name + "' is already up (`treeduce lab status --name " + a_.name +
                    "`); `treeduce lab down --name " + a_.name +
                    "` first, or give another --name.");
      }
      std::fprintf(stderr,
                   "treeduce lab: lab '%s' was left behind by processes that are gone; "
                   "removing it first.\n",
                   a_.name.c_str());
      if (auto p = teardown(*old); !p.empty()) {
        throw Error("cannot remove the stale lab '" + a_.name + "': " + join(p, ", ") + ".");
      }
    }
    std::set<int> used;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(lab_root(), ec)) {
      if (!e.is_directory()) continue;
      try {
        if (auto s = load(e.path().filename().string())) used.insert(s->slot);
      } catch (const Error&) {
      }
    }
    std::string addrs;
    run_capture({"ip", "-o", "-4", "addr", "show"}, &addrs);
    for (int slot = 0; slot < 255; ++slot) {
      if (used.count(slot) != 0) continue;
      const std::string br = "tl" + std::to_string(slot) + "br";
      if (fs::exists("/sys/class/net/" + br)) continue;
      if (addrs.find(" 198.19." + std::to_string(slot) + ".1/") != std::string::npos) continue;
      s_.slot = slot;
      break;
    }
    if (s_.slot < 0) throw Error("all 255 lab slots are taken; bring a lab down first.");
    s_.name = a_.name;
    s_.phase = "starting";
    s_.up_pid = getpid();
    s_.up_start = proc_start(getpid());
    s_.mtu = a_.mtu;
    s_.base_loss = a_.loss;
    fs::create_directories(dir());
    save(s_);
  }

  void build(const ctl::Topology& t) {
    std::ofstream(dir() + "/topology.yaml") << manager_yaml_;
    // The management network: a bridge in this namespace, every host on it.
    s_.bridge = pfx() + "br";
    s_.mgmt_ip = "198.19." + std::to_string(s_.slot) + ".1";
    save(s_);
    ip({"link", "add", s_.bridge, "type", "bridge"});
    ip({"addr", "add", s_.mgmt_ip + "/24", "dev", s_.bridge});
    ip({"link", "set", s_.bridge, "up"});
    for (std::size_t h = 0; h < t.hosts.size(); ++h) add_host(t, h);
    std::vector<std::string> names;
    for (const ctl::Switch& sw : t.switches) names.push_back(sw.name);
    make_pki(dir(), s_.mgmt_ip, names);
    start_manager();
    start_switches(t);
    wait_registered();
    wait_hosts();
  }

  void disable_ipv6(const std::string& dev) {
    // No router solicitations or MLD reports into the switches' ports (they would only show up as
    // drops in `lab status`).
    std::ofstream("/proc/sys/net/ipv6/conf/" + dev + "/disable_ipv6") << "1\n";
  }

  void add_host(const ctl::Topology& t, std::size_t h) {
    check_interrupted();
    const ctl::Host& host = t.hosts[h];
    const ctl::Switch& leaf = t.switches[host.leaf];
    HostRec r;
    r.name = host.name;
    r.ns = "tdlab-" + a_.name + "." + host.name;
    r.ip = ip_str(host.data.ip);
    r.mgmt_ip = "198.19." + std::to_string(s_.slot) + "." + std::to_string(10 + h);
    r.leaf = leaf.name;
    r.leaf_data = ctl::to_string(leaf.data);
    r.port_if = pfx() + "h" + std::to_string(h);
    r.mgmt_if = pfx() + "m" + std::to_string(h);
    const std::string tmp_port = pfx() + "g" + std::to_string(h);
    const std::string tmp_mgmt = pfx() + "n" + std::to_string(h);
    // What is already there belongs to someone else: refused, and never recorded (so never
    // removed by this lab's teardown).
    if (fs::exists("/run/netns/" + r.ns)) {
      throw Error("network namespace " + r.ns +
                  " already exists, and no lab of this machine records it; remove it (`ip netns "
                  "del " +
                  r.ns + "`) or give another --name.");
    }
    for (const std::string& l : {r.port_if, r.mgmt_if, tmp_port, tmp_mgmt}) {
      if (fs::exists("/sys/class/net/" + l)) {
        throw Error("interface " + l +
                    " already exists, and no lab of this machine records it; "
                    "remove it (`ip link del " +
                    l + "`).");
      }
    }
    // Recorded before they exist: a `down` after a crash here removes them all the same.
    s_.hosts.push_back(r);
    s_.namespaces.push_back(r.ns);
    for (const auto& l : {r.port_if, r.mgmt_if, tmp_port, tmp_mgmt}) s_.links.push_back(l);
    save(s_);
    const std::string mtu = std::to_string(a_.mtu);
    ip({"netns", "add", r.ns});
    {
      std::string out;
      run_capture({"ip", "netns", "exec", r.ns, "sh", "-c",
                   "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                   "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"},
                  &out);
    }
    ip({"-n", r.ns, "link", "set", "lo", "up"});
    // The data link: eth0 in the host, its peer read by the leaf's af_packet port.
    ip({"link", "add", r.port_if, "mtu", mtu, "type", "veth", "peer", "name", tmp_port, "mtu",
        mtu});
    disable_ipv6(r.port_if);
    ip({"link", "set", tmp_port, "netns", r.ns, "name", "eth0"});
    ip({"-n", r.ns, "addr", "add", r.ip + "/32", "dev", "eth0"});
    ip({"-n", r.ns, "link", "set", "eth0", "up"});
    ip({"link", "set", r.port_if, "up"});
    // The leaf answers ARP for its data address on every port: an on-link route is all a host
    // needs.
    const std::string leaf_ip = ip_str(leaf.data.ip);
    ip({"-n", r.ns, "route", "add", leaf_ip + "/32", "dev", "eth0", "src", r.ip});
    // The management link, on the bridge.
    ip({"link", "add", r.mgmt_if, "type", "veth", "peer", "name", tmp_mgmt});
    disable_ipv6(r.mgmt_if);
    ip({"link", "set", tmp_mgmt, "netns", r.ns, "name", "mgmt0"});
    ip({"link", "set", r.mgmt_if, "master", s_.bridge, "up"});
    ip({"-n", r.ns, "addr", "add", r.mgmt_ip + "/24", "dev", "mgmt0"});
    ip({"-n", r.ns, "link", "set", "mgmt0", "up"});
  }

  void start_manager() {
    const std::string port_file = dir() + "/manager.port";
    std::vector<std::string> argv = {
        manager_bin_,         "-t",      dir() + "/topology.yaml", "-l",    s_.mgmt_ip + ":0",
        "--port-file",        port_file, "--switch-lease-ms",      "15000", "--db",
        dir() + "/manager.db"};
    const tls::TlsOptions mt = lab_tls(dir(), "manager");
    argv.insert(argv.end(), {"--tls-ca", mt.ca, "--tls-cert", mt.cert, "--tls-key", mt.key});
    s_.procs.push_back(spawn_detached("manager", "manager", argv, dir() + "/manager.log"));
    save(s_);
    const ProcRec& m = s_.procs.back();
    wait_until(
        [&] {
          if (!ours(m) && read_file(port_file).empty()) {
            throw Error("treeduce-manager exited at start:\n" + tail(m.log));
          }
          return !read_file(port_file).empty();
        },
        std::chrono::seconds(60),
        [&] { return "treeduce-manager did not listen within 60 s:\n" + tail(m.log); });
    int port = std::atoi(read_file(port_file).c_str());
    s_.manager = s_.mgmt_ip + ":" + std::to_string(port);
    save(s_);
  }

  struct Plan {
    std::string config;
    std::vector<std::string> argv;
  };

  void start_switches(const ctl::Topology& t) {
    // Ports: each switch's hosts (af_packet on the veth end), then one memif port per link. The
    // upper end of a link is the memif server, on a socket of its own; DPDK 22.11's server
    // refuses a client until its port has started, and a refused client never retries, so the
    // levels start from the top, each once the one above is ready.
    const std::size_t n = t.switches.size();
    std::vector<SwitchRec> recs(n);
    std::vector<std::vector<std::string>> vdevs(n);
    std::vector<int> memifs(n, 0), server_ids(n, 0);
    const std::string bsize = a_.mtu > 1500 ? ",bsize=16384" : "";
    for (std::size_t i = 0; i < n; ++i) {
      recs[i].name = t.switches[i].name;
      recs[i].level = int(t.switches[i].level);
      recs[i].data = ctl::to_string(t.switches[i].data);
      for (std::size_t k = 0; k < t.switches[i].hosts.size(); ++k) {
        const std::uint32_t h = t.switches[i].hosts[k];
        const std::string port = "net_" + a_.switch_ports + std::to_string(k);
        recs[i].ports.push_back({port, t.hosts[h].name});
        vdevs[i].push_back(is_af_xdp(recs[i].ports.back())
                               ? af_xdp_vdev(port, s_.hosts[h].port_if)
                               : af_packet_vdev(port, s_.hosts[h].port_if, 1, a_.mtu));
      }
    }
    for (std::size_t lo = 0; lo < n; ++lo) {
      for (std::uint32_t hi : t.switches[lo].up) {
        const std::string sock = dir() + "/" + t.switches[hi].name + ".memif.sock";
        if (std::find(s_.sockets.begin(), s_.sockets.end(), sock) == s_.sockets.end()) {
          s_.sockets.push_back(sock);
        }
        const int id = server_ids[hi]++;
        const std::string lo_port = "net_memif" + std::to_string(memifs[lo]++);
        const std::string hi_port = "net_memif" + std::to_string(memifs[hi]++);
        vdevs[lo].push_back("--vdev=" + lo_port + ",role=client,id=" + std::to_string(id) +
                            ",socket=" + sock + ",socket-abstract=no" + bsize);
        vdevs[hi].push_back("--vdev=" + hi_port + ",role=server,id=" + std::to_string(id) +
                            ",socket=" + sock + ",socket-abstract=no" + bsize);
        recs[lo].ports.push_back({lo_port, t.switches[hi].name + ":" + hi_port});
        recs[hi].ports.push_back({hi_port, t.switches[lo].name + ":" + lo_port});
        s_.switch_links.push_back({t.switches[lo].name, lo_port, t.switches[hi].name, hi_port});
      }
    }
    s_.switches = recs;
    save(s_);
    std::vector<Plan> plans(n);
    for (std::size_t i = 0; i < n; ++i) plans[i] = plan(t.switches[i], recs[i], vdevs[i], i);
    for (int level = int(t.levels()) - 1; level >= 0; --level) {
      std::vector<std::size_t> started;
      for (std::size_t i = 0; i < n; ++i) {
        if (int(t.switches[i].level) != level) continue;
        start_switch(i, plans[i]);
        started.push_back(i);
      }
      for (std::size_t i : started) wait_ready(i, plans[i]);
    }
  }

  Plan plan(const ctl::Switch& sw, const SwitchRec& rec, const std::vector<std::string>& vdevs,
            std::size_t index) {
    // Every port carries the switch's data address as its own (a /32: no link subnet), so that
    // its ARP requests for hosts and peers come from an address they route back to.
    std::ostringstream y;
    y << "# treeduce lab '" << a_.name << "': switch " << sw.name << "\nname: " << sw.name
      << "\ndata: " << rec.data << "\nports:\n";
    for (const PortRec& p : rec.ports) {
      y << "  - {name: " << p.name << ", ip: " << ip_str(sw.data.ip) << "/32";
      if (a_.mtu != 1500) y << ", mtu: " << a_.mtu;
      if (a_.loss > 0) y << ", rx_loss: " << a_.loss;
      y << "}\n";
    }
    // Few descriptors and mbufs: the lab runs many switches on a small machine (docs/lab.md).
    y << "idle_sleep_us: " << a_.idle_sleep_us << "\nrx_desc: 256\ntx_desc: 256\nmbufs: 1024\n"
      << "metrics: 127.0.0.1:0\nmanager: " << s_.manager
      << "\nagent_listen: 127.0.0.1:0\nheartbeat_ms: 500\nfinal_stats: " << dir() << "/" << sw.name
      << ".prom\nseed: " << index + 1
      << "\n# treeduce lab fault and capture: SetPortFault and SetPortCapture on the agent\n"
      << "faults: true\n";
    const tls::TlsOptions m = lab_tls(dir(), "switch-" + sw.name);
    y << "# mutual TLS with the lab's own CA (docs/lab.md)\ntls_ca: " << m.ca
      << "\ntls_cert: " << m.cert << "\ntls_key: " << m.key << "\n";
    Plan p;
    p.config = dir() + "/" + sw.name + ".yaml";
    std::ofstream(p.config) << y.str();
    const std::string prefix = pfx() + "-" + sw.name;
    s_.dpdk_prefixes.push_back(prefix);
    // Measured: a switch's pools take about 4.4 MiB per port (512 descriptors of 8576-byte
    // mbufs) plus 13 MiB of lcore caches and headers; -m 32 is too little for 4 ports, 64 works.
    // A net_af_xdp port has a pool of its own besides: 4096 page-sized mbufs with one lcore
    // (switchd's af_xdp_pool), 16.3 MiB.
    const auto xdp_ports = std::count_if(rec.ports.begin(), rec.ports.end(), is_af_xdp);
    const int mem = a_.dpdk_mem_mb != 0
                        ? a_.dpdk_mem_mb
                        : 40 + 6 * int(rec.ports.size()) + 17 * static_cast<int>(xdp_ports);
    p.argv = switch_eal_argv(switch_bin_, prefix, mem, 1);
    p.argv.insert(p.argv.end(), vdevs.begin(), vdevs.end());
    p.argv.insert(p.argv.end(), {"--", "--config", p.config});
    return p;
  }

  void start_switch(std::size_t i, const Plan& p) {
    check_interrupted();
    const std::string& name = s_.switches[i].name;
    s_.procs.push_back(spawn_detached("switch", name, p.argv, dir() + "/" + name + ".log"));
    save(s_);
  }

  ProcRec& proc_of(const std::string& name) {
    for (ProcRec& p : s_.procs) {
      if (p.role == "switch" && p.name == name) return p;
    }
    throw Error("internal: no process for switch " + name + ".");
  }

  void wait_ready(std::size_t i, const Plan& plan) {
    SwitchRec& rec = s_.switches[i];
    for (int attempt = 0;; ++attempt) {
      ProcRec& p = proc_of(rec.name);
      bool exited = false;
      wait_until(
          [&] {
            if (read_file(p.log).find(" ready: ") != std::string::npos) return true;
            exited = !ours(p);
            return exited;
          },
          std::chrono::seconds(120),
          [&] {
            return "treeduce-switch " + rec.name + " was not ready within 120 s:\n" + tail(p.log);
          });
      const std::string log = read_file(p.log);
      const std::size_t r = log.find(" ready: ");
      if (r != std::string::npos) {
        const std::size_t m = log.find("metrics port ", r);
        if (m != std::string::npos) rec.metrics_port = std::atoi(log.c_str() + m + 13);
        save(s_);
        return;
      }
      // The af_packet PMD's fanout group can meet another switch's (emulated_fabric.cpp,
      // Fabric::wait_ready): a new process has a new pid, hence a new group.
      if (attempt == 3 || !packet_fanout_lost(log)) {
        throw Error("treeduce-switch " + rec.name + " exited at start:\n" + tail(p.log));
      }
      std::fprintf(stderr, "treeduce lab: %s lost a PACKET_FANOUT group to another switch; again\n",
                   rec.name.c_str());
      p = spawn_detached("switch", rec.name, plan.argv, p.log);
      save(s_);
    }
  }

  std::unique_ptr<pb::Query::Stub> query() {
    return pb::Query::NewStub(grpc::CreateChannel(s_.manager, admin_creds(dir())));
  }

  void wait_registered() {
    auto stub = query();
    std::vector<std::string> missing;
    wait_until(
        [&] {
          for (const ProcRec& p : s_.procs) {
            reap_child(p.pid);
            if (!ours(p)) {
              throw Error(p.name + " (pid " + std::to_string(p.pid) + ") exited:\n" + tail(p.log));
            }
          }
          pb::SwitchList sl;
          grpc::ClientContext c;
          c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
          if (!stub->ListSwitches(&c, pb::ListRequest(), &sl).ok()) return false;
          missing.clear();
          for (const auto& s : sl.switches()) {
            if (!s.registered() || !s.up()) missing.push_back(s.name());
          }
          return missing.empty() && sl.switches_size() > 0;
        },
        std::chrono::seconds(60),
        [&] {
          return "switches " + join(missing, ", ") +
                 " did not register with the manager within 60 s; see " + dir() + "/*.log.";
        });
  }

  void wait_hosts() {
    for (const HostRec& h : s_.hosts) {
      const std::string leaf_ip = h.leaf_data.substr(0, h.leaf_data.find(':'));
      int tries = 0;
      for (std::string out;
           run_capture({"ip", "netns", "exec", h.ns, "ping", "-c", "1", "-W", "1", "-q", leaf_ip},
                       &out) != 0;) {
        check_interrupted();
        if (++tries == 30) {
          throw Error("host " + h.name + " (" + h.ip + ") gets no answer from its leaf " + h.leaf +
                      " at " + leaf_ip + ":\n" + tail(dir() + "/" + h.leaf + ".log"));
        }
      }
    }
  }

  void print_usage() {
    const std::string n = a_.name == "default" ? "" : " --name " + a_.name;
    // sudo resets PATH: name treeduce-perf by its full path when it can be found.
    std::string perf = "treeduce-perf";
    try {
      perf = find_binary("treeduce-perf", "TREEDUCE_PERF_BIN", TREEDUCE_LAB_PERF_BIN);
    } catch (const Error&) {
    }
    std::size_t links = s_.switch_links.size() + s_.hosts.size();
    std::printf(
        "lab '%s' is up in %.1f s: %zu switch%s, %zu host%s, %zu link%s; manager at %s.\n"
        "State, configurations and logs: %s\n\n",
        a_.name.c_str(), s_.up_seconds, s_.switches.size(), s_.switches.size() == 1 ? "" : "es",
        s_.hosts.size(), s_.hosts.size() == 1 ? "" : "s", links, links == 1 ? "" : "s",
        s_.manager.c_str(), dir().c_str());
    // The commands as this user can type them: with sudo when sudo ran us, and this program by
    // its path unless PATH finds it.
    std::string self = "treeduce";
    std::error_code ec;
    const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
      bool on_path = false;
      if (const char* path = std::getenv("PATH")) {
        std::istringstream in(path);
        for (std::string d; !on_path && std::getline(in, d, ':');) {
          on_path = !d.empty() && fs::equivalent(fs::path(d) / "treeduce", exe, ec);
        }
      }
      if (!on_path) self = exe.string();
    }
    if (std::getenv("SUDO_USER") != nullptr) self = "sudo " + self;
    const std::string& h0 = s_.hosts[0].name;
    const std::vector<std::pair<std::string, std::string>> lines = {
        {self + " lab status" + n, "what runs, trees, jobs, counters"},
        {self + " lab exec" + n + " " + h0 + " -- ip -4 addr",
         "a command in " + h0 + "'s namespace"},
        {self + " lab run" + n + " -- " + perf + " -b 1024 -e 65536", "one rank per host"},
        {self + " -m " + s_.manager + " jobs", "the manager's jobs"},
        {self + " lab down" + n, "removes everything"},
    };
    for (const auto& [cmd, what] : lines) std::printf("  # %s\n  %s\n", what.c_str(), cmd.c_str());
  }

  UpArgs a_;
  State s_;
  std::string manager_yaml_;
  std::string switch_bin_, manager_bin_;
};

// ---- down ---------------------------------------------------------------------------------------

int down(const std::string& name) {
  std::optional<State> s;
  {
    RootLock lock;
    s = load(name);
  }
  if (!s) {
    std::printf("treeduce lab: no lab named '%s'; nothing to remove.\n", name.c_str());
    return 0;
  }
  if (up_alive(*s)) {
    // `lab up` of it still runs: stop it, it removes what it made. (A `lab up` killed with -9 is
    // gone: its processes are removed below, never waited for.)
    kill(s->up_pid, SIGTERM);
    const auto end = Clock::now() + std::chrono::seconds(60);
    while (fs::exists(lab_dir(name) + "/state.json") && up_alive(*s) && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    s = load(name);
    if (!s) {
      std::printf("lab '%s' is down.\n", name.c_str());
      return 0;
    }
  }
  const auto problems = teardown(*s);
  if (!problems.empty()) {
    throw Error("could not remove " + join(problems, ", ") + " of lab '" + name +
                "'; its state stays in " + lab_dir(name) + ".");
  }
  std::printf("lab '%s' is down.\n", name.c_str());
  return 0;
}

// ---- status -------------------------------------------------------------------------------------

using Row = std::vector<std::string>;

void print_table(const Row& header, const std::vector<Row>& rows) {
  std::vector<std::size_t> w(header.size());
  for (std::size_t c = 0; c < header.size(); ++c) w[c] = header[c].size();
  for (const Row& r : rows) {
    for (std::size_t c = 0; c < r.size() && c < w.size(); ++c) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const Row& r) {
    std::string s;
    for (std::size_t c = 0; c < r.size(); ++c) {
      s += r[c];
      if (c + 1 < r.size()) s += std::string(w[c] - r[c].size() + 2, ' ');
    }
    std::printf("%s\n", s.c_str());
  };
  line(header);
  for (const Row& r : rows) line(r);
}

/// GET http://127.0.0.1:<port>/metrics; "" when it does not answer.
std::string get_metrics(int port) {
  if (port <= 0) return "";
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{3, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(std::uint16_t(port));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req.data(), req.size()) == ssize_t(req.size())) {
      char buf[16384];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) body.append(buf, std::size_t(n));
    }
  }
  close(fd);
  const std::size_t h = body.find("\r\n\r\n");
  return h == std::string::npos ? "" : body.substr(h + 4);
}

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    if (l.empty() || l[0] == '#') continue;
    Sample s;
    std::size_t i = l.find_first_of("{ ");
    if (i == std::string::npos) continue;
    s.name = l.substr(0, i);
    if (l[i] == '{') {
      const std::size_t e = l.find('}', i);
      if (e == std::string::npos) continue;
      std::string body = l.substr(i + 1, e - i - 1);
      std::size_t p = 0;
      while (p < body.size()) {
        const std::size_t eq = body.find('=', p);
        if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') break;
        const std::size_t q = body.find('"', eq + 2);
        if (q == std::string::npos) break;
        s.labels[body.substr(p, eq - p)] = body.substr(eq + 2, q - eq - 2);
        p = q + 1;
        if (p < body.size() && body[p] == ',') ++p;
      }
      i = e + 1;
    }
    s.value = std::strtod(l.c_str() + i, nullptr);
    out.push_back(std::move(s));
  }
  return out;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f", v);
  return b;
}

// ---- link names (status, fault, capture) --------------------------------------------------------

/// A link as `lab status` names it and `lab fault` / `lab capture` take it: a host's link by the
/// host's name (`h0`), a link between switches as `LOWER-UPPER` (`leaf0-spine0`), its switch
/// ends `SWITCH:PORT`.
struct LinkName {
  std::string name;
  std::vector<std::pair<std::string, std::string>> ends;  ///< (switch, port); the first captures
  std::string kind;
};

std::vector<LinkName> link_names(const State& s) {
  std::vector<LinkName> out;
  for (const SwitchRec& sw : s.switches) {
    for (const PortRec& p : sw.ports) {
      if (p.peer.find(':') == std::string::npos) {
        out.push_back(
            {p.peer, {{sw.name, p.name}}, is_af_xdp(p) ? "veth/af_xdp" : "veth/af_packet"});
      }
    }
  }
  std::map<std::string, int> seen;
  for (const LinkRec& l : s.switch_links) {
    std::string n = l.a + "-" + l.b;
    // Two links between one pair of switches: leaf0-spine0, leaf0-spine0.2.
    if (const int k = ++seen[n]; k > 1) n += "." + std::to_string(k);
    out.push_back({n, {{l.a, l.a_port}, {l.b, l.b_port}}, "memif"});
  }
  return out;
}

/// `word` as a link name, `SWITCH:PORT` (that end only), or one sentence naming the known ones.
LinkName find_link(const State& s, const std::string& word) {
  const auto links = link_names(s);
  for (const LinkName& l : links) {
    if (l.name == word) return l;
  }
  const std::size_t colon = word.find(':');
  if (colon != std::string::npos) {
    const std::string sw = word.substr(0, colon), port = word.substr(colon + 1);
    for (const SwitchRec& r : s.switches) {
      if (r.name != sw) continue;
      std::vector<std::string> ports;
      for (const PortRec& p : r.ports) {
        if (p.name == port) return {word, {{sw, port}}, "port"};
        ports.push_back(p.name);
      }
      throw Error("switch '" + sw + "' of lab '" + s.name + "' has no port '" + port +
                      "' (its ports: " + join(ports, ", ") + ").",
                  2);
    }
  }
  std::vector<std::string> names;
  for (const LinkName& l : links) names.push_back(l.name);
  if (names.size() > 16) {
    names.resize(16);
    names.push_back("...");
  }
  throw Error("lab '" + s.name + "' has no link '" + word + "' (links: " + join(names, ", ") +
                  "; or one switch end as SWITCH:PORT, as `lab status` lists them).",
              2);
}

const FaultRec* fault_of(const State& s, const std::string& sw, const std::string& port) {
  for (const FaultRec& f : s.faults) {
    if (f.sw == sw && f.port == port) return &f;
  }
  return nullptr;
}

/// A port's fault state as its switch has it: the fault set on it, else `lab up --loss` alone.
FaultRec fault_or_base(const State& s, const std::string& sw, const std::string& port) {
  if (const FaultRec* f = fault_of(s, sw, port)) return *f;
  FaultRec b{sw, port};
  b.rx_loss = s.base_loss;
  return b;
}

/// "loss 0.05, down, delay 500 us, rate 100 Mb/s"; "-" when healthy.
std::string describe(const FaultRec& f) {
  std::vector<std::string> w;
  char b[64];
  if (f.rx_loss > 0) {
    std::snprintf(b, sizeof b, "loss %g", f.rx_loss);
    w.push_back(b);
  }
  if (f.down) w.push_back("down");
  if (f.delay_us != 0) w.push_back("delay " + std::to_string(f.delay_us) + " us");
  if (f.rate_mbps != 0) w.push_back("rate " + std::to_string(f.rate_mbps) + " Mb/s");
  return w.empty() ? "-" : join(w, ", ");
}

/// Per port of one switch's metrics: counter name (rx_packets, fault_down, ...) -> value.
std::map<std::string, std::map<std::string, double>> port_samples(const std::vector<Sample>& m) {
  std::map<std::string, std::map<std::string, double>> ports;
  for (const Sample& x : m) {
    if (x.name.rfind("treeduce_port_", 0) == 0 && x.labels.count("port")) {
      std::string what = x.name.substr(14);
      if (what.size() > 6 && what.compare(what.size() - 6, 6, "_total") == 0) {
        what.resize(what.size() - 6);
      }
      if (x.labels.count("counter")) what = x.labels.at("counter");
      ports[x.labels.at("port")][what] += x.value;
    }
  }
  return ports;
}

int status(const std::string& name) {
  const State s = need_lab(name);
  bool healthy = true;
  const ProcRec* manager = nullptr;
  for (const ProcRec& p : s.procs) {
    if (p.role == "manager") manager = &p;
  }
  const bool manager_alive = manager != nullptr && ours(*manager);
  healthy &= manager_alive;
  long total_rss = 0;
  for (const ProcRec& p : s.procs) {
    if (ours(p)) total_rss += rss_kib(p.pid);
  }
  std::printf(
      "lab '%s': state %s, manager %s (pid %d, %s), up in %.1f s, memory of its processes %s "
      "(RSS)\n\n",
      s.name.c_str(), lab_dir(s.name).c_str(), s.manager.c_str(), manager ? manager->pid : -1,
      manager_alive ? "alive" : "DEAD", s.up_seconds, mib(total_rss).c_str());

  // The manager's view: switches, jobs (trees are the jobs that have one).
  pb::SwitchList sl;
  pb::JobList jl;
  bool asked = false;
  if (manager_alive) {
    auto stub = pb::Query::NewStub(grpc::CreateChannel(s.manager, admin_creds(lab_dir(s.name))));
    grpc::ClientContext c1, c2;
    c1.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c2.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    asked = stub->ListSwitches(&c1, pb::ListRequest(), &sl).ok() &&
            stub->ListJobs(&c2, pb::ListRequest(), &jl).ok();
  }
  std::map<std::string, std::string> mstate;
  for (const auto& sw : sl.switches()) {
    std::string st = !sw.registered() ? "unregistered" : sw.up() ? "up" : "down";
    if (sw.drained()) st = st == "up" ? "drained" : st + ",drained";
    mstate[sw.name()] = st;
  }
  std::vector<Row> rows;
  std::map<std::string, std::vector<Sample>> metrics;
  for (const SwitchRec& sw : s.switches) {
    const ProcRec* p = nullptr;
    for (const ProcRec& q : s.procs) {
      if (q.role == "switch" && q.name == sw.name) p = &q;
    }
    const bool up = p != nullptr && ours(*p);
    const std::string ms =
        asked ? (mstate.count(sw.name) ? mstate[sw.name] : "unknown") : "(manager unreachable)";
    healthy &= up && ms == "up";
    if (up) metrics[sw.name] = parse_prometheus(get_metrics(sw.metrics_port));
    rows.push_back({sw.name, std::to_string(sw.level), p ? std::to_string(p->pid) : "-",
                    up ? "alive" : "DEAD", ms, sw.data,
                    sw.metrics_port ? "127.0.0.1:" + std::to_string(sw.metrics_port) : "-",
                    std::to_string(sw.ports.size()), up ? mib(rss_kib(p->pid)) : "-"});
  }
  print_table({"SWITCH", "LEVEL", "PID", "PROCESS", "MANAGER", "DATA", "METRICS", "PORTS", "RSS"},
              rows);

  rows.clear();
  for (const HostRec& h : s.hosts) {
    const bool ns = fs::exists("/run/netns/" + h.ns);
    healthy &= ns;
    rows.push_back({h.name, h.ip, h.mgmt_ip, h.leaf + " (" + h.leaf_data + ")",
                    ns ? h.ns : h.ns + " (MISSING)"});
  }
  std::printf("\n");
  print_table({"HOST", "ADDRESS", "MGMT", "LEAF", "NAMESPACE"}, rows);

  // Links by the names `lab fault` and `lab capture` take, with the faults set on their ends.
  rows.clear();
  for (const LinkName& l : link_names(s)) {
    std::vector<std::string> ends, faults;
    for (const auto& [sw, port] : l.ends) {
      ends.push_back(sw + ":" + port);
      if (const std::string d = describe(fault_or_base(s, sw, port)); d != "-") {
        faults.push_back((l.ends.size() > 1 ? sw + ":" + port + " " : "") + d);
      }
    }
    rows.push_back({l.name, join(ends, " "), l.kind, faults.empty() ? "-" : join(faults, "; ")});
  }
  std::printf("\n");
  print_table({"LINK", "ENDS", "KIND", "FAULTS"}, rows);

  std::printf("\n");
  if (!asked) {
    std::printf("trees and jobs: the manager at %s does not answer.\n", s.manager.c_str());
  } else {
    rows.clear();
    std::vector<Row> trees;
    for (const auto& j : jl.jobs()) {
      static const char* states[] = {"unknown", "gathering", "running", "refused", "failed"};
      const int st = int(j.state());
      rows.push_back({j.job(), st >= 0 && st < 5 ? states[st] : "unknown",
                      std::to_string(j.joined()) + "/" + std::to_string(j.world_size()),
                      j.switches_size() ? std::to_string(j.tree_id()) : "-",
                      j.reason().empty() ? "-" : j.reason()});
      if (j.switches_size() > 0) {
        std::vector<std::string> sws(j.switches().begin(), j.switches().end());
        trees.push_back({std::to_string(j.tree_id()), j.job(), std::to_string(j.depth()),
                         std::to_string(j.slots()), std::to_string(j.payload_bytes()),
                         join(sws, ",")});
      }
    }
    if (trees.empty()) {
      std::printf("trees: none installed\n");
    } else {
      print_table({"TREE", "JOB", "DEPTH", "SLOTS", "PAYLOAD", "SWITCHES (ROOT FIRST)"}, trees);
    }
    std::printf("\n");
    if (rows.empty()) {
      std::printf("jobs: none\n");
    } else {
      print_table({"JOB", "STATE", "RANKS", "TREE", "REASON"}, rows);
    }
  }

  // Per-port traffic and the switches' drops (their /metrics endpoints, docs/switch.md).
  rows.clear();
  std::vector<Row> drops, daemon;
  for (const SwitchRec& sw : s.switches) {
    auto it = metrics.find(sw.name);
    if (it == metrics.end()) continue;
    auto ports = port_samples(it->second);
    for (const Sample& x : it->second) {
      if (x.name == "treeduce_switch_daemon_total" && x.value != 0) {
        daemon.push_back(
            {sw.name, x.labels.count("counter") ? x.labels.at("counter") : "?", num(x.value)});
      } else if (x.name == "treeduce_switch_drops_total" && x.value != 0) {
        drops.push_back(
            {sw.name, x.labels.count("reason") ? x.labels.at("reason") : "?", num(x.value)});
      }
    }
    for (const PortRec& p : sw.ports) {
      auto& c = ports[p.name];
      // The faults and capture the switch itself reports (its gauges), beside what was asked.
      FaultRec live;
      live.rx_loss = c["fault_rx_loss"];
      live.down = c["fault_down"] != 0;
      live.delay_us = std::uint32_t(c["fault_delay_us"]);
      live.rate_mbps = std::uint32_t(c["fault_rate_mbps"]);
      std::string fault = describe(live);
      if (c["capturing"] != 0) fault = (fault == "-" ? "" : fault + ", ") + "capturing";
      rows.push_back({sw.name + ":" + p.name, p.peer, num(c["rx_packets"]), num(c["tx_packets"]),
                      num(c["rx_bytes"]), num(c["tx_bytes"]),
                      num(c["rx_missed"] + c["rx_errors"] + c["tx_errors"]), fault});
    }
  }
  std::printf("\n");
  print_table(
      {"PORT", "PEER", "RX_PKTS", "TX_PKTS", "RX_BYTES", "TX_BYTES", "ERRORS", "SWITCH SAYS"},
      rows);
  std::printf("\n");
  if (drops.empty()) {
    std::printf("drops: none\n");
  } else {
    print_table({"SWITCH", "DROP REASON", "COUNT"}, drops);
  }
  // The daemon's own: ARP and ICMP, unresolved next hops, injected loss (--loss), exhaustion.
  std::printf("\n");
  if (daemon.empty()) {
    std::printf("daemon counters: all 0\n");
  } else {
    print_table({"SWITCH", "DAEMON COUNTER", "COUNT"}, daemon);
  }
  return healthy ? 0 : 1;
}

// ---- exec and run -------------------------------------------------------------------------------

const HostRec& find_host(const State& s, const std::string& name) {
  for (const HostRec& h : s.hosts) {
    if (h.name == name) return h;
  }
  std::vector<std::string> names;
  for (const HostRec& h : s.hosts) names.push_back(h.name);
  if (names.size() > 12) {
    names.resize(12);
    names.push_back("...");
  }
  throw Error("lab '" + s.name + "' has no host '" + name + "' (hosts: " + join(names, ", ") + ").",
              2);
}

int exec_in(const std::string& name, const std::string& host, const std::vector<std::string>& cmd) {
  const State s = need_lab(name);
  const HostRec& h = find_host(s, host);
  if (cmd.empty()) throw Error("give the command after --: treeduce lab exec HOST -- CMD...", 2);
  if (std::string e = enter_netns(h.ns); !e.empty()) throw Error(e + ".");
  // What a program needs to join a job from this host (docs/lab.md, "exec"); the job's name,
  // rank and world size are the caller's to give.
  const tls::TlsOptions job_tls = lab_tls(lab_dir(s.name), "job");
  const std::map<std::string, std::string> env = {
      {"TREEDUCE_LAB", s.name},
      {"TREEDUCE_LAB_HOST", h.name},
      {"TREEDUCE_MANAGER", s.manager},
      {"TREEDUCE_HOST", h.ip},
      {"TREEDUCE_BIND", h.ip},
      {"TREEDUCE_FALLBACK_ADDRESS", h.mgmt_ip},
      {"TREEDUCE_TLS_CA", job_tls.ca},
      {"TREEDUCE_TLS_CERT", job_tls.cert},
      {"TREEDUCE_TLS_KEY", job_tls.key},
      {"TREEDUCE_TLS_SERVER_NAME", ""},  // the lab's manager certificate names its address
  };
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> a;
  for (const auto& x : cmd) a.push_back(const_cast<char*>(x.c_str()));
  a.push_back(nullptr);
  execvp(a[0], a.data());
  std::fprintf(stderr, "treeduce lab exec: cannot run '%s': %s.\n", a[0], std::strerror(errno));
  return errno == ENOENT ? 127 : 126;
}

struct RunArgs {
  bool mpi = false;
  int n = 0;
  std::vector<std::string> hosts;
  int master_port = 29500;
  std::vector<std::string> cmd;
};

/// One rank's output pipe, cut into lines prefixed with its host.
struct Stream {
  int fd = -1;
  FILE* to = nullptr;
  std::string prefix;
  std::string partial;
  /// Under mpirun (--tag-output): rank r's host, for "[job,r]<stdout>:line".
  const std::vector<std::string>* mpi_hosts = nullptr;
  void line(const std::string& l) {
    if (mpi_hosts != nullptr) {
      const std::size_t comma = l.find(','), close = l.find("]<"), colon = l.find(">:");
      if (!l.empty() && l[0] == '[' && comma != std::string::npos && close != std::string::npos &&
          colon != std::string::npos && comma < close && close < colon) {
        const std::size_t r = std::strtoul(l.c_str() + comma + 1, nullptr, 10);
        FILE* f = l.compare(close + 2, 6, "stderr") == 0 ? stderr : stdout;
        const std::string host = r < mpi_hosts->size() ? (*mpi_hosts)[r] : "rank ?";
        std::fprintf(f, "[%s] %s\n", host.c_str(), l.substr(colon + 2).c_str());
        std::fflush(f);
        return;
      }
    }
    std::fprintf(to, "%s%s\n", prefix.c_str(), l.c_str());
  }
  void emit(const char* data, std::size_t n) {
    partial.append(data, n);
    for (std::size_t nl; (nl = partial.find('\n')) != std::string::npos;) {
      line(partial.substr(0, nl));
      partial.erase(0, nl + 1);
    }
    std::fflush(to);
  }
  void finish() {
    if (!partial.empty()) line(partial);
    partial.clear();
    std::fflush(to);
  }
};

/// A word for /bin/sh, quoted.
std::string sh_quote(const std::string& w) {
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// The ranks under mpirun (as treeduce-fabric --compare mpi starts them): an rsh agent that
/// starts each "node" inside its host's namespace with a host name of its own, and a rank script
/// that sets the host's variables by namespace. Node names are tdlabnode<i>, not the namespaces'
/// names: Open MPI cuts a node name at its first '.'. Returns mpirun's argv.
std::vector<std::string> mpirun_argv(const State& s, const std::vector<const HostRec*>& hosts,
                                     const std::string& dir, const std::vector<std::string>& cmd) {
  std::string agent =
      "#!/bin/sh\n# mpirun's rsh agent: NODE CMD -> CMD inside NODE's host namespace, on a host "
      "named NODE (orteds that share a host name share a session directory and collide).\n"
      "node=$1; shift\ncase \"$node\" in\n";
  std::string rank = "#!/bin/sh\nns=$(ip netns identify $$)\ncase \"$ns\" in\n";
  std::string nodes;
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    const HostRec& h = *hosts[i];
    const std::string node = "tdlabnode" + std::to_string(i);
    agent += "  " + node + ") ns=" + sh_quote(h.ns) + ";;\n";
    rank += "  " + sh_quote(h.ns) + ") export TREEDUCE_HOST=" + h.ip + " TREEDUCE_BIND=" + h.ip +
            " TREEDUCE_FALLBACK_ADDRESS=" + h.mgmt_ip + " TREEDUCE_LAB_HOST=" + sh_quote(h.name) +
            ";;\n";
    nodes += (i ? "," : "") + node;
  }
  agent +=
      "  *) echo \"rsh-agent: unknown node $node\" >&2; exit 1;;\nesac\n"
      "exec ip netns exec \"$ns\" unshare --uts /bin/sh -c "
      "'hostname \"$1\" && exec /bin/sh -c \"$2\"' rsh-agent \"$node\" \"$*\"\n";
  rank += "  *) echo \"rank.sh: not in a host namespace of lab " + s.name +
          " ($ns)\" >&2; exit 126;;\nesac\n"
          "export RANK=$OMPI_COMM_WORLD_RANK WORLD_SIZE=$OMPI_COMM_WORLD_SIZE "
          "LOCAL_RANK=$OMPI_COMM_WORLD_LOCAL_RANK LOCAL_WORLD_SIZE=$OMPI_COMM_WORLD_LOCAL_SIZE "
          "TREEDUCE_RANK=$OMPI_COMM_WORLD_RANK TREEDUCE_WORLD_SIZE=$OMPI_COMM_WORLD_SIZE\n"
          "exec \"$@\"\n";
  std::ofstream(dir + "/rsh-agent.sh") << agent;
  std::ofstream(dir + "/rank.sh") << rank;
  chmod((dir + "/rsh-agent.sh").c_str(), 0755);
  chmod((dir + "/rank.sh").c_str(), 0755);
  const std::string mgmt = "198.19." + std::to_string(s.slot) + ".0/24";
  std::vector<std::string> argv = {
      "mpirun", "-np", std::to_string(hosts.size()), "--host", nodes, "--map-by", "node",
      "--bind-to", "none", "--tag-output", "--mca", "plm_rsh_agent", dir + "/rsh-agent.sh",
      // The ranks share this machine's CPUs: wait by yielding (each node has one slot, so Open
      // MPI cannot know it is oversubscribed).
      "--mca", "mpi_yield_when_idle", "1",
      // The orteds share one machine: hwloc's shared-memory topology segfaults them.
      "--mca", "rtc", "^hwloc",
      // Control and MPI traffic on the lab's management network, TCP only.
      "--mca", "oob_tcp_if_include", mgmt, "--mca", "btl", "tcp,self", "--mca",
      "btl_tcp_if_include", mgmt};
  for (const char* v : {"TREEDUCE_MANAGER", "TREEDUCE_JOB", "TREEDUCE_FALLBACK_STORE",
                        "TREEDUCE_LAB", "MASTER_ADDR", "MASTER_PORT", "TREEDUCE_TLS_CA",
                        "TREEDUCE_TLS_CERT", "TREEDUCE_TLS_KEY", "TREEDUCE_TLS_SERVER_NAME"}) {
    argv.push_back("-x");
    argv.push_back(v);
  }
  argv.push_back(dir + "/rank.sh");
  argv.insert(argv.end(), cmd.begin(), cmd.end());
  return argv;
}

int run_ranks(const std::string& name, const RunArgs& a) {
  const State s = need_lab(name);
  const tls::TlsOptions job_tls = lab_tls(lab_dir(s.name), "job");
  if (a.cmd.empty()) throw Error("give the command after --: treeduce lab run -- CMD...", 2);
  std::vector<const HostRec*> hosts;
  if (!a.hosts.empty()) {
    std::set<std::string> seen;
    for (const std::string& h : a.hosts) {
      if (!seen.insert(h).second) throw Error("host '" + h + "' is given twice in --hosts.", 2);
      hosts.push_back(&find_host(s, h));
    }
  } else {
    const std::size_t n = a.n > 0 ? std::size_t(a.n) : s.hosts.size();
    if (n > s.hosts.size()) {
      throw Error("-n " + std::to_string(n) + " asks for more ranks than lab '" + s.name +
                      "' has hosts (" + std::to_string(s.hosts.size()) + ").",
                  2);
    }
    for (std::size_t i = 0; i < n; ++i) hosts.push_back(&s.hosts[i]);
  }
  const int world = int(hosts.size());
  // A job name of its own per run: the manager refuses a name whose ranks have not all left.
  const std::string job = s.name + "-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count());
  const std::string store = lab_dir(s.name) + "/runs/" + job;
  fs::create_directories(store);

  // A reader that goes away (`lab run ... | head`) must not kill us while the ranks run on.
  signal(SIGPIPE, SIG_IGN);
  sigset_t mask, old;
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, &old);
  const int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);

  struct Rank {
    pid_t pid = -1;
    const HostRec* host = nullptr;
    bool done = false;
    int status = 0;
    bool stopped = false;  ///< signalled by us
  };
  // With --mpi, one process: mpirun, in this namespace; its output tagged by rank.
  std::vector<std::string> mpi_hosts;
  for (const HostRec* h : hosts) mpi_hosts.push_back(h->name);
  std::vector<std::string> mpi_argv;
  if (a.mpi) mpi_argv = mpirun_argv(s, hosts, store, a.cmd);
  const int procs = a.mpi ? 1 : world;
  std::vector<Rank> ranks(static_cast<std::size_t>(procs));
  std::vector<Stream> streams;
  for (int r = 0; r < procs; ++r) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) throw Error("pipe failed.");
    const HostRec& h = *hosts[std::size_t(r)];
    const pid_t pid = fork();
    if (pid == 0) {
      sigprocmask(SIG_SETMASK, &old, nullptr);
      signal(SIGPIPE, SIG_DFL);  // an ignored signal stays ignored across exec
      setpgid(0, 0);             // Ctrl-C reaches the ranks through us, each in a group of its own
      dup2(out[1], 1);
      dup2(err[1], 2);
      const int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      if (a.mpi) {
        const std::map<std::string, std::string> env = {
            {"MASTER_ADDR", hosts[0]->mgmt_ip}, {"MASTER_PORT", std::to_string(a.master_port)},
            {"TREEDUCE_MANAGER", s.manager},    {"TREEDUCE_JOB", job},
            {"TREEDUCE_FALLBACK_STORE", store}, {"TREEDUCE_LAB", s.name},
            {"OMPI_ALLOW_RUN_AS_ROOT", "1"},    {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"},
            {"TREEDUCE_TLS_CA", job_tls.ca},    {"TREEDUCE_TLS_CERT", job_tls.cert},
            {"TREEDUCE_TLS_KEY", job_tls.key},  {"TREEDUCE_TLS_SERVER_NAME", ""},
        };
        for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
        std::vector<char*> argv;
        for (const auto& x : mpi_argv) argv.push_back(const_cast<char*>(x.c_str()));
        argv.push_back(nullptr);
        execvp(argv[0], argv.data());
        std::fprintf(stderr, "cannot run mpirun: %s (Open MPI is package openmpi-bin)\n",
                     std::strerror(errno));
        _exit(127);
      }
      if (std::string e = enter_netns(h.ns); !e.empty()) {
        std::fprintf(stderr, "%s\n", e.c_str());
        _exit(126);
      }
      const std::map<std::string, std::string> env = {
          {"RANK", std::to_string(r)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "1"},
          {"MASTER_ADDR", hosts[0]->mgmt_ip},
          {"MASTER_PORT", std::to_string(a.master_port)},
          {"TREEDUCE_MANAGER", s.manager},
          {"TREEDUCE_JOB", job},
          {"TREEDUCE_RANK", std::to_string(r)},
          {"TREEDUCE_WORLD_SIZE", std::to_string(world)},
          {"TREEDUCE_HOST", h.ip},
          {"TREEDUCE_BIND", h.ip},
          {"TREEDUCE_FALLBACK_STORE", store},
          {"TREEDUCE_FALLBACK_ADDRESS", h.mgmt_ip},
          {"TREEDUCE_LAB", s.name},
          {"TREEDUCE_LAB_HOST", h.name},
          // The job identity of the lab's CA: ranks talk mutual TLS to the manager.
          {"TREEDUCE_TLS_CA", job_tls.ca},
          {"TREEDUCE_TLS_CERT", job_tls.cert},
          {"TREEDUCE_TLS_KEY", job_tls.key},
          {"TREEDUCE_TLS_SERVER_NAME", ""},  // the lab's manager certificate names its address
      };
      for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      for (const auto& x : a.cmd) argv.push_back(const_cast<char*>(x.c_str()));
      argv.push_back(nullptr);
      execvp(argv[0], argv.data());
      std::fprintf(stderr, "cannot run '%s': %s\n", argv[0], std::strerror(errno));
      _exit(errno == ENOENT ? 127 : 126);
    }
    close(out[1]);
    close(err[1]);
    setpgid(pid, pid);
    ranks[std::size_t(r)] = {pid, &h};
    const std::string label = a.mpi ? "[mpirun] " : "[" + h.name + "] ";
    streams.push_back({out[0], stdout, label, "", a.mpi ? &mpi_hosts : nullptr});
    streams.push_back({err[0], stderr, label, "", a.mpi ? &mpi_hosts : nullptr});
  }
  std::fprintf(stderr, "[lab] job %s: %d ranks%s on %s\n", job.c_str(), world,
               a.mpi ? " under mpirun" : "",
               [&] {
                 std::vector<std::string> n;
                 for (const auto* h : hosts) n.push_back(h->name);
                 return join(n, ",");
               }()
                   .c_str());

  int interrupted_by = 0;
  auto stop_all = [&](int sig) {
    for (Rank& r : ranks) {
      if (!r.done) {
        killpg(r.pid, sig);
        r.stopped = true;
      }
    }
  };
  auto reap = [&] {
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      if (r.done) continue;
      int st = 0;
      if (waitpid(r.pid, &st, WNOHANG) != r.pid) continue;
      r.done = true;
      r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      if (r.status != 0 && !r.stopped && interrupted_by == 0) {
        // As torchrun: one failed rank ends the job (the others would wait for it forever).
        if (a.mpi) continue;  // mpirun has stopped its ranks itself
        std::fprintf(stderr, "[lab] rank %zu (%s) exited with status %d; stopping the others\n", i,
                     r.host->name.c_str(), r.status);
        stop_all(SIGTERM);
      }
    }
  };
  std::size_t open_streams = streams.size();
  // SIGKILL for what SIGTERM did not stop within 10 s (max: no SIGTERM sent yet, or done).
  Clock::time_point kill_at = Clock::time_point::max();
  bool killed = false;
  enum class Leftovers { none, draining, terminated, sigkilled } leftovers = Leftovers::none;
  while (open_streams > 0 ||
         std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return !r.done; })) {
    std::vector<pollfd> pfds;
    for (const Stream& st : streams) pfds.push_back({st.fd, POLLIN, 0});
    pfds.push_back({sfd, POLLIN, 0});
    int timeout = -1;
    if (kill_at != Clock::time_point::max()) {
      timeout = int(std::max<long>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count()));
    }
    poll(pfds.data(), pfds.size(), timeout);
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (streams[i].fd < 0 || pfds[i].revents == 0) continue;
      char buf[8192];
      const ssize_t n = read(streams[i].fd, buf, sizeof buf);
      if (n > 0) {
        streams[i].emit(buf, std::size_t(n));
      } else if (n == 0 || errno != EINTR) {
        streams[i].finish();
        close(streams[i].fd);
        streams[i].fd = -1;
        --open_streams;
      }
    }
    if (pfds.back().revents != 0) {
      signalfd_siginfo si{};
      while (read(sfd, &si, sizeof si) == ssize_t(sizeof si)) {
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) {
          if (interrupted_by == 0) {
            interrupted_by = int(si.ssi_signo);
            std::fprintf(stderr, "[lab] %s: stopping every rank\n",
                         si.ssi_signo == SIGINT ? "interrupted" : "terminated");
            stop_all(SIGTERM);
          } else {
            stop_all(SIGKILL);  // a second Ctrl-C does not wait
          }
        }
      }
    }
    reap();
    const bool all_reaped =
        std::all_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.done; });
    if (all_reaped && open_streams > 0 && leftovers == Leftovers::none) {
      // Every rank exited, but its output is still open: unread (it drains at once), or held by
      // something a rank left behind (a background child), which is stopped after a drain.
      leftovers = Leftovers::draining;
      kill_at = Clock::now() + std::chrono::seconds(1);
    }
    if (!killed && kill_at == Clock::time_point::max() &&
        std::any_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.stopped; })) {
      kill_at = Clock::now() + std::chrono::seconds(10);
    }
    if (Clock::now() >= kill_at) {
      if (leftovers == Leftovers::draining) {
        // Still open: stop what is left in the ranks' process groups, so that run returns.
        if (std::any_of(ranks.begin(), ranks.end(),
                        [](const Rank& r) { return killpg(r.pid, 0) == 0; })) {
          std::fprintf(stderr,
                       "[lab] every rank exited; stopping what they left running (it holds "
                       "their output)\n");
          for (const Rank& r : ranks) killpg(r.pid, SIGTERM);
          leftovers = Leftovers::terminated;
        } else {
          leftovers = Leftovers::sigkilled;  // nothing of ours holds it: stop reading soon
        }
        kill_at = Clock::now() + std::chrono::seconds(10);
      } else if (leftovers == Leftovers::terminated) {
        for (const Rank& r : ranks) killpg(r.pid, SIGKILL);
        leftovers = Leftovers::sigkilled;
        // What left the ranks' groups (setsid) is not ours to kill: stop reading it soon.
        kill_at = Clock::now() + std::chrono::seconds(1);
      } else if (leftovers == Leftovers::sigkilled) {
        for (Stream& st : streams) {
          if (st.fd < 0) continue;
          st.finish();
          close(st.fd);
          st.fd = -1;
          --open_streams;
        }
        kill_at = Clock::time_point::max();
      } else {
        stop_all(SIGKILL);
        killed = true;
        kill_at = Clock::time_point::max();
      }
    }
  }
  close(sfd);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  std::error_code ec;
  fs::remove_all(store, ec);
  // The worst rank: the highest status of the ranks that ended by themselves; ranks we stopped
  // count only when nothing else failed (an interrupted run is 128 + the signal).
  int worst = 0;
  for (const Rank& r : ranks) {
    if (!r.stopped) worst = std::max(worst, r.status);
  }
  if (worst == 0 && interrupted_by != 0) worst = 128 + interrupted_by;
  if (worst == 0) {
    for (const Rank& r : ranks) worst = std::max(worst, r.status);
  }
  std::fprintf(
      stderr, "[lab] job %s: %s\n", job.c_str(),
      worst == 0 ? "every rank exited with 0" : ("exit status " + std::to_string(worst)).c_str());
  return worst;
}

// ---- fault and capture --------------------------------------------------------------------------

/// The switch's agent port, from its ready line ("agent port N") in its log; 0 if not there.
int agent_port(const State& s, const std::string& sw) {
  const std::string log = read_file(lab_dir(s.name) + "/" + sw + ".log");
  const std::size_t r = log.rfind(" ready: ");
  if (r == std::string::npos) return 0;
  const std::size_t a = log.find("agent port ", r);
  return a == std::string::npos ? 0 : std::atoi(log.c_str() + a + 11);
}

const ProcRec* proc_named(const State& s, const std::string& role, const std::string& name) {
  for (const ProcRec& p : s.procs) {
    if (p.role == role && p.name == name) return &p;
  }
  return nullptr;
}

std::unique_ptr<pb::SwitchAgent::Stub> agent_of(const State& s, const std::string& sw) {
  const ProcRec* p = proc_named(s, "switch", sw);
  const int port = agent_port(s, sw);
  if (p == nullptr || !ours(*p) || port == 0) {
    throw Error("switch " + sw + " of lab '" + s.name +
                "' does not run (`treeduce lab fault restart " + sw +
                (s.name == "default" ? "" : " --name " + s.name) + "` starts it again).");
  }
  return pb::SwitchAgent::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), admin_creds(lab_dir(s.name))));
}

/// Sets one port's whole fault state on its switch.
void apply_fault(const State& s, const FaultRec& f) {
  auto stub = agent_of(s, f.sw);
  pb::PortFault m;
  m.set_switch_name(f.sw);
  m.set_port(f.port);
  m.set_rx_loss(f.rx_loss);
  m.set_down(f.down);
  m.set_delay_us(f.delay_us);
  m.set_rate_mbps(f.rate_mbps);
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  pb::AgentReply rep;
  const grpc::Status st = stub->SetPortFault(&c, m, &rep);
  if (!st.ok()) {
    std::string why = st.error_message();
    if (st.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
      why +=
          " (this lab's switches run without `faults: true`: a lab brought up by an older "
          "treeduce; bring it down and up again)";
    }
    throw Error("switch " + f.sw + " refused the fault on " + f.port + ": " + why);
  }
}

/// Records `f` (or forgets it when it is the base: no fault but `lab up --loss`) in the state.
void record_fault(State& s, const FaultRec& f) {
  auto it = std::find_if(s.faults.begin(), s.faults.end(),
                         [&](const FaultRec& x) { return x.sw == f.sw && x.port == f.port; });
  const bool healthy = f.rx_loss == s.base_loss && !f.down && f.delay_us == 0 && f.rate_mbps == 0;
  if (it != s.faults.end()) s.faults.erase(it);
  if (!healthy) s.faults.push_back(f);
}

struct FaultArgs {
  std::string action;  ///< set, down, up, clear, kill, restart
  std::string target;
  std::optional<double> loss;
  std::optional<std::uint32_t> delay_us, rate_mbps;
};

/// Waits until `done` or `bound` passes; false if it passed.
bool wait_for(const std::function<bool()>& done, std::chrono::seconds bound) {
  const auto end = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

/// SIGTERM (SIGKILL when `hard`, or after 20 s), until it is gone.
void stop_proc(const ProcRec& p, bool hard) {
  if (!ours(p)) return;
  kill(p.pid, hard ? SIGKILL : SIGTERM);
  if (!hard && wait_for([&] { return !ours(p); }, std::chrono::seconds(20))) return;
  kill(p.pid, SIGKILL);
  if (!wait_for([&] { return !ours(p); }, std::chrono::seconds(20))) {
    throw Error(p.name + " (pid " + std::to_string(p.pid) + ") does not end even with SIGKILL.");
  }
}

/// The switch named `name`, or one sentence with the lab's switches.
const SwitchRec& find_switch(const State& s, const std::string& name) {
  for (const SwitchRec& sw : s.switches) {
    if (sw.name == name) return sw;
  }
  std::vector<std::string> names;
  for (const SwitchRec& sw : s.switches) names.push_back(sw.name);
  throw Error("lab '" + s.name + "' has no switch '" + name + "' (switches: " + join(names, ", ") +
                  "; or manager).",
              2);
}

/// Waits until the manager lists every switch registered and up.
void wait_switches_up(const State& s, std::chrono::seconds bound) {
  auto stub = pb::Query::NewStub(grpc::CreateChannel(s.manager, admin_creds(lab_dir(s.name))));
  std::vector<std::string> missing;
  const bool ok = wait_for(
      [&] {
        pb::SwitchList sl;
        grpc::ClientContext c;
        c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        if (!stub->ListSwitches(&c, pb::ListRequest(), &sl).ok()) {
          missing = {"(the manager does not answer)"};
          return false;
        }
        missing.clear();
        for (const auto& x : sl.switches()) {
          if (!x.registered() || !x.up()) missing.push_back(x.name());
        }
        return missing.empty() && sl.switches_size() > 0;
      },
      bound);
  if (!ok) {
    throw Error("switches " + join(missing, ", ") + " are not up at the manager within " +
                std::to_string(bound.count()) + " s; see " + lab_dir(s.name) + "/*.log.");
  }
}

/// Starts switch `name` again from its recorded command line and waits for its ready line.
void start_switch_again(State& s, const std::string& name) {
  ProcRec* p = nullptr;
  for (ProcRec& q : s.procs) {
    if (q.role == "switch" && q.name == name) p = &q;
  }
  if (p == nullptr) throw Error("internal: no process for switch " + name + ".");
  SwitchRec* rec = nullptr;
  for (SwitchRec& r : s.switches) {
    if (r.name == name) rec = &r;
  }
  // A memif server left its socket file behind when it was killed; the new one makes it again.
  std::error_code ec;
  fs::remove(lab_dir(s.name) + "/" + name + ".memif.sock", ec);
  fs::remove_all("/var/run/dpdk/tl" + std::to_string(s.slot) + "-" + name, ec);
  for (int attempt = 0;; ++attempt) {
    // The old log goes first: its ready line is not the new process's.
    fs::remove(p->log, ec);
    *p = spawn_detached("switch", name, p->argv, p->log);
    save(s);
    const bool ended = wait_for(
        [&] { return read_file(p->log).find(" ready: ") != std::string::npos || !ours(*p); },
        std::chrono::seconds(120));
    const std::string log = read_file(p->log);
    const std::size_t r = log.find(" ready: ");
    if (r != std::string::npos) {
      const std::size_t m = log.find("metrics port ", r);
      if (m != std::string::npos) rec->metrics_port = std::atoi(log.c_str() + m + 13);
      save(s);
      // The manager may still list the old process as up (its lease): the new one's own word.
      if (!wait_for(
              [&] {
                return read_file(p->log).find(": registered with the manager") !=
                           std::string::npos ||
                       !ours(*p);
              },
              std::chrono::seconds(60)) ||
          !ours(*p)) {
        throw Error("treeduce-switch " + name + " did not register with the manager:\n" +
                    tail(p->log));
      }
      return;
    }
    if (!ended) {
      throw Error("treeduce-switch " + name + " was not ready within 120 s:\n" + tail(p->log));
    }
    if (attempt == 3 || !packet_fanout_lost(log)) {
      throw Error("treeduce-switch " + name + " exited at start:\n" + tail(p->log));
    }
  }
}

/// `lab fault kill|restart manager`: the manager keeps its port and its database (--db), so the
/// switches' agents reach the new one and it restores every job and tree.
void restart_manager(State& s, bool start) {
  ProcRec* m = nullptr;
  for (ProcRec& q : s.procs) {
    if (q.role == "manager") m = &q;
  }
  if (m == nullptr) throw Error("internal: the lab records no manager.");
  if (!start) {
    if (!ours(*m)) throw Error("the manager of lab '" + s.name + "' does not run.");
    stop_proc(*m, true);
    return;
  }
  stop_proc(*m, false);
  // Listen where the switches and ranks look for it, with the same database.
  std::vector<std::string> argv = m->argv;
  for (std::size_t i = 0; i + 1 < argv.size(); ++i) {
    if (argv[i] == "-l") argv[i + 1] = s.manager;
  }
  if (std::find(argv.begin(), argv.end(), "--db") == argv.end()) {
    argv.insert(argv.end(), {"--db", lab_dir(s.name) + "/manager.db"});
  }
  const std::string port_file = lab_dir(s.name) + "/manager.port";
  std::error_code ec;
  fs::remove(port_file, ec);
  *m = spawn_detached("manager", "manager", argv, m->log);
  save(s);
  if (!wait_for([&] { return !read_file(port_file).empty() || !ours(*m); },
                std::chrono::seconds(60)) ||
      read_file(port_file).empty()) {
    throw Error("treeduce-manager did not listen again:\n" + tail(m->log));
  }
}

int fault(const std::string& name, const FaultArgs& a) {
  // One `lab fault` at a time changes a lab's state file.
  const int lock =
      open((lab_dir(name) + "/.fault.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock >= 0) flock(lock, LOCK_EX);
  struct Closer {
    int fd;
    ~Closer() {
      if (fd >= 0) close(fd);
    }
  } closer{lock};
  State s = need_lab(name);
  const std::string n = name == "default" ? "" : " --name " + name;
  if (a.action == "kill" || a.action == "restart") {
    if (a.target == "manager") {
      restart_manager(s, a.action == "restart");
      if (a.action == "restart") {
        wait_switches_up(s, std::chrono::seconds(150));
        std::printf("manager of lab '%s' restarted (pid %d) at %s, its state restored from %s.\n",
                    name.c_str(), proc_named(s, "manager", "manager")->pid, s.manager.c_str(),
                    (lab_dir(name) + "/manager.db").c_str());
      } else {
        std::printf(
            "manager of lab '%s' killed (SIGKILL); `treeduce lab fault restart manager%s` "
            "starts it again.\n",
            name.c_str(), n.c_str());
      }
      return 0;
    }
    const SwitchRec& target = find_switch(s, a.target);
    if (a.action == "kill") {
      const ProcRec* p = proc_named(s, "switch", target.name);
      if (p == nullptr || !ours(*p)) {
        throw Error("switch " + target.name + " of lab '" + name + "' does not run.");
      }
      stop_proc(*p, true);
      std::printf(
          "switch %s killed (SIGKILL); `treeduce lab fault restart %s%s` starts it "
          "again.\n",
          target.name.c_str(), target.name.c_str(), n.c_str());
      return 0;
    }
    // Restart: the switch and every switch below it through memif links, whose clients lost
    // their server and never reconnect (docs/switch.md, "Ports that work"); top down, each
    // server before its clients.
    std::set<std::string> group = {target.name};
    for (bool grew = true; grew;) {
      grew = false;
      for (const LinkRec& l : s.switch_links) {
        if (group.count(l.b) != 0 && group.insert(l.a).second) grew = true;
      }
    }
    std::vector<const SwitchRec*> order;
    for (const SwitchRec& sw : s.switches) {
      if (group.count(sw.name) != 0) order.push_back(&sw);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const SwitchRec* x, const SwitchRec* y) { return x->level > y->level; });
    std::vector<std::string> names;
    for (const SwitchRec* sw : order) names.push_back(sw->name);
    // Clients first, so that none sees its server go and come back under it.
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      if (const ProcRec* p = proc_named(s, "switch", (*it)->name)) stop_proc(*p, false);
    }
    std::size_t reapplied = 0;
    for (const std::string& sw : names) {
      start_switch_again(s, sw);
      for (const FaultRec& f : s.faults) {
        if (f.sw == sw) {
          apply_fault(s, f);
          ++reapplied;
        }
      }
    }
    wait_switches_up(s, std::chrono::seconds(60));
    std::vector<std::string> also(names.begin() + 1, names.end());
    std::printf("switch %s restarted (pid %d)%s; %zu fault%s reapplied.\n", target.name.c_str(),
                proc_named(s, "switch", target.name)->pid,
                also.empty() ? ""
                             : (", and " + join(also, ", ") +
                                " (its memif clients, which do not reconnect by themselves)")
                                   .c_str(),
                reapplied, reapplied == 1 ? "" : "s");
    return 0;
  }

  // Faults on links or ports.
  std::vector<std::pair<std::string, std::string>> ends;
  std::string what;
  if (a.action == "clear" && (a.target.empty() || a.target == "all")) {
    for (const FaultRec& f : s.faults) ends.emplace_back(f.sw, f.port);
    what = "every link";
  } else {
    const LinkName l = find_link(s, a.target);
    ends = l.ends;
    what = l.kind == "port" ? "port " + l.name : "link " + l.name;
  }
  if (a.action == "set" && !a.loss && !a.delay_us && !a.rate_mbps) {
    throw Error("give what to set: --loss F, --delay-us D and/or --rate-mbps R.", 2);
  }
  // Every end's switch must run before any is changed: a link is never left half faulted.
  for (const auto& end : ends) agent_of(s, end.first);
  for (const auto& [sw, port] : ends) {
    // A port's fault starts from `lab up --loss`, and `clear` goes back to it.
    FaultRec f = fault_or_base(s, sw, port);
    if (a.action == "set") {
      if (a.loss) f.rx_loss = *a.loss;
      if (a.delay_us) f.delay_us = *a.delay_us;
      if (a.rate_mbps) f.rate_mbps = *a.rate_mbps;
    } else if (a.action == "down") {
      f.down = true;
    } else if (a.action == "up") {
      f.down = false;
    } else {
      f = FaultRec{sw, port};
      f.rx_loss = s.base_loss;
    }
    apply_fault(s, f);
    record_fault(s, f);
    save(s);
  }
  std::vector<std::string> now;
  for (const auto& [sw, port] : ends) {
    const FaultRec* f = fault_of(s, sw, port);
    now.push_back(sw + ":" + port + " " +
                  (f                 ? describe(*f)
                   : s.base_loss > 0 ? describe(fault_or_base(s, sw, port)) + " (lab up --loss)"
                                     : std::string("healthy")));
  }
  std::printf("%s: %s.\n", what.c_str(),
              now.empty() ? "no faults were set" : join(now, "; ").c_str());
  return 0;
}

struct CaptureArgs {
  std::string link;
  std::string output;
  std::uint64_t count = 0;
  double seconds = 0;
  bool stop = false;  ///< only stop a capture left running (its `lab capture` was killed)
};

int capture(const std::string& name, const CaptureArgs& a) {
  const State s = need_lab(name);
  const LinkName l = find_link(s, a.link);
  const std::string sw = l.ends.front().first, port = l.ends.front().second;
  if (a.stop) {
    auto stub = agent_of(s, sw);
    pb::PortCapture m;
    m.set_switch_name(sw);
    m.set_port(port);
    pb::PortCaptureReply rep;
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status st = stub->SetPortCapture(&c, m, &rep);
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      throw Error("no capture runs on " + sw + ":" + port + " (link " + l.name + ").");
    }
    if (!st.ok()) throw Error("switch " + sw + " cannot stop the capture: " + st.error_message());
    std::printf("%llu frames captured on %s:%s (link %s); the capture is stopped\n",
                static_cast<unsigned long long>(rep.frames()), sw.c_str(), port.c_str(),
                l.name.c_str());
    return 0;
  }
  std::string path = a.output;
  if (path.empty()) throw Error("give the file to write with -o FILE.pcap (or --stop).", 2);
  path = fs::absolute(path).lexically_normal().string();
  if (fs::is_directory(path)) throw Error(path + " is a directory; give a file name.", 2);
  const SwitchRec& rec = find_switch(s, sw);
  auto stub = agent_of(s, sw);
  auto frames_now = [&] {
    auto ports = port_samples(parse_prometheus(get_metrics(rec.metrics_port)));
    return ports[port]["rx_packets"] + ports[port]["tx_packets"];
  };
  pb::PortCapture m;
  m.set_switch_name(sw);
  m.set_port(port);
  m.set_path(path);
  pb::PortCaptureReply rep;
  {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = stub->SetPortCapture(&c, m, &rep);
    if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      throw Error(sw + ":" + port + " (link " + l.name +
                  ") is being captured already; stop that capture with Ctrl-C, or with `treeduce "
                  "lab capture " +
                  a.link + " --stop" + (name == "default" ? "" : " --name " + name) +
                  "` if its `lab capture` is gone.");
    }
    if (!st.ok()) {
      throw Error("switch " + sw + " cannot capture " + port + ": " + st.error_message());
    }
  }
  // Counted from once the capture runs; polled, so the file may hold a few frames more.
  const double base = a.count != 0 ? frames_now() : 0;
  char secs[32];
  std::snprintf(secs, sizeof secs, "%g", a.seconds);
  std::fprintf(stderr, "treeduce lab: capturing %s:%s (link %s) into %s; %s\n", sw.c_str(),
               port.c_str(), l.name.c_str(), path.c_str(),
               a.count != 0    ? ("until " + std::to_string(a.count) + " frames, or Ctrl-C").c_str()
               : a.seconds > 0 ? ("for " + std::string(secs) + " s, or Ctrl-C").c_str()
                               : "Ctrl-C stops it");
  const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                      std::chrono::duration<double>(a.seconds));
  while (!g_interrupted) {
    if (a.seconds > 0 && Clock::now() >= end) break;
    if (a.count != 0 && frames_now() - base >= double(a.count)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  m.set_path("");
  grpc::ClientContext c;
  c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status st = stub->SetPortCapture(&c, m, &rep);
  if (!st.ok()) {
    throw Error("switch " + sw + " did not stop the capture of " + port + ": " +
                st.error_message());
  }
  // The switch wrote it as root: hand it to the user who ran sudo.
  chmod(path.c_str(), 0644);
  if (const char* uid = std::getenv("SUDO_UID"), *gid = std::getenv("SUDO_GID"); uid && gid) {
    if (chown(path.c_str(), uid_t(std::atol(uid)), gid_t(std::atol(gid))) != 0) {
      std::fprintf(stderr, "treeduce lab: cannot give %s to uid %s: %s.\n", path.c_str(), uid,
                   std::strerror(errno));
    }
  }
  std::printf("%llu frames captured on %s:%s (link %s) into %s\n",
              static_cast<unsigned long long>(rep.frames()), sw.c_str(), port.c_str(),
              l.name.c_str(), path.c_str());
  // The dissector knows the treeduce port by a preference (docs/wireshark.md); a topology's other
  // port (the fat-tree's 4791, RoCEv2's, which Wireshark would otherwise decode as RoCE) needs it.
  const std::string udp = rec.data.substr(rec.data.rfind(':') + 1);
  std::printf("read it with: tshark -r %s -X lua_script:treeduce.lua%s\n", path.c_str(),
              udp == "47110" ? "" : (" -o treeduce.port:" + udp).c_str());
  return 0;
}

// ---- the command line ---------------------------------------------------------------------------

class Commands final : public LabCommands {
 public:
  explicit Commands(CLI::App& app) {
    lab_ = app.add_subcommand(
        "lab",
        "the emulated fabric as a testbed: switches, hosts and a manager on this machine "
        "(docs/lab.md)");
    lab_->require_subcommand(1);
    up_ = lab_->add_subcommand("up",
                               "brings a lab up: a topology file, --fat-tree K, --rail G,S,R,P or "
                               "--leaf N "
                               "(default: --leaf 4)");
    up_->add_option("topology", ua_.topology_file,
                    "topology YAML file (the manager's format, docs/manager.md)");
    up_->add_option("--fat-tree", ua_.fat_tree,
                    "two-level k-ary fat-tree: k leaves of k/2 hosts, "
                    "k/2 spines")
        ->check(CLI::Range(2, 128));
    up_->add_option("--rail", ua_.rail,
                    "rail-optimised: GROUPS,SERVERS,RAILS,SPINES (rail r of every server of a "
                    "group on that group's rail-r leaf; each server's rail a host of its own)");
    up_->add_option("--leaf", ua_.leaf, "one switch with N hosts")->check(CLI::Range(1, 32));
    up_->add_option("--mtu", ua_.mtu, "MTU of every data link (above 1500: jumbo frames)")
        ->check(CLI::Range(1280, 8400))
        ->capture_default_str();
    up_->add_option(
           "--dpdk-mem", ua_.dpdk_mem_mb,
           "DPDK memory of each switch in MiB (EAL -m; default 40 + 6 per port, + 17 per af_xdp "
           "port)")
        ->check(CLI::Range(16, 4096));
    up_->add_option("--idle-sleep-us", ua_.idle_sleep_us,
                    "longest sleep of an idle switch lcore (0: busy polling)")
        ->check(CLI::Range(0, 1000000))
        ->capture_default_str();
    up_->add_option("--switch-ports", ua_.switch_ports,
                    "the switches' ports to the hosts' veths: af_packet (net_af_packet) or af_xdp "
                    "(net_af_xdp, an AF_XDP socket: MTU at most 3442 with 4 KiB pages)")
        ->check(CLI::IsMember({"af_packet", "af_xdp"}))
        ->capture_default_str();
    up_->add_option("--loss", ua_.loss,
                    "drop this fraction of the frames every switch port receives (rx_loss; the "
                    "hosts and switches retransmit)")
        ->check(CLI::Range(0.0, 0.99));
    status_ = lab_->add_subcommand("status", "processes, hosts, links, trees, jobs, counters");
    exec_ = lab_->add_subcommand("exec", "runs a command in one host's network namespace");
    exec_->add_option("host", host_, "host name (the topology's)")->required();
    exec_->add_option("command", cmd_, "the command, after --")->required();
    run_ = lab_->add_subcommand(
        "run",
        "runs a command on the hosts as the ranks of one job (RANK, WORLD_SIZE, "
        "MASTER_ADDR, TREEDUCE_*), output prefixed by host; exit status of the worst rank");
    run_->add_option("-n", ra_.n, "ranks: the first N hosts in topology order (default: all)")
        ->check(CLI::Range(1, 100000));
    run_->add_option("--hosts", hosts_csv_, "ranks on these hosts, in this order: h1,h2,...");
    run_->add_option("--master-port", ra_.master_port, "MASTER_PORT (1 to 65535)")
        ->check(CLI::Range(1, 65535))
        ->capture_default_str();
    run_->add_flag("--mpi", ra_.mpi,
                   "start the ranks with Open MPI's mpirun (one orted per host namespace, TCP on "
                   "the management network)");
    run_->add_option("command", ra_.cmd, "the command, after --")->required();
    down_ =
        lab_->add_subcommand("down", "removes every process, namespace, link and file of a lab");
    fault_ = lab_->add_subcommand(
        "fault",
        "injects a fault, reversibly: loss, delay, rate on a link or port, a link down, a "
        "switch or the manager killed and restarted (shown in `lab status`)");
    fault_->require_subcommand(1);
    const std::string link_help =
        "a link as `lab status` names it (h0, leaf0-spine0) or one switch end, SWITCH:PORT";
    auto* set = fault_->add_subcommand(
        "set",
        "sets loss, delay and/or rate on a link's switch ends (a host's link: its switch "
        "port); what is not given stays as it was");
    set->add_option("link", fa_.target, link_help)->required();
    set->add_option("--loss", loss_, "drop this fraction of the frames each end receives (0 to 1)")
        ->check(CLI::Range(0.0, 1.0));
    set->add_option("--delay-us", delay_,
                    "hold each frame an end receives this long, in microseconds (0 to 1000000)")
        ->check(CLI::Range(0, 1000000));
    set->add_option("--rate-mbps", rate_,
                    "release the frames an end receives at most this fast, in Mb/s (1 to 1000000; "
                    "0: line rate)")
        ->check(CLI::Range(0, 1000000));
    auto* down = fault_->add_subcommand("down", "cuts a link (both directions) until `up`");
    down->add_option("link", fa_.target, link_help)->required();
    auto* up =
        fault_->add_subcommand("up", "brings a link set down back up (its other faults stay)");
    up->add_option("link", fa_.target, link_help)->required();
    auto* clear =
        fault_->add_subcommand("clear", "heals a link, or every link (`all`, the default)");
    clear->add_option("link", fa_.target, link_help + ", or all");
    auto* kill = fault_->add_subcommand("kill", "kills a switch or the manager with SIGKILL");
    kill->add_option("switch", fa_.target, "a switch's name, or manager")->required();
    auto* restart = fault_->add_subcommand(
        "restart",
        "restarts a switch (and the switches below it on memif links) or the manager (same port "
        "and database); a restarted switch gets its faults back");
    restart->add_option("switch", fa_.target, "a switch's name, or manager")->required();
    fault_actions_ = {set, down, up, clear, kill, restart};
    capture_ = lab_->add_subcommand(
        "capture",
        "captures every frame of a link (at one switch end) into a pcap file until Ctrl-C, "
        "--count or --seconds");
    capture_->add_option("link", ca_.link, link_help)->required();
    auto* output = capture_->add_option("-o,--output", ca_.output, "the pcap file to write");
    capture_
        ->add_flag("--stop", ca_.stop,
                   "only stop a capture of LINK left running (its `lab capture` was killed)")
        ->excludes(output);
    auto* count = capture_
                      ->add_option("--count", ca_.count,
                                   "stop once the port has received and sent this many frames")
                      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 40));
    capture_->add_option("--seconds", ca_.seconds, "stop after this many seconds")
        ->check(CLI::Range(0.001, 31536000.0))
        ->excludes(count);
    for (CLI::App* c : {up_, status_, exec_, run_, down_, capture_, fault_}) {
      c->add_option("--name", name_, "the lab's name")->capture_default_str();
    }
    for (CLI::App* c : fault_actions_) {
      c->add_option("--name", name_, "the lab's name")->capture_default_str();
    }
  }

  bool parsed() const override { return lab_->parsed(); }

  int run() override {
    try {
      if (!good_lab_name(name_)) {
        throw Error("'" + name_ + "' is not a lab name (1 to 32 letters, digits, '-' or '_').", 2);
      }
      if (geteuid() != 0) {
        throw Error("treeduce lab needs root for network namespaces; run it as root or with sudo");
      }
      if (up_->parsed()) {
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, nullptr);
        sigaction(SIGTERM, &sa, nullptr);
        ua_.name = name_;
        return Up(ua_).run();
      }
      if (down_->parsed()) return down(name_);
      if (status_->parsed()) return status(name_);
      if (fault_->parsed()) {
        for (CLI::App* c : fault_actions_) {
          if (c->parsed()) fa_.action = c->get_name();
        }
        if (loss_ >= 0) fa_.loss = loss_;
        if (delay_ >= 0) fa_.delay_us = std::uint32_t(delay_);
        if (rate_ >= 0) fa_.rate_mbps = std::uint32_t(rate_);
        return fault(name_, fa_);
      }
      if (capture_->parsed()) {
        struct sigaction sa {};
        sa.sa_handler = on_signal;
        sigaction(SIGINT, &sa, nullptr);
        sigaction(SIGTERM, &sa, nullptr);
        return capture(name_, ca_);
      }
      if (exec_->parsed()) return exec_in(name_, host_, cmd_);
      if (run_->parsed()) {
        std::istringstream in(hosts_csv_);
        for (std::string h; std::getline(in, h, ',');) {
          if (h.empty()) throw Error("--hosts '" + hosts_csv_ + "' has an empty host name.", 2);
          ra_.hosts.push_back(h);
        }
        if (ra_.n != 0 && !ra_.hosts.empty()) throw Error("give -n or --hosts, not both.", 2);
        return run_ranks(name_, ra_);
      }
      return 2;
    } catch (const Error& e) {
      std::string m = e.what();
      if (!m.empty() && m.back() != '.' && m.back() != '\n' && m.back() != ')') m += '.';
      // A sentence that names the command already (not root) stands alone.
      std::fprintf(stderr, "%s%s\n",
                   m.rfind("treeduce lab", 0) == 0 ? "" : "treeduce lab: ", m.c_str());
      return e.code;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "treeduce lab: %s\n", e.what());
      return 1;
    }
  }

 private:
  CLI::App* lab_ = nullptr;
  CLI::App *up_ = nullptr, *status_ = nullptr, *exec_ = nullptr, *run_ = nullptr, *down_ = nullptr;
  std::string name_ = "default";
  UpArgs ua_;
  RunArgs ra_;
  std::string host_;
  std::string hosts_csv_;
  std::vector<std::string> cmd_;
  CLI::App *fault_ = nullptr, *capture_ = nullptr;
  std::vector<CLI::App*> fault_actions_;
  FaultArgs fa_;
  double loss_ = -1;
  long delay_ = -1, rate_ = -1;
  CaptureArgs ca_;
};

}  // namespace

std::unique_ptr<LabCommands> add_lab_commands(CLI::App& app) {
  return std::make_unique<Commands>(app);
}

}  // namespace treeduce::lab
