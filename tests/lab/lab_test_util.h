// The small helpers every test that drives real processes shares: reading files, quoting for sh,
// searching output, waiting for events without clocks, reaping children. Header-only, no
// assumptions about the test (lab_test_support.h adds the `treeduce lab` fixture on top).
#pragma once

#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace treeduce::labtest {

namespace fs = std::filesystem;

inline std::string read_file(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// `w` quoted for sh.
inline std::string shq(const std::string& w) {
  std::string q = "'";
  for (char c : w) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

inline bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

/// The line of `text` that starts with `head`, "" if none.
inline std::string line_of(const std::string& text, const std::string& head) {
  for (const std::string& l : lines(text)) {
    if (l.rfind(head, 0) == 0) return l;
  }
  return "";
}

/// Polls `pred` every 10 ms until it holds; false after `bound`. The bound only turns a hang into
/// a failure: it is never what a test waits for.
template <typename F>
bool eventually(F pred, std::chrono::seconds bound = std::chrono::seconds(120)) {
  const auto end = std::chrono::steady_clock::now() + bound;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

/// Reaps child `pid`: its exit status, or 128 + the signal that ended it.
inline int wait_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// Reaps child `pid` into `st`. Should it still run after 120 s (a hang), it is sent SIGTERM,
/// then SIGKILL, reaped, and false is returned.
inline bool reap_child(pid_t pid, int& st) {
  if (eventually([&] { return waitpid(pid, &st, WNOHANG) == pid; })) return true;
  kill(pid, SIGTERM);
  if (!eventually([&] { return waitpid(pid, &st, WNOHANG) == pid; })) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
  }
  return false;
}

struct Result {
  int status = -1;
  std::string out, err;
};

}  // namespace treeduce::labtest
