/// @file
/// What DPDK 22.11 says and what it does, where the two differ. Used by port.cpp when it brings
/// up ports and pools for the switch daemon and for libtreeduce's DPDK transport.
#pragma once

#include <rte_mempool.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string_view>

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

/// net_af_packet's ring frames (its framesz= argument, 2048 by default) bound the frames it
/// carries whatever the MTU says. The kernel writes a received frame at offset 66 of a ring frame
/// (TPACKET_ALIGN(52-byte tpacket2 header and sockaddr_ll + 16) - 14) and cuts what does not fit:
/// the PMD then hands over a frame shorter than its IP header says, which the switch drops as
/// ip_bad_length. So IP packets of up to framesz - 80 bytes arrive whole: the largest MTU a
/// port with `framesz` carries (DPDK 22.11 drivers/net/af_packet, Linux af_packet.c
/// tpacket_rcv()). The PMD itself only checks that framesz - 32 bytes fit an mbuf.
inline constexpr std::uint32_t kAfPacketRxOffset = 80;
inline constexpr std::uint32_t kAfPacketDefaultFramesz = 2048;
inline std::uint32_t af_packet_max_mtu(std::uint32_t framesz) {
  return framesz > kAfPacketRxOffset ? framesz - kAfPacketRxOffset : 0;
}

/// The framesz= of a net_af_packet vdev's arguments ("iface=veth0,qpairs=2,framesz=8480"): the
/// PMD's default when it is absent, 0 when it is not a number (the PMD refuses such a vdev).
inline std::uint32_t af_packet_framesz(std::string_view args) {
  constexpr std::string_view key = "framesz=";
  for (std::size_t at = 0; at < args.size();) {
    const std::size_t end = std::min(args.find(',', at), args.size());
    const std::string_view kv = args.substr(at, end - at);
    if (kv.substr(0, key.size()) == key) {
      std::uint32_t v = 0;
      const std::string_view digits = kv.substr(key.size());
      if (digits.empty() || digits.size() > 9) return 0;
      for (char c : digits) {
        if (c < '0' || c > '9') return 0;
        v = v * 10 + static_cast<std::uint32_t>(c - '0');
      }
      return v;
    }
    at = end + 1;
  }
  return kAfPacketDefaultFramesz;
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
