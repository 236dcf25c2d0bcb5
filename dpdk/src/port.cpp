#include "treeduce/dpdk/port.h"

#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_errno.h>
#include <rte_ether.h>
#include <rte_mbuf.h>

#include <algorithm>
#include <cstring>

#include "treeduce/dpdk/quirks.h"

namespace treeduce::dpdk {

namespace {

/// " (DPDK's reason)." for a negative errno, a positive one or rte_errno.
std::string because(int rc) { return std::string(" (") + rte_strerror(rc < 0 ? -rc : rc) + ")."; }

std::string probed_ports() {
  std::string known;
  std::uint16_t pid;
  RTE_ETH_FOREACH_DEV(pid) {
    char name[RTE_ETH_NAME_MAX_LEN];
    if (rte_eth_dev_get_name_by_port(pid, name) == 0)
      known += std::string(known.empty() ? "" : ", ") + name;
  }
  return known;
}

/// The MTU asked for: the request's, or the port's own, raised to the request's minimum.
std::uint16_t wanted_mtu(std::uint16_t port, const PortRequest& req) {
  std::uint16_t mtu = req.mtu;
  // configure() sets the MTU it is given, and 0 means 1500: keep the port's own unless told.
  if (mtu == 0 && rte_eth_dev_get_mtu(port, &mtu) != 0) mtu = RTE_ETHER_MTU;
  return std::max(mtu, req.min_mtu);
}

/// The ethdev configuration for `req` on a device with `info`, frames up to `mtu`.
rte_eth_conf port_conf(const rte_eth_dev_info& info, const PortRequest& req,
                       std::uint16_t rx_queues, std::uint16_t mtu) {
  rte_eth_conf conf{};
  if (rx_queues > 1) {
    conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
    conf.rx_adv_conf.rss_conf.rss_hf =
        (RTE_ETH_RSS_NONFRAG_IPV4_UDP | RTE_ETH_RSS_IPV4) & info.flow_type_rss_offloads;
    if (conf.rx_adv_conf.rss_conf.rss_hf == 0) conf.rxmode.mq_mode = RTE_ETH_MQ_RX_NONE;
  }
  if (req.multi_seg_tx && (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0)
    conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
  conf.rxmode.mtu = configurable_mtu(info.driver_name, info.max_rx_pktlen, mtu);
  if (req.rx_frame_room != 0 &&
      std::uint32_t{mtu} + RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN > req.rx_frame_room &&
      (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_SCATTER) != 0) {
    conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_SCATTER;  // frames longer than one mbuf
  }
  return conf;
}

/// RX queues 0..rx_queues-1 and TX queues 0..tx_queues-1 on the port's socket.
Status setup_queues(std::uint16_t port, const rte_eth_dev_info& info, const rte_eth_conf& conf,
                    std::uint16_t rx_queues, const PortRequest& req) {
  std::uint16_t rxd = req.rx_desc, txd = req.tx_desc;
  rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
  const auto socket = static_cast<unsigned>(port_socket(port));
  for (std::uint16_t q = 0; q < rx_queues; ++q) {
    if (int rc = rte_eth_rx_queue_setup(port, q, rxd, socket, nullptr, req.rx_pool); rc != 0)
      return failed_precondition("RX queue set-up failed on DPDK port '" + req.name + "'" +
                                 because(rc));
  }
  for (std::uint16_t q = 0; q < req.tx_queues; ++q) {
    rte_eth_txconf txc = info.default_txconf;
    txc.offloads = conf.txmode.offloads;
    if (int rc = rte_eth_tx_queue_setup(port, q, txd, socket, &txc); rc != 0)
      return failed_precondition("TX queue set-up failed on DPDK port '" + req.name + "'" +
                                 because(rc));
  }
  return Status::Ok();
}

/// Sets the requested MAC (promiscuous mode when the PMD cannot take it), or reads the port's.
Result<Mac> set_mac(std::uint16_t port, const PortRequest& req) {
  rte_ether_addr mac;
  if (req.mac) {
    std::memcpy(mac.addr_bytes, req.mac->data(), 6);
    // A PMD that cannot take another MAC still receives it in promiscuous mode.
    if (rte_eth_dev_default_mac_addr_set(port, &mac) != 0) rte_eth_promiscuous_enable(port);
    return *req.mac;
  }
  if (int rc = rte_eth_macaddr_get(port, &mac); rc != 0)
    return internal_error("Cannot read the MAC of DPDK port '" + req.name + "'" + because(rc));
  Mac out;
  std::memcpy(out.data(), mac.addr_bytes, 6);
  return out;
}

/// net_af_packet cuts frames longer than its ring frames (af_packet_max_mtu()): a port whose MTU
/// its framesz cannot carry would come up, log its MTU and drop every larger frame as
/// ip_bad_length. Refused here with the framesz it needs instead; a clamped MTU would only move
/// the same drops to the hosts, whose payload size was chosen for the MTU asked.
Status check_af_packet(const rte_eth_dev_info& info, const PortRequest& req, std::uint16_t mtu) {
  if (info.driver_name == nullptr || std::strcmp(info.driver_name, "net_af_packet") != 0 ||
      info.device == nullptr)
    return Status::Ok();
  const rte_devargs* da = rte_dev_devargs(info.device);
  const std::uint32_t framesz =
      af_packet_framesz(da != nullptr && da->args != nullptr ? da->args : "");
  if (framesz == 0) return Status::Ok();  // the PMD refused it already
  const std::string at =
      "DPDK port '" + req.name + "' (net_af_packet, framesz=" + std::to_string(framesz) + ")";
  if (mtu > af_packet_max_mtu(framesz)) {
    // A multiple of 16 keeps ring frames aligned (TPACKET_ALIGNMENT).
    const std::uint32_t need = (mtu + kAfPacketRxOffset + 15) / 16 * 16;
    return failed_precondition(
        at + " carries IP packets of at most " + std::to_string(af_packet_max_mtu(framesz)) +
        " bytes (framesz - 80: the kernel writes each frame 66 bytes into a ring frame and cuts "
        "what does not fit), but its MTU is " +
        std::to_string(mtu) + ": give the vdev framesz=" + std::to_string(need) +
        " or more (with blocksz a multiple of it), or the port an MTU of at most " +
        std::to_string(af_packet_max_mtu(framesz)) + ".");
  }
  if (req.rx_pool != nullptr) {
    const std::uint32_t room = rte_pktmbuf_data_room_size(req.rx_pool) - RTE_PKTMBUF_HEADROOM;
    if (framesz - 32 > room)
      return failed_precondition(
          at + " copies up to framesz - 32 = " + std::to_string(framesz - 32) +
          " bytes into one mbuf, but the mbufs hold " + std::to_string(room) +
          ": give it framesz=" + std::to_string((room + 32) / 16 * 16) + " or less.");
  }
  return Status::Ok();
}

}  // namespace

Result<std::uint16_t> find_port(const std::string& name) {
  std::uint16_t id = 0;
  if (rte_eth_dev_get_port_by_name(name.c_str(), &id) == 0) return id;
  const std::string known = probed_ports();
  return not_found(
      "There is no DPDK port '" + name + "' (the EAL probed " +
      (known.empty() ? "none: give it the port, e.g. --vdev=net_memif0,... or -a PCI" : known) +
      ").");
}

Result<rte_eth_dev_info> device_info(std::uint16_t port, const std::string& name) {
  rte_eth_dev_info info;
  if (int rc = rte_eth_dev_info_get(port, &info); rc != 0)
    return internal_error("Cannot read the device info of DPDK port '" + name + "'" + because(rc));
  return info;
}

int port_socket(std::uint16_t port) {
  const int socket = rte_eth_dev_socket_id(port);
  return socket < 0 ? SOCKET_ID_ANY : socket;
}

Result<rte_mempool*> create_pool(const std::string& name, std::uint32_t mbufs, unsigned cache,
                                 std::uint16_t data_room, int socket) {
  rte_mempool* mp = rte_pktmbuf_pool_create(name.c_str(), mbufs, cache, 0, data_room, socket);
  if (mp == nullptr)
    return resource_exhausted("Cannot allocate " + std::to_string(mbufs) + " mbufs of " +
                              std::to_string(data_room) + " bytes for pool '" + name +
                              "': give DPDK more memory (-m) or use fewer mbufs" +
                              because(rte_errno));
  prefault_mempool(mp);
  return mp;
}

Result<PortUp> start_port(std::uint16_t port, const rte_eth_dev_info& info,
                          const PortRequest& req) {
  PortUp up;
  up.rx_queues = std::min(req.rx_queues, info.max_rx_queues);
  up.mtu = wanted_mtu(port, req);
  if (Status s = check_af_packet(info, req, up.mtu); !s.ok()) return s;
  const rte_eth_conf conf = port_conf(info, req, up.rx_queues, up.mtu);
  up.configured_mtu = conf.rxmode.mtu;
  up.multi_seg_tx = (conf.txmode.offloads & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
  if (int rc = rte_eth_dev_configure(port, up.rx_queues, req.tx_queues, &conf); rc != 0)
    return failed_precondition("DPDK port '" + req.name + "' refused " +
                               std::to_string(up.rx_queues) + " RX and " +
                               std::to_string(req.tx_queues) + " TX queue(s) with MTU " +
                               std::to_string(up.mtu) + because(rc));
  if (Status s = setup_queues(port, info, conf, up.rx_queues, req); !s.ok()) return s;
  Result<Mac> mac = set_mac(port, req);
  if (!mac.ok()) return mac.status();
  up.mac = *mac;
  if (int rc = rte_eth_dev_start(port); rc != 0)
    return failed_precondition("DPDK port '" + req.name + "' did not start" + because(rc));
  return up;
}

}  // namespace treeduce::dpdk
