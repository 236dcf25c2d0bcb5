// The ibverbs raw-packet transport; design, limits and what was never run on a device are in
// verbs_transport.h.
#include "verbs_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "environment.h"

namespace treeduce::host {

namespace detail {

static_assert(offsetof(FlowRule, eth) == sizeof(ibv_flow_attr));
static_assert(offsetof(FlowRule, ipv4) == offsetof(FlowRule, eth) + sizeof(ibv_flow_spec_eth));
static_assert(offsetof(FlowRule, udp) == offsetof(FlowRule, ipv4) + sizeof(ibv_flow_spec_ipv4));
static_assert(sizeof(FlowRule) == offsetof(FlowRule, udp) + sizeof(ibv_flow_spec_tcp_udp));

namespace {

bool unicast_mac(const std::uint8_t m[6]) {
  static constexpr std::uint8_t zero[6] = {};
  return (m[0] & 1) == 0 && std::memcmp(m, zero, 6) != 0;
}

}  // namespace

std::string validate_options(const VerbsTransportOptions& opt, VerbsResolved* out) {
  VerbsResolved r;
  if (opt.port_num == 0)
    return "The RDMA device port number must be 1 or more (ports are 1-based).";
  in_addr a{};
  if (inet_pton(AF_INET, opt.local_address.c_str(), &a) != 1) {
    return "The local address '" + opt.local_address + "' is not an IPv4 address.";
  }
  r.self.ip = ntohl(a.s_addr);
  if (r.self.ip == 0) return "The local address must not be 0.0.0.0 (no kernel socket binds it).";
  if (opt.port == 0) return "The local UDP port must be from 1 to 65535, not 0.";
  r.self.port = opt.port;
  if (!parse_mac(opt.local_mac, r.self.mac) || !unicast_mac(r.self.mac)) {
    return "The local MAC address '" + opt.local_mac + "' is not a unicast aa:bb:cc:dd:ee:ff.";
  }
  if (!parse_ipv4_endpoint(opt.leaf_address, &r.leaf.ip, &r.leaf.port)) {
    return "The leaf switch address '" + opt.leaf_address + "' is not a.b.c.d:port.";
  }
  if (!parse_mac(opt.leaf_mac, r.leaf.mac) || !unicast_mac(r.leaf.mac)) {
    return "The leaf switch MAC address '" + opt.leaf_mac +
           "' is not a unicast aa:bb:cc:dd:ee:ff (there is no ARP: give it).";
  }
  if (!proto::valid_payload_bytes(opt.payload_bytes)) {
    return "The payload size must be a power of two from 256 to 8192 bytes, not " +
           std::to_string(opt.payload_bytes) + ".";
  }
  if (opt.send_ring < 64 || opt.send_ring > 4096) {
    return "The send ring must hold 64 to 4096 buffers, not " + std::to_string(opt.send_ring) + ".";
  }
  if (opt.recv_ring < 64 || opt.recv_ring > 16384) {
    return "The receive ring must hold 64 to 16384 buffers, not " + std::to_string(opt.recv_ring) +
           ".";
  }
  r.frame_bytes = proto::kFrameHeaderBytes + opt.payload_bytes;
  *out = r;
  return {};
}

std::size_t build_tx_frame(std::uint8_t* out, std::size_t cap, const proto::Endpoint& self,
                           const proto::Endpoint& leaf, const OutPacket& p) noexcept {
  const std::size_t len = proto::kFrameHeaderBytes + p.payload_len;
  if (len > cap) return 0;
  constexpr std::size_t l2l4 =
      sizeof(proto::EtherHdr) + sizeof(proto::Ipv4Hdr) + sizeof(proto::UdpHdr);
  proto::write_l2_l4(out, self, leaf, sizeof(proto::TdHdr) + p.payload_len);
  proto::store_header(out + l2l4, p.td);
  if (p.payload_len != 0) std::memcpy(out + proto::kFrameHeaderBytes, p.payload, p.payload_len);
  return len;
}

bool classify_rx_frame(const std::uint8_t* frame, std::size_t len, const proto::Endpoint& self,
                       const proto::Endpoint& leaf, RxDatagram* out) noexcept {
  proto::Parsed parsed;
  const proto::Reason e = proto::parse_frame(frame, len, self.ip, self.port, &parsed);
  if (e != proto::Reason::none && e != proto::Reason::bad_version) return false;
  if (parsed.src_ip != leaf.ip || parsed.src_port != leaf.port) return false;
  *out = {parsed.payload - sizeof(proto::TdHdr), sizeof(proto::TdHdr) + parsed.payload_len};
  return true;
}

void make_flow_rule(const proto::Endpoint& self, std::uint8_t port_num, FlowRule* rule) noexcept {
  std::memset(rule, 0, sizeof *rule);
  rule->attr.type = IBV_FLOW_ATTR_NORMAL;
  rule->attr.size = sizeof(FlowRule);
  rule->attr.priority = 0;
  rule->attr.num_of_specs = 3;
  rule->attr.port = port_num;
  rule->attr.flags = 0;
  rule->eth.type = IBV_FLOW_SPEC_ETH;
  rule->eth.size = sizeof(ibv_flow_spec_eth);
  std::memcpy(rule->eth.val.dst_mac, self.mac, 6);
  std::memset(rule->eth.mask.dst_mac, 0xff, 6);
  rule->eth.val.ether_type = htons(0x0800);
  rule->eth.mask.ether_type = 0xffff;
  rule->ipv4.type = IBV_FLOW_SPEC_IPV4;
  rule->ipv4.size = sizeof(ibv_flow_spec_ipv4);
  rule->ipv4.val.dst_ip = htonl(self.ip);
  rule->ipv4.mask.dst_ip = 0xffffffffu;
  rule->udp.type = IBV_FLOW_SPEC_UDP;
  rule->udp.size = sizeof(ibv_flow_spec_tcp_udp);
  rule->udp.val.dst_port = htons(self.port);
  rule->udp.mask.dst_port = 0xffff;
}

std::string verbs_error(const char* call, const std::string& what, int err) {
  std::string s = std::string(call) + " (" + what + ") failed: " + std::strerror(err) + " (errno " +
                  std::to_string(err) + ").";
  if (err == EPERM || err == EACCES) {
    s += " Raw packet QPs and flow rules need CAP_NET_RAW.";
  }
  return s;
}

}  // namespace detail

namespace {

using detail::kVerbsBatch;

constexpr auto kSendReapBound = std::chrono::milliseconds(10);
constexpr auto kSendRoomBound = std::chrono::milliseconds(100);

std::string no_device_sentence() {
  return "No RDMA device found (ibv_get_device_list returned none); use the UDP transport.";
}

class VerbsTransport final : public Transport {
 public:
  ~VerbsTransport() override {
    if (flow_ != nullptr) ibv_destroy_flow(flow_);
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
    if (send_cq_ != nullptr) ibv_destroy_cq(send_cq_);
    if (recv_cq_ != nullptr) {
      if (unacked_events_ != 0) ibv_ack_cq_events(recv_cq_, unacked_events_);
      ibv_destroy_cq(recv_cq_);
    }
    if (channel_ != nullptr) ibv_destroy_comp_channel(channel_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (ctx_ != nullptr) ibv_close_device(ctx_);
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  std::string open(const VerbsTransportOptions& opt) {
    if (std::string err = detail::validate_options(opt, &res_); !err.empty()) return err;
    send_ring_ = opt.send_ring;
    recv_ring_ = opt.recv_ring;
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return detail::verbs_error("eventfd", "the wake-up descriptor", errno);

    // The device.
    int ndev = 0;
    errno = 0;
    ibv_device** list = ibv_get_device_list(&ndev);
    if (list == nullptr) {
      // ENOSYS: no uverbs in the kernel (no RDMA hardware or driver): the same as none.
      if (errno == ENOSYS || errno == 0) return no_device_sentence();
      return detail::verbs_error("ibv_get_device_list", "listing RDMA devices", errno);
    }
    if (ndev == 0) {
      ibv_free_device_list(list);
      return no_device_sentence();
    }
    ibv_device* dev = nullptr;
    std::string names;
    for (int i = 0; i < ndev; ++i) {
      const char* name = ibv_get_device_name(list[i]);
      names += (i == 0 ? "" : ", ") + std::string(name);
      if (dev == nullptr && (opt.device.empty() || opt.device == name)) dev = list[i];
    }
    if (dev == nullptr) {
      ibv_free_device_list(list);
      return "RDMA device '" + opt.device + "' not found (devices: " + names + ").";
    }
    dev_name_ = ibv_get_device_name(dev);
    ctx_ = ibv_open_device(dev);
    const int open_errno = errno;
    ibv_free_device_list(list);
    if (ctx_ == nullptr) return detail::verbs_error("ibv_open_device", dev_name_, open_errno);
    const std::string where = dev_name_ + " port " + std::to_string(opt.port_num);

    ibv_port_attr pattr{};
    if (const int rc = ibv_query_port(ctx_, opt.port_num, &pattr); rc != 0) {
      return detail::verbs_error("ibv_query_port", where, rc);
    }
    if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) {
      return "Port " + std::to_string(opt.port_num) + " of " + dev_name_ +
             " is not an Ethernet port; a raw packet QP needs one.";
    }

    // Protection domain, completion queues (receive completions raise channel events).
    pd_ = ibv_alloc_pd(ctx_);
    if (pd_ == nullptr) return detail::verbs_error("ibv_alloc_pd", dev_name_, errno);
    channel_ = ibv_create_comp_channel(ctx_);
    if (channel_ == nullptr) {
      return detail::verbs_error("ibv_create_comp_channel", dev_name_, errno);
    }
    const int fl = fcntl(channel_->fd, F_GETFL);
    if (fl < 0 || fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK) != 0) {
      return detail::verbs_error("fcntl", "O_NONBLOCK on the completion channel", errno);
    }
    send_cq_ = ibv_create_cq(ctx_, static_cast<int>(send_ring_), nullptr, nullptr, 0);
    if (send_cq_ == nullptr) return detail::verbs_error("ibv_create_cq", "send CQ", errno);
    recv_cq_ = ibv_create_cq(ctx_, static_cast<int>(recv_ring_), nullptr, channel_, 0);
    if (recv_cq_ == nullptr) return detail::verbs_error("ibv_create_cq", "receive CQ", errno);

    // The raw packet QP: INIT (bound to the port), RTR, RTS; no addresses, we write frames.
    ibv_qp_init_attr qia{};
    qia.send_cq = send_cq_;
    qia.recv_cq = recv_cq_;
    qia.cap.max_send_wr = send_ring_;
    qia.cap.max_recv_wr = recv_ring_;
    qia.cap.max_send_sge = 1;
    qia.cap.max_recv_sge = 1;
    qia.qp_type = IBV_QPT_RAW_PACKET;
    qia.sq_sig_all = 0;
    qp_ = ibv_create_qp(pd_, &qia);
    if (qp_ == nullptr)
      return detail::verbs_error("ibv_create_qp", "raw packet QP on " + where, errno);
    ibv_qp_attr qa{};
    qa.qp_state = IBV_QPS_INIT;
    qa.port_num = opt.port_num;
    if (const int rc = ibv_modify_qp(qp_, &qa, IBV_QP_STATE | IBV_QP_PORT); rc != 0) {
      return detail::verbs_error("ibv_modify_qp", "raw packet QP to INIT", rc);
    }

    // One memory region: send buffers, then receive buffers.
    tx_stride_ = (res_.frame_bytes + 63) / 64 * 64;
    const std::size_t tx_bytes = tx_stride_ * send_ring_;
    mem_.assign(tx_bytes + detail::kRxBufferBytes * recv_ring_, 0);
    mr_ = ibv_reg_mr(pd_, mem_.data(), mem_.size(), int{IBV_ACCESS_LOCAL_WRITE});
    if (mr_ == nullptr) {
      return detail::verbs_error("ibv_reg_mr",
                                 std::to_string(mem_.size()) + " bytes of frame buffers", errno);
    }
    rx_base_ = mem_.data() + tx_bytes;
    // Receive WRs may be posted from INIT on; post them before frames can arrive.
    for (std::uint32_t i = 0; i < recv_ring_; ++i) {
      if (std::string err = post_recv(i); !err.empty()) return err;
    }
    qa = ibv_qp_attr{};
    qa.qp_state = IBV_QPS_RTR;
    if (const int rc = ibv_modify_qp(qp_, &qa, IBV_QP_STATE); rc != 0) {
      return detail::verbs_error("ibv_modify_qp", "raw packet QP to RTR", rc);
    }
    qa = ibv_qp_attr{};
    qa.qp_state = IBV_QPS_RTS;
    if (const int rc = ibv_modify_qp(qp_, &qa, IBV_QP_STATE); rc != 0) {
      return detail::verbs_error("ibv_modify_qp", "raw packet QP to RTS", rc);
    }

    // Steer our UDP port to the QP.
    detail::FlowRule rule;
    detail::make_flow_rule(res_.self, opt.port_num, &rule);
    flow_ = ibv_create_flow(qp_, &rule.attr);
    if (flow_ == nullptr) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "UDP port %u on %s", static_cast<unsigned>(res_.self.port),
                    where.c_str());
      return detail::verbs_error("ibv_create_flow", buf, errno);
    }
    repost_.reserve(kVerbsBatch);
    return {};
  }

  std::size_t batch() const noexcept override { return kVerbsBatch; }
  const TransportStats& stats() const noexcept override { return stats_; }

  void wake() noexcept override {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t r = write(wake_fd_, &one, sizeof one);
  }

  std::string send(const OutPacket* p, std::size_t n) override {
    if (n > kVerbsBatch) {
      return "send() takes at most " + std::to_string(kVerbsBatch) + " packets, not " +
             std::to_string(n) + ".";
    }
    if (std::string err = reap_sends(); !err.empty()) return err;
    if (in_flight_ + n > send_ring_) {
      // Wait briefly for the NIC to free buffers; after that the rest counts as lost.
      const auto until = std::chrono::steady_clock::now() + kSendRoomBound;
      while (in_flight_ + n > send_ring_ && std::chrono::steady_clock::now() < until) {
        if (std::string err = reap_sends(); !err.empty()) return err;
      }
    }
    const std::size_t room = send_ring_ - std::min<std::size_t>(in_flight_, send_ring_);
    const std::size_t k = std::min(n, room);
    stats_.send_errors += n - k;
    if (k == 0) return {};
    ibv_sge sge[kVerbsBatch];
    ibv_send_wr wr[kVerbsBatch];
    for (std::size_t i = 0; i < k; ++i) {
      const std::uint32_t slot = tx_head_;
      tx_head_ = (tx_head_ + 1) % send_ring_;
      std::uint8_t* buf = mem_.data() + static_cast<std::size_t>(slot) * tx_stride_;
      const std::size_t len = detail::build_tx_frame(buf, tx_stride_, res_.self, res_.leaf, p[i]);
      if (len == 0) {
        return "A " + std::to_string(p[i].payload_len) +
               "-byte payload is larger than the transport's payload size (" +
               std::to_string(res_.frame_bytes - proto::kFrameHeaderBytes) + " bytes).";
      }
      sge[i] = {reinterpret_cast<std::uintptr_t>(buf), static_cast<std::uint32_t>(len), mr_->lkey};
      wr[i] = ibv_send_wr{};
      wr[i].wr_id = slot;
      wr[i].sg_list = &sge[i];
      wr[i].num_sge = 1;
      wr[i].opcode = IBV_WR_SEND;
      wr[i].send_flags = IBV_SEND_SIGNALED;
      wr[i].next = i + 1 < k ? &wr[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_, wr, &bad); rc != 0) {
      return detail::verbs_error("ibv_post_send", "raw packet QP", rc);
    }
    in_flight_ += k;
    stats_.sent += k;
    // Reap this batch's completions, bounded: what is left is reaped by later calls.
    const auto until = std::chrono::steady_clock::now() + kSendReapBound;
    while (in_flight_ != 0 && std::chrono::steady_clock::now() < until) {
      if (std::string err = reap_sends(); !err.empty()) return err;
    }
    return {};
  }

  std::span<const RxDatagram> receive(std::uint64_t timeout_ns, std::string* error) override {
    // The previous batch's buffers are the caller's no longer.
    for (const std::uint32_t i : repost_) {
      if (std::string err = post_recv(i); !err.empty()) {
        *error = err;
        return {};
      }
    }
    repost_.clear();
    std::size_t n = drain(error);
    if (n != 0 || timeout_ns == 0 || !error->empty()) return {rx_out_, n};
    // Arm the CQ, then look again: a completion between the drain and the arming raises no event.
    if (const int rc = ibv_req_notify_cq(recv_cq_, 0); rc != 0) {
      *error = detail::verbs_error("ibv_req_notify_cq", "receive CQ", rc);
      return {};
    }
    n = drain(error);
    if (n != 0 || !error->empty()) return {rx_out_, n};
    pollfd pfds[2] = {{wake_fd_, POLLIN, 0}, {channel_->fd, POLLIN, 0}};
    const timespec ts{static_cast<time_t>(timeout_ns / 1'000'000'000u),
                      static_cast<long>(timeout_ns % 1'000'000'000u)};
    if (ppoll(pfds, 2, &ts, nullptr) < 0) {
      if (errno != EINTR) *error = detail::verbs_error("ppoll", "completion channel", errno);
      return {};
    }
    if ((pfds[1].revents & POLLIN) != 0) {
      ibv_cq* cq = nullptr;
      void* cq_ctx = nullptr;
      if (ibv_get_cq_event(channel_, &cq, &cq_ctx) == 0) {
        // Acknowledging takes a mutex; batch it.
        if (++unacked_events_ >= 64) {
          ibv_ack_cq_events(recv_cq_, unacked_events_);
          unacked_events_ = 0;
        }
      }
    }
    if ((pfds[0].revents & POLLIN) != 0) {
      std::uint64_t v;
      [[maybe_unused]] const ssize_t r = read(wake_fd_, &v, sizeof v);
      return {};
    }
    n = drain(error);
    return {rx_out_, n};
  }

 private:
  std::string post_recv(std::uint32_t i) {
    ibv_sge sge{reinterpret_cast<std::uintptr_t>(rx_base_ + detail::kRxBufferBytes * i),
                static_cast<std::uint32_t>(detail::kRxBufferBytes), mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = i;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (const int rc = ibv_post_recv(qp_, &wr, &bad); rc != 0) {
      return detail::verbs_error("ibv_post_recv", "raw packet QP", rc);
    }
    return {};
  }

  // Polls the send CQ once; completions free send buffers (in order: one SQ).
  std::string reap_sends() {
    ibv_wc wc[kVerbsBatch];
    const int r = ibv_poll_cq(send_cq_, static_cast<int>(kVerbsBatch), wc);
    if (r < 0) return "ibv_poll_cq (send CQ) failed: returned " + std::to_string(r) + ".";
    for (int i = 0; i < r; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        return std::string("A send on the raw packet QP completed with status '") +
               ibv_wc_status_str(wc[i].status) + "' (ibv_poll_cq, vendor error " +
               std::to_string(wc[i].vendor_err) + ").";
      }
    }
    in_flight_ -= std::min<std::size_t>(in_flight_, static_cast<std::size_t>(r));
    return {};
  }

  // Takes the receive completions there are (up to a batch) without waiting; returns how many
  // datagrams from the leaf are in rx_out_.
  std::size_t drain(std::string* error) {
    ibv_wc wc[kVerbsBatch];
    const int r = ibv_poll_cq(recv_cq_, static_cast<int>(kVerbsBatch), wc);
    if (r < 0) {
      *error = "ibv_poll_cq (receive CQ) failed: returned " + std::to_string(r) + ".";
      return 0;
    }
    std::size_t out = 0;
    for (int i = 0; i < r; ++i) {
      const auto idx = static_cast<std::uint32_t>(wc[i].wr_id);
      if (wc[i].status != IBV_WC_SUCCESS) {
        *error = std::string("A receive on the raw packet QP completed with status '") +
                 ibv_wc_status_str(wc[i].status) + "' (ibv_poll_cq, vendor error " +
                 std::to_string(wc[i].vendor_err) + ").";
        return out;
      }
      repost_.push_back(idx);
      const std::uint8_t* frame = rx_base_ + detail::kRxBufferBytes * idx;
      if (detail::classify_rx_frame(frame, wc[i].byte_len, res_.self, res_.leaf, &rx_out_[out])) {
        ++out;
        ++stats_.received;
      } else {
        ++stats_.foreign;
      }
    }
    return out;
  }

  detail::VerbsResolved res_;
  std::string dev_name_;
  std::uint32_t send_ring_ = 0;
  std::uint32_t recv_ring_ = 0;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* send_cq_ = nullptr;
  ibv_cq* recv_cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_flow* flow_ = nullptr;
  unsigned unacked_events_ = 0;
  int wake_fd_ = -1;
  std::vector<std::uint8_t> mem_;  // send ring then receive ring, registered as mr_
  std::uint8_t* rx_base_ = nullptr;
  std::size_t tx_stride_ = 0;
  std::uint32_t tx_head_ = 0;
  std::size_t in_flight_ = 0;
  std::vector<std::uint32_t> repost_;
  RxDatagram rx_out_[kVerbsBatch];
  TransportStats stats_;
};

}  // namespace

std::unique_ptr<Transport> make_verbs_transport(const VerbsTransportOptions& opt,
                                                std::string* error) {
  auto t = std::make_unique<VerbsTransport>();
  if (std::string err = t->open(opt); !err.empty()) {
    *error = std::move(err);
    return nullptr;
  }
  return t;
}

}  // namespace treeduce::host
