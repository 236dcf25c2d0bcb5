#include "treeduce/host/rto_estimator.h"

#include <algorithm>

namespace treeduce::host {

void RtoEstimator::sample(std::uint64_t latency_ns, std::uint64_t now_ns) noexcept {
  const std::uint64_t r = latency_ns;
  if (samples_ == 0) {
    // RFC 6298, 2.2.
    srtt_ = r;
    rttvar_ = r / 2;
    min_ = r;
    window_start_ = now_ns;
    peak_cur_ = r;
    peak_prev_ = 0;
  } else {
    // RFC 6298, 2.3: RTTVAR <- 3/4 RTTVAR + 1/4 |SRTT - R|; SRTT <- 7/8 SRTT + 1/8 R.
    const std::uint64_t dev = srtt_ > r ? srtt_ - r : r - srtt_;
    rttvar_ = rttvar_ - rttvar_ / 4 + dev / 4;
    srtt_ = srtt_ - srtt_ / 8 + r / 8;
    min_ = std::min(min_, r);
    if (now_ns - window_start_ >= cfg_.peak_window_ns) {
      peak_prev_ = now_ns - window_start_ >= 2 * cfg_.peak_window_ns ? 0 : peak_cur_;
      peak_cur_ = 0;
      window_start_ = now_ns;
    }
    peak_cur_ = std::max(peak_cur_, r);
  }
  ++samples_;
}

std::uint64_t RtoEstimator::peak(std::uint64_t now_ns) const noexcept {
  const std::uint64_t age = now_ns >= window_start_ ? now_ns - window_start_ : 0;
  if (age < cfg_.peak_window_ns) return std::max(peak_cur_, peak_prev_);
  if (age < 2 * cfg_.peak_window_ns) return peak_cur_;
  return 0;
}

std::uint64_t RtoEstimator::rto(std::uint64_t now_ns) const noexcept {
  std::uint64_t t = cfg_.initial_ns;
  // No margin above the largest sample: a sample can hold another rank's timeout (a RESULT waits
  // for the rank that recovers a loss), so any margin would let the ranks' timeouts raise each
  // other towards the ceiling (the simulated fabric showed it for 5/4 x the peak and for
  // SRTT + 4 RTTVAR); the floor is the margin.
  if (samples_ != 0) t = peak(now_ns);
  return std::max(cfg_.floor_ns, std::min(t, cfg_.ceiling_ns));  // the floor wins a conflict
}

}  // namespace treeduce::host
