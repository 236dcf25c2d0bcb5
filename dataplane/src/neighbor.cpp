// ARP and ICMP echo replies for the switch's own address. Control traffic, not the reduction
// datapath: correctness and bounds over speed, but still no allocation, so the daemon can answer
// from its polling loop.
#include "treeduce/dataplane/neighbor.h"

#include <algorithm>
#include <cstring>

namespace treeduce::dp {

using proto::EtherHdr;
using proto::inet_checksum;
using proto::ipv4_checksum;
using proto::Ipv4Hdr;
using proto::load_header;
using proto::store_header;

namespace {

constexpr std::uint16_t kEtherTypeIpv4 = 0x0800;
constexpr std::uint8_t kIpProtoIcmp = 1;
constexpr std::uint8_t kIcmpEchoReply = 0;
constexpr std::uint8_t kIcmpEchoRequest = 8;

NeighborVerdict answer_arp(const std::uint8_t* frame, std::size_t len, const Endpoint& self,
                           std::uint8_t* out, std::size_t cap, std::size_t* out_len) noexcept {
  if (len < sizeof(EtherHdr) + sizeof(ArpHdr)) return NeighborVerdict::malformed;
  const auto eth = load_header<EtherHdr>(frame);
  const auto arp = load_header<ArpHdr>(frame + sizeof(EtherHdr));
  if (arp.htype.get() != 1 || arp.ptype.get() != kEtherTypeIpv4 || arp.hlen != 6 || arp.plen != 4) {
    return NeighborVerdict::malformed;
  }
  if (arp.oper.get() != 1 || arp.tpa.get() != self.ip) return NeighborVerdict::ignored;
  // Ethernet frames are at least 60 bytes before the FCS; pad the reply so that drivers that do
  // not pad (net_pcap, net_ring, memif) still put a legal frame on the wire.
  constexpr std::size_t kReplyLen = kArpFrameBytes;
  if (cap < kReplyLen) return NeighborVerdict::no_room;
  EtherHdr reth;
  std::memcpy(reth.dst, eth.src, 6);
  std::memcpy(reth.src, self.mac, 6);
  reth.ether_type.set(kEtherTypeArp);
  ArpHdr reply = arp;
  reply.oper.set(std::uint16_t{2});
  std::memcpy(reply.tha, arp.sha, 6);
  reply.tpa = arp.spa;
  std::memcpy(reply.sha, self.mac, 6);
  reply.spa.set(self.ip);
  std::memset(out, 0, kReplyLen);
  store_header(out, reth);
  store_header(out + sizeof(EtherHdr), reply);
  *out_len = kReplyLen;
  return NeighborVerdict::arp_reply;
}

NeighborVerdict answer_icmp(const std::uint8_t* frame, std::size_t len, const Endpoint& self,
                            std::uint8_t* out, std::size_t cap, std::size_t* out_len) noexcept {
  if (len < sizeof(EtherHdr) + sizeof(Ipv4Hdr)) return NeighborVerdict::malformed;
  const auto eth = load_header<EtherHdr>(frame);
  const auto ip = load_header<Ipv4Hdr>(frame + sizeof(EtherHdr));
  if (ip.protocol != kIpProtoIcmp) return NeighborVerdict::not_neighbor;
  if (ip.version_ihl != 0x45 || ipv4_checksum(ip) != 0) return NeighborVerdict::malformed;
  const std::size_t ip_len = ip.total_length.get();
  if (ip_len < sizeof(Ipv4Hdr) + sizeof(IcmpHdr) || ip_len > len - sizeof(EtherHdr)) {
    return NeighborVerdict::malformed;
  }
  if ((ip.fragment.get() & 0x3FFF) != 0) return NeighborVerdict::ignored;  // fragments
  if (ip.dst_addr.get() != self.ip) return NeighborVerdict::ignored;
  const std::uint8_t* icmp_p = frame + sizeof(EtherHdr) + sizeof(Ipv4Hdr);
  const std::size_t icmp_len = ip_len - sizeof(Ipv4Hdr);
  const auto icmp = load_header<IcmpHdr>(icmp_p);
  if (icmp.type != kIcmpEchoRequest || icmp.code != 0) return NeighborVerdict::ignored;
  if (inet_checksum(icmp_p, icmp_len) != 0) return NeighborVerdict::malformed;
  const std::size_t reply_len = std::max<std::size_t>(sizeof(EtherHdr) + ip_len, 60);
  if (cap < reply_len) return NeighborVerdict::no_room;

  std::memset(out, 0, reply_len);
  EtherHdr reth;
  std::memcpy(reth.dst, eth.src, 6);
  std::memcpy(reth.src, self.mac, 6);
  reth.ether_type.set(kEtherTypeIpv4);
  Ipv4Hdr rip = ip;
  rip.src_addr.set(self.ip);
  rip.dst_addr = ip.src_addr;
  rip.ttl = 64;
  rip.tos = 0;
  rip.hdr_checksum.set(0);
  rip.hdr_checksum.set(ipv4_checksum(rip));
  std::uint8_t* ricmp = out + sizeof(EtherHdr) + sizeof(Ipv4Hdr);
  std::memcpy(ricmp, icmp_p, icmp_len);  // identifier, sequence and data come back unchanged
  IcmpHdr rhdr = icmp;
  rhdr.type = kIcmpEchoReply;
  rhdr.checksum.set(0);
  store_header(ricmp, rhdr);
  rhdr.checksum.set(inet_checksum(ricmp, icmp_len));
  store_header(ricmp, rhdr);
  store_header(out, reth);
  store_header(out + sizeof(EtherHdr), rip);
  *out_len = reply_len;
  return NeighborVerdict::echo_reply;
}

}  // namespace

NeighborVerdict answer_neighbor(const std::uint8_t* frame, std::size_t len, const Endpoint& self,
                                std::uint8_t* out, std::size_t cap, std::size_t* out_len) noexcept {
  *out_len = 0;
  if (frame == nullptr || len < sizeof(EtherHdr)) return NeighborVerdict::not_neighbor;
  const std::uint16_t type = load_header<EtherHdr>(frame).ether_type.get();
  if (type == kEtherTypeArp) return answer_arp(frame, len, self, out, cap, out_len);
  if (type == kEtherTypeIpv4) return answer_icmp(frame, len, self, out, cap, out_len);
  return NeighborVerdict::not_neighbor;
}

bool parse_arp(const std::uint8_t* frame, std::size_t len, ArpSender* out) noexcept {
  if (frame == nullptr || len < sizeof(EtherHdr) + sizeof(ArpHdr)) return false;
  if (load_header<EtherHdr>(frame).ether_type.get() != kEtherTypeArp) return false;
  const auto arp = load_header<ArpHdr>(frame + sizeof(EtherHdr));
  const std::uint16_t oper = arp.oper.get();
  if (arp.htype.get() != 1 || arp.ptype.get() != kEtherTypeIpv4 || arp.hlen != 6 || arp.plen != 4 ||
      (oper != 1 && oper != 2)) {
    return false;
  }
  if (arp.spa.get() == 0 || (arp.sha[0] & 1) != 0) return false;
  out->ip = arp.spa.get();
  std::memcpy(out->mac, arp.sha, 6);
  out->target_ip = arp.tpa.get();
  out->request = oper == 1;
  return true;
}

void write_arp_request(std::uint8_t* out, const Endpoint& self, std::uint32_t target) noexcept {
  EtherHdr eth;
  std::memset(eth.dst, 0xFF, 6);
  std::memcpy(eth.src, self.mac, 6);
  eth.ether_type.set(kEtherTypeArp);
  ArpHdr arp;
  arp.htype.set(std::uint16_t{1});
  arp.ptype.set(kEtherTypeIpv4);
  arp.hlen = 6;
  arp.plen = 4;
  arp.oper.set(std::uint16_t{1});
  std::memcpy(arp.sha, self.mac, 6);
  arp.spa.set(self.ip);
  std::memset(arp.tha, 0, 6);
  arp.tpa.set(target);
  std::memset(out, 0, kArpFrameBytes);
  store_header(out, eth);
  store_header(out + sizeof(EtherHdr), arp);
}

}  // namespace treeduce::dp
