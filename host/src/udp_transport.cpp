#include "udp_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "debug_env.h"

namespace treeduce::host {

bool parse_ipv4_endpoint(const std::string& s, std::uint32_t* ip, std::uint16_t* port) {
  const auto colon = s.rfind(':');
  if (colon == std::string::npos) return false;
  in_addr a{};
  if (inet_pton(AF_INET, s.substr(0, colon).c_str(), &a) != 1) return false;
  const std::string p = s.substr(colon + 1);
  char* end = nullptr;
  const unsigned long v = std::strtoul(p.c_str(), &end, 10);
  if (p.empty() || *end != '\0' || v == 0 || v > 65535) return false;
  *ip = ntohl(a.s_addr);
  *port = static_cast<std::uint16_t>(v);
  return true;
}

namespace {

// Debug lines go to stderr only when TREEDUCE_DEBUG is set (docs/host.md, "Logging"): which
// offloads the kernel gave us is worth knowing when measuring, and noise otherwise.
void debug(const std::string& line) {
  static const bool on = debug_on(std::getenv("TREEDUCE_DEBUG"));
  if (on) std::fprintf(stderr, "treeduce: debug: %s\n", line.c_str());
}

std::string errno_sentence(const char* what) {
  return std::string(what) + " failed: " + std::strerror(errno) + ".";
}

// One GSO message carries at most 64 segments (the kernel's UDP_MAX_SEGMENTS) and at most a
// 64 KiB datagram in all.
constexpr std::size_t kMaxGsoSegments = 64;
constexpr std::size_t kMaxGsoBytes = 65000;
// A GRO receive buffer holds one coalesced super-datagram.
constexpr std::size_t kGroBufferBytes = 65536;
// A ppoll that returned within this found its datagrams already queued (it did not sleep).
constexpr std::int64_t kImmediateNs = 2000;

class UdpTransport final : public Transport {
 public:
  static constexpr std::size_t kBatch = 64;

  ~UdpTransport() override {
    for (const int fd : fds_) close(fd);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  std::string open(const UdpTransportOptions& opt) {
    std::uint16_t leaf_port = 0;
    std::uint32_t leaf_ip = 0;
    if (!parse_ipv4_endpoint(opt.leaf_address, &leaf_ip, &leaf_port)) {
      return "The leaf switch address '" + opt.leaf_address + "' is not a.b.c.d:port.";
    }
    leaf_ = sockaddr_in{};
    leaf_.sin_family = AF_INET;
    leaf_.sin_addr.s_addr = htonl(leaf_ip);
    leaf_.sin_port = htons(leaf_port);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_port = htons(opt.port);
    if (inet_pton(AF_INET, opt.bind_address.c_str(), &local.sin_addr) != 1) {
      return "The bind address '" + opt.bind_address + "' is not an IPv4 address.";
    }
    if (opt.send_ports < 1 || opt.send_ports > kBatch) {
      return "The number of UDP send ports must be from 1 to 64, not " +
             std::to_string(opt.send_ports) + ".";
    }
    segment_bytes_ = sizeof(proto::TdHdr) + opt.payload_bytes;
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return errno_sentence("eventfd");
    for (std::uint32_t i = 0; i < opt.send_ports; ++i) {
      const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) return errno_sentence("socket");
      fds_.push_back(fd);
      // DF on every datagram: the protocol requires it and switches drop fragments, so a
      // datagram too large for the path fails loudly (EMSGSIZE) instead of being fragmented.
      const int pmtu = IP_PMTUDISC_DO;
      setsockopt(fd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu, sizeof pmtu);
      sockaddr_in a = local;
      if (i != 0) a.sin_port = 0;  // extra send sockets: any port (see UdpTransportOptions)
      if (bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s:%u", opt.bind_address.c_str(), ntohs(a.sin_port));
        return std::string("Binding the UDP socket to ") + buf +
               " failed: " + std::strerror(errno) + ".";
      }
    }
    // A window's results arrive as one burst (slots x payload per rank); the kernel caps this at
    // net.core.rmem_max.
    const int rcvbuf = 8 << 20;
    setsockopt(fds_[0], SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    probe_offloads(opt.gso, opt.gro);
    // Receive buffers: one datagram each, or one coalesced super-datagram each with GRO.
    const std::size_t nbuf = gro_ ? 16 : kBatch;
    const std::size_t stride = gro_ ? kGroBufferBytes : segment_bytes_;
    rx_buf_.resize(nbuf * stride);
    rx_msgs_.resize(nbuf);
    rx_iov_.resize(nbuf);
    rx_addr_.resize(nbuf);
    rx_ctl_.resize(nbuf);
    for (std::size_t i = 0; i < nbuf; ++i) rx_iov_[i] = {rx_buf_.data() + i * stride, stride};
    rx_out_.resize(gro_ ? nbuf * (kGroBufferBytes / segment_bytes_ + 1) : nbuf);
    pfds_.resize(fds_.size() + 1);
    return {};
  }

  std::size_t batch() const noexcept override { return kBatch; }
  const TransportStats& stats() const noexcept override { return stats_; }

  void wake() noexcept override {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t r = write(wake_fd_, &one, sizeof one);
  }

  std::string send(const OutPacket* p, std::size_t n) override {
    // Group the packets by their slot's socket; within one socket they keep their order.
    const std::size_t nsock = fds_.size();
    for (std::size_t s = 0; s < nsock; ++s) {
      std::size_t k = 0;
      for (std::size_t i = 0; i < n; ++i) {
        if (nsock == 1 || p[i].td.slot.get() % nsock == s) order_[k++] = &p[i];
      }
      if (k == 0) continue;
      if (std::string err = send_socket(fds_[s], k); !err.empty()) return err;
    }
    return {};
  }

  // System calls per wait: a receive that waits costs a ppoll and a recvmmsg, plus a recvmmsg
  // before them when it looks first (drain_first_). Looking first pays when datagrams are
  // usually there already (a stream of results: one recvmmsg, no ppoll), and is a wasted call
  // when the caller has just sent and waits for the answer (a small allreduce: its result is one
  // round trip away). So it looks first only while that has been finding datagrams, or when
  // ppoll found them waiting (it returned at once).
  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* error) override {
    std::size_t n = 0;
    if (drain_first_ || timeout_ns == 0) {
      n = drain(error, nullptr);
      if (n != 0 || timeout_ns == 0 || !error->empty()) return {rx_out_.data(), n};
      drain_first_ = false;
    }
    pfds_[0] = {wake_fd_, POLLIN, 0};
    for (std::size_t i = 0; i < fds_.size(); ++i) pfds_[i + 1] = {fds_[i], POLLIN, 0};
    const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000u),
                      static_cast<long>(timeout_ns % 1'000'000'000u)};
    timespec t0{}, t1{};
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ppoll(pfds_.data(), pfds_.size(), &ts, nullptr) < 0) {
      if (errno != EINTR) *error = errno_sentence("ppoll on the UDP sockets");
      return {};
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if ((pfds_[0].revents & POLLIN) != 0) {
      std::uint64_t v;
      [[maybe_unused]] const ssize_t r = read(wake_fd_, &v, sizeof v);
      return {};
    }
    n = drain(error, &pfds_[1]);
    // Datagrams that were waiting when ppoll was called (it did not block): look first next time.
    const std::int64_t waited_ns =
        (t1.tv_sec - t0.tv_sec) * 1'000'000'000ll + (t1.tv_nsec - t0.tv_nsec);
    if (n != 0 && waited_ns < kImmediateNs) drain_first_ = true;
    return {rx_out_.data(), n};
  }

 private:
  void probe_offloads(bool want_gso, bool want_gro) {
    // Probing the socket options once is enough to know the kernel has them (Linux >= 4.18 for
    // GSO, 5.0 for GRO); a device that cannot segment is caught at the first send (EIO).
    int seg = static_cast<int>(segment_bytes_);
    gso_ = want_gso && setsockopt(fds_[0], SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0;
    if (gso_) {
      seg = 0;  // the size goes in each message's cmsg: a plain datagram stays plain
      setsockopt(fds_[0], SOL_UDP, UDP_SEGMENT, &seg, sizeof seg);
    }
    const int one = 1;
    gro_ = want_gro && setsockopt(fds_[0], SOL_UDP, UDP_GRO, &one, sizeof one) == 0;
    debug(std::string("UDP GSO ") +
          (gso_       ? "on"
           : want_gso ? "off (the kernel refused it)"
                      : "off") +
          ", GRO " +
          (gro_       ? "on"
           : want_gro ? "off (the kernel refused it)"
                      : "off") +
          ".");
  }

  // Build messages for order_[from, k): runs of same-size packets become one GSO message when
  // GSO is on, every other packet its own datagram. Returns the number of messages.
  std::size_t build(std::size_t from, std::size_t k) {
    const std::size_t max_segs =
        std::min(kMaxGsoSegments, std::max<std::size_t>(1, kMaxGsoBytes / segment_bytes_));
    std::size_t m = 0;
    for (std::size_t i = from; i < k; ++m) {
      const std::uint32_t len = order_[i]->payload_len;
      std::size_t segs = 1;
      if (gso_) {
        while (i + segs < k && segs < max_segs && order_[i + segs]->payload_len == len) ++segs;
      }
      for (std::size_t j = 0; j < segs; ++j) {
        tx_iov_[2 * (i + j)] = {const_cast<proto::TdHdr*>(&order_[i + j]->td),
                                sizeof(proto::TdHdr)};
        tx_iov_[2 * (i + j) + 1] = {const_cast<std::uint8_t*>(order_[i + j]->payload),
                                    order_[i + j]->payload_len};
      }
      msghdr& h = tx_msgs_[m].msg_hdr;
      h = msghdr{};
      h.msg_name = &leaf_;
      h.msg_namelen = sizeof leaf_;
      h.msg_iov = &tx_iov_[2 * i];
      h.msg_iovlen = 2 * segs;
      if (segs > 1) {
        // The kernel cuts the concatenated iovecs every gso_size bytes: each cut is one of our
        // datagrams, header and payload, without copying anything here.
        h.msg_control = tx_ctl_[m].buf;
        h.msg_controllen = sizeof tx_ctl_[m].buf;
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_UDP;
        c->cmsg_type = UDP_SEGMENT;
        c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
        const auto gso_size = static_cast<std::uint16_t>(sizeof(proto::TdHdr) + len);
        std::memcpy(CMSG_DATA(c), &gso_size, sizeof gso_size);
      }
      msg_first_[m] = i;
      msg_segs_[m] = segs;
      i += segs;
    }
    return m;
  }

  std::string send_socket(int fd, std::size_t k) {
    std::size_t nmsg = build(0, k);
    std::size_t done = 0;
    while (done < nmsg) {
      const int r = sendmmsg(fd, &tx_msgs_[done], static_cast<unsigned>(nmsg - done), 0);
      if (r > 0) {
        for (int j = 0; j < r; ++j) {
          const std::size_t segs = msg_segs_[done + static_cast<std::size_t>(j)];
          stats_.sent += segs;
          if (segs > 1) ++stats_.gso_sends;
        }
        done += static_cast<std::size_t>(r);
        continue;
      }
      const std::size_t segs = msg_segs_[done];
      switch (errno) {
        case EINTR:
          break;
        case EIO:
        case EINVAL:
        case EOPNOTSUPP:
          if (segs > 1) {
            // The device cannot segment (no checksum offload, xfrm, ...): plain datagrams from
            // here on, starting again with this message's packets.
            debug(std::string("UDP GSO send failed (") + std::strerror(errno) +
                  "); sending plain datagrams from now on.");
            gso_ = false;
            const std::size_t first = msg_first_[done];
            nmsg = build(first, k);
            done = 0;
            break;
          }
          return errno_sentence("sendmmsg to the leaf switch");
        case EAGAIN: {
          // Socket buffer full: wait briefly for room; if none comes, the packets count as lost
          // and the engine's timers send them again, so a stuck socket never blocks the thread.
          pollfd pfd{fd, POLLOUT, 0};
          if (poll(&pfd, 1, 100) <= 0) {
            for (std::size_t j = done; j < nmsg; ++j) stats_.send_errors += msg_segs_[j];
            return {};
          }
          break;
        }
        case ENOBUFS:
        case ENETUNREACH:
        case EHOSTUNREACH:
        case EHOSTDOWN:
        case ECONNREFUSED:  // an ICMP port unreachable from an earlier datagram (switch down)
        case EPERM:         // a firewall rule
          stats_.send_errors += segs;
          ++done;
          break;
        case EMSGSIZE:
          return "A " + std::to_string(segment_bytes_) +
                 "-byte datagram exceeds the path MTU to the leaf switch; use a smaller payload "
                 "size or a larger MTU.";
        default:
          return errno_sentence("sendmmsg to the leaf switch");
      }
    }
    return {};
  }

  // Read what is queued on every socket (`ready` null), or on those ppoll found readable
  // (`ready`: one pollfd per socket), without waiting; returns the datagrams found.
  std::size_t drain(std::string* error, const pollfd* ready) {
    std::size_t out = 0, used = 0;
    for (std::size_t s = 0; s < fds_.size(); ++s) {
      const int fd = fds_[s];
      if (ready != nullptr && (ready[s].revents & (POLLIN | POLLERR)) == 0) continue;
      const std::size_t room = rx_msgs_.size() - used;
      if (room == 0) {
        drain_first_ = true;  // a full batch: more may be queued
        break;
      }
      for (std::size_t i = used; i < rx_msgs_.size(); ++i) {
        msghdr& h = rx_msgs_[i].msg_hdr;
        h = msghdr{};
        h.msg_name = &rx_addr_[i];
        h.msg_namelen = sizeof rx_addr_[i];
        h.msg_iov = &rx_iov_[i];
        h.msg_iovlen = 1;
        if (gro_) {
          h.msg_control = rx_ctl_[i].buf;
          h.msg_controllen = sizeof rx_ctl_[i].buf;
        }
      }
      const int r =
          recvmmsg(fd, &rx_msgs_[used], static_cast<unsigned>(room), MSG_DONTWAIT, nullptr);
      if (r < 0) {
        // ECONNREFUSED: an ICMP error for an earlier send (the switch's port is closed). The
        // engine's timers decide when that is fatal, not one ICMP message.
        if (errno != EAGAIN && errno != EINTR && errno != ECONNREFUSED) {
          *error = errno_sentence("recvmmsg on the UDP socket");
          return out;
        }
        continue;
      }
      for (std::size_t i = used; i < used + static_cast<std::size_t>(r); ++i) {
        const msghdr& h = rx_msgs_[i].msg_hdr;
        const sockaddr_in& a = rx_addr_[i];
        const std::size_t len = rx_msgs_[i].msg_len;
        if (a.sin_addr.s_addr != leaf_.sin_addr.s_addr || a.sin_port != leaf_.sin_port ||
            (h.msg_flags & MSG_TRUNC) != 0) {
          ++stats_.foreign;
          continue;
        }
        const auto* data = static_cast<const std::uint8_t*>(rx_iov_[i].iov_base);
        std::size_t seg = len;
        if (gro_) {
          for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
               c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
            if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
              int v;
              std::memcpy(&v, CMSG_DATA(c), sizeof v);
              if (v > 0) seg = static_cast<std::size_t>(v);
            }
          }
        }
        // A coalesced super-datagram is the concatenation of datagrams of `seg` bytes each
        // (the last may be shorter).
        for (std::size_t off = 0; off < len && out < rx_out_.size(); off += seg) {
          rx_out_[out++] = {data + off, std::min(seg, len - off)};
          ++stats_.received;
        }
      }
      used += static_cast<std::size_t>(r);
      if (used == rx_msgs_.size()) drain_first_ = true;  // a full batch: more may be queued
    }
    return out;
  }

  struct Control {
    alignas(cmsghdr) char buf[CMSG_SPACE(sizeof(int))];
  };

  std::vector<int> fds_;
  int wake_fd_ = -1;
  sockaddr_in leaf_{};
  std::size_t segment_bytes_ = 0;
  bool gso_ = false, gro_ = false;
  bool drain_first_ = true;  // receive() looks before it waits (see receive())
  TransportStats stats_;
  // Send side: all sized for one batch, so sending allocates nothing.
  std::array<const OutPacket*, kBatch> order_{};
  std::array<iovec, 2 * kBatch> tx_iov_{};
  std::array<mmsghdr, kBatch> tx_msgs_{};
  std::array<Control, kBatch> tx_ctl_{};
  std::array<std::size_t, kBatch> msg_first_{}, msg_segs_{};
  // Receive side, allocated once in open().
  std::vector<std::uint8_t> rx_buf_;
  std::vector<mmsghdr> rx_msgs_;
  std::vector<iovec> rx_iov_;
  std::vector<sockaddr_in> rx_addr_;
  std::vector<Control> rx_ctl_;
  std::vector<RxDatagram> rx_out_;
  std::vector<pollfd> pfds_;
};

}  // namespace

std::unique_ptr<Transport> make_udp_transport(const UdpTransportOptions& opt, std::string* error) {
  auto t = std::make_unique<UdpTransport>();
  if (std::string err = t->open(opt); !err.empty()) {
    *error = err;
    return nullptr;
  }
  return t;
}

}  // namespace treeduce::host
