#include "sim_fabric.h"

#include <algorithm>
#include <limits>

#include "treeduce/aggregation/kernels.h"

namespace treeduce::sim {

namespace {
constexpr std::uint32_t kIpBase = 0x0A000000;  // 10.0.0.0/8
constexpr std::uint16_t kHostPort = 50000;
}  // namespace

Fabric::Fabric(std::uint64_t seed, LinkModel link) : rng_(seed), link_(link) {
  tx_.resize(32 * dp::kMaxChildren);
}

dp::Endpoint Fabric::make_addr(std::size_t node_id, std::uint16_t port) const {
  dp::Endpoint e;
  e.mac[0] = 0x02;  // locally administered
  e.mac[4] = static_cast<std::uint8_t>(node_id >> 8);
  e.mac[5] = static_cast<std::uint8_t>(node_id);
  e.ip = kIpBase + 1 + static_cast<std::uint32_t>(node_id);
  e.port = port;
  return e;
}

dp::Endpoint Fabric::rogue_addr() {
  dp::Endpoint e;
  e.mac[0] = 0x02;
  e.mac[1] = 0xBA;
  e.ip = 0xC0A80001;  // 192.168.0.1: no node
  e.port = 666;
  return e;
}

int Fabric::add_switch() {
  const std::size_t id = nodes_.size();
  SwitchNode s;
  s.addr = make_addr(id, dp::kDefaultUdpPort);
  s.core = std::make_unique<dp::Core>(dp::CoreConfig{s.addr});
  nodes_.push_back({true, switches_.size()});
  by_ip_[s.addr.ip] = static_cast<int>(id);
  switches_.push_back(std::move(s));
  return static_cast<int>(switches_.size() - 1);
}

int Fabric::install(const JobSpec& spec, const TopoNode& n, int job, bool is_root,
                    const dp::Endpoint& parent, std::uint16_t index_at_parent,
                    std::uint16_t* hosts) {
  if (n.sw < 0) {  // a host
    const std::size_t id = nodes_.size();
    HostNode h;
    h.job = job;
    h.index = static_cast<std::uint16_t>(std::count_if(
        hosts_.begin(), hosts_.end(), [&](const HostNode& x) { return x.job == job; }));
    h.addr = make_addr(id, kHostPort);
    host::EngineConfig ec;
    ec.tree_id = spec.tree_id;
    ec.key = spec.key;
    ec.child_index = index_at_parent;
    ec.slots = spec.slots;
    ec.payload_bytes = spec.payload_bytes;
    ec.rto_initial_ns = spec.rto_initial_ns;
    ec.rto_max_ns = spec.rto_max_ns;
    ec.adaptive_rto = spec.adaptive_rto;
    ec.rto = spec.rto;
    ec.max_retries = 60;
    h.engine = std::make_unique<host::ProtocolEngine>(ec);
    nodes_.push_back({false, hosts_.size()});
    by_ip_[h.addr.ip] = static_cast<int>(id);
    hosts_.push_back(std::move(h));
    leaf_of_.push_back(parent);
    *hosts = 1;
    return 0;
  }
  SwitchNode& s = switches_[static_cast<std::size_t>(n.sw)];
  dp::TreeConfig tc;
  tc.tree_id = spec.tree_id;
  tc.key = spec.key;
  tc.role = is_root ? dp::Role::root : dp::Role::inner;
  tc.parent = parent;
  tc.index_at_parent = index_at_parent;
  tc.slots = spec.slots;
  tc.payload_bytes = spec.payload_bytes;
  tc.deterministic = spec.deterministic;
  std::uint16_t total = 0;
  for (std::size_t i = 0; i < n.kids.size(); ++i) {
    std::uint16_t h = 0;
    const std::size_t host_before = hosts_.size();
    if (install(spec, n.kids[i], job, false, s.addr, static_cast<std::uint16_t>(i), &h) != 0) {
      return -1;
    }
    dp::ChildConfig cc;
    cc.addr = n.kids[i].sw < 0 ? hosts_[host_before].addr
                               : switches_[static_cast<std::size_t>(n.kids[i].sw)].addr;
    cc.hosts = h;
    tc.children.push_back(cc);
    total = static_cast<std::uint16_t>(total + h);
  }
  *hosts = total;
  return s.core->install_tree(tc).ok() ? 0 : -1;
}

int Fabric::add_job(const JobSpec& spec) {
  const int job = static_cast<int>(jobs_.size());
  jobs_.push_back(spec);
  std::uint16_t world = 0;
  if (install(spec, spec.root, job, true, dp::Endpoint{}, 0, &world) != 0) return -1;
  for (auto& h : hosts_) {
    if (h.job != job) continue;
    host::EngineConfig ec = h.engine->config();
    ec.world = world;
    h.engine = std::make_unique<host::ProtocolEngine>(ec);
    h.outputs.resize(spec.inputs.size());
  }
  return job;
}

std::vector<const HostNode*> Fabric::hosts(int job) const {
  std::vector<const HostNode*> v;
  for (const auto& h : hosts_) {
    if (h.job == job) v.push_back(&h);
  }
  return v;
}

void Fabric::send_raw(int node, std::vector<std::uint8_t> frame, std::uint64_t at) {
  const std::uint64_t poll = link_.switch_poll_ns;
  if (poll != 0 && nodes_[static_cast<std::size_t>(node)].is_switch)
    at = (at + poll - 1) / poll * poll;
  queue_.push(Ev{at, order_++, node, std::move(frame)});
}

void Fabric::inject(int sw, std::vector<std::uint8_t> frame, std::uint64_t at_ns) {
  std::size_t id = 0;
  for (; id < nodes_.size(); ++id) {
    if (nodes_[id].is_switch && nodes_[id].index == static_cast<std::size_t>(sw)) break;
  }
  send_raw(static_cast<int>(id), std::move(frame), at_ns);
}

void Fabric::inject_to_address(std::vector<std::uint8_t> frame, std::uint64_t at_ns) {
  const auto ip = dp::load_header<dp::Ipv4Hdr>(frame.data() + sizeof(dp::EtherHdr));
  const auto it = by_ip_.find(ip.dst_addr.get());
  if (it == by_ip_.end()) {
    ++stats_.unroutable;
    return;
  }
  send_raw(it->second, std::move(frame), at_ns);
}

void Fabric::send(const std::uint8_t* frame, std::size_t len) {
  ++stats_.sent;
  const auto ip = dp::load_header<dp::Ipv4Hdr>(frame + sizeof(dp::EtherHdr));
  const auto it = by_ip_.find(ip.dst_addr.get());
  if (it == by_ip_.end()) {
    ++stats_.unroutable;
    return;
  }
  std::uniform_real_distribution<double> u(0.0, 1.0);
  if (u(rng_) < link_.loss) {
    ++stats_.lost;
    return;
  }
  const int copies = u(rng_) < link_.dup ? 2 : 1;
  if (copies == 2) ++stats_.duplicated;
  for (int c = 0; c < copies; ++c) {
    const std::uint64_t jitter =
        link_.jitter_ns == 0
            ? 0
            : std::uniform_int_distribution<std::uint64_t>(0, link_.jitter_ns)(rng_);
    send_raw(it->second, std::vector<std::uint8_t>(frame, frame + len),
             now_ + link_.delay_ns + jitter + (c == 1 ? link_.dup_delay_ns : 0));
  }
}

void Fabric::check_result(const std::uint8_t* frame, std::size_t len) {
  const auto td = dp::load_header<dp::TdHdr>(frame + dp::kFrameHeaderBytes - sizeof(dp::TdHdr));
  if (td.opcode != static_cast<std::uint8_t>(dp::Opcode::result)) return;
  ++stats_.results_checked;
  std::size_t j = 0;
  while (j < jobs_.size() && jobs_[j].tree_id != td.tree_id.get()) ++j;
  const std::uint32_t seq = td.seq.get();  // the engine counts collectives from 0
  if (j == jobs_.size() || seq >= jobs_[j].inputs.size()) {
    ++stats_.wrong_results;
    return;
  }
  const JobSpec& spec = jobs_[j];
  refs_.resize(jobs_.size());
  while (refs_[j].size() <= seq) refs_[j].push_back(reference(spec, refs_[j].size()));
  // Chunks continue from one collective to the next: the first of collective `seq`.
  const std::size_t per = spec.payload_bytes / dtype_size(spec.dtype);
  std::uint32_t first = 0;
  for (std::uint32_t c = 0; c < seq; ++c)
    first += static_cast<std::uint32_t>(
        (spec.inputs[c][0].size() / dtype_size(spec.dtype) + per - 1) / per);
  const std::size_t off = std::size_t{td.chunk.get() - first} * spec.payload_bytes;
  const std::size_t n = len - dp::kFrameHeaderBytes;
  const auto& ref = refs_[j][seq];
  if (off + n > ref.size() ||
      std::memcmp(frame + dp::kFrameHeaderBytes, ref.data() + off, n) != 0) {
    ++stats_.wrong_results;
  }
}

void Fabric::start_collective(HostNode& h) {
  const JobSpec& spec = jobs_[static_cast<std::size_t>(h.job)];
  const auto& in = spec.inputs[h.collective][h.index];
  h.outputs[h.collective].assign(in.size(), 0xEE);
  const host::Status st =
      h.engine->enqueue(in.data(), h.outputs[h.collective].data(),
                        in.size() / dtype_size(spec.dtype), spec.dtype, spec.op);
  ++h.collective;
  if (st != host::Status::running) {
    h.finished = true;
    h.final_status = st;
  }
}

void Fabric::host_step(HostNode& h) {
  if (h.finished) return;
  const JobSpec& spec = jobs_[static_cast<std::size_t>(h.job)];
  const std::size_t depth = std::max<std::uint32_t>(spec.pipeline, 1);
  for (;;) {
    const host::Status st = h.engine->status();
    if (st != host::Status::running && st != host::Status::done && st != host::Status::idle) {
      h.finished = true;
      h.final_status = st;
      break;
    }
    if (h.engine->completed() == spec.inputs.size()) {
      h.finished = true;
      h.final_status = host::Status::done;
      break;
    }
    // Keep `depth` collectives queued (one at a time: the next once the last is done).
    while (h.collective < spec.inputs.size() && h.engine->in_flight() < depth && !h.finished) {
      start_collective(h);
    }
    if (h.finished) break;
    host::OutPacket out[64];
    const std::size_t n = h.engine->poll(now_, out, 64);
    std::uint8_t buf[dp::kMaxFrameBytes];
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t len =
          dp::build_frame(buf, h.addr, leaf_of_[static_cast<std::size_t>(&h - hosts_.data())],
                          out[i].td, out[i].payload, out[i].payload_len);
      send(buf, len);
    }
    if (n < 64) break;
  }
  h.deadline = h.finished ? std::numeric_limits<std::uint64_t>::max() : h.engine->next_deadline();
}

bool Fabric::run(std::uint64_t limit_ns) {
  for (auto& h : hosts_) {
    host_step(h);
  }
  std::vector<std::vector<std::vector<std::uint8_t>>> per_node(nodes_.size());
  for (;;) {
    std::uint64_t t = queue_.empty() ? std::numeric_limits<std::uint64_t>::max() : queue_.top().t;
    bool all_finished = true;
    for (const auto& h : hosts_) {
      if (h.finished) continue;
      all_finished = false;
      t = std::min(t, h.deadline);
    }
    if (all_finished && queue_.empty()) break;
    if (t == std::numeric_limits<std::uint64_t>::max() || t > limit_ns) break;
    now_ = std::max(now_, t);
    while (!queue_.empty() && queue_.top().t <= now_) {
      Ev ev = std::move(const_cast<Ev&>(queue_.top()));
      queue_.pop();
      per_node[static_cast<std::size_t>(ev.node)].push_back(std::move(ev.frame));
    }
    for (std::size_t id = 0; id < nodes_.size(); ++id) {
      auto& frames = per_node[id];
      if (frames.empty()) continue;
      stats_.delivered += frames.size();
      if (nodes_[id].is_switch) {
        dp::Core& core = *switches_[nodes_[id].index].core;
        std::vector<dp::RxFrame> rx;
        for (const auto& f : frames) rx.push_back({f.data(), f.size()});
        std::size_t done = 0;
        while (done < rx.size()) {
          const std::size_t burst = std::min<std::size_t>(32, rx.size() - done);
          std::size_t ntx = 0;
          done += core.process_burst(rx.data() + done, burst, tx_.data(), tx_.size(), &ntx);
          std::uint8_t buf[dp::kMaxFrameBytes];
          for (std::size_t k = 0; k < ntx; ++k) {
            std::memcpy(buf, tx_[k].hdr, dp::kFrameHeaderBytes);
            if (tx_[k].payload_len != 0) {
              std::memcpy(buf + dp::kFrameHeaderBytes, tx_[k].payload, tx_[k].payload_len);
            }
            if (check_results_) check_result(buf, tx_[k].len());
            send(buf, tx_[k].len());
          }
        }
      } else {
        HostNode& h = hosts_[nodes_[id].index];
        for (const auto& f : frames) {
          dp::Parsed p;
          if (dp::parse_frame(f.data(), f.size(), h.addr.ip, h.addr.port, &p) !=
              dp::DropReason::none) {
            continue;
          }
          if (!h.finished) h.engine->on_packet(p.td, p.payload, p.payload_len, now_);
        }
        h.deadline = 0;  // step it below
      }
      frames.clear();
    }
    for (auto& h : hosts_) {
      if (!h.finished && h.deadline <= now_) host_step(h);
    }
  }
  for (const auto& h : hosts_) {
    if (!h.finished || h.final_status != host::Status::done) return false;
  }
  return true;
}

namespace {

// Reduce the subtree at `n` for one collective into `out` (wire type), leaves taken in order.
void reduce_subtree(const JobSpec& spec, const TopoNode& n, std::size_t collective,
                    std::size_t* next_host, std::vector<std::uint8_t>* out) {
  if (n.sw < 0) {
    *out = spec.inputs[collective][(*next_host)++];
    return;
  }
  std::vector<std::vector<std::uint8_t>> kids(n.kids.size());
  for (std::size_t i = 0; i < n.kids.size(); ++i) {
    reduce_subtree(spec, n.kids[i], collective, next_host, &kids[i]);
  }
  const std::size_t count = kids[0].size() / dtype_size(spec.dtype);
  const agg::KernelTable* k = agg::kernels_for(agg::Isa::scalar);
  // Chunk by chunk, exactly as the switch does: the kernels are element-wise, so this only
  // matters for being obviously the same computation.
  const std::size_t per = spec.payload_bytes / dtype_size(spec.dtype);
  out->assign(kids[0].size(), 0);
  std::vector<std::uint8_t> acc(per * acc_size(spec.dtype));
  std::vector<const void*> ptrs(kids.size());
  for (std::size_t first = 0; first < count; first += per) {
    const std::size_t m = std::min(per, count - first);
    for (std::size_t i = 0; i < kids.size(); ++i) {
      ptrs[i] = kids[i].data() + first * dtype_size(spec.dtype);
    }
    k->reduce_fn(spec.dtype, spec.op)(acc.data(), ptrs.data(), ptrs.size(), m);
    k->emit_fn(spec.dtype)(out->data() + first * dtype_size(spec.dtype), acc.data(), m);
  }
}

}  // namespace

std::vector<std::uint8_t> reference(const JobSpec& spec, std::size_t collective) {
  std::size_t next = 0;
  std::vector<std::uint8_t> out;
  reduce_subtree(spec, spec.root, collective, &next, &out);
  return out;
}

}  // namespace treeduce::sim
