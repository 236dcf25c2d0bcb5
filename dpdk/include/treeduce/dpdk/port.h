/// @file
/// Bringing up an ethdev port and its mbuf pools, the same way in the switch daemon
/// (dataplane/switchd/ports.cpp) and in libtreeduce's DPDK transport (host/src/dpdk_transport.cpp):
/// find the port the EAL probed, create prefaulted pools, configure the port (the MTU quirk of
/// quirks.h, RSS, multi-segment TX, RX scatter), set up its queues and MAC, start it.
///
/// Called after rte_eal_init(), off the datapath. Failures are a Status with one sentence that
/// names the port or pool and DPDK's reason.
#pragma once

#include <rte_ethdev.h>
#include <rte_mempool.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "treeduce/common/status.h"

namespace treeduce::dpdk {

using Mac = std::array<std::uint8_t, 6>;

/// The id of the port the EAL probed as `name` ("net_memif0", "0000:3b:00.0"); not_found, with
/// the names it did probe, when there is none.
Result<std::uint16_t> find_port(const std::string& name);

/// The port's device info (`name` for the sentence).
Result<rte_eth_dev_info> device_info(std::uint16_t port, const std::string& name);

/// The NUMA socket of the port's device; SOCKET_ID_ANY when unknown (virtual devices).
int port_socket(std::uint16_t port);

/// A packet mbuf pool of `mbufs` mbufs with `data_room` bytes each (headroom included) and a
/// per-lcore cache of `cache`, every page touched once (prefault_mempool). Pool names are global
/// to the EAL. resource_exhausted when the EAL has not the memory.
Result<rte_mempool*> create_pool(const std::string& name, std::uint32_t mbufs, unsigned cache,
                                 std::uint16_t data_room, int socket);

/// How to bring a port up.
struct PortRequest {
  std::string name;  ///< the port's name, for sentences
  /// RX queues: at most this many (fewer when the PMD has fewer). With more than one, RSS
  /// spreads frames over them by IPv4/UDP 5-tuple where the PMD hashes those.
  std::uint16_t rx_queues = 1;
  std::uint16_t tx_queues = 1;  ///< exactly this many (the caller checks the PMD has them)
  /// Descriptors per queue, adjusted to what the PMD supports.
  std::uint16_t rx_desc = 1024;
  std::uint16_t tx_desc = 1024;
  std::uint16_t mtu = 0;           ///< 0: the port's own (1500 when it cannot say)
  std::uint16_t min_mtu = 0;       ///< the MTU is raised to at least this
  rte_mempool* rx_pool = nullptr;  ///< RX queues take their mbufs from here
  /// Bytes of an RX mbuf for a frame: with an MTU whose frames are longer, RX scatter is asked
  /// for where the PMD has it. 0: never.
  std::uint32_t rx_frame_room = 0;
  bool multi_seg_tx = false;  ///< take multi-segment mbufs on TX, where the PMD can
  /// Set as the port's default MAC (promiscuous mode when the PMD refuses); unset: the port's own.
  std::optional<Mac> mac;
};

/// What the port came up with.
struct PortUp {
  std::uint16_t rx_queues = 0;
  std::uint16_t mtu = 0;             ///< the MTU frames may have (asked for, or the port's own)
  std::uint16_t configured_mtu = 0;  ///< what ethdev was given (configurable_mtu): may be less
  bool multi_seg_tx = false;         ///< TX takes multi-segment mbufs
  Mac mac{};                         ///< the MAC the port receives for
};

/// Configures `port` (`info` from device_info()) as `req` asks, sets up its queues and MAC, and
/// starts it.
Result<PortUp> start_port(std::uint16_t port, const rte_eth_dev_info& info, const PortRequest& req);

}  // namespace treeduce::dpdk
