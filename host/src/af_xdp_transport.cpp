// The AF_XDP transport; design, modes and requirements in af_xdp_transport.h.
#include "af_xdp_transport.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <net/if.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xdp/xsk.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "debug_env.h"
#include "next_hop.h"
#include "treeduce/protocol/wire.h"

// AF_XDP multi-buffer (Linux 6.6), newer than Debian 12's kernel headers.
#ifndef XDP_USE_SG
#define XDP_USE_SG (1 << 4)
#endif
#ifndef XDP_PKT_CONTD
#define XDP_PKT_CONTD (1 << 0)
#endif

namespace treeduce::host {

namespace detail {

FramePool::FramePool(std::uint64_t first, std::uint32_t count, std::uint32_t frame_bytes)
    : first_(first), count_(count), frame_bytes_(frame_bytes), is_free_(count, true) {
  stack_.reserve(count);
  // Lowest address on top: the first frames taken are the first in memory.
  for (std::uint32_t i = count; i-- > 0;) stack_.push_back(first + std::uint64_t{i} * frame_bytes);
}

bool FramePool::take(std::uint64_t* addr) noexcept {
  if (stack_.empty()) return false;
  *addr = stack_.back();
  stack_.pop_back();
  is_free_[(*addr - first_) / frame_bytes_] = false;
  return true;
}

bool FramePool::give_back(std::uint64_t addr) noexcept {
  if (addr < first_ || (addr - first_) % frame_bytes_ != 0) return false;
  const std::uint64_t i = (addr - first_) / frame_bytes_;
  if (i >= count_ || is_free_[i]) return false;
  is_free_[i] = true;
  stack_.push_back(addr);
  return true;
}

namespace {

// The program's maps and counters (xdp/treeduce_xdp.bpf.c).
struct Match {
  std::uint32_t ip;    // network order
  std::uint16_t port;  // network order
  std::uint16_t pad;
};

std::uint64_t counter(bpf_object* obj, std::uint32_t which) {
  bpf_map* m = obj != nullptr ? bpf_object__find_map_by_name(obj, "td_counts") : nullptr;
  std::uint64_t v = 0;
  if (m != nullptr) bpf_map_lookup_elem(bpf_map__fd(m), &which, &v);
  return v;
}

}  // namespace

LoadedXdpProgram::~LoadedXdpProgram() { bpf_object__close(obj_); }

std::string LoadedXdpProgram::load(std::uint32_t ip, std::uint16_t port, bool frags) {
  bpf_object__close(obj_);  // a load again replaces the last
  bpf_object_open_opts o;
  detail::init_bpf_opts(&o);
  o.object_name = "treeduce_xdp";
  obj_ = bpf_object__open_mem(kTreeduceXdpObject, kTreeduceXdpObjectSize, &o);
  if (obj_ == nullptr) {
    return std::string("Opening the embedded XDP program failed: ") + std::strerror(errno) + ".";
  }
  if (frags) {
    // Frames longer than one buffer (multi-buffer XDP): the program reads only the headers, in
    // the first buffer, so it takes them as they are.
    bpf_program* p = bpf_object__find_program_by_name(obj_, "treeduce_xdp");
    if (p != nullptr) bpf_program__set_flags(p, bpf_program__flags(p) | BPF_F_XDP_HAS_FRAGS);
  }
  if (const int e = bpf_object__load(obj_); e != 0) {
    bpf_object__close(obj_);
    obj_ = nullptr;
    return std::string("The kernel refused the XDP program (") + std::strerror(-e) +
           (e == -EPERM ? "; loading BPF needs CAP_BPF or CAP_SYS_ADMIN" : "") + ").";
  }
  const Match m{htonl(ip), htons(port), 0};
  const std::uint32_t zero = 0;
  bpf_map* match = bpf_object__find_map_by_name(obj_, "td_match");
  if (match == nullptr || bpf_map_update_elem(bpf_map__fd(match), &zero, &m, BPF_ANY) != 0) {
    return std::string("Setting the XDP program's address failed: ") + std::strerror(errno) + ".";
  }
  return {};
}

int LoadedXdpProgram::program_fd() const noexcept {
  bpf_program* p = bpf_object__find_program_by_name(obj_, "treeduce_xdp");
  return p != nullptr ? bpf_program__fd(p) : -1;
}

int LoadedXdpProgram::xsk_map_fd() const noexcept {
  return bpf_object__find_map_fd_by_name(obj_, "td_xsks");
}

std::uint64_t LoadedXdpProgram::matched() const noexcept { return counter(obj_, 0); }
std::uint64_t LoadedXdpProgram::no_socket() const noexcept { return counter(obj_, 1); }

}  // namespace detail

namespace {

constexpr std::size_t kBatch = 64;
// Descriptors held per returned datagram on average: one of ours (8266 bytes in 4 KiB frames
// less the kernel's headroom) takes 3; a foreign frame up to the MTU may take up to 17.
constexpr std::size_t kMaxDescs = 4;
// A full TX ring gets this long to drain before the rest of the batch counts as lost (as a full
// socket buffer does in the UDP transport).
constexpr auto kTxDrainBound = std::chrono::milliseconds(100);

std::string mac_text(const std::uint8_t m[6]) {
  char b[18];
  std::snprintf(b, sizeof b, "%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
  return b;
}

class AfXdpTransport final : public Transport {
 public:
  ~AfXdpTransport() override {
    // What the kernel dropped on the way to the socket, with TREEDUCE_DEBUG (docs/host.md,
    // "Logging").
    if (xsk_ != nullptr && debug_on(std::getenv("TREEDUCE_DEBUG"))) {
      xdp_statistics st{};
      socklen_t len = sizeof st;
      if (getsockopt(xsk_socket__fd(xsk_), SOL_XDP, XDP_STATISTICS, &st, &len) == 0) {
        std::fprintf(stderr,
                     "treeduce: debug: af_xdp on %s: %llu dropped, %llu invalid, %llu RX ring "
                     "full, %llu fill ring empty, %llu matched on a queue without the socket\n",
                     ifname_.c_str(), static_cast<unsigned long long>(st.rx_dropped),
                     static_cast<unsigned long long>(st.rx_invalid_descs + st.tx_invalid_descs),
                     static_cast<unsigned long long>(st.rx_ring_full),
                     static_cast<unsigned long long>(st.rx_fill_ring_empty_descs),
                     static_cast<unsigned long long>(program_.no_socket()));
      }
    }
    if (xsk_ != nullptr) xsk_socket__delete(xsk_);
    if (link_fd_ >= 0) close(link_fd_);
    if (umem_ != nullptr) xsk_umem__delete(umem_);
    if (area_ != nullptr) munmap(area_, area_bytes_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  std::string open(const AfXdpTransportOptions& opt) {
    in_addr a{};
    if (inet_pton(AF_INET, opt.local_address.c_str(), &a) != 1 || a.s_addr == 0) {
      return "The local address '" + opt.local_address +
             "' is not an IPv4 address of this host (the af_xdp transport needs one: set "
             "TREEDUCE_BIND).";
    }
    self_.ip = ntohl(a.s_addr);
    if (opt.port == 0) return "The local UDP port must be from 1 to 65535, not 0.";
    self_.port = opt.port;
    if (!parse_ipv4_endpoint(opt.leaf_address, &leaf_.ip, &leaf_.port)) {
      return "The leaf switch address '" + opt.leaf_address + "' is not a.b.c.d:port.";
    }
    const std::size_t frame = proto::kFrameHeaderBytes + opt.payload_bytes;
    // A UMEM frame holds the kernel's XDP headroom and one whole Ethernet frame.
    chunk_ = frame + XDP_PACKET_HEADROOM <= 2048 ? 2048 : 4096;
    if (opt.payload_bytes == 0 || opt.payload_bytes > proto::kMaxPayloadBytes) {
      return "The payload size must be from 1 to " + std::to_string(proto::kMaxPayloadBytes) +
             " bytes, not " + std::to_string(opt.payload_bytes) + ".";
    }
    // A frame longer than one UMEM frame goes in several buffers (AF_XDP multi-buffer).
    sg_ = frame + XDP_PACKET_HEADROOM > chunk_;
    frame_bytes_ = frame;
    if (sg_) {
      rx_copy_.resize(kBatch * frame);
    }
    if (opt.frames < 128 || opt.frames > 65536 || (opt.frames & (opt.frames - 1)) != 0) {
      return "The UMEM must have a power of two from 128 to 65536 frames, not " +
             std::to_string(opt.frames) + ".";
    }
    payload_bytes_ = opt.payload_bytes;

    NextHop hop;
    if (std::string e = resolve_next_hop(leaf_.ip, opt.interface, opt.arp_timeout_ms, &hop);
        !e.empty()) {
      return e;
    }
    std::memcpy(self_.mac, hop.local_mac, 6);
    std::memcpy(leaf_.mac, hop.next_hop_mac, 6);
    if (frame - sizeof(proto::EtherHdr) > hop.mtu) {
      return "A " + std::to_string(frame - sizeof(proto::EtherHdr)) +
             "-byte IPv4 datagram exceeds the MTU of " + hop.interface + " (" +
             std::to_string(hop.mtu) + "); use a smaller payload size or a larger MTU.";
    }
    ifname_ = hop.interface;
    ifindex_ = hop.ifindex;
    queue_ = opt.queue;

    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return std::string("eventfd failed: ") + std::strerror(errno) + ".";
    // The program takes multi-buffer frames whenever the kernel can (Linux 5.18): native XDP
    // on veth refuses a program without them above an MTU of about a page. Where the kernel
    // cannot, and frames fit one buffer, without.
    if (std::string e = program_.load(self_.ip, self_.port, true); !e.empty()) {
      if (sg_) return e;
      if (std::string e2 = program_.load(self_.ip, self_.port, false); !e2.empty()) return e2;
    }
    if (std::string e = attach(opt.mode); !e.empty()) return e;

    rx_frames_ = opt.frames / 2;
    tx_frames_ = opt.frames - rx_frames_;
    area_bytes_ = std::size_t{opt.frames} * chunk_;
    void* area = mmap(nullptr, area_bytes_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (area == MAP_FAILED) {
      return "Mapping the " + std::to_string(area_bytes_ >> 20) +
             " MiB UMEM failed: " + std::strerror(errno) + ".";
    }
    area_ = static_cast<std::uint8_t*>(area);
    if (std::string e = bind_socket(opt.mode); !e.empty()) return e;
    if (const int e = xsk_socket__update_xskmap(xsk_, program_.xsk_map_fd()); e != 0) {
      return "Putting the AF_XDP socket in the XDP program's map failed: " +
             std::string(std::strerror(-e)) + ".";
    }
    // Every RX frame to the fill ring; the TX frames are the pool's.
    std::uint32_t idx = 0;
    if (xsk_ring_prod__reserve(&fill_, rx_frames_, &idx) != rx_frames_) {
      return "The AF_XDP fill ring has no room for its frames.";
    }
    for (std::uint32_t i = 0; i < rx_frames_; ++i) {
      *xsk_ring_prod__fill_addr(&fill_, idx + i) = std::uint64_t{i} * chunk_;
    }
    xsk_ring_prod__submit(&fill_, rx_frames_);
    tx_pool_ =
        std::make_unique<detail::FramePool>(std::uint64_t{rx_frames_} * chunk_, tx_frames_, chunk_);
    std::fprintf(stderr,
                 "treeduce: info: af_xdp transport on %s queue %u: %s; %s:%u to leaf %s:%u via "
                 "%s\n",
                 ifname_.c_str(), queue_, mode_.c_str(), opt.local_address.c_str(), self_.port,
                 opt.leaf_address.substr(0, opt.leaf_address.rfind(':')).c_str(), leaf_.port,
                 mac_text(leaf_.mac).c_str());
    return {};
  }

  const TransportStats& stats() const noexcept override { return stats_; }
  std::size_t batch() const noexcept override { return kBatch; }
  void wake() noexcept override { eventfd_write(wake_fd_, 1); }

  std::string send(const OutPacket* p, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) {
      if (p[i].payload_len > payload_bytes_) {
        return "A " + std::to_string(sizeof(proto::TdHdr) + p[i].payload_len) +
               "-byte datagram exceeds the af_xdp transport's " +
               std::to_string(sizeof(proto::TdHdr) + payload_bytes_) +
               " bytes; use a smaller payload size.";
      }
    }
    std::size_t done = 0;
    auto deadline = std::chrono::steady_clock::time_point::max();
    while (done < n) {
      reap_completions();
      // As many packets as there are free frames for (one each, or several in multi-buffer).
      std::uint32_t k = 0, descs = 0;
      while (done + k < n) {
        const std::uint32_t d = descs_for(p[done + k]);
        if (descs + d > tx_pool_->free()) break;
        descs += d;
        ++k;
      }
      std::uint32_t idx = 0;
      if (descs != 0 && xsk_ring_prod__reserve(&tx_, descs, &idx) != descs) k = descs = 0;
      for (std::uint32_t j = 0; j < k; ++j) idx = put_frame(p[done + j], idx);
      if (k != 0) {
        xsk_ring_prod__submit(&tx_, descs);
        done += k;
        stats_.sent += k;
        deadline = std::chrono::steady_clock::time_point::max();
      }
      if (std::string e = kick(); !e.empty()) return e;
      if (done == n) break;
      if (k != 0) continue;
      // Every TX frame is in flight: wait for completions, within a bound.
      const auto now = std::chrono::steady_clock::now();
      if (deadline == std::chrono::steady_clock::time_point::max()) deadline = now + kTxDrainBound;
      if (now >= deadline) {
        stats_.send_errors += n - done;
        break;
      }
      pollfd pfd{xsk_socket__fd(xsk_), POLLOUT, 0};
      poll(&pfd, 1, 1);
    }
    return {};
  }

  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* error) override {
    release_held();
    reap_completions();
    std::size_t n = drain();
    if (n != 0 || timeout_ns == 0) return {rx_out_.data(), n};
    std::array<pollfd, 2> pfds{pollfd{wake_fd_, POLLIN, 0},
                               pollfd{xsk_socket__fd(xsk_), POLLIN, 0}};
    const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000u),
                      static_cast<long>(timeout_ns % 1'000'000'000u)};
    if (ppoll(pfds.data(), pfds.size(), &ts, nullptr) < 0) {
      if (errno != EINTR) {
        *error = std::string("ppoll on the AF_XDP socket failed: ") + std::strerror(errno) + ".";
      }
      return {};
    }
    if ((pfds[0].revents & POLLIN) != 0) {
      eventfd_t v;
      eventfd_read(wake_fd_, &v);
      return {};
    }
    n = drain();
    return {rx_out_.data(), n};
  }

 private:
  // Attaches the program in the mode asked for, or the best the interface takes (auto).
  std::string attach(XdpMode mode) {
    const bool try_native = mode != XdpMode::skb;
    const bool try_skb = mode == XdpMode::auto_select || mode == XdpMode::skb;
    int native_err = 0;
    for (const std::uint32_t flags :
         {std::uint32_t{XDP_FLAGS_DRV_MODE}, std::uint32_t{XDP_FLAGS_SKB_MODE}}) {
      if (flags == XDP_FLAGS_DRV_MODE ? !try_native : !try_skb) continue;
      bpf_link_create_opts lo;
      detail::init_bpf_opts(&lo);
      lo.flags = flags;
      link_fd_ = bpf_link_create(program_.program_fd(), ifindex_, BPF_XDP, &lo);
      if (link_fd_ >= 0) {
        native_ = flags == XDP_FLAGS_DRV_MODE;
        mode_ = native_ ? "native XDP" : "generic XDP (SKB mode)";
        if (!native_ && native_err != 0) {
          mode_ += std::string(", native refused: ") + std::strerror(-native_err);
        }
        return {};
      }
      const int e = link_fd_;
      if (e == -EBUSY || e == -EEXIST) {
        return "Another XDP program is already attached to " + ifname_ + " (ip link show " +
               ifname_ +
               "); the af_xdp transport needs the interface's XDP "
               "hook to itself.";
      }
      if (e == -EPERM || e == -EACCES) {
        return "Attaching an XDP program to " + ifname_ + " was refused (" + std::strerror(-e) +
               "); the af_xdp transport needs CAP_NET_ADMIN and CAP_BPF.";
      }
      if (flags == XDP_FLAGS_DRV_MODE) native_err = e;
      if (!try_skb || flags == XDP_FLAGS_SKB_MODE) {
        return "The kernel refused XDP on " + ifname_ + " (" + std::strerror(-e) + ", " +
               (flags == XDP_FLAGS_DRV_MODE ? "native mode: the driver may lack XDP; "
                                              "TREEDUCE_XDP_MODE=skb works on any interface"
                                            : "generic mode") +
               ").";
      }
    }
    return "No XDP mode was tried.";
  }

  std::string make_umem() {
    xsk_umem_config uc{};
    uc.fill_size = rx_frames_;
    uc.comp_size = tx_frames_;
    uc.frame_size = chunk_;
    uc.frame_headroom = 0;
    uc.flags = 0;
    const int e = xsk_umem__create(&umem_, area_, area_bytes_, &fill_, &comp_, &uc);
    if (e != 0) {
      umem_ = nullptr;
      return "Registering the " + std::to_string(area_bytes_ >> 20) + " MiB UMEM failed (" +
             std::strerror(-e) +
             (e == -ENOMEM || e == -EPERM
                  ? "; it needs CAP_IPC_LOCK or an RLIMIT_MEMLOCK above its size"
                  : "") +
             ").";
    }
    return {};
  }

  // The socket: zero-copy when the mode allows it and the driver takes it, else copy mode.
  std::string bind_socket(XdpMode mode) {
    const bool zc_first = native_ && (mode == XdpMode::auto_select || mode == XdpMode::native ||
                                      mode == XdpMode::zerocopy);
    std::string zc_refused;
    for (const bool zc : {true, false}) {
      if (zc && !zc_first) continue;
      if (!zc && mode == XdpMode::zerocopy) break;
      if (std::string e = make_umem(); !e.empty()) return e;
      xsk_socket_config sc{};
      sc.rx_size = rx_frames_;
      sc.tx_size = tx_frames_;
      sc.libxdp_flags = XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD;
      sc.bind_flags = static_cast<std::uint16_t>(
          XDP_USE_NEED_WAKEUP | (zc ? XDP_ZEROCOPY : XDP_COPY) | (sg_ ? XDP_USE_SG : 0));
      int e = xsk_socket__create(&xsk_, ifname_.c_str(), queue_, umem_, &rx_, &tx_, &sc);
      // The kernel lets go of a queue when the last socket on it is freed, in deferred work
      // after close (and after its copy-mode frames are freed): a transport made right after
      // another on the same queue finds it busy for a moment. Up to 2 s of that is waited out.
      for (int i = 0; i < 200 && e == -EBUSY; ++i) {
        usleep(10'000);
        e = xsk_socket__create(&xsk_, ifname_.c_str(), queue_, umem_, &rx_, &tx_, &sc);
      }
      if (e == 0) {
        mode_ += zc ? ", zero-copy" : ", copy mode";
        if (!zc && !zc_refused.empty()) mode_ += " (zero-copy refused: " + zc_refused + ")";
        return {};
      }
      xsk_ = nullptr;
      xsk_umem__delete(umem_);
      umem_ = nullptr;
      if (zc && mode != XdpMode::zerocopy) {
        zc_refused = std::strerror(-e);
        continue;
      }
      if (e == -EINVAL && sg_) {
        return "Binding an AF_XDP socket to " + ifname_ + " with frames of " +
               std::to_string(frame_bytes_) + " bytes failed (" + std::strerror(-e) +
               "); payloads above 2048 bytes need AF_XDP multi-buffer (Linux 6.6 or later): set "
               "TREEDUCE_PAYLOAD_BYTES=2048 or less.";
      }
      if (e == -EINVAL && queue_ != 0) {
        return "Binding an AF_XDP socket to queue " + std::to_string(queue_) + " of " + ifname_ +
               " failed (" + std::strerror(-e) + "); does the interface have that queue?";
      }
      return "Binding an AF_XDP socket to " + ifname_ + " queue " + std::to_string(queue_) +
             (zc ? " in zero-copy mode" : "") + " failed (" + std::strerror(-e) +
             (e == -EPERM   ? "; it needs CAP_NET_RAW"
              : e == -EBUSY ? "; another AF_XDP socket holds that queue"
              : zc ? "; the driver offers no zero-copy: TREEDUCE_XDP_MODE=auto falls back to copy"
                   : "") +
             ").";
    }
    return "The af_xdp transport was asked for zero-copy, which needs native XDP: " + mode_ + ".";
  }

  // TX descriptors (UMEM frames) the frame of `p` takes.
  std::uint32_t descs_for(const OutPacket& p) const noexcept {
    if (!sg_) return 1;
    const std::size_t len = proto::kFrameHeaderBytes + p.payload_len;
    return static_cast<std::uint32_t>((len + chunk_ - 1) / chunk_);
  }

  // Writes the frame of `p` into free TX frames at ring index `idx` on; the next index.
  std::uint32_t put_frame(const OutPacket& p, std::uint32_t idx) {
    const std::uint32_t nd = descs_for(p);
    std::uint64_t addr = 0;
    if (nd == 1) {
      tx_pool_->take(&addr);
      const std::size_t len =
          proto::build_frame(static_cast<std::uint8_t*>(xsk_umem__get_data(area_, addr)), self_,
                             leaf_, p.td, p.payload, p.payload_len);
      *xsk_ring_prod__tx_desc(&tx_, idx) = {addr, static_cast<std::uint32_t>(len), 0};
      return idx + 1;
    }
    // Multi-buffer: the headers written once, then headers and payload cut into UMEM frames,
    // every descriptor but the last marked as continued.
    std::uint8_t hdr[proto::kFrameHeaderBytes];
    proto::write_l2_l4(hdr, self_, leaf_, sizeof(proto::TdHdr) + p.payload_len);
    proto::store_header(hdr + sizeof hdr - sizeof(proto::TdHdr), p.td);
    const std::size_t len = sizeof hdr + p.payload_len;
    for (std::size_t off = 0; off < len; off += chunk_, ++idx) {
      tx_pool_->take(&addr);
      auto* dst = static_cast<std::uint8_t*>(xsk_umem__get_data(area_, addr));
      const std::size_t piece = std::min<std::size_t>(chunk_, len - off);
      std::size_t from_hdr = 0;  // bytes of this piece that are headers (first piece only)
      if (off < sizeof hdr) {
        from_hdr = std::min(piece, sizeof hdr - off);
        std::memcpy(dst, hdr + off, from_hdr);
      }
      if (from_hdr < piece) {
        std::memcpy(dst + from_hdr, p.payload + (off + from_hdr - sizeof hdr), piece - from_hdr);
      }
      *xsk_ring_prod__tx_desc(&tx_, idx) = {addr, static_cast<std::uint32_t>(piece),
                                            off + piece < len ? XDP_PKT_CONTD : 0u};
    }
    return idx;
  }

  // Makes the kernel send what the TX ring holds. In copy mode one sendto() sends a bounded
  // batch and says EAGAIN when more is left.
  std::string kick() {
    if (!xsk_ring_prod__needs_wakeup(&tx_)) return {};
    for (int i = 0; i < 1024; ++i) {
      if (sendto(xsk_socket__fd(xsk_), nullptr, 0, MSG_DONTWAIT, nullptr, 0) >= 0) return {};
      switch (errno) {
        case EAGAIN:
        case EINTR:
          continue;
        case EBUSY:    // the driver is busy with the ring: its next poll sends it
        case ENOBUFS:  // no skb for a copy: the frames stay in the ring for the next kick
        case ENETDOWN:
          return {};
        default:
          return std::string("sendto on the AF_XDP socket failed: ") + std::strerror(errno) + ".";
      }
    }
    return {};
  }

  void reap_completions() {
    std::uint32_t idx = 0;
    const std::uint32_t n = xsk_ring_cons__peek(&comp_, tx_frames_, &idx);
    for (std::uint32_t i = 0; i < n; ++i) {
      tx_pool_->give_back(*xsk_ring_cons__comp_addr(&comp_, idx + i));
    }
    if (n != 0) xsk_ring_cons__release(&comp_, n);
  }

  // The frames the last receive() returned go back to the fill ring.
  void release_held() {
    if (nheld_ == 0) return;
    std::uint32_t idx = 0;
    // The fill ring holds every RX frame, so there is always room for the ones we hold.
    if (xsk_ring_prod__reserve(&fill_, nheld_, &idx) != nheld_) return;
    for (std::uint32_t i = 0; i < nheld_; ++i)
      *xsk_ring_prod__fill_addr(&fill_, idx + i) = held_[i];
    xsk_ring_prod__submit(&fill_, nheld_);
    nheld_ = 0;
    if (xsk_ring_prod__needs_wakeup(&fill_)) {
      recvfrom(xsk_socket__fd(xsk_), nullptr, 0, MSG_DONTWAIT, nullptr, nullptr);
    }
  }

  // Up to kBatch datagrams from the RX ring, returned where they lie in their UMEM frames (or,
  // a frame in several buffers, copied together).
  std::size_t drain() {
    std::uint32_t idx = 0;
    const std::uint32_t k = xsk_ring_cons__peek(&rx_, kBatch * kMaxDescs, &idx);
    std::size_t out = 0;
    std::uint32_t i = 0;
    while (i < k && out < kBatch) {
      // The frame's descriptors: all but its last marked as continued.
      std::uint32_t last = i;
      while (last < k && (xsk_ring_cons__rx_desc(&rx_, idx + last)->options & XDP_PKT_CONTD) != 0)
        ++last;
      if (last == k) break;  // the rest of this frame is not in the ring yet
      // A long foreign frame (up to the interface's MTU) may take more buffers than are left
      // to hold: it waits for the next receive(), which starts with none held.
      if (nheld_ + (last - i + 1) > held_.size()) break;
      const xdp_desc* d = xsk_ring_cons__rx_desc(&rx_, idx + i);
      const auto* frame = static_cast<const std::uint8_t*>(xsk_umem__get_data(area_, d->addr));
      std::size_t len = d->len;
      const bool pieces = last != i;
      if (pieces) {
        std::uint8_t* copy = rx_copy_.data() + out * frame_bytes_;
        len = 0;
        for (std::uint32_t j = i; j <= last; ++j) {
          const xdp_desc* dj = xsk_ring_cons__rx_desc(&rx_, idx + j);
          if (len + dj->len <= frame_bytes_) {
            std::memcpy(copy + len, xsk_umem__get_data(area_, dj->addr), dj->len);
          }
          len += dj->len;
        }
        frame = copy;
      }
      for (std::uint32_t j = i; j <= last; ++j) {
        held_[nheld_++] = xsk_umem__extract_addr(xsk_ring_cons__rx_desc(&rx_, idx + j)->addr);
      }
      i = last + 1;
      proto::Parsed ps;
      // A frame in pieces longer than ours was not copied whole: foreign.
      const proto::Reason r = pieces && len > frame_bytes_
                                  ? proto::Reason::too_short
                                  : proto::parse_frame(frame, len, self_.ip, self_.port, &ps);
      if ((r != proto::Reason::none && r != proto::Reason::bad_version) || ps.src_ip != leaf_.ip ||
          ps.src_port != leaf_.port || ps.payload_len > payload_bytes_) {
        ++stats_.foreign;
        continue;
      }
      rx_out_[out++] = {ps.payload - sizeof(proto::TdHdr), sizeof(proto::TdHdr) + ps.payload_len};
      ++stats_.received;
    }
    if (i < k) xsk_ring_cons__cancel(&rx_, k - i);
    if (i != 0) xsk_ring_cons__release(&rx_, i);
    return out;
  }

  proto::Endpoint self_, leaf_;
  std::string ifname_;
  int ifindex_ = 0;
  std::uint32_t queue_ = 0;
  std::uint32_t payload_bytes_ = 0;
  std::uint32_t chunk_ = 2048;
  std::uint32_t rx_frames_ = 0, tx_frames_ = 0;
  bool native_ = false;
  std::string mode_;  // what was chosen, for the info line
  detail::LoadedXdpProgram program_;
  int link_fd_ = -1;
  int wake_fd_ = -1;
  std::uint8_t* area_ = nullptr;
  std::size_t area_bytes_ = 0;
  xsk_umem* umem_ = nullptr;
  xsk_socket* xsk_ = nullptr;
  xsk_ring_prod fill_{}, tx_{};
  xsk_ring_cons comp_{}, rx_{};
  std::unique_ptr<detail::FramePool> tx_pool_;
  bool sg_ = false;                    // frames span several UMEM frames (multi-buffer)
  std::size_t frame_bytes_ = 0;        // our largest frame
  std::vector<std::uint8_t> rx_copy_;  // multi-buffer: kBatch frames made contiguous
  std::array<std::uint64_t, kBatch * kMaxDescs> held_{};  // RX frames of the last receive()
  std::uint32_t nheld_ = 0;
  std::array<RxDatagram, kBatch> rx_out_{};
  TransportStats stats_;
};

}  // namespace

std::unique_ptr<Transport> make_af_xdp_transport(const AfXdpTransportOptions& opt,
                                                 std::string* error) {
  auto t = std::make_unique<AfXdpTransport>();
  *error = t->open(opt);
  return error->empty() ? std::move(t) : nullptr;
}

}  // namespace treeduce::host
