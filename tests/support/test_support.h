// Small helpers shared by test files of several components.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

namespace treeduce::test_support {

/// The first ```yaml block of docs/<page>: the documented example is the tested one. Empty when
/// the page has none. Needs TREEDUCE_SOURCE_ROOT (meson passes it).
inline std::string doc_yaml(const std::string& page) {
  std::ifstream in(std::string(TREEDUCE_SOURCE_ROOT) + "/docs/" + page);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  const auto start = doc.find("```yaml\n");
  const auto end = doc.find("```\n", start + 8);
  if (start == std::string::npos || end == std::string::npos) return {};
  return doc.substr(start + 8, end - start - 8);
}

/// Polls `p` every 10 ms for up to `ms` milliseconds; its last answer.
template <typename Pred>
bool eventually(Pred p, int ms = 5000) {
  for (int i = 0; i < ms / 10; ++i) {
    if (p()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return p();
}

/// A monotonic clock in milliseconds that moves only when the test advances it. A lease or
/// heartbeat deadline measured on it cannot expire because a loaded machine ran a thread late:
/// tests that want an expiry make it happen with advance().
class ManualClock {
 public:
  explicit ManualClock(std::int64_t start_ms = 1000) : ms_(start_ms) {}
  std::int64_t now() const { return ms_.load(); }
  void advance(std::int64_t ms) { ms_ += ms; }
  /// For RegistryOptions::clock.
  std::function<std::int64_t()> fn() {
    return [this] { return now(); };
  }

 private:
  std::atomic<std::int64_t> ms_;
};

}  // namespace treeduce::test_support
