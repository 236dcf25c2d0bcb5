// Where a frame to the leaf switch goes, as the kernel's routing and neighbour tables say: for
// transports that write whole Ethernet frames on an interface the kernel also uses (af_xdp,
// host/src/af_xdp_transport.h), so that they need no MAC address given by hand. Linux
// rtnetlink: RTM_GETROUTE for the leaf's address, RTM_GETNEIGH for the next hop, and when the
// kernel has no entry yet, an RTM_NEWNEIGH with NTF_USE that makes it send the ARP request
// (needs CAP_NET_ADMIN, which attaching an XDP program needs anyway), then the neighbour
// notifications until the answer comes.
#pragma once

#include <cstdint>
#include <string>

namespace treeduce::host {

struct NextHop {
  std::string interface;  ///< the interface the route to the leaf leaves by
  int ifindex = 0;
  std::uint32_t gateway = 0;  ///< host order; 0: the leaf is on the link
  std::uint8_t local_mac[6] = {};
  std::uint8_t next_hop_mac[6] = {};  ///< the leaf's, or the gateway's
  std::uint32_t mtu = 0;
};

/// The interface, next hop and MACs for frames to `leaf_ip` (host order). `interface`: "" = the
/// route's; else that interface (the next hop is then the route's gateway when the route leaves
/// by it, the leaf itself otherwise). Waits up to `arp_timeout_ms` for ARP. "" and `*out`, or a
/// sentence.
std::string resolve_next_hop(std::uint32_t leaf_ip, const std::string& interface,
                             std::uint32_t arp_timeout_ms, NextHop* out);

}  // namespace treeduce::host
