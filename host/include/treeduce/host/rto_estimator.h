/// @file
/// The adaptive retransmission timeout of the host protocol engine (docs/protocol.md, "Host
/// behaviour", timers): per-chunk latency samples (first send to RESULT); the timeout is the
/// largest sample of the last one to two windows, clamped to a floor and a ceiling. It keeps an
/// RFC 6298 SRTT/RTTVAR too, for reports. Free of clocks: the caller passes the time, so tests
/// drive it with a fake one.
#pragma once

#include <cstdint>

namespace treeduce::host {

struct RtoConfig {
  std::uint64_t initial_ns = 10'000'000;  ///< before the first sample
  std::uint64_t floor_ns = 2'000'000;     ///< the timeout never goes below this
  std::uint64_t ceiling_ns = 32'000'000;  ///< nor above this (backoff may, up to rto_max_ns)
  /// The peak sample is remembered for one to two of these windows (a windowed maximum).
  std::uint64_t peak_window_ns = 1'000'000'000;
};

/// Samples -> timeout. A sample is the time from a chunk's first transmission to its RESULT; the
/// engine feeds only samples that are unambiguous (Karn's rule) and that no later chunk's RESULT
/// overtook (see ProtocolEngine). A sample includes the other ranks' skew: a chunk's RESULT waits
/// for the slowest rank's contribution, which is what a timeout must wait for too.
class RtoEstimator {
 public:
  explicit RtoEstimator(const RtoConfig& cfg = {}) : cfg_(cfg) {}

  /// One latency sample `latency_ns`, taken at time `now_ns` (monotonic, any epoch).
  void sample(std::uint64_t latency_ns, std::uint64_t now_ns) noexcept;

  /// The timeout for a chunk first sent at `now_ns`: initial_ns before any sample; then the
  /// largest sample of the current and the previous window (none after two idle windows: the
  /// floor), within [floor_ns, ceiling_ns]. No margin above it: see rto_estimator.cpp.
  std::uint64_t rto(std::uint64_t now_ns) const noexcept;

  std::uint64_t samples() const noexcept { return samples_; }
  /// RFC 6298's smoothed latency and its mean deviation (gains 1/8, 1/4): for reports only.
  std::uint64_t srtt_ns() const noexcept { return srtt_; }
  std::uint64_t rttvar_ns() const noexcept { return rttvar_; }
  /// The smallest sample seen (0 before any): a lower bound on a round trip through the switch.
  std::uint64_t min_ns() const noexcept { return min_; }
  const RtoConfig& config() const noexcept { return cfg_; }

 private:
  std::uint64_t peak(std::uint64_t now_ns) const noexcept;

  RtoConfig cfg_;
  std::uint64_t samples_ = 0;
  std::uint64_t srtt_ = 0;
  std::uint64_t rttvar_ = 0;
  std::uint64_t min_ = 0;
  std::uint64_t window_start_ = 0;  // of the current peak window
  std::uint64_t peak_cur_ = 0;      // largest sample of the current window
  std::uint64_t peak_prev_ = 0;     // of the window before
};

}  // namespace treeduce::host
