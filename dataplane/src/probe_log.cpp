// The rate-limited log of probes (probe_log.h).
#include "treeduce/dataplane/probe_log.h"

#include <arpa/inet.h>

#include <iterator>

namespace treeduce::dp {

namespace {

std::string dotted(std::uint32_t ip) {
  const std::uint32_t be = htonl(ip);
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &be, buf, sizeof buf);
  return buf;
}

std::string seconds(std::uint64_t ns) {
  return std::to_string(ns / 1'000'000'000) + (ns % 1'000'000'000 == 0 ? "" : "+") + " s";
}

}  // namespace

void ProbeLog::note(const Probe& p) {
  auto it = src_.find(p.src_ip);
  if (it == src_.end()) {
    if (src_.size() >= cfg_.max_sources) {
      ++unlisted_;
      return;
    }
    it = src_.emplace(p.src_ip, Source{}).first;
  }
  Source& s = it->second;
  (p.reason == proto::Reason::bad_key ? s.bad_key : s.bad_source) += 1;
  s.last_tree = p.tree_id;
}

std::vector<std::string> ProbeLog::flush(std::uint64_t now_ns, bool last) {
  std::vector<std::string> lines;
  if (!window_started_ || now_ns - window_start_ns_ >= cfg_.interval_ns) {
    window_started_ = true;
    window_start_ns_ = now_ns;
    lines_in_window_ = 0;
  }
  std::uint64_t held_sources = 0, held_probes = 0;
  for (auto it = src_.begin(); it != src_.end();) {
    Source& s = it->second;
    const std::uint64_t n = s.bad_key + s.bad_source;
    const bool due = !s.logged || now_ns - s.last_line_ns >= cfg_.interval_ns;
    if (n == 0) {
      // Quiet for a whole interval since its last line: forget it (its next probe is news).
      if (due) {
        it = src_.erase(it);
      } else {
        ++it;
      }
      continue;
    }
    if (!due && !last) {
      ++it;
      continue;
    }
    if (lines_in_window_ >= cfg_.max_lines) {
      ++held_sources;
      held_probes += n;
      ++it;
      continue;
    }
    std::string l = "probe from " + dotted(it->first) + ": ";
    if (s.bad_key != 0) l += std::to_string(s.bad_key) + " refused as bad_key (wrong job key)";
    if (s.bad_key != 0 && s.bad_source != 0) l += ", ";
    if (s.bad_source != 0) {
      l += std::to_string(s.bad_source) + " refused as bad_source (not the member's address)";
    }
    l += ", last for tree " + std::to_string(s.last_tree);
    l += s.logged ? " (in the last " + seconds(now_ns - s.last_line_ns) + ")"
                  : " (at most one line per address every " + seconds(cfg_.interval_ns) + ")";
    lines.push_back(std::move(l));
    ++lines_in_window_;
    s.logged = true;
    s.last_line_ns = now_ns;
    s.bad_key = s.bad_source = 0;
    ++it;
  }
  // The summary takes the interval's last line; it is written once the budget is spent, and
  // whenever probes could not be remembered or queued.
  const bool budget_spent = lines_in_window_ >= cfg_.max_lines && held_sources != 0;
  if ((budget_spent || unlisted_ != 0) && lines_in_window_ <= cfg_.max_lines) {
    std::string l = "probes held back: ";
    if (held_sources != 0) {
      l += std::to_string(held_probes) + " from " + std::to_string(held_sources) +
           " more addresses (at most " + std::to_string(cfg_.max_lines) + " lines every " +
           seconds(cfg_.interval_ns) + ")";
    }
    if (unlisted_ != 0) {
      if (held_sources != 0) l += ", ";
      l += std::to_string(unlisted_) + " from addresses beyond the " +
           std::to_string(cfg_.max_sources) + " remembered";
    }
    l += "; the counters have them all";
    lines.push_back(std::move(l));
    lines_in_window_ = cfg_.max_lines + 1;  // nothing more until the next interval
    unlisted_ = 0;
  }
  return lines;
}

}  // namespace treeduce::dp
