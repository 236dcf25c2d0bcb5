#include "treeduce/lab/netns.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace treeduce::lab {

int sh(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

namespace {

/// True for "td<pid>..." when that process is gone: a lab of a run that was killed (a test killed
/// by its timeout, a SIGKILLed main job) never cleaned up.
bool stale(const std::string& name) {
  if (name.rfind("td", 0) != 0) return false;
  const pid_t pid = static_cast<pid_t>(std::atol(name.c_str() + 2));
  return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH;
}

/// The first word of each line `cmd` prints, cut at '@' ("veth0@if12" is veth0).
std::vector<std::string> first_words(const std::string& cmd) {
  std::vector<std::string> out;
  FILE* f = popen(cmd.c_str(), "r");
  if (f == nullptr) return out;
  char line[512];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    const std::string l(line);
    out.push_back(l.substr(0, l.find_first_of(" @\n")));
  }
  pclose(f);
  return out;
}

/// What such a lab left: its namespaces, with what still runs in them, and the interfaces of
/// this namespace, its bridges (its veth ends went with their namespaces). A stale management
/// bridge would hold the address the next lab's bridge needs.
void reap_stale_labs() {
  for (const std::string& ns : first_words("ip netns list 2>/dev/null")) {
    if (!stale(ns)) continue;
    sh("ip netns pids " + ns + " 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del " + ns +
       " 2>/dev/null");
  }
  for (const std::string& link : first_words("ip -br link show 2>/dev/null")) {
    if (stale(link)) sh("ip link del " + link + " 2>/dev/null");
  }
}

}  // namespace

Lab::Lab(const std::string& tag) {
  reap_stale_labs();
  // A counter too: a namespace's deletion frees its veth peers asynchronously, so the next lab of
  // the same process must not reuse the names of this one's interfaces.
  static int labs = 0;
  prefix_ = "td" + std::to_string(getpid()) + tag + std::to_string(labs++ % 100);
  char tmpl[] = "/tmp/treeduce-lab-XXXXXX";
  const char* d = mkdtemp(tmpl);
  dir_ = d != nullptr ? d : "/tmp";
}

Lab::~Lab() {
  for (Proc* p : procs_) {
    if (!p->done) stop(*p, std::chrono::milliseconds(2000));
  }
  for (auto it = namespaces_.rbegin(); it != namespaces_.rend(); ++it) {
    sh("ip netns pids " + *it + " 2>/dev/null | xargs -r kill -9 2>/dev/null; ip netns del " + *it +
       " 2>/dev/null");
  }
  for (const std::string& b : bridges_) sh("ip link del " + b + " 2>/dev/null");
  for (Proc* p : procs_) delete p;
  // Logs stay when the test asks for it (debugging a failure); the namespaces never do.
  if (std::getenv("TREEDUCE_KEEP_LAB") == nullptr && dir_ != "/tmp") {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string Lab::netns(const std::string& name) {
  const std::string full = prefix_ + "-" + name;
  if (sh("ip netns add " + full) == 0) {
    namespaces_.push_back(full);
    sh("ip -n " + full + " link set lo up");
  }
  return full;
}

bool Lab::veth(const std::string& ns_a, const std::string& a, const std::string& ns_b,
               const std::string& b) {
  // Created in the root namespace under temporary names, then moved: names only need to be
  // unique inside their namespace afterwards.
  static int n = 0;
  const std::string ta = "tdv" + std::to_string(getpid() % 100000) + "a" + std::to_string(n);
  const std::string tb = "tdv" + std::to_string(getpid() % 100000) + "b" + std::to_string(n);
  ++n;
  // An empty namespace name is this process's own.
  const auto move = [](const std::string& t, const std::string& ns, const std::string& name) {
    return ns.empty() ? "ip link set " + t + " name " + name
                      : "ip link set " + t + " netns " + ns + " name " + name;
  };
  const auto up = [](const std::string& ns, const std::string& name) {
    return (ns.empty() ? "ip" : "ip -n " + ns) + " link set " + name + " up";
  };
  const std::string cmds[] = {
      "ip link add " + ta + " type veth peer name " + tb,
      move(ta, ns_a, a),
      move(tb, ns_b, b),
      up(ns_a, a),
      up(ns_b, b),
  };
  for (const std::string& c : cmds) {
    if (sh(c) != 0) {
      std::fprintf(stderr, "lab: failed: %s\n", c.c_str());
      return false;
    }
  }
  return true;
}

bool Lab::bridge(const std::string& name, const std::string& cidr) {
  if (sh("ip link add name " + name + " type bridge") != 0) {
    std::fprintf(stderr, "lab: cannot create bridge %s\n", name.c_str());
    return false;
  }
  bridges_.push_back(name);
  return sh("ip addr add " + cidr + " dev " + name) == 0 && sh("ip link set " + name + " up") == 0;
}

bool Lab::attach(const std::string& dev, const std::string& br) {
  return sh("ip link set " + dev + " master " + br) == 0;
}

int Lab::in(const std::string& ns, const std::string& cmd) {
  return sh(ns.empty() ? cmd : "ip netns exec " + ns + " " + cmd);
}

Proc& Lab::spawn(const std::string& name, const std::string& ns,
                 const std::vector<std::string>& argv) {
  auto* p = new Proc;
  procs_.push_back(p);
  p->name = name;
  p->log = dir_ + "/" + name + ".log";
  std::vector<std::string> full;
  if (!ns.empty()) full = {"ip", "netns", "exec", ns};
  full.insert(full.end(), argv.begin(), argv.end());
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(p->log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (auto& s : full) args.push_back(s.data());
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  p->pid = pid;
  return *p;
}

bool Lab::reap(Proc& p, bool block) {
  if (p.done) return true;
  int st = 0;
  const pid_t r = waitpid(p.pid, &st, block ? 0 : WNOHANG);
  if (r != p.pid) return false;
  p.done = true;
  p.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return true;
}

bool Lab::wait(Proc& p, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!reap(p, false)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

int Lab::stop(Proc& p, std::chrono::milliseconds grace) {
  if (p.done) return p.status;
  kill(p.pid, SIGTERM);
  if (!wait(p, grace)) {
    kill(p.pid, SIGKILL);
    reap(p, true);
  }
  return p.status;
}

std::string Lab::read_log(const Proc& p) {
  std::ifstream f(p.log);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool Lab::wait_log(Proc& p, const std::string& text, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (read_log(p).find(text) != std::string::npos) return true;
    if (reap(p, false)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

std::string Lab::write(const std::string& name, const std::string& text) {
  const std::string path = dir_ + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace treeduce::lab
