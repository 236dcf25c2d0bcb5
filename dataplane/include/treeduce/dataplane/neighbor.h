/// @file
/// ARP and ICMP echo for a switch's own address: what lets hosts that use the kernel's UDP stack
/// reach a treeduce switch with no static neighbour entries, and lets a person ping it.
///
/// Pure functions over byte arrays, like the core: a received frame in, at most one reply frame
/// out. The DPDK daemon calls answer_neighbor() for every frame that is not treeduce traffic.
#pragma once

#include <cstddef>
#include <cstdint>

#include "treeduce/protocol/wire.h"

namespace treeduce::dp {

using proto::be16;
using proto::be32;
using proto::Endpoint;

/// ARP over Ethernet for IPv4 (RFC 826), 28 bytes after the Ethernet header.
struct [[gnu::packed]] ArpHdr {
  be16 htype;           ///< 1 (Ethernet)
  be16 ptype;           ///< 0x0800 (IPv4)
  std::uint8_t hlen;    ///< 6
  std::uint8_t plen;    ///< 4
  be16 oper;            ///< 1 request, 2 reply
  std::uint8_t sha[6];  ///< sender MAC
  be32 spa;             ///< sender IPv4
  std::uint8_t tha[6];  ///< target MAC
  be32 tpa;             ///< target IPv4
};
static_assert(sizeof(ArpHdr) == 28 && alignof(ArpHdr) == 1);

/// ICMP header (RFC 792); for echo, identifier and sequence follow in `rest`.
struct [[gnu::packed]] IcmpHdr {
  std::uint8_t type;   ///< 8 echo request, 0 echo reply
  std::uint8_t code;   ///< 0
  be16 checksum;       ///< over the whole ICMP message
  std::uint32_t rest;  ///< echo: identifier and sequence, returned unchanged
};
static_assert(sizeof(IcmpHdr) == 8 && alignof(IcmpHdr) == 1);

inline constexpr std::uint16_t kEtherTypeArp = 0x0806;

/// What answer_neighbor() did with a frame.
enum class NeighborVerdict : std::uint8_t {
  arp_reply,     ///< an ARP request for our address: reply written
  echo_reply,    ///< an ICMP echo request to our address: reply written
  not_neighbor,  ///< neither ARP nor ICMP: not for this function (the caller counts it)
  ignored,       ///< ARP or ICMP we do not answer (a reply, another target, another ICMP type)
  malformed,     ///< ARP or ICMP that fails a length or checksum check
  no_room,       ///< the reply would not fit in `cap` bytes
};

/// If `frame` is an ARP request for `self.ip` or an ICMP echo request to `self.ip` (IPv4, no
/// options, not a fragment, correct IPv4 and ICMP checksums), writes the reply frame into `out`
/// and stores its length in `*out_len`. Never reads outside [frame, frame + len) nor writes
/// outside [out, out + cap). An echo reply returns the request's identifier, sequence and data.
NeighborVerdict answer_neighbor(const std::uint8_t* frame, std::size_t len, const Endpoint& self,
                                std::uint8_t* out, std::size_t cap, std::size_t* out_len) noexcept;

/// What an ARP packet says about its sender: how a switch learns its neighbours.
struct ArpSender {
  std::uint32_t ip = 0;  ///< sender IPv4, host order
  std::uint8_t mac[6] = {};
  std::uint32_t target_ip = 0;  ///< host order
  bool request = false;         ///< a request (else a reply)
};

/// If `frame` is a well-formed ARP request or reply for Ethernet/IPv4, fills `*out` and returns
/// true. A sender of 0.0.0.0 (ARP probe) or a multicast sender MAC yields false: nothing to learn.
bool parse_arp(const std::uint8_t* frame, std::size_t len, ArpSender* out) noexcept;

/// Bytes written by write_arp_request(): a minimum-size Ethernet frame.
inline constexpr std::size_t kArpFrameBytes = 60;

/// Write a broadcast ARP request "who has `target` (host order)? tell self.ip" from `self.mac`
/// into `out` (kArpFrameBytes bytes, padded with zeros).
void write_arp_request(std::uint8_t* out, const Endpoint& self, std::uint32_t target) noexcept;

}  // namespace treeduce::dp
