// An ibverbs implementation of host::Transport (transport.h), built when rdma-core
// (libibverbs) is present.
//
// treeduce switches speak Ethernet/IPv4/UDP, not RoCE, so this transport uses a RAW_PACKET QP
// (IBV_QPT_RAW_PACKET, as DPDK's mlx5 driver and SwitchML-style hosts do) on an Ethernet port of
// an RDMA device and writes whole frames itself:
//
// - Open: ibv_get_device_list, ibv_open_device, ibv_query_port (the port must be Ethernet),
//   ibv_alloc_pd, a send CQ and a receive CQ (the receive CQ on a completion channel), the raw
//   QP (INIT with the port, RTR, RTS), one registered memory region holding a ring of send
//   frame buffers and a ring of receive buffers, every receive buffer posted, and a flow
//   steering rule (ibv_create_flow: ETH dst MAC + EtherType IPv4, IPV4 dst address, UDP dst
//   port) so that the QP receives the frames for our UDP port (and the kernel stack no longer
//   sees them).
// - send(): each packet's frame is built in a free send buffer: Ethernet/IPv4/UDP headers with
//   proto::write_l2_l4 (IPv4 checksum computed here, UDP checksum 0), the TdHdr, then the payload
//   COPIED from the caller's buffer. A two-entry scatter-gather list (header from our ring,
//   payload in place) would avoid the copy, but only if the caller's buffers were registered
//   (ibv_reg_mr of the collective's send buffer, or on-demand paging): the Transport interface
//   carries no registration, so we copy. Every WR is signalled; send() polls the send CQ until
//   this batch completes, for at most 10 ms (later calls reap what is left). When the ring has
//   no room for 100 ms the rest of the batch counts as lost (send_errors), as the UDP
//   transport does with a full socket buffer: the engine retransmits.
// - receive(timeout): polls the receive CQ; when nothing is there and timeout > 0 it arms the
//   CQ (ibv_req_notify_cq), polls once more (the race), and waits with ppoll() on the
//   completion channel's fd and an eventfd, so that wake() (an eventfd write: any thread,
//   async-signal-safe) interrupts it, exactly like the UDP transport. No busy polling: a
//   progress thread that waits for the engine's next deadline costs no CPU. Completed frames
//   are parsed with proto::parse_frame (our IPv4 address and UDP port); frames from the leaf's
//   IPv4 address and UDP port are returned (TdHdr + payload, in the receive buffer, valid
//   until the next receive()); anything else counts as foreign. The buffers of one receive()
//   are posted again at the start of the next.
// - No ARP: the leaf switch's MAC address is an option (and so is ours: the NIC port's MAC).
//   A leaf that changes MAC (failover) needs a new transport. No VLAN tag.
// - Frames longer than the path MTU are not checked here (the NIC sends them; a switch or the
//   leaf drops them): choose payload_bytes to fit the port MTU (1024 B payload = 1098 B frame).
// - Needs CAP_NET_RAW (raw packet QPs and flow rules); without it ibv_create_qp fails with EPERM
//   and the sentence says so.
//
// NOT RUN where this was written (no RDMA device, no uverbs in the kernel: ibv_get_device_list
// returns NULL with ENOSYS): everything that touches a device, i.e. all of open() after
// ibv_get_device_list, send(), receive() and wake() of a live transport. It compiles against
// rdma-core's headers and links against libibverbs. Tested (tests/host/test_verbs_transport.cpp):
// the no-device path and the pure parts below in `detail` (options validation, MAC parsing,
// frame building into a buffer, received-frame classification, the flow rule, error sentences).
// First on real hardware (mlx5, CAP_NET_RAW), check: the flow rule is accepted as built
// (some devices want no MAC in the ETH spec), the QP state transitions, and one allreduce
// through a switch against the UDP transport.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "transport.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::host {

struct VerbsTransportOptions {
  std::string device;         ///< RDMA device name (e.g. "mlx5_0"); "" = the first one
  std::uint8_t port_num = 1;  ///< device port, 1-based; must be an Ethernet port
  std::string local_address;  ///< our IPv4 address; RESULTs come to local_address:port
  std::uint16_t port = 0;     ///< our UDP port, 1..65535 (no kernel socket: no port 0 = any)
  std::string local_mac;      ///< the port's MAC address, "aa:bb:cc:dd:ee:ff"
  std::string leaf_address;   ///< "a.b.c.d:port" of the leaf switch
  std::string leaf_mac;       ///< the leaf switch's MAC on our link (no ARP)
  std::uint32_t payload_bytes = 1024;  ///< a power of two in [256, 8192]
  std::uint32_t send_ring = 256;       ///< send buffers (and send WRs), 64..4096
  std::uint32_t recv_ring = 1024;      ///< receive buffers posted, 64..16384
};

/// The ibverbs raw-packet transport. nullptr and a sentence in `*error` on failure; with no
/// RDMA device: "No RDMA device found (ibv_get_device_list returned none); use the UDP
/// transport."
std::unique_ptr<Transport> make_verbs_transport(const VerbsTransportOptions& opt,
                                                std::string* error);

namespace detail {

/// Packets one send() takes (and receive completions one receive() returns).
inline constexpr std::size_t kVerbsBatch = 64;
/// Bytes of each receive buffer: any Ethernet frame up to a 9000-byte MTU (no FCS).
inline constexpr std::size_t kRxBufferBytes = 9216;

/// Validated options: host-order endpoints.
struct VerbsResolved {
  proto::Endpoint self;         ///< our MAC, IPv4 address, UDP port
  proto::Endpoint leaf;         ///< the leaf switch's
  std::size_t frame_bytes = 0;  ///< largest frame we send: kFrameHeaderBytes + payload_bytes
};

/// Checks every option that needs no device; "" and `*out` filled, or a sentence.
std::string validate_options(const VerbsTransportOptions& opt, VerbsResolved* out);

/// Writes the whole frame of `p` (headers, TdHdr, payload copied) into `out` of `cap` bytes.
/// Returns the frame length, or 0 when it does not fit.
std::size_t build_tx_frame(std::uint8_t* out, std::size_t cap, const proto::Endpoint& self,
                           const proto::Endpoint& leaf, const OutPacket& p) noexcept;

/// Classifies a received frame: true and `*out` (TdHdr + payload, pointing into `frame`) when it
/// is a treeduce datagram to `self` from `leaf`'s IPv4 address and UDP port (a datagram with an
/// unknown treeduce version is passed on, as the UDP transport does); false (foreign) otherwise.
bool classify_rx_frame(const std::uint8_t* frame, std::size_t len, const proto::Endpoint& self,
                       const proto::Endpoint& leaf, RxDatagram* out) noexcept;

/// The flow steering rule given to ibv_create_flow: the attribute followed by its specs, with
/// no padding between them (checked in verbs_transport.cpp).
struct FlowRule {
  ibv_flow_attr attr;
  ibv_flow_spec_eth eth;
  ibv_flow_spec_ipv4 ipv4;
  ibv_flow_spec_tcp_udp udp;
};

/// Fills `*rule` to steer Ethernet frames to self.mac with IPv4 destination self.ip and UDP
/// destination port self.port, arriving on `port_num`, to a QP.
void make_flow_rule(const proto::Endpoint& self, std::uint8_t port_num, FlowRule* rule) noexcept;

/// "<call> (<what>) failed: <strerror> (errno N)." plus a hint for EPERM/EACCES (CAP_NET_RAW).
std::string verbs_error(const char* call, const std::string& what, int err);

}  // namespace detail

}  // namespace treeduce::host
