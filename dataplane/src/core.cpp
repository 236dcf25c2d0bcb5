// The switch core's datapath and tree table. See docs/switch-core.md for the design and the
// measured per-packet costs quoted in comments here.
#include "treeduce/dataplane/core.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <new>
#include <string>

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
  // The process_burst() call (Core::burst_) whose output last pointed at the outgoing payload
  // buffer and at the RESULT buffer. Such a buffer is not written again in the same call: its
  // frames are still unsent (core.h, TxFrame). A stamp that matches again after 2^32 calls
  // only defers one frame to the next call, which is always safe.
  std::uint32_t out_burst = 0;
  std::uint32_t res_burst = 0;
};

struct AlignedFree {
  void operator()(std::uint8_t* p) const noexcept { std::free(p); }
};

}  // namespace

/// A tree's output headers, one template per next hop: Ethernet+IPv4+UDP for a full-size payload,
/// IPv4 checksum included, with the MACs of the hop once resolved (Core::set_next_hops()), and
/// the hop's tag. Immutable once published; replaced whole, freed after a grace period.
struct TreeHops {
  std::vector<std::uint8_t> child_l2l4;  // nchildren * kL2L4Bytes
  std::vector<std::uint16_t> child_tag;  // nchildren
  std::uint8_t parent_l2l4[kL2L4Bytes] = {};
  std::uint16_t parent_tag = kNoHop;
};

/// One installed tree: configuration, kernels looked up once, slot bookkeeping and slot memory.
struct Tree {
  TreeConfig cfg;
  bool root = true;
  std::uint16_t nchildren = 0;
  std::uint32_t slot_mask = 0;
  std::uint32_t slot_shift = 0;
  std::uint16_t max_elems[kNumDTypes] = {};
  // Filled for every (dtype, op) the tree allows and op_defined() admits, nullptr elsewhere: a
  // null accumulate entry is how check_chunk() refuses a pair.
  agg::LoadFn load[kNumDTypes][kNumReduceOps] = {};
  agg::AccumulateFn accumulate[kNumDTypes][kNumReduceOps] = {};
  agg::ReduceFn reduce[kNumDTypes][kNumReduceOps] = {};
  agg::EmitFn emit[kNumDTypes] = {};
  std::vector<SlotMeta> meta;  // slot * 2 + version
  // Per slot version, at mem + index * stride: accumulator (acc_size bytes per element, for the
  // widest of the tree's types: 4x the payload for FP8, 2x for f16/bf16), the outgoing payload
  // (a root's RESULT, a non-root's partial), a non-root's RESULT from its parent, then in
  // deterministic mode one payload per child. The partial and the RESULT have their own buffers
  // because a burst may re-send the partial (a duplicate) and then take the RESULT: both frames
  // are still unsent when process_burst() returns.
  std::unique_ptr<std::uint8_t, AlignedFree> mem;
  std::size_t stride = 0;
  std::size_t out_off = 0;
  std::size_t res_off = 0;
  std::size_t det_off = 0;
  // The output headers (owning). A shorter payload than the tree's (a collective's last chunk)
  // patches a copy's lengths and IPv4 checksum (RFC 1624), never rebuilds it.
  std::atomic<TreeHops*> hops{nullptr};
  Counters counters;
  ~Tree() { delete hops.load(std::memory_order_relaxed); }
};

namespace {

/// The header templates of tree `t` for the hops given (nullptr or tag kNoHop: the configured
/// MACs), or nullptr when out of memory.
TreeHops* make_hops(const Tree& t, const Endpoint& self, std::span<const NextHop> children,
                    const NextHop* parent) noexcept {
  auto* h = new (std::nothrow) TreeHops;
  if (h == nullptr) return nullptr;
  try {
    h->child_l2l4.resize(t.nchildren * kL2L4Bytes);
    h->child_tag.assign(t.nchildren, kNoHop);
  } catch (const std::bad_alloc&) {
    delete h;
    return nullptr;
  }
  const std::size_t udp_payload = sizeof(TdHdr) + t.cfg.payload_bytes;
  const auto one = [&](std::uint8_t* out, const Endpoint& to, const NextHop* hop) {
    Endpoint src = self;
    Endpoint dst = to;
    if (hop != nullptr && hop->tag != kNoHop) {
      std::memcpy(src.mac, hop->src_mac, 6);
      std::memcpy(dst.mac, hop->dst_mac, 6);
    }
    write_l2_l4(out, src, dst, udp_payload);
  };
  for (std::size_t i = 0; i < t.nchildren; ++i) {
    const NextHop* hop = i < children.size() ? &children[i] : nullptr;
    one(&h->child_l2l4[i * kL2L4Bytes], t.cfg.children[i].addr, hop);
    if (hop != nullptr) h->child_tag[i] = hop->tag;
  }
  if (!t.root) {
    one(h->parent_l2l4, t.cfg.parent, parent);
    if (parent != nullptr) h->parent_tag = parent->tag;
  }
  return h;
}

}  // namespace

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

Status Core::check_config(const TreeConfig& cfg) {
  if (auto issue = validate_tree(cfg))
    return invalid_argument("tree " + std::to_string(cfg.tree_id) + ": " + issue->sentence);
  return Status::Ok();
}

Status Core::install_tree(const TreeConfig& cfg) {
  const std::string tree = "tree " + std::to_string(cfg.tree_id);
  if (trees_[cfg.tree_id].load(std::memory_order_relaxed) != nullptr)
    return already_exists(tree + " is installed already.");
  if (Status s = check_config(cfg); !s.ok()) return s;
  const auto no_memory = [&] {
    return resource_exhausted(tree + ": no memory for its slots (" + std::to_string(cfg.slots) +
                              " slots of " + std::to_string(cfg.payload_bytes) + " bytes).");
  };

  auto t = std::unique_ptr<Tree>(new (std::nothrow) Tree);
  if (!t) return no_memory();
  t->cfg = cfg;
  t->root = cfg.role == Role::root;
  t->nchildren = static_cast<std::uint16_t>(cfg.children.size());
  t->slot_mask = cfg.slots - 1;
  t->slot_shift = static_cast<std::uint32_t>(std::countr_zero(cfg.slots));
  // The accumulator holds payload_bytes / dtype_size elements of acc_size bytes: 4x the payload
  // for FP8, 2x for f16/bf16, 1x for every other type.
  std::size_t acc_bytes = 0;
  const agg::KernelTable& k = agg::kernels();
  for (DType d : kAllDTypes) {
    const auto di = static_cast<std::size_t>(d);
    if ((cfg.dtype_mask >> di & 1) == 0) continue;
    t->max_elems[di] = static_cast<std::uint16_t>(cfg.payload_bytes / dtype_size(d));
    acc_bytes = std::max(acc_bytes, cfg.payload_bytes / dtype_size(d) * acc_size(d));
    t->emit[di] = k.emit_fn(d);
    for (ReduceOp o : kAllReduceOps) {
      const auto oi = static_cast<std::size_t>(o);
      if ((cfg.op_mask >> oi & 1) == 0 || !op_defined(d, o)) continue;
      t->load[di][oi] = k.load_fn(d, o);
      t->accumulate[di][oi] = k.accumulate_fn(d, o);
      t->reduce[di][oi] = k.reduce_fn(d, o);
    }
  }
  const auto round64 = [](std::size_t b) { return (b + 63) & ~std::size_t{63}; };
  acc_bytes = round64(acc_bytes);
  t->out_off = acc_bytes;
  t->res_off = t->root ? t->out_off : t->out_off + cfg.payload_bytes;
  t->det_off = t->res_off + cfg.payload_bytes;
  t->stride = t->det_off + (cfg.deterministic ? t->nchildren * std::size_t{cfg.payload_bytes} : 0);
  const std::size_t local = local_slots(cfg.slots);
  const std::size_t total = std::max<std::size_t>(t->stride * local * 2, 64);
  // One tree may not take more than 1 GiB: a control-plane mistake, not a reason to die.
  if (total > (std::size_t{1} << 30)) return no_memory();
  auto* mem = static_cast<std::uint8_t*>(std::aligned_alloc(64, total));
  if (mem == nullptr) return no_memory();
  std::memset(mem, 0, total);  // touch every page now, not on the first packets
  t->mem.reset(mem);
  t->meta.assign(local * 2, SlotMeta{});

  TreeHops* hops = make_hops(*t, cfg_.self, {}, nullptr);
  if (hops == nullptr) return no_memory();
  t->hops.store(hops, std::memory_order_relaxed);
  // Everything above is written before this release store; a datapath thread's acquire load of
  // the pointer sees a complete tree.
  trees_[cfg.tree_id].store(t.release(), std::memory_order_release);
  ++ntrees_;
  return Status::Ok();
}

Tree* Core::unpublish_tree(std::uint16_t tree_id) noexcept {
  Tree* t = trees_[tree_id].exchange(nullptr, std::memory_order_acq_rel);
  if (t != nullptr) --ntrees_;
  return t;
}

void Core::destroy_tree(Tree* t) noexcept { delete t; }

Status Core::set_next_hops(std::uint16_t tree_id, std::span<const NextHop> children,
                           const NextHop& parent, TreeHops** old) {
  *old = nullptr;
  Tree* t = trees_[tree_id].load(std::memory_order_acquire);
  if (t == nullptr) return not_found("There is no tree " + std::to_string(tree_id) + ".");
  if (children.size() != t->nchildren)
    return invalid_argument("tree " + std::to_string(tree_id) + " has " +
                            std::to_string(t->nchildren) + " children, got " +
                            std::to_string(children.size()) + " next hops.");
  TreeHops* h = make_hops(*t, cfg_.self, children, &parent);
  if (h == nullptr)
    return resource_exhausted("no memory for the next hops of tree " + std::to_string(tree_id) +
                              ".");
  *old = t->hops.exchange(h, std::memory_order_acq_rel);
  return Status::Ok();
}

void Core::destroy_hops(TreeHops* h) noexcept { delete h; }

Status Core::remove_tree(std::uint16_t tree_id) {
  Tree* t = unpublish_tree(tree_id);
  if (t == nullptr) return not_found("There is no tree " + std::to_string(tree_id) + ".");
  destroy_tree(t);
  return Status::Ok();
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

// ---- datapath ---------------------------------------------------------------------------------
// One frame goes through these stages in order (docs/protocol.md section 4 is the rule book):
//   handle()      parse (proto::parse_frame), opcode, tree lookup, room in `tx`
//   check_chunk() the header against the tree: key, reserved byte, dtype/op, count, length, slot
//   on_contrib()  the CONTRIB state machine: slot version reuse, duplicates, fold, completion
//   on_result()   the RESULT state machine at a non-root
//   send_up(), send_down(), refuse()  build the frames that go out
// A stage that refuses a frame returns refuse(reason): counted, and NACKed when the reason says.

/// A CONTRIB's or RESULT's header fields in host order, checked against its tree, and the slot
/// version they name (this core's shard of it).
struct Core::Chunk {
  DType dtype;
  ReduceOp op;
  std::uint16_t count;
  std::uint32_t chunk;
  std::uint32_t seq;
  std::size_t plen;  ///< payload bytes = count x dtype size
  bool full;         ///< plen is the tree's payload size: the prebuilt L2-L4 headers fit
  SlotMeta* m;
  std::uint8_t* base;  ///< the slot version's memory (accumulator first)
  const TdHdr* hdr;    ///< the received header: what everything this slot version sends echoes
};

namespace {

constexpr std::size_t kIpLenOffset = sizeof(EtherHdr) + offsetof(Ipv4Hdr, total_length);
constexpr std::size_t kIpSumOffset = sizeof(EtherHdr) + offsetof(Ipv4Hdr, hdr_checksum);
constexpr std::size_t kUdpLenOffset =
    sizeof(EtherHdr) + sizeof(Ipv4Hdr) + offsetof(UdpHdr, dgram_len);

inline std::uint16_t get16(const std::uint8_t* p) noexcept {
  be16 v;
  std::memcpy(&v, p, 2);
  return v.get();
}
inline void put16(std::uint8_t* p, std::uint16_t x) noexcept {
  const be16 v = be16::of(x);
  std::memcpy(p, &v, 2);
}

/// Shortens a copied L2-L4 template to a datagram of `udp_payload` bytes (treeduce header +
/// payload): both length fields, and the IPv4 checksum updated for the one changed word (RFC 1624
/// eqn. 3: HC' = ~(~HC + ~m + m')), not recomputed. The UDP checksum is 0 (none) and stays 0.
inline void shorten_l2l4(std::uint8_t* h, std::size_t udp_payload) noexcept {
  const std::uint16_t old_len = get16(h + kIpLenOffset);
  const auto new_len = static_cast<std::uint16_t>(sizeof(Ipv4Hdr) + sizeof(UdpHdr) + udp_payload);
  std::uint32_t sum = static_cast<std::uint16_t>(~get16(h + kIpSumOffset)) +
                      static_cast<std::uint32_t>(static_cast<std::uint16_t>(~old_len)) + new_len;
  sum = (sum & 0xFFFF) + (sum >> 16);
  sum = (sum & 0xFFFF) + (sum >> 16);
  put16(h + kIpLenOffset, new_len);
  put16(h + kIpSumOffset, static_cast<std::uint16_t>(~sum));
  put16(h + kUdpLenOffset, static_cast<std::uint16_t>(sizeof(UdpHdr) + udp_payload));
}

/// Fill `f` with a frame carrying `td` and `payload_len` bytes at `payload`, from the hop's
/// L2-L4 template for a full-size payload (`full`: payload_len is that size).
inline void emit_frame(TxFrame& f, const std::uint8_t* l2l4_full, std::uint16_t tag, bool full,
                       const TdHdr& td, const std::uint8_t* payload,
                       std::size_t payload_len) noexcept {
  std::memcpy(f.hdr, l2l4_full, kL2L4Bytes);
  if (!full) [[unlikely]]
    shorten_l2l4(f.hdr, sizeof(TdHdr) + payload_len);
  store_header(f.hdr + kL2L4Bytes, td);
  f.payload = payload;
  f.payload_len = static_cast<std::uint32_t>(payload_len);
  f.hop = tag;
}

/// The header of everything a slot version sends: the received one's chunk fields with our
/// version, `oc`, the child index `child`, the slot version's ncontrib and the tree's key. Built
/// field by field, not as a copy of `h` patched afterwards: narrow stores into a copy that is
/// then read as a whole stall store forwarding (the same ~10 ns as in send_down()).
inline TdHdr make_td(const TdHdr& h, Opcode oc, std::uint16_t child, std::uint32_t ncontrib,
                     std::uint64_t key) noexcept {
  TdHdr o{};
  o.version = kProtocolVersion;
  o.opcode = static_cast<std::uint8_t>(oc);
  o.dtype = h.dtype;
  o.op = h.op;
  o.tree_id = h.tree_id;
  o.child.set(child);
  o.slot = h.slot;
  o.slot_ver = h.slot_ver;
  o.count = h.count;
  o.ncontrib.set(static_cast<std::uint16_t>(ncontrib));
  o.chunk = h.chunk;
  o.seq = h.seq;
  o.key.set(key);
  return o;
}

}  // namespace

std::size_t Core::process_burst(const RxFrame* rx, std::size_t n_rx, TxFrame* tx,
                                std::size_t tx_cap, std::size_t* n_tx) noexcept {
  // A new stamp: no frame of this call points at slot memory yet. 0 means "never" in SlotMeta.
  if (++burst_ == 0) ++burst_;
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
  const DropReason pr = parse_frame(data, len, cfg_.self.ip, cfg_.self.port, &p);
  if (pr == DropReason::bad_version) return refuse(nullptr, p, pr, tx);
  if (pr != DropReason::none) {
    drop(nullptr, pr);
    return 0;
  }
  const auto opcode = static_cast<Opcode>(p.td.opcode);
  if (opcode == Opcode::nack) {
    drop(nullptr, DropReason::nack_received);
    return 0;
  }
  if (opcode != Opcode::contrib && opcode != Opcode::result) {
    drop(nullptr, DropReason::bad_opcode);
    return 0;
  }
  Tree* t = trees_[p.td.tree_id.get()].load(std::memory_order_acquire);
  if (t == nullptr) return refuse(nullptr, p, DropReason::unknown_tree, tx);
  // Worst case output of this frame: a multicast to every child. Checked before any state
  // changes so that the caller can retry the frame after draining TX.
  if (room < t->nchildren) {
    *consumed = false;
    return 0;
  }
  ++t->counters.events[static_cast<std::size_t>(Event::rx_frames)];
  Chunk c;
  if (const DropReason r = check_chunk(*t, p, &c); r != DropReason::none) {
    if (r == DropReason::wrong_shard) {
      drop(t, r);
      return 0;
    }
    return refuse(t, p, r, tx);
  }
  const std::size_t n = opcode == Opcode::contrib ? on_contrib(*t, p, c, tx, consumed)
                                                  : on_result(*t, p, c, tx, consumed);
  // A deferred frame is offered again in the next call and counted then.
  if (!*consumed) [[unlikely]]
    --t->counters.events[static_cast<std::size_t>(Event::rx_frames)];
  return n;
}

DropReason Core::check_chunk(Tree& t, const Parsed& p, Chunk* c) noexcept {
  const TdHdr& h = p.td;
  if (h.key.get() != t.cfg.key) return DropReason::bad_key;
  if (h.reason != 0) return DropReason::bad_reserved;
  // Unknown codes, pairs the tree does not allow and pairs with no meaning (op_defined()).
  if (h.dtype >= kNumDTypes || h.op >= kNumReduceOps || t.accumulate[h.dtype][h.op] == nullptr) {
    return DropReason::bad_dtype_op;
  }
  c->dtype = static_cast<DType>(h.dtype);
  c->op = static_cast<ReduceOp>(h.op);
  c->count = h.count.get();
  if (c->count == 0 || c->count > t.max_elems[h.dtype]) return DropReason::bad_count;
  c->plen = std::size_t{c->count} * dtype_size(c->dtype);
  if (p.payload_len != c->plen) return DropReason::bad_length;
  c->chunk = h.chunk.get();
  const std::uint32_t slot = h.slot.get();
  const unsigned ver = (c->chunk >> t.slot_shift) & 1;
  if (slot != (c->chunk & t.slot_mask) || h.slot_ver != ver) return DropReason::bad_slot;
  // One datapath thread (shards == 1) skips the division.
  const std::uint32_t local = cfg_.shards == 1 ? slot : slot / cfg_.shards;
  if (local * cfg_.shards + cfg_.shard != slot) return DropReason::wrong_shard;
  c->seq = h.seq.get();
  c->full = c->plen == t.cfg.payload_bytes;
  const std::size_t si = std::size_t{local} * 2 + ver;
  c->m = &t.meta[si];
  c->base = t.mem.get() + si * t.stride;
  c->hdr = &h;
  return DropReason::none;
}

std::size_t Core::on_contrib(Tree& t, const Parsed& p, Chunk& c, TxFrame* tx,
                             bool* consumed) noexcept {
  const std::uint16_t child = p.td.child.get();
  if (child >= t.nchildren) return refuse(&t, p, DropReason::bad_child, tx);
  const ChildConfig& cc = t.cfg.children[child];
  if (p.src_ip != cc.addr.ip) return refuse(&t, p, DropReason::bad_source, tx);
  if (p.td.ncontrib.get() != cc.hosts) return refuse(&t, p, DropReason::bad_ncontrib, tx);
  SlotMeta& m = *c.m;
  // A newer chunk for this slot version: by the window rule every host already has the result
  // of the chunk held here (docs/protocol.md, "Why reuse is safe"), so it can be forgotten.
  const bool reuse = m.state == SlotState::empty || serial_after(c.chunk, m.chunk);
  if (reuse) {
    if (m.state != SlotState::empty && serial_after(m.seq, c.seq))
      return refuse(&t, p, DropReason::stale_seq, tx);
  } else if (c.chunk != m.chunk) {
    return refuse(&t, p, DropReason::stale_chunk, tx);
  } else if (c.seq != m.seq) {
    return refuse(&t, p, DropReason::stale_seq, tx);
  } else if (m.dtype != c.dtype || m.op != c.op || m.count != c.count) {
    return refuse(&t, p, DropReason::chunk_mismatch, tx);
  }
  const std::uint64_t bit = std::uint64_t{1} << child;
  if (!reuse && (m.bitmap & bit) != 0) {
    // Never added twice. The sender retransmitted because it has no result yet: help it along.
    switch (m.state) {
      case SlotState::waiting_parent:
        event(&t, Event::partial_resent);
        return send_up(t, c, tx);
      case SlotState::done:
        event(&t, Event::result_unicast);
        return send_down(t, c, child, 1, tx);
      default:
        return refuse(&t, p, DropReason::duplicate_pending, tx);
    }
  }
  // The last contribution writes the outgoing payload (a root's is also its RESULT buffer). If a
  // frame of this call still points there, it must be sent first: leave this frame for the next
  // call rather than change a payload under a header that names another chunk.
  const bool completes = (reuse ? 1 : m.arrived + 1) == t.nchildren;
  if (completes && (t.root ? m.res_burst : m.out_burst) == burst_) {
    event(&t, Event::tx_deferred);
    *consumed = false;
    return 0;
  }
  if (reuse) {
    if (m.state != SlotState::empty) event(&t, Event::slot_reused);
    SlotMeta fresh;  // the buffer stamps stay: the buffers still hold what was sent from them
    fresh.state = SlotState::accumulating;
    fresh.dtype = c.dtype;
    fresh.op = c.op;
    fresh.count = c.count;
    fresh.chunk = c.chunk;
    fresh.seq = c.seq;
    fresh.out_burst = m.out_burst;
    fresh.res_burst = m.res_burst;
    m = fresh;
  }
  m.bitmap |= bit;
  ++m.arrived;
  m.ncontrib += cc.hosts;
  const auto di = static_cast<std::size_t>(c.dtype);
  const auto oi = static_cast<std::size_t>(c.op);
  std::uint8_t* const acc = c.base;
  if (t.cfg.deterministic) {
    // Keep the payload; the fold happens in child order once all are in.
    std::memcpy(c.base + t.det_off + std::size_t{child} * t.cfg.payload_bytes, p.payload, c.plen);
  } else if (m.arrived == 1) {
    t.load[di][oi](acc, p.payload, c.count);
  } else {
    t.accumulate[di][oi](acc, p.payload, c.count);
  }
  event(&t, Event::contrib_accepted);
  return completes ? complete(t, c, tx) : 0;
}

std::size_t Core::complete(Tree& t, Chunk& c, TxFrame* tx) noexcept {
  // All children are in: fold (deterministic mode), narrow once, send on.
  SlotMeta& m = *c.m;
  const auto di = static_cast<std::size_t>(c.dtype);
  const auto oi = static_cast<std::size_t>(c.op);
  std::uint8_t* const acc = c.base;
  if (t.cfg.deterministic) {
    const void* ptrs[kMaxChildren];
    for (std::size_t k = 0; k < t.nchildren; ++k) {
      ptrs[k] = c.base + t.det_off + k * t.cfg.payload_bytes;
    }
    t.reduce[di][oi](acc, ptrs, t.nchildren, c.count);
  }
  t.emit[di](c.base + t.out_off, acc, c.count);
  if (t.root) {
    m.state = SlotState::done;
    event(&t, Event::result_multicast);
    return send_down(t, c, 0, t.nchildren, tx);
  }
  m.state = SlotState::waiting_parent;
  event(&t, Event::partial_sent);
  return send_up(t, c, tx);
}

std::size_t Core::on_result(Tree& t, const Parsed& p, Chunk& c, TxFrame* tx,
                            bool* consumed) noexcept {
  if (t.root) return refuse(&t, p, DropReason::unexpected_result, tx);
  if (p.src_ip != t.cfg.parent.ip) return refuse(&t, p, DropReason::bad_source, tx);
  if (p.td.child.get() != t.cfg.index_at_parent) return refuse(&t, p, DropReason::bad_child, tx);
  SlotMeta& m = *c.m;
  if (m.state == SlotState::empty || m.chunk != c.chunk || m.seq != c.seq)
    return refuse(&t, p, DropReason::stale_result, tx);
  if (m.state == SlotState::done) return refuse(&t, p, DropReason::duplicate_result, tx);
  if (m.state != SlotState::waiting_parent) return refuse(&t, p, DropReason::unexpected_result, tx);
  if (m.dtype != c.dtype || m.op != c.op || m.count != c.count)
    return refuse(&t, p, DropReason::chunk_mismatch, tx);
  // As in on_contrib(): the RESULT buffer may still be the payload of an unsent frame (chunk
  // c - 2S's multicast or a unicast of it earlier in this call).
  if (m.res_burst == burst_) {
    event(&t, Event::tx_deferred);
    *consumed = false;
    return 0;
  }
  std::memcpy(c.base + t.res_off, p.payload, c.plen);
  m.ncontrib = p.td.ncontrib.get();
  m.state = SlotState::done;
  event(&t, Event::result_multicast);
  return send_down(t, c, 0, t.nchildren, tx);
}

std::size_t Core::send_up(Tree& t, const Chunk& c, TxFrame* tx) noexcept {
  const TdHdr o = make_td(*c.hdr, Opcode::contrib, t.cfg.index_at_parent, c.m->ncontrib, t.cfg.key);
  const TreeHops& h = *t.hops.load(std::memory_order_acquire);
  emit_frame(tx[0], h.parent_l2l4, h.parent_tag, c.full, o, c.base + t.out_off, c.plen);
  c.m->out_burst = burst_;
  t.counters.events[static_cast<std::size_t>(Event::tx_frames)] += 1;
  return 1;
}

std::size_t Core::send_down(Tree& t, const Chunk& c, std::uint16_t first, std::uint16_t n,
                            TxFrame* tx) noexcept {
  const TdHdr o = make_td(*c.hdr, Opcode::result, 0, c.m->ncontrib, t.cfg.key);
  const std::uint8_t* const res = c.base + t.res_off;
  const TreeHops& h = *t.hops.load(std::memory_order_acquire);
  for (std::uint16_t k = 0; k < n; ++k) {
    const auto child = static_cast<std::uint16_t>(first + k);
    emit_frame(tx[k], &h.child_l2l4[child * kL2L4Bytes], h.child_tag[child], c.full, o, res,
               c.plen);
    // Patch the child index in the frame, not in `o`: a 2-byte store into `o` followed by its
    // 32-byte copy stalls store forwarding, which cost ~10 ns per copy (perf, 256 B fan-in 8).
    const be16 be_child = be16::of(child);
    std::memcpy(tx[k].hdr + kL2L4Bytes + offsetof(TdHdr, child), &be_child, 2);
  }
  c.m->res_burst = burst_;
  t.counters.events[static_cast<std::size_t>(Event::tx_frames)] += n;
  return n;
}

std::size_t Core::refuse(Tree* t, const Parsed& p, DropReason r, TxFrame* tx) noexcept {
  drop(t, r);
  if (r == DropReason::bad_key || r == DropReason::bad_source) [[unlikely]] {
    if (nprobes_ < kMaxProbes) {
      probes_[nprobes_++] = Probe{p.src_ip, p.td.tree_id.get(), r};
    } else {
      ++probes_lost_;
    }
  }
  if (p.td.opcode != static_cast<std::uint8_t>(Opcode::contrib) || !nacks(r)) return 0;
  if (nack_budget_ == 0) [[unlikely]] {
    event(t, Event::nack_suppressed);
    return 0;
  }
  --nack_budget_;
  // The NACK goes back to where the CONTRIB came from (its source MAC, IPv4 address and UDP
  // port) and echoes its header with our version and no payload. Its key field is a MAC keyed
  // with the key the CONTRIB carried (the tree's key never goes back, and for unknown_tree or
  // bad_key the sender gets only a MAC under its own key): the sender can tell this NACK from a
  // spoofed one. 0.8 us (wire.h), on refusals only.
  Endpoint dst;
  std::memcpy(dst.mac, p.src_mac, 6);
  dst.ip = p.src_ip;
  dst.port = p.src_port;
  TdHdr n = p.td;
  n.version = kProtocolVersion;
  n.opcode = static_cast<std::uint8_t>(Opcode::nack);
  n.reason = static_cast<std::uint8_t>(r);
  n.count.set(0);
  n.ncontrib.set(0);
  n.key = proto::nack_mac(p.td.key, n);
  write_l2_l4(tx[0].hdr, cfg_.self, dst, sizeof(TdHdr));
  store_header(tx[0].hdr + kL2L4Bytes, n);
  tx[0].payload = nullptr;
  tx[0].payload_len = 0;
  tx[0].hop = kNoHop;
  event(t, Event::nack_sent);
  if (t != nullptr) ++t->counters.events[static_cast<std::size_t>(Event::tx_frames)];
  return 1;
}

}  // namespace treeduce::dp
