/// @file
/// The rate-limited log of refusals that may be someone probing a switch: CONTRIBs and RESULTs
/// refused as bad_key (a guessed job key) or bad_source (a frame claiming a member's place from
/// another address). The core counts every one (counters.h); this decides which log lines to
/// write: at most one per source address every `interval_ns`, saying how many were held back,
/// and at most `max_lines` lines per interval in all, so that a stranger cycling through made-up
/// source addresses cannot flood the log either. No clock and no I/O here: the caller passes the
/// time and writes the lines (treeduce-switch: its control thread, never a datapath lcore).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "treeduce/protocol/reasons.h"

namespace treeduce::dp {

/// One refusal worth a log line: where the frame claimed to come from, the tree it named.
struct Probe {
  std::uint32_t src_ip = 0;  ///< host order
  std::uint16_t tree_id = 0;
  proto::Reason reason = proto::Reason::none;  ///< bad_key or bad_source
};

class ProbeLog {
 public:
  struct Config {
    std::uint64_t interval_ns = 10'000'000'000;  ///< per source: one line per this much time
    std::size_t max_lines = 20;                  ///< lines per interval, all sources together
    std::size_t max_sources = 4096;  ///< addresses remembered; probes from more are summed
  };
  explicit ProbeLog(const Config& cfg) : cfg_(cfg) {}

  /// A probe seen. Counted only: lines come from flush().
  void note(const Probe& p);
  /// The lines due at `now_ns`: one for every source with probes not yet logged whose last line
  /// is `interval_ns` old (or that never had one), up to the interval's budget; then, once per
  /// interval, one line summing what the budget or the table's size held back. Sources quiet
  /// for an interval are forgotten. `last` (at shutdown): every source with probes not logged
  /// is due, whenever its last line was.
  std::vector<std::string> flush(std::uint64_t now_ns, bool last = false);

  /// Sources remembered now (for tests).
  std::size_t sources() const noexcept { return src_.size(); }

 private:
  struct Source {
    std::uint64_t last_line_ns = 0;
    bool logged = false;                        ///< a line was written for it
    std::uint64_t bad_key = 0, bad_source = 0;  ///< since its last line
    std::uint16_t last_tree = 0;
  };
  Config cfg_;
  std::unordered_map<std::uint32_t, Source> src_;
  std::uint64_t window_start_ns_ = 0;
  std::size_t lines_in_window_ = 0;
  bool window_started_ = false;
  std::uint64_t unlisted_ = 0;  ///< probes from sources beyond max_sources
};

}  // namespace treeduce::dp
