// The switch core's datapath and tree table. See docs/switch-core.md for the design and the
// measured per-packet costs quoted in comments here.
#include "treeduce/dataplane/core.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <new>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::dp {

namespace {

constexpr std::size_t kL2L4Bytes = kFrameHeaderBytes - sizeof(TdHdr);
constexpr std::size_t kTreeIds = 65536;

/// Bookkeeping of one slot version; the data lives in Tree::mem.
struct SlotMeta {
  SlotState state = SlotState::empty;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  std::uint16_t count = 0;
  std::uint16_t arrived = 0;
  std::uint32_t chunk = 0;
  std::uint32_t seq = 0;
  std::uint32_t ncontrib = 0;
  std::uint64_t bitmap = 0;
};

struct AlignedFree {
  void operator()(std::uint8_t* p) const noexcept { std::free(p); }
};

DropReason from_parse(ParseError e) noexcept {
  switch (e) {
    case ParseError::ok:
      return DropReason::none;
    case ParseError::too_short:
      return DropReason::too_short;
    case ParseError::not_ipv4:
      return DropReason::not_ipv4;
    case ParseError::ip_bad_header:
      return DropReason::ip_bad_header;
    case ParseError::ip_bad_checksum:
      return DropReason::ip_bad_checksum;
    case ParseError::ip_bad_length:
      return DropReason::ip_bad_length;
    case ParseError::ip_fragment:
      return DropReason::ip_fragment;
    case ParseError::not_udp:
      return DropReason::not_udp;
    case ParseError::wrong_port:
      return DropReason::wrong_port;
    case ParseError::udp_bad_length:
      return DropReason::udp_bad_length;
    case ParseError::not_for_us:
      return DropReason::not_for_us;
    case ParseError::bad_version:
      return DropReason::bad_version;
  }
  return DropReason::too_short;
}

}  // namespace

/// One installed tree: configuration, kernels looked up once, slot bookkeeping and slot memory.
struct Tree {
  TreeConfig cfg;
  bool root = true;
  std::uint16_t nchildren = 0;
  std::uint32_t slot_mask = 0;
  std::uint32_t slot_shift = 0;
  std::uint16_t max_elems[kNumDTypes] = {};
  agg::LoadFn load[kNumDTypes] = {};
  agg::AccumulateFn accumulate[kNumDTypes][kNumReduceOps] = {};
  agg::ReduceFn reduce[kNumDTypes][kNumReduceOps] = {};
  agg::EmitFn emit[kNumDTypes] = {};
  std::vector<SlotMeta> meta;  // slot * 2 + version
  // Per slot version, at mem + index * stride: accumulator (32-bit lanes), the outgoing payload
  // (a root's RESULT, a non-root's partial), a non-root's RESULT from its parent, then in
  // deterministic mode one payload per child. The partial and the RESULT have their own buffers
  // because a burst may re-send the partial (a duplicate) and then take the RESULT: both frames
  // are still unsent when process_burst() returns.
  std::unique_ptr<std::uint8_t, AlignedFree> mem;
  std::size_t stride = 0;
  std::size_t out_off = 0;
  std::size_t res_off = 0;
  std::size_t det_off = 0;
  // Ethernet+IPv4+UDP headers for a full-size payload, with checksums: per child and to the
  // parent. A shorter payload (a collective's last chunk) rebuilds them.
  std::vector<std::uint8_t> child_l2l4;  // nchildren * kL2L4Bytes
  std::uint8_t parent_l2l4[kL2L4Bytes] = {};
  Counters counters;
};

Core::Core(const CoreConfig& cfg)
    : cfg_(cfg), trees_(std::make_unique<std::atomic<Tree*>[]>(kTreeIds)) {
  if (cfg_.shards == 0) cfg_.shards = 1;
}

Core::~Core() {
  for (std::size_t i = 0; i < kTreeIds; ++i) delete trees_[i].load(std::memory_order_relaxed);
}

std::size_t Core::tree_count() const noexcept { return ntrees_; }

std::uint32_t Core::local_slots(std::uint32_t slots) const noexcept {
  return cfg_.shard < slots ? (slots - cfg_.shard + cfg_.shards - 1) / cfg_.shards : 0;
}

const TreeConfig* Core::tree_config(std::uint16_t tree_id) const noexcept {
  const Tree* t = trees_[tree_id].load(std::memory_order_acquire);
  return t != nullptr ? &t->cfg : nullptr;
}

const char* Core::check_config(const TreeConfig& cfg) noexcept {
  if (cfg.children.empty() || cfg.children.size() > kMaxChildren) {
    return "a tree has 1 to 64 children";
  }
  if (cfg.slots == 0 || cfg.slots > kMaxSlots || !std::has_single_bit(cfg.slots)) {
    return "slots must be a power of two from 1 to 4096";
  }
  if (!valid_payload_bytes(cfg.payload_bytes)) {
    return "payload_bytes must be a power of two from 256 to 8192";
  }
  if ((cfg.dtype_mask & 0x3F) == 0 || (cfg.dtype_mask & ~0x3F) != 0) {
    return "the dtype mask must allow at least one of the 6 element types and nothing else";
  }
  if ((cfg.op_mask & 0x7) == 0 || (cfg.op_mask & ~0x7) != 0) {
    return "the op mask must allow at least one of sum, min, max and nothing else";
  }
  if (static_cast<unsigned>(cfg.role) > 2) return "the role must be leaf, inner or root";
  std::uint32_t hosts = 0;  // the ncontrib header field is 16 bits
  for (const auto& c : cfg.children) {
    if (c.hosts == 0) return "every child has at least one host under it";
    hosts += c.hosts;
  }
  if (hosts > 0xFFFF) return "a tree covers at most 65535 hosts";
  return nullptr;
}

int Core::install_tree(const TreeConfig& cfg) {
  if (trees_[cfg.tree_id].load(std::memory_order_relaxed) != nullptr) return -EEXIST;
  if (check_config(cfg) != nullptr) return -EINVAL;

  auto t = std::unique_ptr<Tree>(new (std::nothrow) Tree);
  if (!t) return -ENOMEM;
  t->cfg = cfg;
  t->root = cfg.role == Role::root;
  t->nchildren = static_cast<std::uint16_t>(cfg.children.size());
  t->slot_mask = cfg.slots - 1;
  t->slot_shift = static_cast<std::uint32_t>(std::countr_zero(cfg.slots));
  std::size_t min_size = 4;
  const agg::KernelTable& k = agg::kernels();
  for (DType d : kAllDTypes) {
    const auto di = static_cast<std::size_t>(d);
    if ((cfg.dtype_mask >> di & 1) == 0) continue;
    t->max_elems[di] = static_cast<std::uint16_t>(cfg.payload_bytes / dtype_size(d));
    if (dtype_size(d) < min_size) min_size = dtype_size(d);
    t->load[di] = k.load_fn(d);
    t->emit[di] = k.emit_fn(d);
    for (ReduceOp o : kAllReduceOps) {
      const auto oi = static_cast<std::size_t>(o);
      t->accumulate[di][oi] = k.accumulate_fn(d, o);
      t->reduce[di][oi] = k.reduce_fn(d, o);
    }
  }
  const auto round64 = [](std::size_t b) { return (b + 63) & ~std::size_t{63}; };
  const std::size_t acc_bytes = round64(cfg.payload_bytes / min_size * 4);
  t->out_off = acc_bytes;
  t->res_off = t->root ? t->out_off : t->out_off + cfg.payload_bytes;
  t->det_off = t->res_off + cfg.payload_bytes;
  t->stride = t->det_off + (cfg.deterministic ? t->nchildren * std::size_t{cfg.payload_bytes} : 0);
  const std::size_t local = local_slots(cfg.slots);
  const std::size_t total = std::max<std::size_t>(t->stride * local * 2, 64);
  // One tree may not take more than 1 GiB: a control-plane mistake, not a reason to die.
  if (total > (std::size_t{1} << 30)) return -ENOMEM;
  auto* mem = static_cast<std::uint8_t*>(std::aligned_alloc(64, total));
  if (mem == nullptr) return -ENOMEM;
  std::memset(mem, 0, total);  // touch every page now, not on the first packets
  t->mem.reset(mem);
  t->meta.assign(local * 2, SlotMeta{});

  t->child_l2l4.resize(t->nchildren * kL2L4Bytes);
  for (std::size_t i = 0; i < t->nchildren; ++i) {
    write_l2_l4(&t->child_l2l4[i * kL2L4Bytes], cfg_.self, cfg.children[i].addr,
                sizeof(TdHdr) + cfg.payload_bytes);
  }
  if (!t->root)
    write_l2_l4(t->parent_l2l4, cfg_.self, cfg.parent, sizeof(TdHdr) + cfg.payload_bytes);
  // Everything above is written before this release store; a datapath thread's acquire load of
  // the pointer sees a complete tree.
  trees_[cfg.tree_id].store(t.release(), std::memory_order_release);
  ++ntrees_;
  return 0;
}

Tree* Core::unpublish_tree(std::uint16_t tree_id) noexcept {
  Tree* t = trees_[tree_id].exchange(nullptr, std::memory_order_acq_rel);
  if (t != nullptr) --ntrees_;
  return t;
}

void Core::destroy_tree(Tree* t) noexcept { delete t; }

int Core::remove_tree(std::uint16_t tree_id) {
  Tree* t = unpublish_tree(tree_id);
  if (t == nullptr) return -ENOENT;
  destroy_tree(t);
  return 0;
}

const Counters* Core::tree_counters(std::uint16_t tree_id) const noexcept {
  const Tree* t = trees_[tree_id].load(std::memory_order_acquire);
  return t != nullptr ? &t->counters : nullptr;
}

int Core::slot_view(std::uint16_t tree_id, std::uint32_t slot, unsigned ver, SlotView* out) const {
  const Tree* t = trees_[tree_id].load(std::memory_order_acquire);
  if (t == nullptr) return -ENOENT;
  if (slot >= t->cfg.slots || ver > 1) return -EINVAL;
  if (slot % cfg_.shards != cfg_.shard) return -EINVAL;
  const SlotMeta& m = t->meta[slot / cfg_.shards * 2 + ver];
  *out = SlotView{m.state, m.chunk, m.seq, m.bitmap, m.arrived, m.ncontrib, m.count, m.dtype, m.op};
  return 0;
}

void Core::drop(Tree* t, DropReason r) noexcept {
  ++counters_.drops[static_cast<std::size_t>(r)];
  if (t != nullptr) ++t->counters.drops[static_cast<std::size_t>(r)];
}

void Core::event(Tree* t, Event e, std::uint64_t n) noexcept {
  counters_.events[static_cast<std::size_t>(e)] += n;
  if (t != nullptr) t->counters.events[static_cast<std::size_t>(e)] += n;
}

namespace {

/// Fill `f` with a frame carrying `td` and `payload_len` bytes at `payload`, using the prebuilt
/// L2-L4 header when the length is the tree's full size.
inline void emit_frame(TxFrame& f, const std::uint8_t* l2l4_full, bool full, const Endpoint& self,
                       const Endpoint& dst, const TdHdr& td, const std::uint8_t* payload,
                       std::size_t payload_len) noexcept {
  if (full) {
    std::memcpy(f.hdr, l2l4_full, kL2L4Bytes);
  } else {
    write_l2_l4(f.hdr, self, dst, sizeof(TdHdr) + payload_len);
  }
  store_header(f.hdr + kL2L4Bytes, td);
  f.payload = payload;
  f.payload_len = static_cast<std::uint32_t>(payload_len);
}

}  // namespace

std::size_t Core::process_burst(const RxFrame* rx, std::size_t n_rx, TxFrame* tx,
                                std::size_t tx_cap, std::size_t* n_tx) noexcept {
  std::size_t out = 0;
  std::size_t i = 0;
  for (; i < n_rx; ++i) {
    // The headers span the first two cache lines of a frame. Without prefetching, the first
    // load of each frame's Ethernet header took ~60% of parse_frame's samples (perf, 256 B,
    // fan-in 8): fetch the next frame's headers while this one is processed, as DPDK's l3fwd does.
    if (i + 1 < n_rx && rx[i + 1].len > 64) {
      __builtin_prefetch(rx[i + 1].data);
      __builtin_prefetch(rx[i + 1].data + 64);
    }
    bool consumed = true;
    const std::size_t n = handle(rx[i].data, rx[i].len, tx + out, tx_cap - out, &consumed);
    if (!consumed) break;
    out += n;
  }
  counters_.events[static_cast<std::size_t>(Event::rx_frames)] += i;
  counters_.events[static_cast<std::size_t>(Event::tx_frames)] += out;
  *n_tx = out;
  return i;
}

std::size_t Core::handle(const std::uint8_t* data, std::size_t len, TxFrame* tx, std::size_t room,
                         bool* consumed) noexcept {
  if (room == 0) {
    *consumed = false;
    return 0;
  }
  Parsed p;
  const ParseError pe = parse_frame(data, len, cfg_.self.ip, cfg_.self.port, &p);
  if (pe != ParseError::ok && pe != ParseError::bad_version) {
    drop(nullptr, from_parse(pe));
    return 0;
  }
  const TdHdr& h = p.td;
  Tree* t = nullptr;
  // Drop, and answer a CONTRIB with a NACK when the reason says so. The NACK goes back to the
  // frame's source, echoes the header with our version, no key and no payload.
  const auto refuse = [&](DropReason r) -> std::size_t {
    drop(t, r);
    if (h.opcode != static_cast<std::uint8_t>(Opcode::contrib) || !nacks(r)) return 0;
    Endpoint dst;
    std::memcpy(dst.mac, p.src_mac, 6);
    dst.ip = p.src_ip;
    dst.port = p.src_port;
    TdHdr n = h;
    n.version = kProtocolVersion;
    n.opcode = static_cast<std::uint8_t>(Opcode::nack);
    n.reason = static_cast<std::uint8_t>(r);
    n.count = 0;
    n.ncontrib = 0;
    n.key = 0;
    write_l2_l4(tx[0].hdr, cfg_.self, dst, sizeof(TdHdr));
    store_header(tx[0].hdr + kL2L4Bytes, n);
    tx[0].payload = nullptr;
    tx[0].payload_len = 0;
    event(t, Event::nack_sent);
    if (t != nullptr) ++t->counters.events[static_cast<std::size_t>(Event::tx_frames)];
    return 1;
  };
  if (pe == ParseError::bad_version) return refuse(DropReason::bad_version);
  const auto opcode = static_cast<Opcode>(h.opcode);
  if (opcode == Opcode::nack) {
    drop(nullptr, DropReason::nack_received);
    return 0;
  }
  if (opcode != Opcode::contrib && opcode != Opcode::result) {
    drop(nullptr, DropReason::bad_opcode);
    return 0;
  }
  t = trees_[bswap_be(h.tree_id)].load(std::memory_order_acquire);
  if (t == nullptr) return refuse(DropReason::unknown_tree);
  // Worst case output of this frame: a multicast to every child. Checked before any state
  // changes so that the caller can retry the frame after draining TX.
  if (room < t->nchildren) {
    *consumed = false;
    return 0;
  }
  ++t->counters.events[static_cast<std::size_t>(Event::rx_frames)];
  if (bswap_be(h.key) != t->cfg.key) return refuse(DropReason::bad_key);
  if (h.dtype >= kNumDTypes || h.op >= kNumReduceOps || (t->cfg.dtype_mask >> h.dtype & 1) == 0 ||
      (t->cfg.op_mask >> h.op & 1) == 0) {
    return refuse(DropReason::bad_dtype_op);
  }
  const auto dtype = static_cast<DType>(h.dtype);
  const auto op = static_cast<ReduceOp>(h.op);
  const std::uint16_t count = bswap_be(h.count);
  if (count == 0 || count > t->max_elems[h.dtype]) return refuse(DropReason::bad_count);
  const std::size_t plen = std::size_t{count} * dtype_size(dtype);
  if (p.payload_len != plen) return refuse(DropReason::bad_length);
  const std::uint32_t chunk = bswap_be(h.chunk);
  const std::uint32_t slot = bswap_be(h.slot);
  const unsigned ver = (chunk >> t->slot_shift) & 1;
  if (slot != (chunk & t->slot_mask) || h.slot_ver != ver) return refuse(DropReason::bad_slot);
  // One datapath thread (shards == 1) skips the division.
  const std::uint32_t local = cfg_.shards == 1 ? slot : slot / cfg_.shards;
  if (local * cfg_.shards + cfg_.shard != slot) {
    drop(t, DropReason::wrong_shard);
    return 0;
  }
  const std::uint32_t seq = bswap_be(h.seq);
  const std::size_t si = std::size_t{local} * 2 + ver;
  SlotMeta& m = t->meta[si];
  std::uint8_t* const base = t->mem.get() + si * t->stride;
  std::uint8_t* const acc = base;
  std::uint8_t* const outbuf = base + t->out_off;
  std::uint8_t* const resbuf = base + t->res_off;
  const bool full = plen == t->cfg.payload_bytes;

  // The header of everything this slot version sends: patched per destination below.
  const auto make_td = [&](Opcode oc, std::uint16_t child) {
    TdHdr o{};
    o.version = kProtocolVersion;
    o.opcode = static_cast<std::uint8_t>(oc);
    o.dtype = h.dtype;
    o.op = h.op;
    o.tree_id = h.tree_id;
    o.child = bswap_be(child);
    o.slot = h.slot;
    o.slot_ver = h.slot_ver;
    o.count = h.count;
    o.ncontrib = bswap_be(static_cast<std::uint16_t>(m.ncontrib));
    o.chunk = h.chunk;
    o.seq = h.seq;
    o.key = bswap_be(t->cfg.key);
    return o;
  };
  const auto send_up = [&]() -> std::size_t {
    const TdHdr o = make_td(Opcode::contrib, t->cfg.index_at_parent);
    emit_frame(tx[0], t->parent_l2l4, full, cfg_.self, t->cfg.parent, o, outbuf, plen);
    t->counters.events[static_cast<std::size_t>(Event::tx_frames)] += 1;
    return 1;
  };
  const auto send_down = [&](std::uint16_t first, std::uint16_t n) -> std::size_t {
    const TdHdr o = make_td(Opcode::result, 0);
    for (std::uint16_t c = 0; c < n; ++c) {
      const std::uint16_t child = static_cast<std::uint16_t>(first + c);
      emit_frame(tx[c], &t->child_l2l4[child * kL2L4Bytes], full, cfg_.self,
                 t->cfg.children[child].addr, o, resbuf, plen);
      // Patch the child index in the frame, not in `o`: a 2-byte store into `o` followed by its
      // 32-byte copy stalls store forwarding, which cost ~10 ns per copy (perf, 256 B fan-in 8).
      const std::uint16_t be_child = bswap_be(child);
      std::memcpy(tx[c].hdr + kL2L4Bytes + offsetof(TdHdr, child), &be_child, 2);
    }
    t->counters.events[static_cast<std::size_t>(Event::tx_frames)] += n;
    return n;
  };

  if (opcode == Opcode::result) {
    if (t->root) return refuse(DropReason::unexpected_result);
    if (p.src_ip != t->cfg.parent.ip) return refuse(DropReason::bad_source);
    if (m.state == SlotState::empty || m.chunk != chunk || m.seq != seq) {
      return refuse(DropReason::stale_result);
    }
    if (m.state == SlotState::done) return refuse(DropReason::duplicate_result);
    if (m.state != SlotState::waiting_parent) return refuse(DropReason::unexpected_result);
    if (m.dtype != dtype || m.op != op || m.count != count) {
      return refuse(DropReason::chunk_mismatch);
    }
    std::memcpy(resbuf, p.payload, plen);
    m.ncontrib = bswap_be(h.ncontrib);
    m.state = SlotState::done;
    event(t, Event::result_multicast);
    return send_down(0, t->nchildren);
  }

  // CONTRIB from a child.
  const std::uint16_t child = bswap_be(h.child);
  if (child >= t->nchildren) return refuse(DropReason::bad_child);
  const ChildConfig& cc = t->cfg.children[child];
  if (p.src_ip != cc.addr.ip) return refuse(DropReason::bad_source);
  if (bswap_be(h.ncontrib) != cc.hosts) return refuse(DropReason::bad_ncontrib);
  if (m.state == SlotState::empty || serial_after(chunk, m.chunk)) {
    // A newer chunk for this slot version: by the window rule every host already has the result
    // of the chunk held here (docs/protocol.md, "Why reuse is safe"), so it can be forgotten.
    if (m.state != SlotState::empty) {
      if (serial_after(m.seq, seq)) return refuse(DropReason::stale_seq);
      event(t, Event::slot_reused);
    }
    m = SlotMeta{SlotState::accumulating, dtype, op, count, 0, chunk, seq, 0, 0};
  } else if (chunk != m.chunk) {
    return refuse(DropReason::stale_chunk);
  } else if (seq != m.seq) {
    return refuse(DropReason::stale_seq);
  }
  if (m.dtype != dtype || m.op != op || m.count != count) {
    return refuse(DropReason::chunk_mismatch);
  }
  const std::uint64_t bit = std::uint64_t{1} << child;
  if ((m.bitmap & bit) != 0) {
    // Never added twice. The sender retransmitted because it has no result yet: help it along.
    switch (m.state) {
      case SlotState::waiting_parent:
        event(t, Event::partial_resent);
        return send_up();
      case SlotState::done:
        event(t, Event::result_unicast);
        return send_down(child, 1);
      default:
        return refuse(DropReason::duplicate_pending);
    }
  }
  m.bitmap |= bit;
  ++m.arrived;
  m.ncontrib += cc.hosts;
  const auto di = static_cast<std::size_t>(dtype);
  const auto oi = static_cast<std::size_t>(op);
  if (t->cfg.deterministic) {
    // Keep the payload; the fold happens in child order once all are in.
    std::memcpy(base + t->det_off + std::size_t{child} * t->cfg.payload_bytes, p.payload, plen);
  } else if (m.arrived == 1) {
    t->load[di](acc, p.payload, count);
  } else {
    t->accumulate[di][oi](acc, p.payload, count);
  }
  event(t, Event::contrib_accepted);
  if (m.arrived < t->nchildren) return 0;

  // Complete: fold (deterministic mode), narrow once, send on.
  if (t->cfg.deterministic) {
    const void* ptrs[kMaxChildren];
    for (std::size_t c = 0; c < t->nchildren; ++c) {
      ptrs[c] = base + t->det_off + c * t->cfg.payload_bytes;
    }
    t->reduce[di][oi](acc, ptrs, t->nchildren, count);
  }
  t->emit[di](outbuf, acc, count);
  if (t->root) {
    m.state = SlotState::done;
    event(t, Event::result_multicast);
    return send_down(0, t->nchildren);
  }
  m.state = SlotState::waiting_parent;
  event(t, Event::partial_sent);
  return send_up();
}

}  // namespace treeduce::dp
