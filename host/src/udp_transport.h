// The host library's packet I/O: one small interface between the communicator's progress thread
// (which owns a ProtocolEngine) and the network, and its kernel UDP implementation.
//
// The interface deals in whole treeduce datagrams (TdHdr + payload) to and from one leaf switch,
// in batches, so that other transports fit behind it later without touching the communicator:
// a DPDK transport (its own Ethernet/IPv4/UDP headers with proto::write_l2_l4, rte_eth_tx_burst of
// a header mbuf chained to an external-buffer mbuf over the caller's payload, rx bursts polled
// with receive(timeout 0)), or an ibverbs transport (UD QP or RoCEv2 framing; post_send of
// scatter-gather lists that are these same iovec pairs, completions read in receive()): see
// dpdk_transport.h and verbs_transport.h; docs/host.md, "Transports".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "treeduce/host/protocol_engine.h"

namespace treeduce::host {

/// A received datagram: treeduce header then payload, in the transport's memory, valid until
/// the next receive() call.
struct RxDatagram {
  const std::uint8_t* data;
  std::size_t len;
};

/// Counters of a transport (read by the progress thread that drives it).
struct TransportStats {
  std::uint64_t sent = 0;         ///< datagrams handed to the kernel
  std::uint64_t received = 0;     ///< datagrams from the leaf switch
  std::uint64_t foreign = 0;      ///< datagrams from anyone else, or too long; ignored
  std::uint64_t send_errors = 0;  ///< datagrams the kernel refused for a reason the network may
                                  ///< fix (counted as lost: the engine retransmits)
  std::uint64_t gso_sends = 0;    ///< messages sent as one UDP GSO super-datagram
};

class Transport {
 public:
  virtual ~Transport() = default;
  /// Most packets one send() takes.
  virtual std::size_t batch() const noexcept = 0;
  /// Send `n` <= batch() packets to the leaf switch. Packets are not copied: header and payload
  /// go out as an iovec pair. Returns "" or an error sentence (a fatal socket error, or a
  /// datagram larger than the path MTU).
  virtual std::string send(const OutPacket* p, std::size_t n) = 0;
  /// Wait up to `timeout_ns` (0: do not wait) for datagrams from the leaf switch and return
  /// what arrived (a batch; call again for more), valid until the next receive(). Empty when the
  /// time passed or wake() was called. A fatal socket error returns empty with a sentence in
  /// `*error`.
  virtual std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* error) = 0;
  /// Make a receive() blocked in another thread return now (any thread, async-signal-safe).
  virtual void wake() noexcept = 0;
  virtual const TransportStats& stats() const noexcept = 0;
};

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

/// Parses "a.b.c.d:port" (port 1..65535) into host-order parts. False when it is not that.
bool parse_ipv4_endpoint(const std::string& s, std::uint32_t* ip, std::uint16_t* port);

}  // namespace treeduce::host
