/// @file
/// What DPDK 22.11 says and what it does, where the two differ. Used by port.cpp when it brings
/// up ports and pools for the switch daemon and for libtreeduce's DPDK transport.
#pragma once

#include <rte_mempool.h>

#include <cstdint>
#include <cstring>

namespace treeduce::dpdk {

/// net_af_packet and net_memif advertise 1518-byte frames (max_rx_pktlen), so ethdev refuses a
/// larger MTU, yet carry longer ones: af_packet up to its ring frame (framesz=), memif in
/// chained or larger (bsize=) buffers. The MTU to configure for `wanted`: `wanted` itself, or
/// for these PMDs what they advertise (the frames then decide).
inline std::uint16_t configurable_mtu(const char* driver, std::uint32_t max_rx_pktlen,
                                      std::uint16_t wanted) {
  constexpr std::uint32_t kL2 = 14 + 4;  // Ethernet header and CRC
  const bool under_reports = driver != nullptr && (std::strcmp(driver, "net_af_packet") == 0 ||
                                                   std::strcmp(driver, "net_memif") == 0);
  if (!under_reports || wanted + kL2 <= max_rx_pktlen || max_rx_pktlen <= kL2) return wanted;
  return static_cast<std::uint16_t>(max_rx_pktlen - kL2);
}

/// Touches every page of a pool's memory once. Without hugepages (--no-huge) the EAL's memory is
/// ordinary anonymous memory that the kernel maps at first touch, and a pool hands out its mbufs
/// in turn: every first use of a page in the datapath would be a page fault (several microseconds
/// each) until the whole pool has gone round once, which with thousands of jumbo mbufs takes
/// seconds of traffic. Hugepage memory is mapped when the EAL reserves it; this is then cheap.
inline void prefault_mempool(rte_mempool* mp) {
  rte_mempool_mem_iter(
      mp,
      [](rte_mempool*, void*, rte_mempool_memhdr* m, unsigned) {
        auto* base = static_cast<volatile std::uint8_t*>(m->addr);
        for (std::size_t off = 0; off < m->len; off += 4096) base[off] = base[off];
      },
      nullptr);
}

}  // namespace treeduce::dpdk
