/// @file
/// The treeduce wire format: Ethernet / IPv4 / UDP / treeduce header / payload.
///
/// docs/protocol.md is the normative description; this file must agree with it. One packed struct
/// per header (as in DPDK lib/net/rte_udp.h); every multi-byte field is a big-endian type (be16,
/// be32, be64) that is read with get() and written with set(), so a field can neither be used
/// without its conversion nor converted twice. Frames are byte arrays of unknown alignment, so
/// headers are copied in and out with std::memcpy (load_header / store_header) rather than cast:
/// no alignment or aliasing questions, and the compiler turns a 32-byte memcpy into two vector
/// moves.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/protocol/reasons.h"

namespace treeduce::proto {

/// Host to network (big-endian) byte order and back; the same operation both ways.
constexpr std::uint16_t bswap_be(std::uint16_t v) noexcept {
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap16(v);
  return v;
}
constexpr std::uint32_t bswap_be(std::uint32_t v) noexcept {
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap32(v);
  return v;
}
constexpr std::uint64_t bswap_be(std::uint64_t v) noexcept {
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap64(v);
  return v;
}

/// A big-endian field of a wire header: holds the bytes as they are on the wire. No implicit
/// conversion either way: get() reads the value, set() stores one.
template <class T>
struct [[gnu::packed]] BigEndian {
  T raw;  ///< the field's bytes as on the wire
  constexpr T get() const noexcept { return bswap_be(raw); }
  constexpr void set(T v) noexcept { raw = bswap_be(v); }
  static constexpr BigEndian of(T v) noexcept { return BigEndian{bswap_be(v)}; }
  bool operator==(const BigEndian&) const = default;
};
using be16 = BigEndian<std::uint16_t>;
using be32 = BigEndian<std::uint32_t>;
using be64 = BigEndian<std::uint64_t>;
static_assert(sizeof(be16) == 2 && sizeof(be32) == 4 && sizeof(be64) == 8 && alignof(be64) == 1);

/// Ethernet II header (no VLAN tag).
struct [[gnu::packed]] EtherHdr {
  std::uint8_t dst[6];  ///< destination MAC
  std::uint8_t src[6];  ///< source MAC
  be16 ether_type;      ///< 0x0800 for IPv4
};
static_assert(sizeof(EtherHdr) == 14 && alignof(EtherHdr) == 1);

/// IPv4 header without options (treeduce never sends options and drops packets that carry them).
struct [[gnu::packed]] Ipv4Hdr {
  std::uint8_t version_ihl;  ///< 0x45: version 4, 5 words
  std::uint8_t tos;          ///< DSCP/ECN; sent as 0, ignored on receive
  be16 total_length;         ///< IPv4 header + UDP + treeduce + payload
  be16 packet_id;            ///< sent as 0
  be16 fragment;             ///< flags + offset; DF (0x4000) sent, fragments dropped
  std::uint8_t ttl;          ///< sent as 64
  std::uint8_t protocol;     ///< 17 (UDP)
  be16 hdr_checksum;         ///< RFC 791 header checksum, verified on receive
  be32 src_addr;
  be32 dst_addr;
};
static_assert(sizeof(Ipv4Hdr) == 20 && alignof(Ipv4Hdr) == 1);

/// UDP header.
struct [[gnu::packed]] UdpHdr {
  be16 src_port;
  be16 dst_port;     ///< the switch's configured port for packets to a switch
  be16 dgram_len;    ///< UDP header + treeduce header + payload
  be16 dgram_cksum;  ///< 0 (no checksum, legal for IPv4); not verified on receive
};
static_assert(sizeof(UdpHdr) == 8 && alignof(UdpHdr) == 1);

/// Protocol version carried in TdHdr::version. A switch drops (and NACKs) any other value.
inline constexpr std::uint8_t kProtocolVersion = 1;
/// Default UDP port of treeduce switches (configurable per switch).
inline constexpr std::uint16_t kDefaultUdpPort = 47110;

/// TdHdr::opcode values. Never renumber: they are on the wire.
enum class Opcode : std::uint8_t {
  contrib = 1,  ///< a child's contribution (host data or a switch's partial), travels up
  result = 2,   ///< the reduced result of a chunk, travels down (multicast or unicast)
  nack = 3,     ///< a switch refuses a CONTRIB; TdHdr::reason says why; no payload
};

/// TdHdr::dtype and TdHdr::op carry treeduce::DType and treeduce::ReduceOp (aggregation/dtype.h)
/// by value; these are their wire codes (append only).
static_assert(static_cast<int>(DType::f32) == 0 && static_cast<int>(DType::f16) == 1 &&
              static_cast<int>(DType::bf16) == 2 && static_cast<int>(DType::e4m3) == 3 &&
              static_cast<int>(DType::e5m2) == 4 && static_cast<int>(DType::i32) == 5);
static_assert(static_cast<int>(ReduceOp::sum) == 0 && static_cast<int>(ReduceOp::min) == 1 &&
              static_cast<int>(ReduceOp::max) == 2);

/// The treeduce header, 32 bytes, big-endian multi-byte fields.
struct [[gnu::packed]] TdHdr {
  std::uint8_t version;   ///< kProtocolVersion
  std::uint8_t opcode;    ///< Opcode
  std::uint8_t dtype;     ///< treeduce::DType of the payload elements
  std::uint8_t op;        ///< treeduce::ReduceOp
  be16 tree_id;           ///< tree, unique per switch, installed by the control plane
  be16 child;             ///< CONTRIB: sender's child index at the receiver; else receiver's
  be16 slot;              ///< chunk mod slots (slots is a power of two)
  std::uint8_t slot_ver;  ///< (chunk / slots) mod 2: live/shadow version of the slot
  std::uint8_t reason;    ///< NACK: the Reason that refused the CONTRIB; else 0 (checked)
  be16 count;             ///< elements in the payload, 1..payload_bytes/dtype_size
  be16 ncontrib;          ///< hosts folded into this payload (1 from a host; total in RESULT)
  be32 chunk;             ///< position in the tree's packet stream; serial-number arithmetic
  be32 seq;               ///< collective sequence number (per tree, serial-number arithmetic)
  be64 key;               ///< per-job key, checked by every switch; a NACK's MAC (nack_mac)
};
static_assert(sizeof(TdHdr) == 32 && alignof(TdHdr) == 1);

/// Header bytes a NACK's MAC covers: everything in front of TdHdr::key.
inline constexpr std::size_t kNackMacCovered = offsetof(TdHdr, key);
static_assert(kNackMacCovered == 24);

/// The MAC a NACK carries in its `key` field (docs/protocol.md section 2, "The NACK's MAC"): the
/// first 8 bytes of HMAC-SHA256 whose key is `contrib_key`, the 8 key bytes of the refused CONTRIB
/// exactly as they were on the wire, over the first 24 bytes of the NACK's header (`nack`, every
/// field but `key` final). A host that sent the CONTRIB knows that key; a stranger who did not see
/// it cannot make a NACK the host accepts, and the job's key never travels back. Not on any fast
/// path: 0.8 us measured (four SHA-256 blocks, 2-core VM under load), once per refused CONTRIB
/// and per NACK received.
be64 nack_mac(be64 contrib_key, const TdHdr& nack) noexcept;

/// True when `nack`'s `key` field is nack_mac(`key`, `nack`): a switch refused a CONTRIB that
/// carried `key` (host order, as in EngineConfig). Compared in constant time.
bool nack_verifies(std::uint64_t key, const TdHdr& nack) noexcept;

/// Bytes in front of the payload in every treeduce frame.
inline constexpr std::size_t kFrameHeaderBytes =
    sizeof(EtherHdr) + sizeof(Ipv4Hdr) + sizeof(UdpHdr) + sizeof(TdHdr);
static_assert(kFrameHeaderBytes == 74);
inline constexpr std::size_t kMinPayloadBytes = 256;
inline constexpr std::size_t kMaxPayloadBytes = 8192;
inline constexpr std::size_t kMaxFrameBytes = kFrameHeaderBytes + kMaxPayloadBytes;

/// Copy a header out of / into a frame at `p` (any alignment).
template <class H>
inline H load_header(const std::uint8_t* p) noexcept {
  H h;
  std::memcpy(&h, p, sizeof(H));
  return h;
}
template <class H>
inline void store_header(std::uint8_t* p, const H& h) noexcept {
  std::memcpy(p, &h, sizeof(H));
}

/// A node's address on the fabric: where to send frames and what to expect as their source.
struct Endpoint {
  std::uint8_t mac[6] = {};
  std::uint32_t ip = 0;    ///< host byte order
  std::uint16_t port = 0;  ///< host byte order
  bool operator==(const Endpoint&) const = default;
};

/// RFC 1071 Internet checksum of `len` bytes (an odd last byte is padded with zero); 0 when a
/// message that carries its own checksum is intact.
std::uint16_t inet_checksum(const std::uint8_t* p, std::size_t len) noexcept;

/// inet_checksum() of an IPv4 header (20 bytes); 0 when the stored checksum is right.
std::uint16_t ipv4_checksum(const Ipv4Hdr& ip) noexcept;

/// Write Ethernet + IPv4 + UDP headers for a datagram of `udp_payload_bytes` (treeduce header +
/// payload) from `src` to `dst` into `out` (42 bytes), with a correct IPv4 checksum.
void write_l2_l4(std::uint8_t* out, const Endpoint& src, const Endpoint& dst,
                 std::size_t udp_payload_bytes) noexcept;

/// A parsed frame: host-order copies of what the core needs and a pointer to the payload.
struct Parsed {
  TdHdr td;                    ///< as on the wire
  std::uint32_t src_ip = 0;    ///< host order
  std::uint32_t dst_ip = 0;    ///< host order
  std::uint16_t src_port = 0;  ///< host order
  std::uint8_t src_mac[6] = {};
  const std::uint8_t* payload = nullptr;
  std::size_t payload_len = 0;
};

/// Parse and validate a whole frame addressed to `self` (IPv4 address and UDP port). Every length
/// is checked against `len`; never reads outside [frame, frame+len). Trailing bytes after the IPv4
/// datagram (Ethernet padding) are ignored. The payload's length is what the UDP length leaves
/// after the treeduce header; checking it against TdHdr::count is the caller's job (it needs the
/// dtype). Returns Reason::none for a frame to use, or the first framing check that failed
/// (too_short .. not_for_us, docs/protocol.md section 4 step 1), or bad_version: then `out` is
/// filled all the same, so that the caller can NACK.
Reason parse_frame(const std::uint8_t* frame, std::size_t len, std::uint32_t self_ip,
                   std::uint16_t self_port, Parsed* out) noexcept;

/// Build a whole frame: L2-L4 headers from `src` to `dst`, the treeduce header `td`, and
/// `payload_len` bytes of payload. `out` must hold kFrameHeaderBytes + payload_len bytes. Returns
/// the frame length.
std::size_t build_frame(std::uint8_t* out, const Endpoint& src, const Endpoint& dst,
                        const TdHdr& td, const void* payload, std::size_t payload_len) noexcept;

/// Serial-number comparison (RFC 1982) for chunk and seq: true when a is after b.
constexpr bool serial_after(std::uint32_t a, std::uint32_t b) noexcept {
  return static_cast<std::int32_t>(a - b) > 0;
}

/// True for payload sizes a tree may use: a power of two in [256, 8192].
constexpr bool valid_payload_bytes(std::size_t b) noexcept {
  return b >= kMinPayloadBytes && b <= kMaxPayloadBytes && std::has_single_bit(b);
}

}  // namespace treeduce::proto
