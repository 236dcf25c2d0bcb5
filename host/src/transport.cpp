// make_transport (transport.h): the transport TransportOptions names, in this build.
#include "transport.h"

#include "udp_transport.h"
#ifdef TREEDUCE_HAVE_DPDK
#include "dpdk_transport.h"
#endif
#ifdef TREEDUCE_HAVE_VERBS
#include "verbs_transport.h"
#endif
#ifdef TREEDUCE_HAVE_AF_XDP
#include "af_xdp_transport.h"
#endif

namespace treeduce::host {

const char* name(TransportKind k) noexcept {
  switch (k) {
    case TransportKind::udp:
      return "udp";
    case TransportKind::dpdk:
      return "dpdk";
    case TransportKind::verbs:
      return "verbs";
    case TransportKind::af_xdp:
      return "af_xdp";
  }
  return "unknown";
}

treeduce::Result<std::unique_ptr<Transport>> make_transport(const TransportOptions& opt,
                                                            const TransportEndpoints& at) {
  std::string err;
  std::unique_ptr<Transport> t;
  switch (opt.kind) {
    case TransportKind::udp: {
      UdpTransportOptions u;
      u.bind_address = at.bind_address;
      u.port = at.port;
      u.leaf_address = at.leaf_address;
      u.payload_bytes = at.payload_bytes;
      u.send_ports = opt.udp_send_ports;
      u.gso = opt.udp_gso;
      u.gro = opt.udp_gro;
      t = make_udp_transport(u, &err);
      break;
    }
#ifdef TREEDUCE_HAVE_VERBS
    case TransportKind::verbs: {
      // Raw Ethernet frames on an RDMA NIC: no ARP, so both MACs are given.
      VerbsTransportOptions v;
      v.device = opt.verbs_device;
      v.port_num = opt.verbs_port;
      v.local_address = at.bind_address;
      v.port = at.port;
      v.local_mac = opt.local_mac;
      v.leaf_address = at.leaf_address;
      v.leaf_mac = opt.leaf_mac;
      v.payload_bytes = at.payload_bytes;
      t = make_verbs_transport(v, &err);
      break;
    }
#endif
#ifdef TREEDUCE_HAVE_DPDK
    case TransportKind::dpdk: {
      // The process initialises the EAL with the port probed (docs/host.md): a traffic generator
      // or benchmark that links libtreeduce owns its DPDK set-up. No ARP: both MACs are given.
      // Or libtreeduce starts the EAL itself, with the arguments it is given.
      if (!opt.dpdk_eal.empty()) err = init_eal_once(opt.dpdk_eal);
      if (!err.empty()) break;
      DpdkTransportOptions d;
      d.port_name = opt.dpdk_port;
      d.local_address = at.bind_address;
      d.local_port = at.port;
      d.local_mac = opt.local_mac;
      d.leaf_address = at.leaf_address;
      d.leaf_mac = opt.leaf_mac;
      d.payload_bytes = at.payload_bytes;
      if (opt.dpdk_tx_copy) d.tx_mode = DpdkTransportOptions::TxMode::copy;
      t = make_dpdk_transport(d, &err);
      break;
    }
#endif
#ifdef TREEDUCE_HAVE_AF_XDP
    case TransportKind::af_xdp:
      // Frames on a kernel interface; the kernel resolves the leaf's MAC (next_hop.h).
      t = make_af_xdp_transport({.interface = opt.xdp_interface,
                                 .queue = opt.xdp_queue,
                                 .mode = opt.xdp_mode,
                                 .local_address = at.bind_address,
                                 .port = at.port,
                                 .leaf_address = at.leaf_address,
                                 .payload_bytes = at.payload_bytes},
                                &err);
      break;
#endif
    default:
      return unavailable(std::string("This build has no ") + name(opt.kind) +
                         " transport; it knows udp" +
#ifdef TREEDUCE_HAVE_DPDK
                         ", dpdk" +
#endif
#ifdef TREEDUCE_HAVE_VERBS
                         ", verbs" +
#endif
#ifdef TREEDUCE_HAVE_AF_XDP
                         ", af_xdp" +
#endif
                         " (dpdk and verbs are built when DPDK and rdma-core are found, af_xdp "
                         "when libxdp, libbpf and clang are).");
  }
  if (!t) return unavailable(err.empty() ? "The transport gave no reason." : err);
  return t;
}

}  // namespace treeduce::host
