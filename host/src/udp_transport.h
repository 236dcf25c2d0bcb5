// The kernel UDP implementation of the host library's Transport (transport.h): non-blocking
// sockets, sendmmsg/recvmmsg batches, optional UDP GSO/GRO; docs/host.md, "Transports".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport.h"

namespace treeduce::host {

struct UdpTransportOptions {
  std::string bind_address;  ///< local IPv4; RESULTs come to bind_address:port
  std::uint16_t port = 0;
  std::string leaf_address;  ///< "a.b.c.d:port" of the leaf switch
  std::uint32_t payload_bytes = 1024;
  /// Source ports: slot s is sent from socket s mod send_ports, so that a switch that spreads
  /// flows over queues by RSS (docs/switch.md) spreads slots over its lcores. Socket 0 is
  /// the receive socket (bind_address:port); the others are bound to bind_address with a port
  /// the kernel picks (a switch checks a CONTRIB's source address, not its port, and sends
  /// RESULTs to the child's configured port). 1..64.
  std::uint32_t send_ports = 1;
  /// Try UDP GSO (UDP_SEGMENT) for sends. Off by default: across a veth pair the super-datagram
  /// is never cut (veth passes GSO packets as they are), and a DPDK switch reading the peer with
  /// net_af_packet, as treeduce's emulated fabric does, receives one oversized frame it must drop.
  /// On a real NIC the kernel or the NIC segments, and GSO saves system calls.
  bool gso = false;
  /// Try UDP GRO (UDP_GRO) for receives: the kernel coalesces, we split; harmless anywhere.
  bool gro = true;
};

/// The kernel UDP transport: non-blocking sockets, sendmmsg/recvmmsg batches, DF set on every
/// datagram, a large receive buffer. nullptr and a sentence in `*error` on failure.
std::unique_ptr<Transport> make_udp_transport(const UdpTransportOptions& opt, std::string* error);

}  // namespace treeduce::host
