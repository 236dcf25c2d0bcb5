// The host library's packet I/O: one small interface between the communicator's network loop
// (network_loop.cpp, which drives a ProtocolEngine) and the network, and the factory that makes
// the transport the options name (transport.cpp). Implementations: kernel UDP (udp_transport.h),
// DPDK (dpdk_transport.h), ibverbs raw packets (verbs_transport.h), AF_XDP (af_xdp_transport.h);
// docs/host.md, "Transports".
//
// The interface deals in whole treeduce datagrams (TdHdr + payload) to and from one leaf switch,
// in batches, so that every transport fits behind it without touching the communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "treeduce/common/status.h"
#include "treeduce/host/communicator.h"
#include "treeduce/host/protocol_engine.h"

namespace treeduce::host {

/// A received datagram: treeduce header then payload, in the transport's memory, valid until
/// the next receive() call.
struct RxDatagram {
  const std::uint8_t* data;
  std::size_t len;
};

/// Counters of a transport (read by the thread that drives it).
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
  /// Send `n` <= batch() packets to the leaf switch. Payloads are read from where they lie (an
  /// iovec, or a frame segment that references them until references() says it no longer does).
  /// Returns "" or an error sentence (a fatal socket error, or a datagram larger than the path
  /// MTU).
  virtual std::string send(const OutPacket* p, std::size_t n) = 0;
  /// Wait up to `timeout_ns` (0: do not wait) for datagrams from the leaf switch and return
  /// what arrived (a batch; call again for more), valid until the next receive(). Empty when the
  /// time passed or wake() was called. A fatal socket error returns empty with a sentence in
  /// `*error`.
  virtual std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* error) = 0;
  /// Whether the transport still holds a reference into the caller's bytes [p, p + len) from
  /// an earlier send() (a zero-copy transport whose device has not yet released a frame): the
  /// network loop completes an operation only once its send buffer has none. May ask the device
  /// to release what it is done with. The default: send() keeps no reference.
  virtual bool references(const void* /*p*/, std::size_t /*len*/) { return false; }
  /// Make a receive() blocked in another thread return now (any thread, async-signal-safe).
  virtual void wake() noexcept = 0;
  virtual const TransportStats& stats() const noexcept = 0;
};

/// Where a transport sends and receives: what the communicator knows once it has a tree.
struct TransportEndpoints {
  std::string bind_address;  ///< local IPv4; RESULTs come to bind_address:port
  std::uint16_t port = 0;
  std::string leaf_address;  ///< "a.b.c.d:port" of the leaf switch
  std::uint32_t payload_bytes = 1024;
};

/// The transport `opt.kind` names, set up for `at`: the transport, or why it could not start
/// (unavailable; a kind this build lacks is a sentence naming the kinds it has).
treeduce::Result<std::unique_ptr<Transport>> make_transport(const TransportOptions& opt,
                                                            const TransportEndpoints& at);

/// Parses "a.b.c.d:port" (port 1..65535) into host-order parts. False when it is not that
/// (defined in udp_transport.cpp; every transport uses it).
bool parse_ipv4_endpoint(const std::string& s, std::uint32_t* ip, std::uint16_t* port);

/// "udp", "dpdk", "verbs", "af_xdp".
const char* name(TransportKind k) noexcept;

}  // namespace treeduce::host
