// resolve_next_hop (next_hop.h): the kernel's route and neighbour entry for the leaf switch,
// over rtnetlink.
#include "next_hop.h"

#include <arpa/inet.h>
#include <linux/neighbour.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>

namespace treeduce::host {
namespace {

std::string dotted(std::uint32_t ip) {
  in_addr a{htonl(ip)};
  char b[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a, b, sizeof b);
  return b;
}

class Netlink {
 public:
  ~Netlink() {
    if (fd_ >= 0) close(fd_);
  }
  // A NETLINK_ROUTE socket, subscribed to `groups`; false on failure.
  bool open(std::uint32_t groups) {
    fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (fd_ < 0) return false;
    sockaddr_nl a{};
    a.nl_family = AF_NETLINK;
    a.nl_groups = groups;
    return bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  int fd() const { return fd_; }

  // Sends `req` and hands every answer to `each` until the ACK, DONE or error. 0 or -errno.
  int transact(nlmsghdr* req, const std::function<void(const nlmsghdr*)>& each) {
    req->nlmsg_seq = ++seq_;
    if (send(fd_, req, req->nlmsg_len, 0) < 0) return -errno;
    alignas(nlmsghdr) char buf[16384];
    for (;;) {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return -errno;
      }
      auto len = static_cast<unsigned>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
        if (h->nlmsg_seq != seq_) continue;
        if (h->nlmsg_type == NLMSG_ERROR) {
          return reinterpret_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;  // 0: the ACK
        }
        if (h->nlmsg_type == NLMSG_DONE) return 0;
        each(h);
        if ((h->nlmsg_flags & NLM_F_MULTI) == 0 && (req->nlmsg_flags & NLM_F_ACK) == 0) return 0;
      }
    }
  }

 private:
  int fd_ = -1;
  std::uint32_t seq_ = 0;
};

// A request of a header, a family message and room for attributes.
template <class Body>
struct Request {
  nlmsghdr h;
  Body body;
  alignas(NLMSG_ALIGNTO) char attrs[64];

  Request(std::uint16_t type, std::uint16_t flags) {
    std::memset(this, 0, sizeof *this);
    h.nlmsg_len = NLMSG_LENGTH(sizeof(Body));
    h.nlmsg_type = type;
    h.nlmsg_flags = static_cast<std::uint16_t>(NLM_F_REQUEST | flags);
  }
  void add(std::uint16_t type, const void* data, std::size_t len) {
    auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(&h) + NLMSG_ALIGN(h.nlmsg_len));
    a->rta_type = type;
    a->rta_len = static_cast<std::uint16_t>(RTA_LENGTH(len));
    std::memcpy(RTA_DATA(a), data, len);
    h.nlmsg_len = NLMSG_ALIGN(h.nlmsg_len) + RTA_ALIGN(a->rta_len);
  }
};

// Calls `each(type, data, len)` for the attributes after `body` of `h`.
void attributes(const nlmsghdr* h, std::size_t body,
                const std::function<void(unsigned, const void*, std::size_t)>& each) {
  const auto* a =
      reinterpret_cast<const rtattr*>(static_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(body));
  int len = static_cast<int>(h->nlmsg_len) - static_cast<int>(NLMSG_LENGTH(body));
  for (; RTA_OK(a, len); a = RTA_NEXT(a, len)) each(a->rta_type, RTA_DATA(a), RTA_PAYLOAD(a));
}

struct Neighbour {
  bool found = false;
  std::uint16_t state = 0;
  bool has_mac = false;
  std::uint8_t mac[6] = {};
};

Neighbour get_neighbour(Netlink& nl, int ifindex, std::uint32_t ip) {
  Request<ndmsg> q(RTM_GETNEIGH, 0);
  q.body.ndm_family = AF_INET;
  q.body.ndm_ifindex = ifindex;
  const std::uint32_t dst = htonl(ip);
  q.add(NDA_DST, &dst, sizeof dst);
  Neighbour n;
  nl.transact(&q.h, [&](const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWNEIGH) return;
    n.found = true;
    n.state = static_cast<const ndmsg*>(NLMSG_DATA(h))->ndm_state;
    attributes(h, sizeof(ndmsg), [&](unsigned type, const void* data, std::size_t len) {
      if (type == NDA_LLADDR && len == 6) {
        std::memcpy(n.mac, data, 6);
        n.has_mac = true;
      }
    });
  });
  return n;
}

bool usable(const Neighbour& n) {
  constexpr std::uint16_t kValid =
      NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT | NUD_NOARP;
  return n.found && n.has_mac && (n.state & kValid) != 0;
}

// Makes the kernel create the entry and send its ARP request (NTF_USE: as if a packet had been
// routed to it). 0 or -errno.
int solicit(Netlink& nl, int ifindex, std::uint32_t ip) {
  Request<ndmsg> q(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_ACK);
  q.body.ndm_family = AF_INET;
  q.body.ndm_ifindex = ifindex;
  q.body.ndm_state = NUD_NONE;
  q.body.ndm_flags = NTF_USE;
  const std::uint32_t dst = htonl(ip);
  q.add(NDA_DST, &dst, sizeof dst);
  return nl.transact(&q.h, [](const nlmsghdr*) {});
}

}  // namespace

std::string resolve_next_hop(std::uint32_t leaf_ip, const std::string& interface,
                             std::uint32_t arp_timeout_ms, NextHop* out) {
  const std::string leaf = dotted(leaf_ip);
  Netlink nl, events;
  if (!nl.open(0) || !events.open(RTMGRP_NEIGH)) {
    return std::string("Opening a netlink socket failed: ") + std::strerror(errno) + ".";
  }
  NextHop r;
  // The route the kernel would take to the leaf.
  Request<rtmsg> q(RTM_GETROUTE, 0);
  q.body.rtm_family = AF_INET;
  q.body.rtm_dst_len = 32;
  const std::uint32_t dst = htonl(leaf_ip);
  q.add(RTA_DST, &dst, sizeof dst);
  int route_oif = 0;
  std::uint32_t route_gw = 0;
  unsigned char route_type = RTN_UNSPEC;
  const int e = nl.transact(&q.h, [&](const nlmsghdr* h) {
    if (h->nlmsg_type != RTM_NEWROUTE) return;
    route_type = static_cast<const rtmsg*>(NLMSG_DATA(h))->rtm_type;
    attributes(h, sizeof(rtmsg), [&](unsigned type, const void* data, std::size_t len) {
      if (type == RTA_OIF && len == 4) std::memcpy(&route_oif, data, 4);
      if (type == RTA_GATEWAY && len == 4) {
        std::memcpy(&route_gw, data, 4);
        route_gw = ntohl(route_gw);
      }
    });
  });
  if (interface.empty()) {
    if (e != 0 || route_oif == 0) {
      return "There is no route to the leaf switch at " + leaf +
             (e != 0 ? std::string(" (") + std::strerror(-e) + ")" : std::string()) + ".";
    }
    if (route_type == RTN_LOCAL) {
      return "The leaf switch's address " + leaf + " is one of this host's own.";
    }
    r.ifindex = route_oif;
    r.gateway = route_gw;
    char name[IF_NAMESIZE] = {};
    if (if_indextoname(static_cast<unsigned>(route_oif), name) == nullptr) {
      return "The interface of the route to " + leaf + " vanished.";
    }
    r.interface = name;
  } else {
    r.interface = interface;
    r.ifindex = static_cast<int>(if_nametoindex(interface.c_str()));
    if (r.ifindex == 0) return "There is no interface '" + interface + "' on this host.";
    if (e == 0 && route_oif == r.ifindex) r.gateway = route_gw;
  }

  // The interface's own MAC and MTU.
  const int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return std::string("socket failed: ") + std::strerror(errno) + ".";
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, r.interface.c_str(), IF_NAMESIZE - 1);
  const bool mac_ok = ioctl(s, SIOCGIFHWADDR, &ifr) == 0;
  if (mac_ok) std::memcpy(r.local_mac, ifr.ifr_hwaddr.sa_data, 6);
  const unsigned short hw_family = ifr.ifr_hwaddr.sa_family;
  const bool mtu_ok = ioctl(s, SIOCGIFMTU, &ifr) == 0;
  if (mtu_ok) r.mtu = static_cast<std::uint32_t>(ifr.ifr_mtu);
  close(s);
  if (!mac_ok || !mtu_ok || hw_family != 1 /* ARPHRD_ETHER */) {
    return "The interface '" + r.interface + "' is not an Ethernet interface.";
  }

  // The next hop's MAC: the kernel's entry, or ARP for it now.
  const std::uint32_t hop = r.gateway != 0 ? r.gateway : leaf_ip;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(arp_timeout_ms);
  bool asked = false;
  for (;;) {
    const Neighbour n = get_neighbour(nl, r.ifindex, hop);
    if (usable(n)) {
      std::memcpy(r.next_hop_mac, n.mac, 6);
      *out = r;
      return {};
    }
    if (n.found && (n.state & NUD_FAILED) != 0 && asked) break;
    if (!asked) {
      if (const int err = solicit(nl, r.ifindex, hop); err != 0) {
        return "Asking the kernel to resolve " + dotted(hop) + " on " + r.interface +
               " failed: " + std::strerror(-err) + ".";
      }
      asked = true;
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    // Wait for a neighbour notification (any: the entry is read again).
    pollfd p{events.fd(), POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) > 0) {
      char buf[8192];
      while (recv(events.fd(), buf, sizeof buf, MSG_DONTWAIT) > 0) {
      }
    }
  }
  return "No ARP answer from " + dotted(hop) +
         (r.gateway != 0 ? " (the gateway to " + leaf + ")" : "") + " on " + r.interface +
         " within " + std::to_string(arp_timeout_ms) +
         " ms; check that the leaf switch runs and the route to it (ip route get " + leaf + ").";
}

}  // namespace treeduce::host
