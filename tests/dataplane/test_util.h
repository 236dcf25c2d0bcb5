// Helpers for driving a dp::Core with hand-made frames.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "treeduce/dataplane/core.h"

namespace treeduce::dp::testing {

inline Endpoint ep(std::uint32_t n, std::uint16_t port = 50000) {
  Endpoint e;
  e.mac[0] = 0x02;
  e.mac[5] = static_cast<std::uint8_t>(n);
  e.ip = 0x0A000000 + n;
  e.port = port;
  return e;
}

inline const Endpoint kSwitch = ep(1, kDefaultUdpPort);
inline const Endpoint kParent = ep(2, kDefaultUdpPort);
inline Endpoint child_ep(std::uint16_t i) { return ep(100 + i); }

inline TreeConfig tree_cfg(std::uint16_t nchildren, bool root, bool det = false,
                           std::uint32_t slots = 4, std::uint32_t payload = 256) {
  TreeConfig t;
  t.tree_id = 5;
  t.key = 0x1122334455667788ULL;
  t.role = root ? Role::root : Role::leaf;
  if (!root) t.parent = kParent;
  t.index_at_parent = 3;
  for (std::uint16_t i = 0; i < nchildren; ++i) t.children.push_back({child_ep(i), 1});
  t.slots = slots;
  t.payload_bytes = payload;
  t.deterministic = det;
  return t;
}

inline TdHdr hdr(Opcode oc, std::uint32_t chunk, std::uint16_t child, std::uint16_t count,
                 DType d = DType::f32, std::uint32_t slots = 4, std::uint32_t seq = 0,
                 std::uint16_t ncontrib = 1) {
  TdHdr h{};
  h.version = kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(oc);
  h.dtype = static_cast<std::uint8_t>(d);
  h.op = 0;
  h.tree_id.set(std::uint16_t{5});
  h.child.set(child);
  h.slot.set(static_cast<std::uint16_t>(chunk % slots));
  h.slot_ver = static_cast<std::uint8_t>((chunk / slots) % 2);
  h.count.set(count);
  h.ncontrib.set(ncontrib);
  h.chunk.set(chunk);
  h.seq.set(seq);
  h.key.set(std::uint64_t{0x1122334455667788ULL});
  return h;
}

inline std::vector<std::uint8_t> frame(const Endpoint& src, const TdHdr& h,
                                       const std::vector<float>& values) {
  std::vector<std::uint8_t> f(kFrameHeaderBytes + values.size() * 4);
  build_frame(f.data(), src, kSwitch, h, values.data(), values.size() * 4);
  return f;
}

/// Feeds frames one at a time and keeps the output.
struct Harness {
  Core core{CoreConfig{kSwitch}};
  std::vector<TxFrame> tx = std::vector<TxFrame>(kMaxChildren * 32);

  std::vector<TxFrame> feed(const std::vector<std::uint8_t>& f) {
    RxFrame rx{f.data(), f.size()};
    std::size_t n = 0;
    EXPECT_EQ(core.process_burst(&rx, 1, tx.data(), tx.size(), &n), 1u);
    return {tx.begin(), tx.begin() + static_cast<std::ptrdiff_t>(n)};
  }
};

inline TdHdr td_of(const TxFrame& f) { return load_header<TdHdr>(f.hdr + 42); }
inline Ipv4Hdr ip_of(const TxFrame& f) { return load_header<Ipv4Hdr>(f.hdr + 14); }
inline float value(const TxFrame& f, std::size_t i) {
  float x;
  std::memcpy(&x, f.payload + 4 * i, 4);
  return x;
}

}  // namespace treeduce::dp::testing
