// libFuzzer target over the frame parser and the slot state machine of dp::Core.
//
// Input: byte 0 picks the tree (children, slots, root or not, deterministic); then records:
//   0 len_hi len_lo bytes...   a raw frame (parser and every early check)
//   1 child chunk seq count v  a well-formed CONTRIB from a child's address (reaches the slots)
//   2 chunk seq count v        a well-formed RESULT from the parent's address
//   3 field value              a well-formed CONTRIB with one header byte overwritten
//   4                          remove and reinstall the tree
// After every frame the slot bookkeeping must be consistent and every output frame must parse at
// its destination; a violation traps, which libFuzzer reports as a crash.
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "treeduce/dataplane/core.h"

namespace {

using namespace treeduce;
using namespace treeduce::dp;

Endpoint ep(std::uint32_t n, std::uint16_t port) {
  Endpoint e;
  e.mac[0] = 0x02;
  e.mac[5] = static_cast<std::uint8_t>(n);
  e.ip = 0x0A000000 + n;
  e.port = port;
  return e;
}

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  bool empty() const { return n == 0; }
  std::uint8_t u8() {
    if (n == 0) return 0;
    --n;
    return *p++;
  }
};

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Reader r{data, size};
  const std::uint8_t sel = r.u8();
  const Endpoint self = ep(1, kDefaultUdpPort);
  const Endpoint parent = ep(2, kDefaultUdpPort);
  TreeConfig tc;
  tc.tree_id = 9;
  tc.key = 0xABCD;
  const std::uint16_t nchildren = static_cast<std::uint16_t>(1 + (sel & 7));
  for (std::uint16_t i = 0; i < nchildren; ++i) {
    tc.children.push_back({ep(100 + i, 5000), static_cast<std::uint16_t>(1 + (i & 1))});
  }
  tc.slots = 1u << ((sel >> 3) & 3);
  tc.role = (sel & 0x20) != 0 ? Role::root : Role::inner;
  if (tc.role != Role::root) tc.parent = parent;  // a root has no parent (proto::validate_tree)
  tc.deterministic = (sel & 0x40) != 0;
  tc.payload_bytes = 256;
  // One core for the whole run (its tree table is 512 KiB); each input installs its tree and
  // removes it at the end, which also exercises install/remove.
  static Core core(CoreConfig{self});
  static std::vector<TxFrame> tx(kMaxChildren);
  static std::vector<std::uint8_t> f(kMaxFrameBytes + 64);
  check(core.install_tree(tc).ok());

  const auto structured = [&](Opcode oc, std::uint16_t child, std::uint32_t chunk,
                              std::uint32_t seq, std::uint16_t count, DType d, Reader& in,
                              std::size_t* len) {
    const std::uint16_t ncontrib =
        oc == Opcode::result ? 99 : (child < nchildren ? tc.children[child].hosts : 1);
    TdHdr h{};
    h.version = kProtocolVersion;
    h.opcode = static_cast<std::uint8_t>(oc);
    h.dtype = static_cast<std::uint8_t>(d);
    h.tree_id.set(tc.tree_id);
    // A well-formed RESULT names the receiver's index at its parent.
    h.child.set(oc == Opcode::result ? tc.index_at_parent : child);
    h.slot.set(static_cast<std::uint16_t>(chunk & (tc.slots - 1)));
    h.slot_ver = static_cast<std::uint8_t>((chunk >> std::countr_zero(tc.slots)) & 1);
    h.count.set(count);
    h.ncontrib.set(ncontrib);
    h.chunk.set(chunk);
    h.seq.set(seq);
    h.key.set(tc.key);
    std::uint8_t payload[256];
    const std::size_t plen = std::size_t{count} * dtype_size(d);
    for (std::size_t i = 0; i < plen && i < sizeof payload; ++i) payload[i] = in.u8();
    const Endpoint& src = oc == Opcode::result ? parent : tc.children[child % nchildren].addr;
    *len = build_frame(f.data(), src, self, h, payload, plen <= 256 ? plen : 256);
  };

  while (!r.empty()) {
    std::size_t len = 0;
    switch (r.u8() % 5) {
      case 0: {
        len = (std::size_t{r.u8()} << 8 | r.u8()) % (f.size() + 1);
        for (std::size_t i = 0; i < len; ++i) f[i] = r.u8();
        break;
      }
      case 1: {
        const std::uint16_t child = r.u8() % nchildren;
        const std::uint32_t chunk = r.u8() % 16;
        const std::uint32_t seq = r.u8() % 3;
        const std::uint16_t count = static_cast<std::uint16_t>(1 + r.u8() % 64);
        const auto d = static_cast<DType>(r.u8() % kNumDTypes);
        structured(Opcode::contrib, child, chunk, seq, count, d, r, &len);
        break;
      }
      case 2: {
        const std::uint32_t chunk = r.u8() % 16;
        const std::uint32_t seq = r.u8() % 3;
        const std::uint16_t count = static_cast<std::uint16_t>(1 + r.u8() % 64);
        const auto d = static_cast<DType>(r.u8() % kNumDTypes);
        structured(Opcode::result, 0, chunk, seq, count, d, r, &len);
        break;
      }
      case 3: {
        const std::uint8_t field = r.u8() % 32;
        const std::uint8_t v = r.u8();
        structured(Opcode::contrib, r.u8() % nchildren, r.u8() % 16, 0, 4, DType::f32, r, &len);
        f[kFrameHeaderBytes - 32 + field] = v;
        break;
      }
      default:
        check(core.remove_tree(tc.tree_id).ok());
        check(core.install_tree(tc).ok());
        continue;
    }
    RxFrame rx{f.data(), len};
    std::size_t ntx = 0;
    check(core.process_burst(&rx, 1, tx.data(), tx.size(), &ntx) == 1);
    check(ntx <= nchildren);
    for (std::size_t i = 0; i < ntx; ++i) {
      // Every frame the switch sends parses at its destination.
      std::vector<std::uint8_t> out(tx[i].hdr, tx[i].hdr + kFrameHeaderBytes);
      check(tx[i].payload_len <= tc.payload_bytes);
      if (tx[i].payload_len != 0) {
        out.insert(out.end(), tx[i].payload, tx[i].payload + tx[i].payload_len);
      }
      const auto ip = load_header<Ipv4Hdr>(out.data() + sizeof(EtherHdr));
      const auto udp = load_header<UdpHdr>(out.data() + sizeof(EtherHdr) + sizeof(Ipv4Hdr));
      Parsed p;
      check(parse_frame(out.data(), out.size(), ip.dst_addr.get(), udp.dst_port.get(), &p) ==
            DropReason::none);
      check(p.src_ip == self.ip);
    }
    for (std::uint32_t s = 0; s < tc.slots; ++s) {
      for (unsigned v = 0; v < 2; ++v) {
        SlotView sv;
        check(core.slot_view(tc.tree_id, s, v, &sv) == 0);
        check(std::popcount(sv.bitmap) == sv.arrived);
        check(sv.arrived <= nchildren);
        check(sv.bitmap < (std::uint64_t{1} << nchildren));
        if (sv.state == SlotState::accumulating) check(sv.arrived < nchildren);
        if (sv.state != SlotState::empty) check((sv.chunk & (tc.slots - 1)) == s);
        if (sv.state == SlotState::waiting_parent) check(sv.arrived == nchildren);
      }
    }
  }
  check(core.remove_tree(tc.tree_id).ok());
  return 0;
}
