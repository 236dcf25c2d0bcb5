#include "treeduce/host/protocol_engine.h"

#include "treeduce/protocol/tree.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace treeduce::host {

using proto::bswap_be;

ProtocolEngine::ProtocolEngine(const EngineConfig& cfg)
    : cfg_(cfg), slot_mask_(cfg.slots - 1), slots_(cfg.slots), rto_est_(cfg.rto) {}

Status ProtocolEngine::start(const void* send, void* recv, std::size_t count, DType dtype,
                             ReduceOp op) {
  if (status_ == Status::running) return Status::invalid;
  return enqueue(send, recv, count, dtype, op);
}

Status ProtocolEngine::enqueue(const void* send, void* recv, std::size_t count, DType dtype,
                               ReduceOp op) {
  if (count == 0 || send == nullptr || recv == nullptr ||
      static_cast<std::size_t>(dtype) >= kNumDTypes ||
      static_cast<std::size_t>(op) >= kNumReduceOps || proto::check_slots(cfg_.slots) ||
      proto::check_payload_bytes(cfg_.payload_bytes)) {
    return Status::invalid;
  }
  if (status_ != Status::running) {
    // A new stream of collectives (after idle, done or a failure): nothing is in flight.
    colls_.clear();
    feed_ = 0;
    nack_reason_ = proto::Reason::none;
    for (auto& s : slots_) s = SlotState{};
    probe_active_ = false;
  }
  // The stream continues where the last collective ended: the window rule (send chunk c+S only
  // after the result of chunk c) must hold across collectives, or a fast host could overwrite a
  // slot version another host still needs. A queued collective's chunks follow the previous
  // collective's in the stream (docs/protocol.md, "Host behaviour", pipelining).
  if (started_once_) ++seq_;
  started_once_ = true;
  Coll c;
  c.send = static_cast<const std::uint8_t*>(send);
  c.recv = static_cast<std::uint8_t*>(recv);
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.elems_per_chunk = cfg_.payload_bytes / dtype_size(dtype);
  c.nchunks = (count + c.elems_per_chunk - 1) / c.elems_per_chunk;
  c.base = next_base_;
  c.seq = seq_;
  next_base_ += static_cast<std::uint32_t>(c.nchunks);
  colls_.push_back(c);
  status_ = Status::running;
  return status_;
}

const ProtocolEngine::Coll* ProtocolEngine::coll_of(std::uint32_t seq) const noexcept {
  if (colls_.empty()) return nullptr;
  const std::uint32_t k = seq - colls_.front().seq;  // serial arithmetic
  return k < colls_.size() ? &colls_[k] : nullptr;
}

OutPacket ProtocolEngine::make_packet(const SlotState& s) const {
  const Coll& c = *coll_of(s.seq);
  const std::size_t first = s.index * c.elems_per_chunk;
  const std::size_t n = std::min(c.elems_per_chunk, c.count - first);
  proto::TdHdr h{};
  h.version = proto::kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(proto::Opcode::contrib);
  h.dtype = static_cast<std::uint8_t>(c.dtype);
  h.op = static_cast<std::uint8_t>(c.op);
  h.tree_id.set(cfg_.tree_id);
  h.child.set(cfg_.child_index);
  h.slot.set(static_cast<std::uint16_t>(s.chunk & slot_mask_));
  h.slot_ver = static_cast<std::uint8_t>((s.chunk >> std::countr_zero(cfg_.slots)) & 1);
  h.count.set(static_cast<std::uint16_t>(n));
  h.ncontrib.set(std::uint16_t{1});
  h.chunk.set(s.chunk);
  h.seq.set(s.seq);
  h.key.set(cfg_.key);
  return OutPacket{h, c.send + first * dtype_size(c.dtype),
                   static_cast<std::uint32_t>(n * dtype_size(c.dtype))};
}

std::size_t ProtocolEngine::poll(std::uint64_t now, OutPacket* out, std::size_t cap,
                                 std::uint64_t* next) {
  constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  if (next != nullptr) *next = kNever;
  if (status_ != Status::running) return 0;
  std::size_t n = 0;
  // next_deadline() as it will be after this call, found on the way. The feed below stops at a
  // busy slot (or runs out of chunks), so its part of next_deadline() is never 0 afterwards.
  std::uint64_t soonest = kNever;
  // Give free slots to the next chunks, in stream order and across collectives: chunk c goes to
  // slot c mod S, which is free only once the result of chunk c - S is in.
  while (feed_ < colls_.size()) {
    Coll& c = colls_[feed_];
    if (c.next_index == c.nchunks) {
      ++feed_;
      continue;
    }
    const std::uint32_t chunk = c.base + static_cast<std::uint32_t>(c.next_index);
    SlotState& s = slots_[chunk & slot_mask_];
    if (s.active) break;
    s = SlotState{true, chunk, c.seq, c.next_index, 0, cfg_.rto_initial_ns, 0, true};
    ++c.next_index;
  }
  for (auto& s : slots_) {
    if (n == cap && next == nullptr) break;
    if (!s.active) continue;
    if (n == cap) {  // `out` is full: the slot waits for the next poll(), untouched
      soonest = std::min(soonest, s.need_send ? 0 : s.deadline);
      continue;
    }
    if (s.need_send) {
      s.need_send = false;
      s.rto = cfg_.adaptive_rto ? rto_est_.rto(now) : cfg_.rto_initial_ns;
      s.sent_at = now;
      s.deadline = now + s.rto;
      out[n++] = make_packet(s);
      ++stats_.sent;
    } else if (s.deadline <= now) {
      // Waiting its turn: a RESULT of a chunk sent once came since this chunk's timer started,
      // and none of a chunk later in the stream. Each rank sends its chunks in stream order over
      // links that keep order, so a switch completes them in that order: the stream moves, and
      // this chunk is queued behind the ones being answered (a slow rank or switch delays every
      // chunk alike). A lost contribution or RESULT shows otherwise: a later chunk answered
      // first, or no RESULT for a whole timeout (then the rules below). Its timer starts again
      // from that last RESULT, when its turn came: a chunk lost at the tail of the stream goes
      // again one timeout after the last RESULT before it, not a timeout after this poll; and
      // only a newer RESULT can hold it again, at most once per chunk ahead of it.
      if (last_result_at_ != kNoTime && last_result_at_ > s.deadline - s.rto &&
          last_result_at_ + s.rto > now && !answered_after(s.chunk)) {
        ++stats_.held;
        s.held = true;
        s.deadline = last_result_at_ + s.rto;
        soonest = std::min(soonest, s.deadline);
        continue;
      }
      // Adaptive timer: while a retransmitted chunk (the probe) has had no RESULT come back, and
      // no other RESULT came since it went, the stream looks stalled, not lossy: another chunk
      // whose timer runs out waits one more timeout, once, instead of going again too (a
      // descheduled rank stalls every chunk of the window at once). Once only: ranks whose
      // probes wait for each other's deferred chunks would otherwise wait for ever.
      if (cfg_.adaptive_rto && probe_active_ && probe_chunk_ != s.chunk && !s.deferred) {
        s.deferred = true;
        s.deadline = now + s.rto;
        soonest = std::min(soonest, s.deadline);
        continue;
      }
      if (s.retries >= cfg_.max_retries) {
        finish(Status::timeout);
        return n;  // *next stays kNever: nothing is pending
      }
      probe_active_ = true;
      probe_chunk_ = s.chunk;
      ++s.retries;
      s.retx_at = now;
      s.rto = std::min(s.rto * 2, cfg_.rto_max_ns);
      s.deadline = now + s.rto;
      out[n++] = make_packet(s);
      ++stats_.retransmits;
    }
    soonest = std::min(soonest, s.deadline);
  }
  if (next != nullptr) *next = soonest;
  return n;
}

void ProtocolEngine::finish(Status st) {
  status_ = st;
  for (auto& s : slots_) s.active = false;
}

void ProtocolEngine::on_packet(const proto::TdHdr& td, const std::uint8_t* payload, std::size_t len,
                               std::uint64_t now) {
  const std::uint32_t chunk = td.chunk.get();
  const Coll* cp = status_ == Status::running ? coll_of(td.seq.get()) : nullptr;
  if (cp == nullptr || td.version != proto::kProtocolVersion || td.tree_id.get() != cfg_.tree_id ||
      td.child.get() != cfg_.child_index) {
    ++stats_.ignored;
    return;
  }
  SlotState& s = slots_[chunk & slot_mask_];
  const bool current = s.active && s.chunk == chunk && s.seq == td.seq.get();
  if (td.opcode == static_cast<std::uint8_t>(proto::Opcode::nack)) {
    // A NACK names a chunk we sent. Only one for a chunk still in flight can fail the
    // collective: a late NACK for a finished chunk says nothing new. Its MAC (keyed with the key
    // our CONTRIB carried) must verify: anyone who can send us a datagram could forge the rest.
    // One that does not is as if lost; the chunk's timer goes on (docs/protocol.md section 5).
    if (!current) {
      ++stats_.ignored;
      return;
    }
    if (!proto::nack_verifies(cfg_.key, td)) {
      ++stats_.nack_unverified;
      return;
    }
    nack_reason_ = static_cast<proto::Reason>(td.reason);
    finish(Status::refused);
    return;
  }
  if (td.opcode != static_cast<std::uint8_t>(proto::Opcode::result) || td.key.get() != cfg_.key) {
    ++stats_.ignored;
    return;
  }
  if (!current) {
    // Results of earlier chunks arrive again when another host's retransmission made a switch
    // multicast, or after our own retransmission crossed the first result.
    ++stats_.duplicates;
    return;
  }
  const std::size_t k = td.seq.get() - colls_.front().seq;
  Coll& c = colls_[k];
  const std::size_t first = s.index * c.elems_per_chunk;
  const std::size_t n = std::min(c.elems_per_chunk, c.count - first);
  if (td.dtype != static_cast<std::uint8_t>(c.dtype) || td.op != static_cast<std::uint8_t>(c.op) ||
      td.count.get() != n || len != n * dtype_size(c.dtype) || td.ncontrib.get() != cfg_.world ||
      td.slot.get() != (chunk & slot_mask_)) {
    finish(Status::bad_result);
    return;
  }
  std::memcpy(c.recv + first * dtype_size(c.dtype), payload, len);
  probe_active_ = false;  // a RESULT came: the stream moves
  // First transmissions go out in stream order, so "sent later" is "later in the stream".
  const bool overtaken = answered_after(chunk);
  if (!answered_any_ || static_cast<std::int32_t>(chunk - newest_answered_) > 0) {
    newest_answered_ = chunk;
  }
  answered_any_ = true;
  if (now != kNoTime) {
    // Only a chunk this rank sent once says that the stream moves in order; one it sent again
    // was a loss (or a stall) being repaired.
    if (s.retries == 0) last_result_at_ = now;
    take_sample(s, now, overtaken);
  }
  s.active = false;
  ++stats_.results;
  ++c.completed;
  // Collectives complete in queue order: a later one whose chunks are all in waits for the
  // earlier ones.
  while (!colls_.empty() && colls_.front().completed == colls_.front().nchunks) {
    colls_.pop_front();
    ++done_total_;
    if (feed_ > 0) --feed_;
  }
  if (colls_.empty()) status_ = Status::done;
}

// The adaptive timer's samples (docs/protocol.md, "Host behaviour"): the time from a chunk's
// first transmission to its RESULT, taken only when it is unambiguous and says how long a
// result takes, not how long a loss took to repair:
// - Karn's rule: a retransmitted chunk gives no sample, except when its one retransmission was
//   needless: the RESULT came sooner after it than half the shortest sample seen, faster than any
//   round trip, so it answers the first transmission (the rank itself was descheduled and found
//   results waiting, say). That sample is what the timeout missed, so it is the one to learn.
// - A chunk whose RESULT came after the RESULT of a chunk later in the stream (first sent later,
//   or later in the same batch) was overtaken: it
//   waited for someone's loss recovery (its own, or another rank's retransmission of a lost
//   contribution), or was reordered. Learning that wait would feed the ranks' timeouts into each
//   other and climb to the ceiling under loss; a rank that is only slow (descheduled, queued)
//   delays every chunk alike and in order, and those samples stay in.
// - A chunk whose timer ran out and was held (waiting its turn) or deferred (a stalled stream):
//   its wait outlasted the timeout, and may hold another rank's loss recovery (the last chunk
//   of a stream, which nothing can overtake, waits so for a lost contribution of another rank).
// A sample includes the skew between ranks: a RESULT waits for the slowest rank's contribution,
// so a chunk this rank sent early measures its wait for the others too, which is what its timer
// must allow for.
void ProtocolEngine::take_sample(const SlotState& s, std::uint64_t now, bool overtaken) {
  if (!cfg_.adaptive_rto || overtaken || s.deferred || s.held || now < s.sent_at) return;
  if (s.retries != 0) {
    const bool needless = s.retries == 1 && rto_est_.samples() != 0 && now >= s.retx_at &&
                          now - s.retx_at < rto_est_.min_ns() / 2;
    if (!needless) return;
    ++stats_.spurious;
  }
  rto_est_.sample(now - s.sent_at, now);
  ++stats_.rto_samples;
}

bool ProtocolEngine::answered_after(std::uint32_t chunk) const noexcept {
  return answered_any_ && static_cast<std::int32_t>(newest_answered_ - chunk) > 0;  // serial
}

std::uint64_t ProtocolEngine::next_deadline() const noexcept {
  if (status_ != Status::running) return std::numeric_limits<std::uint64_t>::max();
  std::uint64_t d = std::numeric_limits<std::uint64_t>::max();
  for (std::size_t i = feed_; i < colls_.size(); ++i) {
    const Coll& c = colls_[i];
    if (c.next_index == c.nchunks) continue;
    if (!slots_[(c.base + static_cast<std::uint32_t>(c.next_index)) & slot_mask_].active) return 0;
    break;
  }
  for (const auto& s : slots_) {
    if (!s.active) continue;
    d = std::min(d, s.need_send ? 0 : s.deadline);
  }
  return d;
}

std::uint64_t ProtocolEngine::next_timeout() const noexcept {
  std::uint64_t d = std::numeric_limits<std::uint64_t>::max();
  if (status_ != Status::running) return d;
  for (const auto& s : slots_)
    if (s.active && !s.need_send) d = std::min(d, s.deadline);
  return d;
}

}  // namespace treeduce::host
