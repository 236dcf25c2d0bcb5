// The host library's AF_XDP transport (docs/host.md, "Transports"): the Transport interface of
// transport.h over one AF_XDP socket (libxdp's xsk API) on one queue of a kernel interface, for
// hosts where DPDK cannot own the NIC. Built when libxdp, libbpf and clang (for the XDP program)
// are found.
//
// - The XDP program (xdp/treeduce_xdp.bpf.c, compiled at build time and embedded) redirects to the
//   socket only IPv4/UDP frames to our address and port; ARP, the manager's gRPC connection and
//   everything else on the interface still reach the kernel. libxdp's own default program would
//   take every frame of the queue, so it is never loaded (XSK_LIBXDP_FLAGS__INHIBIT_PROG_LOAD).
//   The program is attached through a BPF link: it goes away with the process, even a killed one.
// - Mode: native XDP (XDP_FLAGS_DRV_MODE) with a zero-copy socket where the driver offers it,
//   else native with a copy-mode socket, else generic XDP (XDP_FLAGS_SKB_MODE, any interface,
//   veth included) in copy mode; or the one mode asked for. What was chosen is said on stderr
//   ("treeduce: info: ...") and by mode().
// - The UMEM belongs to the transport: frames of 2 KiB (4 KiB for payloads above 1024 bytes),
//   half of them in the fill ring for receiving, half for sending. A received datagram stays in
//   its UMEM frame until the next receive() (the engine's copy to the caller's buffer is the only
//   one); a sent frame comes back through the completion ring. Payloads above 2048 bytes take
//   several UMEM frames per packet (AF_XDP multi-buffer, XDP_USE_SG, Linux 6.6): headers and
//   payload are cut into them to send, and a frame is put together from them on receive.
// - Frames are Ethernet/IPv4/UDP written by proto::build_frame, as the DPDK and verbs transports
//   write theirs; received frames go through proto::parse_frame. The leaf switch's MAC (or its
//   gateway's) comes from the kernel's neighbour table (next_hop.h): the kernel does ARP.
// - receive() waits in poll() on the socket and an eventfd (wake()); send() kicks the kernel
//   with sendto() only when the TX ring says it needs a wake-up (always in copy mode). No thread
//   spins.
// - Needs CAP_NET_ADMIN and CAP_NET_RAW (attaching XDP, the socket), CAP_BPF or CAP_SYS_ADMIN
//   (loading the program), and CAP_IPC_LOCK or an RLIMIT_MEMLOCK above the UMEM (8 MiB at 2 KiB
//   frames, 16 MiB at 4 KiB) on kernels that still charge it. Linux 5.9 or later (XDP links).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "transport.h"

struct bpf_object;  // libbpf's

namespace treeduce::host {

struct AfXdpTransportOptions {
  std::string interface;  ///< "" = the interface of the route to the leaf switch
  std::uint32_t queue = 0;
  XdpMode mode = XdpMode::auto_select;
  std::string local_address;  ///< our IPv4 address; RESULTs come to local_address:port
  std::uint16_t port = 0;
  std::string leaf_address;  ///< "a.b.c.d:port" of the leaf switch
  std::uint32_t payload_bytes = 1024;
  std::uint32_t frames = 4096;          ///< UMEM frames, a power of two from 128 to 65536
  std::uint32_t arp_timeout_ms = 3000;  ///< waiting for the kernel to resolve the next hop
};

/// The AF_XDP transport. nullptr and one sentence in `*error` on failure (no such interface, no
/// route or ARP answer, the kernel refusing the program or the socket, with what to check).
std::unique_ptr<Transport> make_af_xdp_transport(const AfXdpTransportOptions& opt,
                                                 std::string* error);

namespace detail {

/// What libbpf's LIBBPF_OPTS does for an options struct `*o` (every byte zero, padding too: libbpf
/// checks that the bytes past the fields it knows are zero; then `sz`), without the GNU statement
/// expression that a clang -Werror build refuses.
template <class T>
void init_bpf_opts(T* o) {
  std::memset(o, 0, sizeof *o);
  o->sz = sizeof *o;
}

/// The XDP program's object file, embedded at build time (generated source).
extern const unsigned char kTreeduceXdpObject[];
extern const std::size_t kTreeduceXdpObjectSize;

/// A free list of UMEM frame addresses, the transport's accounting of its TX frames: a frame is
/// taken for each packet sent and given back when the completion ring returns it. Giving back an
/// address that is not one of the list's own frames, or one that is already free, is refused
/// (false): a completion the kernel should never send.
class FramePool {
 public:
  /// Frames `first` .. `first + count - 1` of `frame_bytes` each, all free.
  FramePool(std::uint64_t first, std::uint32_t count, std::uint32_t frame_bytes);
  /// A free frame's address, or false when every frame is in flight.
  bool take(std::uint64_t* addr) noexcept;
  bool give_back(std::uint64_t addr) noexcept;
  std::uint32_t free() const noexcept { return static_cast<std::uint32_t>(stack_.size()); }
  std::uint32_t in_flight() const noexcept { return count_ - free(); }

 private:
  std::uint64_t first_;
  std::uint32_t count_, frame_bytes_;
  std::vector<std::uint64_t> stack_;
  std::vector<bool> is_free_;
};

/// The embedded XDP program loaded (not attached) with `ip`/`port` (host order) as what it
/// redirects: for tests that run it with BPF_PROG_TEST_RUN. Frees itself.
class LoadedXdpProgram {
 public:
  ~LoadedXdpProgram();
  /// "" or a sentence. `frags`: the program takes frames in several buffers (multi-buffer XDP,
  /// Linux 5.18). Loading again replaces what was loaded.
  std::string load(std::uint32_t ip, std::uint16_t port, bool frags = false);
  int program_fd() const noexcept;
  int xsk_map_fd() const noexcept;
  /// The program's counters: frames that matched, and of those, found no socket.
  std::uint64_t matched() const noexcept;
  std::uint64_t no_socket() const noexcept;

 private:
  ::bpf_object* obj_ = nullptr;
};

}  // namespace detail

}  // namespace treeduce::host
