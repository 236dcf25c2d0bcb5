// The host library's DPDK transport (docs/host.md, "Transports"): the Transport interface of
// transport.h over one DPDK ethdev port, for traffic generators and benchmarks that want the
// host side out of the kernel.
//
// The EAL is initialised once, before creating a transport, with the port it will use probed,
// e.g. `--no-huge -m 512 --no-pci --file-prefix=... --vdev=net_memif0,role=client,socket=/run/td/
// memif.sock`: by the process itself, or by libtreeduce through init_eal_once() when
// TREEDUCE_DPDK_EAL gives the arguments. The transport itself never calls rte_eal_init or
// rte_eal_cleanup. It then owns the port exclusively while it lives: it configures one RX and one
// TX queue, creates its own mbuf pools, starts the port, and on destruction drains and stops the
// port (it does not close it) and frees its pools.
//
// Transmission without copying the payload (docs/host.md, "Transports"): a frame goes out as a
// header mbuf (Ethernet/IPv4/UDP/treeduce header, from a per-flow template) chained to an
// external-buffer mbuf (rte_pktmbuf_attach_extbuf) over the caller's payload. The shared-info free
// callback of each such mbuf tells the transport the bytes are no longer referenced, and
// references() says whether the PMD still holds any into a buffer: the network loop completes an
// operation only when the network is done with it and no reference is left. Used where the PMD
// takes multi-segment frames (RTE_ETH_TX_OFFLOAD_MULTI_SEGS) and reads them with the CPU and frees
// them within rte_eth_tx_burst (a virtual device: memif in copy mode, af_packet, af_xdp, tap); a
// NIC would DMA from memory that is not registered with DPDK (rte_extmem_register +
// rte_dev_dma_map, not done), and memif with zero-copy=yes sends every segment as an offset into
// the first DPDK memory segment list, which the caller's buffer is not in. Elsewhere the payload
// is copied into the header mbuf, as before. The choice is said once on stderr when the port
// opens.
//
// There is no ARP and no routing here: the leaf switch's MAC is given, every frame goes to it,
// and frames come back to the local MAC (the port's own unless given). Only IPv4 without options,
// UDP, and the treeduce header: proto::write_l2_l4 builds the headers (DF set, IPv4 checksum, UDP
// checksum 0) and proto::parse_frame checks what arrives.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport.h"

namespace treeduce::host {

struct DpdkTransportOptions {
  /// The ethdev name as the EAL probed it ("net_memif0", "0000:3b:00.0", ...).
  std::string port_name;
  /// Local IPv4 address and UDP port: RESULTs come to local_address:local_port, and CONTRIBs are
  /// sent from it.
  std::string local_address;
  std::uint16_t local_port = 0;
  /// Local MAC "aa:bb:cc:dd:ee:ff"; empty: the port's own. A MAC other than the port's is set on
  /// the port as its default, or, if the PMD refuses, the port goes promiscuous.
  std::string local_mac;
  /// "a.b.c.d:port" of the leaf switch; only frames from this address and port are received.
  std::string leaf_address;
  /// The leaf switch's MAC; required (this transport does no ARP).
  std::string leaf_mac;
  /// Largest payload send() takes and receive() accepts (a longer datagram counts as foreign).
  std::uint32_t payload_bytes = 1024;
  /// Descriptors per queue (adjusted to what the PMD supports) and mbufs per pool (the TX pool
  /// and the RX pool each; a PMD that fills its RX ring from the pool needs more than rx_desc).
  std::uint16_t rx_desc = 1024;
  std::uint16_t tx_desc = 1024;
  std::uint32_t mbufs = 4095;
  /// How payloads are transmitted (see the file comment).
  enum class TxMode {
    automatic,  ///< zero-copy where the PMD is known to allow it, else copy
    copy,       ///< always copy the payload into the mbuf
    /// zero-copy on any PMD that takes multi-segment frames, including those that keep the mbufs
    /// after rte_eth_tx_burst (net_ring hands them to its reader): for tests of references()
    zero_copy_any,
  };
  TxMode tx_mode = TxMode::automatic;
};

/// The DPDK transport: one RX and one TX queue on one port, polled by the one progress thread that
/// drives it (send/receive/stats are not thread-safe; wake() may be called from any thread).
/// nullptr and a sentence in `*error` on failure (no such port, a bad address, the port refusing
/// its configuration, no memory for the pools).
std::unique_ptr<Transport> make_dpdk_transport(const DpdkTransportOptions& opt, std::string* error);

/// Initialises the EAL with `args` (whitespace-separated EAL arguments) unless this process did
/// already, so that a program that knows nothing of DPDK can use the DPDK transport
/// (TREEDUCE_DPDK_EAL). Once per process; "" or why the EAL did not start.
std::string init_eal_once(const std::string& args);

}  // namespace treeduce::host
