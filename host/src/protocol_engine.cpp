#include "treeduce/host/protocol_engine.h"

#include "treeduce/protocol/tree.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

namespace treeduce::host {

using proto::bswap_be;

ProtocolEngine::ProtocolEngine(const EngineConfig& cfg)
    : cfg_(cfg), slot_mask_(cfg.slots - 1), slots_(cfg.slots) {}

Status ProtocolEngine::start(const void* send, void* recv, std::size_t count, DType dtype,
                             ReduceOp op) {
  if (status_ == Status::running || count == 0 || send == nullptr || recv == nullptr ||
      static_cast<std::size_t>(dtype) >= kNumDTypes ||
      static_cast<std::size_t>(op) >= kNumReduceOps || proto::check_slots(cfg_.slots) ||
      proto::check_payload_bytes(cfg_.payload_bytes)) {
    return Status::invalid;
  }
  // The stream continues where the last collective ended: the window rule (send chunk c+S only
  // after the result of chunk c) must hold across collectives, or a fast host could overwrite a
  // slot version another host still needs.
  if (started_once_) {
    base_ += static_cast<std::uint32_t>(nchunks_);
    ++seq_;
  }
  started_once_ = true;
  send_ = static_cast<const std::uint8_t*>(send);
  recv_ = static_cast<std::uint8_t*>(recv);
  count_ = count;
  dtype_ = dtype;
  op_ = op;
  elems_per_chunk_ = cfg_.payload_bytes / dtype_size(dtype);
  nchunks_ = (count + elems_per_chunk_ - 1) / elems_per_chunk_;
  next_index_ = 0;
  completed_ = 0;
  nack_reason_ = proto::Reason::none;
  for (auto& s : slots_) s = SlotState{};
  status_ = Status::running;
  return status_;
}

OutPacket ProtocolEngine::make_packet(const SlotState& s) const {
  const std::size_t first = s.index * elems_per_chunk_;
  const std::size_t n = std::min(elems_per_chunk_, count_ - first);
  proto::TdHdr h{};
  h.version = proto::kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(proto::Opcode::contrib);
  h.dtype = static_cast<std::uint8_t>(dtype_);
  h.op = static_cast<std::uint8_t>(op_);
  h.tree_id.set(cfg_.tree_id);
  h.child.set(cfg_.child_index);
  h.slot.set(static_cast<std::uint16_t>(s.chunk & slot_mask_));
  h.slot_ver = static_cast<std::uint8_t>((s.chunk >> std::countr_zero(cfg_.slots)) & 1);
  h.count.set(static_cast<std::uint16_t>(n));
  h.ncontrib.set(std::uint16_t{1});
  h.chunk.set(s.chunk);
  h.seq.set(seq_);
  h.key.set(cfg_.key);
  return OutPacket{h, send_ + first * dtype_size(dtype_),
                   static_cast<std::uint32_t>(n * dtype_size(dtype_))};
}

std::size_t ProtocolEngine::poll(std::uint64_t now, OutPacket* out, std::size_t cap) {
  if (status_ != Status::running) return 0;
  std::size_t n = 0;
  // Give free slots to the next chunks, in stream order: chunk c goes to slot c mod S, which is
  // free only once the result of chunk c - S is in.
  while (next_index_ < nchunks_) {
    const std::uint32_t chunk = base_ + static_cast<std::uint32_t>(next_index_);
    SlotState& s = slots_[chunk & slot_mask_];
    if (s.active) break;
    s = SlotState{true, chunk, next_index_, 0, cfg_.rto_initial_ns, 0, true};
    ++next_index_;
  }
  for (auto& s : slots_) {
    if (n == cap) break;
    if (!s.active) continue;
    if (s.need_send) {
      s.need_send = false;
      s.deadline = now + s.rto;
      out[n++] = make_packet(s);
      ++stats_.sent;
    } else if (s.deadline <= now) {
      if (s.retries >= cfg_.max_retries) {
        finish(Status::timeout);
        return n;
      }
      ++s.retries;
      s.rto = std::min(s.rto * 2, cfg_.rto_max_ns);
      s.deadline = now + s.rto;
      out[n++] = make_packet(s);
      ++stats_.retransmits;
    }
  }
  return n;
}

void ProtocolEngine::finish(Status st) {
  status_ = st;
  for (auto& s : slots_) s.active = false;
}

void ProtocolEngine::on_packet(const proto::TdHdr& td, const std::uint8_t* payload,
                               std::size_t len) {
  const std::uint32_t chunk = td.chunk.get();
  if (status_ != Status::running || td.version != proto::kProtocolVersion ||
      td.tree_id.get() != cfg_.tree_id || td.seq.get() != seq_ ||
      td.child.get() != cfg_.child_index) {
    ++stats_.ignored;
    return;
  }
  SlotState& s = slots_[chunk & slot_mask_];
  const bool current = s.active && s.chunk == chunk;
  if (td.opcode == static_cast<std::uint8_t>(proto::Opcode::nack)) {
    // A NACK names a chunk we sent (NACKs carry no key). Only one for a chunk still in flight
    // can fail the collective: a late NACK for a finished chunk says nothing new.
    if (!current) {
      ++stats_.ignored;
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
  const std::size_t first = s.index * elems_per_chunk_;
  const std::size_t n = std::min(elems_per_chunk_, count_ - first);
  if (td.dtype != static_cast<std::uint8_t>(dtype_) || td.op != static_cast<std::uint8_t>(op_) ||
      td.count.get() != n || len != n * dtype_size(dtype_) || td.ncontrib.get() != cfg_.world ||
      td.slot.get() != (chunk & slot_mask_)) {
    finish(Status::bad_result);
    return;
  }
  std::memcpy(recv_ + first * dtype_size(dtype_), payload, len);
  s.active = false;
  ++stats_.results;
  if (++completed_ == nchunks_) status_ = Status::done;
}

std::uint64_t ProtocolEngine::next_deadline() const noexcept {
  if (status_ != Status::running) return std::numeric_limits<std::uint64_t>::max();
  std::uint64_t d = std::numeric_limits<std::uint64_t>::max();
  if (next_index_ < nchunks_ &&
      !slots_[(base_ + static_cast<std::uint32_t>(next_index_)) & slot_mask_].active) {
    return 0;
  }
  for (const auto& s : slots_) {
    if (!s.active) continue;
    d = std::min(d, s.need_send ? 0 : s.deadline);
  }
  return d;
}

}  // namespace treeduce::host
