// Golden pcap tests of treeduce-switch through DPDK's net_pcap PMD (docs: tests/switchd/README.md).
//
// Each test builds its input frames here (dp::build_frame and the header structs), writes them to
// an input pcap, runs the real daemon on it (rx_pcap in, tx_pcap out) and checks three things:
//  1. the output equals what an in-process dp::Core (the library the daemon runs) and
//     dp::answer_neighbor produce for the same input, from byte 12 on, with the Ethernet
//     addresses checked separately (the daemon sets them: the neighbour's MAC, the port's MAC);
//  2. hand-written semantic properties of the output (sums, ncontrib, NACK reasons, ...);
//  3. the output equals the golden file tests/switchd/golden/<name>-out.pcap byte for byte
//     (timestamps ignored), and the final counters (--final-stats) equal the reference's.
// TREEDUCE_REGEN_GOLDEN=1 rewrites the golden files, only when checks 1 and 2 passed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../support/pcap_file.h"
#include "config.h"
#include "stats.h"
#include "treeduce/aggregation/convert.h"
#include "treeduce/dataplane/core.h"
#include "treeduce/dataplane/counters.h"
#include "treeduce/dataplane/neighbor.h"
#include "treeduce/protocol/wire.h"

#ifndef TREEDUCE_SWITCH_BIN
#error "meson passes -DTREEDUCE_SWITCH_BIN=<path of treeduce-switch>"
#endif
#ifndef TREEDUCE_SOURCE_ROOT
#error "meson passes -DTREEDUCE_SOURCE_ROOT=<source tree>"
#endif

namespace {

namespace dp = treeduce::dp;
namespace proto = treeduce::proto;
namespace sd = treeduce::switchd;
namespace fs = std::filesystem;
using treeduce::DType;
using treeduce::ReduceOp;
using Frame = treeduce::testing::PcapFrame;
using Mac = std::array<std::uint8_t, 6>;

// ---- the fabric every scenario uses (the YAML files in golden/ say the same; checked) ---------

/// RX burst of the daemon (its default; the YAML files set it). Phases of a scenario start at a
/// burst boundary so that a frame's output never depends on a later frame of the same burst.
constexpr std::size_t kBurst = 32;
constexpr char kPortName[] = "net_pcap0";
constexpr std::uint32_t ipv4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return a << 24 | b << 16 | c << 8 | d;
}
constexpr Mac kPortMac = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
constexpr std::uint32_t kPortIp = ipv4(10, 1, 0, 1);
constexpr std::uint32_t kDataIp = ipv4(10, 0, 0, 1);

dp::Endpoint endpoint(const Mac& mac, std::uint32_t ip, std::uint16_t port) {
  dp::Endpoint e;
  std::memcpy(e.mac, mac.data(), 6);
  e.ip = ip;
  e.port = port;
  return e;
}
/// Where hosts and switches send treeduce frames: the data address, on the port's MAC.
const dp::Endpoint kSwitch = endpoint(kPortMac, kDataIp, dp::kDefaultUdpPort);
/// Host i: 10.1.0.(10+i), UDP 50000+i.
dp::Endpoint host(unsigned i) {
  return endpoint({0x02, 0, 0, 0, 0x01, static_cast<std::uint8_t>(i)}, ipv4(10, 1, 0, 10 + i),
                  static_cast<std::uint16_t>(50000 + i));
}
const dp::Endpoint kParent = endpoint({0x02, 0, 0, 0, 0x02, 0x01}, ipv4(10, 1, 0, 2), 47110);
const dp::Endpoint kSubSwitch = endpoint({0x02, 0, 0, 0, 0x02, 0x02}, ipv4(10, 1, 0, 3), 47110);
/// Sends CONTRIBs it is not entitled to (bad_source); a static neighbour so the NACK has a MAC.
const dp::Endpoint kStranger = endpoint({0x02, 0, 0, 0, 0x03, 0x01}, ipv4(10, 1, 0, 99), 50099);
/// Every peer of every scenario: static neighbours, so the daemon never ARPs.
std::vector<dp::Endpoint> neighbours() {
  return {host(0), host(1), host(2), kParent, kSubSwitch, kStranger};
}

dp::ChildConfig child(const dp::Endpoint& e, std::uint16_t hosts = 1) {
  dp::ChildConfig c;
  c.addr = e;
  std::memset(c.addr.mac, 0, 6);  // the config names children by IPv4:port only
  c.hosts = hosts;
  return c;
}
dp::Endpoint no_mac(dp::Endpoint e) {
  std::memset(e.mac, 0, 6);
  return e;
}

// The trees of the YAML files in golden/.
constexpr std::uint64_t kLeafKey = 0x1122334455667788ull;
dp::TreeConfig leaf_tree() {  // leaf.yaml
  dp::TreeConfig t;
  t.tree_id = 7;
  t.key = kLeafKey;
  t.role = dp::Role::leaf;
  t.parent = no_mac(kParent);
  t.index_at_parent = 3;
  t.children = {child(host(0)), child(host(1))};
  t.slots = 4;
  t.payload_bytes = 256;
  return t;
}
constexpr std::uint64_t kRootKey = 0xA5A5000011112222ull;
dp::TreeConfig root_tree(std::uint16_t id, bool det) {  // root.yaml: trees 20 and 21
  dp::TreeConfig t;
  t.tree_id = id;
  t.key = kRootKey + id;
  t.role = dp::Role::root;
  t.children = {child(host(0)), child(host(1)), child(kSubSwitch, 2)};
  t.slots = det ? 4 : 8;
  t.payload_bytes = det ? 256 : 512;
  t.deterministic = det;
  return t;
}
constexpr std::uint64_t kBasicKey = 0x0DDBA11CAFEF00Dull;
dp::TreeConfig basic_tree() {  // basic.yaml: f32/f16, sum/max only
  dp::TreeConfig t;
  t.tree_id = 30;
  t.key = kBasicKey;
  t.role = dp::Role::root;
  t.children = {child(host(0)), child(host(1))};
  t.slots = 4;
  t.payload_bytes = 256;
  t.dtype_mask = 1u << static_cast<unsigned>(DType::f32) | 1u << static_cast<unsigned>(DType::f16);
  t.op_mask =
      1u << static_cast<unsigned>(ReduceOp::sum) | 1u << static_cast<unsigned>(ReduceOp::max);
  return t;
}
constexpr std::uint64_t kLargeKey = 0x4B4B4B4B00000040ull;
dp::TreeConfig large_tree() {  // large.yaml: 4 KiB payloads
  dp::TreeConfig t;
  t.tree_id = 40;
  t.key = kLargeKey;
  t.role = dp::Role::root;
  t.children = {child(host(0)), child(host(1))};
  t.slots = 2;
  t.payload_bytes = 4096;
  return t;
}

// ---- building input frames --------------------------------------------------------------------

/// A treeduce header for `tree` in network order; slot and slot_ver follow from chunk.
dp::TdHdr td(const dp::TreeConfig& tree, dp::Opcode oc, std::uint16_t child_index,
             std::uint32_t chunk, std::uint16_t count, DType d = DType::f32,
             ReduceOp op = ReduceOp::sum, std::uint32_t seq = 0, std::uint16_t ncontrib = 1) {
  dp::TdHdr h{};
  h.version = dp::kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(oc);
  h.dtype = static_cast<std::uint8_t>(d);
  h.op = static_cast<std::uint8_t>(op);
  h.tree_id.set(tree.tree_id);
  h.child.set(child_index);
  h.slot.set(static_cast<std::uint16_t>(chunk % tree.slots));
  h.slot_ver = static_cast<std::uint8_t>((chunk / tree.slots) % 2);
  h.count.set(count);
  h.ncontrib.set(ncontrib);
  h.chunk.set(chunk);
  h.seq.set(seq);
  h.key.set(tree.key);
  return h;
}

/// Element bytes as they travel (native little-endian elements).
Frame elems_f32(const std::vector<float>& v) {
  Frame b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
Frame elems_i32(const std::vector<std::int32_t>& v) {
  Frame b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}
Frame elems_16(const std::vector<float>& v, DType d) {
  std::vector<std::uint16_t> h(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    h[i] = d == DType::f16 ? treeduce::agg::f32_to_f16(v[i]) : treeduce::agg::f32_to_bf16(v[i]);
  }
  Frame b(h.size() * 2);
  std::memcpy(b.data(), h.data(), b.size());
  return b;
}
/// `n` floats a*i + b: small integers, so every sum in these tests is exact.
std::vector<float> ramp(std::size_t n, float a, float b) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = a * static_cast<float>(i % 97) + b;
  return v;
}

Frame frame(const dp::Endpoint& src, const dp::Endpoint& dst, const dp::TdHdr& h,
            const Frame& payload) {
  Frame f(dp::kFrameHeaderBytes + payload.size());
  f.resize(dp::build_frame(f.data(), src, dst, h, payload.data(), payload.size()));
  return f;
}
Frame to_switch(const dp::Endpoint& src, const dp::TdHdr& h, const Frame& payload) {
  return frame(src, kSwitch, h, payload);
}

/// Header access on a frame built by build_frame (no IP options).
constexpr std::size_t kIpOff = sizeof(dp::EtherHdr);
constexpr std::size_t kUdpOff = kIpOff + sizeof(dp::Ipv4Hdr);
constexpr std::size_t kTdOff = kUdpOff + sizeof(dp::UdpHdr);
dp::EtherHdr eth_of(const Frame& f) { return dp::load_header<dp::EtherHdr>(f.data()); }
dp::Ipv4Hdr ip_of(const Frame& f) { return dp::load_header<dp::Ipv4Hdr>(f.data() + kIpOff); }
dp::UdpHdr udp_of(const Frame& f) { return dp::load_header<dp::UdpHdr>(f.data() + kUdpOff); }
dp::TdHdr td_of(const Frame& f) { return dp::load_header<dp::TdHdr>(f.data() + kTdOff); }
Frame payload_of(const Frame& f) { return {f.begin() + dp::kFrameHeaderBytes, f.end()}; }
/// Rewrites the IPv4 header of `f` and fixes its checksum (unless `keep_checksum`).
template <class Fn>
Frame with_ip(Frame f, Fn&& change, bool keep_checksum = false) {
  dp::Ipv4Hdr ip = ip_of(f);
  change(ip);
  if (!keep_checksum) {
    ip.hdr_checksum.set(0);
    ip.hdr_checksum.set(dp::ipv4_checksum(ip));
  }
  dp::store_header(f.data() + kIpOff, ip);
  return f;
}

Frame arp(const dp::Endpoint& from, std::uint16_t oper, std::uint32_t target_ip,
          const Mac& target_mac = {}) {
  dp::EtherHdr eth;
  std::memset(eth.dst, 0xFF, 6);
  if (oper == 2) std::memcpy(eth.dst, target_mac.data(), 6);
  std::memcpy(eth.src, from.mac, 6);
  eth.ether_type.set(dp::kEtherTypeArp);
  dp::ArpHdr a;
  a.htype.set(std::uint16_t{1});
  a.ptype.set(std::uint16_t{0x0800});
  a.hlen = 6;
  a.plen = 4;
  a.oper.set(oper);
  std::memcpy(a.sha, from.mac, 6);
  a.spa.set(from.ip);
  std::memcpy(a.tha, target_mac.data(), 6);
  a.tpa.set(target_ip);
  Frame f(dp::kArpFrameBytes, 0);
  dp::store_header(f.data(), eth);
  dp::store_header(f.data() + sizeof eth, a);
  return f;
}

/// An ICMP echo (type 8 request, 0 reply) with `data_len` bytes of data; `break_checksum` spoils
/// the ICMP checksum.
Frame icmp_echo(const dp::Endpoint& from, std::uint32_t dst_ip, std::uint8_t type, std::uint16_t id,
                std::uint16_t seqno, std::size_t data_len, bool break_checksum = false) {
  const std::size_t icmp_len = sizeof(dp::IcmpHdr) + data_len;
  Frame f(kUdpOff + icmp_len);
  dp::EtherHdr eth;
  std::memcpy(eth.dst, kPortMac.data(), 6);
  std::memcpy(eth.src, from.mac, 6);
  eth.ether_type.set(std::uint16_t{0x0800});
  dp::Ipv4Hdr ip{};
  ip.version_ihl = 0x45;
  ip.total_length.set(static_cast<std::uint16_t>(sizeof(dp::Ipv4Hdr) + icmp_len));
  ip.fragment.set(std::uint16_t{0x4000});
  ip.ttl = 64;
  ip.protocol = 1;
  ip.src_addr.set(from.ip);
  ip.dst_addr.set(dst_ip);
  ip.hdr_checksum.set(dp::ipv4_checksum(ip));
  dp::IcmpHdr icmp{};
  icmp.type = type;
  icmp.rest = dp::bswap_be(static_cast<std::uint32_t>(id) << 16 | seqno);
  std::uint8_t* p = f.data() + kUdpOff;
  for (std::size_t i = 0; i < data_len; ++i) p[sizeof icmp + i] = static_cast<std::uint8_t>(i * 7);
  dp::store_header(p, icmp);
  icmp.checksum.set(dp::inet_checksum(p, icmp_len));
  if (break_checksum) icmp.checksum.raw ^= 0x0101;
  dp::store_header(p, icmp);
  dp::store_header(f.data(), eth);
  dp::store_header(f.data() + kIpOff, ip);
  return f;
}

/// The input of a scenario, with phases aligned to RX bursts.
struct Input {
  std::vector<Frame> frames;
  std::size_t fillers = 0;  ///< padding frames: ARP requests for an address nobody has
  void add(Frame f) { frames.push_back(std::move(f)); }
  /// Pads to the next burst boundary: what follows is received in a later RX burst than what
  /// came before (net_pcap returns full bursts while the file lasts). The filler is an ARP
  /// request for 10.1.0.200, which the daemon ignores without touching the core.
  void next_burst() {
    while (frames.size() % kBurst != 0) {
      frames.push_back(arp(host(2), 1, ipv4(10, 1, 0, 200)));
      ++fillers;
    }
  }
};

// ---- the reference: the same library, in process ------------------------------------------------

using Counts = std::map<std::string, std::uint64_t>;

/// What the daemon should do with an input: dp::Core for treeduce traffic (fed one frame at a
/// time, its output copied at once), dp::answer_neighbor for ARP and ICMP, the daemon's own
/// counters, and the order the daemon sends in (per RX burst: ARP/ICMP replies as they come, then
/// the core's output of the burst).
struct Reference {
  dp::Core core{dp::CoreConfig{kSwitch}};
  std::map<std::uint32_t, Mac> macs;  ///< static neighbours
  Counts daemon;                      ///< switchd counters, by name
  std::vector<std::uint16_t> trees;

  explicit Reference(const std::vector<dp::TreeConfig>& ts) {
    for (const dp::Endpoint& n : neighbours()) {
      std::memcpy(macs[n.ip].data(), n.mac, 6);
    }
    for (const dp::TreeConfig& t : ts) {
      EXPECT_TRUE(core.install_tree(t).ok()) << "tree " << t.tree_id;
      trees.push_back(t.tree_id);
    }
  }

  std::vector<Frame> run(const std::vector<Frame>& in) {
    std::vector<Frame> out;
    std::vector<dp::TxFrame> tx(dp::kMaxChildren * 4);
    const dp::Endpoint port_self = endpoint(kPortMac, kPortIp, 0);
    const dp::Endpoint data_self = endpoint(kPortMac, kDataIp, 0);
    for (std::size_t b = 0; b < in.size(); b += kBurst) {
      std::vector<Frame> slow, fast;
      for (std::size_t i = b; i < std::min(in.size(), b + kBurst); ++i) {
        const Frame& f = in[i];
        const bool arp_or_icmp =
            f.size() >= kUdpOff && (load_be16(&f[12]) == dp::kEtherTypeArp ||
                                    (load_be16(&f[12]) == 0x0800 && f[kIpOff + 9] == 1));
        if (arp_or_icmp) {
          neighbour(f, port_self, data_self, &slow);
          continue;
        }
        if (f.size() > proto::kMaxFrameBytes) {  // the daemon drops it before the core
          ++daemon["rx_too_long"];
          continue;
        }
        dp::RxFrame rx{f.data(), f.size()};
        std::size_t n = 0;
        EXPECT_EQ(core.process_burst(&rx, 1, tx.data(), tx.size(), &n), 1u);
        for (std::size_t k = 0; k < n; ++k) {
          Frame o(tx[k].hdr, tx[k].hdr + dp::kFrameHeaderBytes);
          o.insert(o.end(), tx[k].payload, tx[k].payload + tx[k].payload_len);
          const auto it = macs.find(ip_of(o).dst_addr.get());
          if (it == macs.end()) {
            ++daemon["tx_unresolved"];
            continue;
          }
          std::memcpy(o.data(), it->second.data(), 6);
          std::memcpy(o.data() + 6, kPortMac.data(), 6);
          fast.push_back(std::move(o));
        }
      }
      for (auto& f : slow) out.push_back(std::move(f));
      for (auto& f : fast) out.push_back(std::move(f));
    }
    return out;
  }

  static std::uint16_t load_be16(const std::uint8_t* p) {
    return static_cast<std::uint16_t>(p[0] << 8 | p[1]);
  }

  void neighbour(const Frame& f, const dp::Endpoint& port_self, const dp::Endpoint& data_self,
                 std::vector<Frame>* out) {
    dp::ArpSender s;
    if (dp::parse_arp(f.data(), f.size(), &s) && s.request &&
        (s.target_ip == kPortIp || s.target_ip == kDataIp)) {
      ++daemon["arp_requests_in"];
    }
    Frame r(dp::kMaxFrameBytes);
    std::size_t len = 0;
    dp::NeighborVerdict v =
        dp::answer_neighbor(f.data(), f.size(), port_self, r.data(), r.size(), &len);
    if (v == dp::NeighborVerdict::ignored) {
      v = dp::answer_neighbor(f.data(), f.size(), data_self, r.data(), r.size(), &len);
    }
    switch (v) {
      case dp::NeighborVerdict::arp_reply:
      case dp::NeighborVerdict::echo_reply:
        ++daemon[v == dp::NeighborVerdict::arp_reply ? "arp_replies_out" : "echo_replies_out"];
        r.resize(len);
        out->push_back(std::move(r));
        break;
      case dp::NeighborVerdict::malformed:
        ++daemon["neighbor_malformed"];
        break;
      default:
        ++daemon["neighbor_ignored"];
        break;
    }
  }
};

// ---- pcap files --------------------------------------------------------------------------------

using treeduce::testing::read_pcap;
using treeduce::testing::write_pcap;

std::string hex(const Frame& f) {
  std::ostringstream s;
  char b[4];
  for (std::size_t i = 0; i < f.size(); ++i) {
    if (i % 32 == 0) s << "\n    ";
    std::snprintf(b, sizeof b, "%02x", f[i]);
    s << b << (i % 2 == 1 ? " " : "");
  }
  return s.str();
}

/// Empty when `got` equals `want`; else what differs first: the frame index, the first differing
/// byte offset (from `from` on), both frames in hex.
std::string diff_frames(const std::vector<Frame>& want, const std::vector<Frame>& got,
                        std::size_t from = 0) {
  for (std::size_t i = 0; i < std::min(want.size(), got.size()); ++i) {
    const Frame& w = want[i];
    const Frame& g = got[i];
    std::size_t off = from;
    while (off < w.size() && off < g.size() && w[off] == g[off]) ++off;
    if (off == w.size() && off == g.size()) continue;
    std::ostringstream s;
    s << "frame " << i << " differs at byte " << off << " (lengths: want " << w.size() << ", got "
      << g.size() << ")\n  want:" << hex(w) << "\n  got:" << hex(g);
    return s.str();
  }
  if (want.size() != got.size()) {
    std::ostringstream s;
    s << "want " << want.size() << " frames, got " << got.size();
    const auto& longer = want.size() > got.size() ? want : got;
    const std::size_t first = std::min(want.size(), got.size());
    s << "; first extra frame (" << first << ", in " << (want.size() > got.size() ? "want" : "got")
      << "):" << hex(longer[first]);
    return s.str();
  }
  return "";
}

// ---- running the daemon ------------------------------------------------------------------------

struct Run {
  int exit_code = -1;
  bool timed_out = false;
  std::vector<Frame> out;
  std::map<std::string, double> metrics;  ///< "name{labels}" -> value
  std::string log;
};

std::string golden_dir() { return std::string(TREEDUCE_SOURCE_ROOT) + "/tests/switchd/golden/"; }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs treeduce-switch on `in` with the config golden/<cfg>: one net_pcap port, one lcore, a
/// private --file-prefix and temp dir (removed afterwards), killed after 30 s.
Run run_daemon(const std::string& cfg, const std::vector<Frame>& in) {
  static std::atomic<unsigned> runs{0};
  Run r;
  char tmpl[] = "/tmp/tdpcap-XXXXXX";
  const char* dir = mkdtemp(tmpl);
  if (dir == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    return r;
  }
  const std::string tmp = dir;
  const std::string in_path = tmp + "/in.pcap", out_path = tmp + "/out.pcap",
                    stats_path = tmp + "/stats.prom", log_path = tmp + "/daemon.log";
  write_pcap(in_path, in);
  const std::string prefix =
      "tdpcap" + std::to_string(getpid()) + "-" + std::to_string(runs.fetch_add(1));
  // TREEDUCE_SWITCH_BIN in the environment runs another build of the daemon (diagnosis).
  const char* bin = std::getenv("TREEDUCE_SWITCH_BIN");
  std::vector<std::string> args = {
      bin != nullptr && *bin != '\0' ? bin : TREEDUCE_SWITCH_BIN,
      "--no-huge",
      "-m",
      "256",
      "--no-pci",
      "--file-prefix=" + prefix,
      "-l",
      "0",
      "--log-level=lib.eal:error",
      "--vdev=net_pcap0,rx_pcap=" + in_path + ",tx_pcap=" + out_path,
      "--",
      "--config",
      golden_dir() + cfg,
      "--exit-idle-ms",
      "300",
      "--run-ms",
      "20000",
      "--metrics",
      "off",
      "--final-stats",
      stats_path,
  };
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    ADD_FAILURE() << "cannot start " << argv[0] << ": " << std::strerror(rc);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    int status = 0;
    for (;;) {
      const pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        r.timed_out = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  r.log = slurp(log_path);
  std::string error;
  if (fs::exists(out_path) && !read_pcap(out_path, &r.out, &error)) ADD_FAILURE() << error;
  std::istringstream stats(slurp(stats_path));
  for (std::string line; std::getline(stats, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    r.metrics[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  // The EAL's runtime directory of this run (its --file-prefix is ours alone).
  for (const char* base : {"/var/run/dpdk/", "/tmp/dpdk/"}) fs::remove_all(base + prefix, ec);
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR")) {
    fs::remove_all(std::string(xdg) + "/dpdk/" + prefix, ec);
  }
  return r;
}

// ---- checks ------------------------------------------------------------------------------------

bool regen() {
  const char* v = std::getenv("TREEDUCE_REGEN_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

/// In normal mode: `frames` must equal golden/<file>. In regeneration mode: writes it, unless the
/// test already failed (a golden file is blessed only after the independent checks passed).
void check_golden(const std::string& file, const std::vector<Frame>& frames) {
  const std::string path = golden_dir() + file;
  if (regen()) {
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "not blessing " << path << ": the checks above failed";
      return;
    }
    write_pcap(path, frames);
    std::printf("[ regen    ] wrote %s (%zu frames)\n", path.c_str(), frames.size());
    return;
  }
  std::vector<Frame> golden;
  std::string error;
  if (!fs::exists(path)) {
    ADD_FAILURE() << "golden file " << path
                  << " is missing; run this test with TREEDUCE_REGEN_GOLDEN=1 to create it";
    return;
  }
  ASSERT_TRUE(read_pcap(path, &golden, &error)) << error;
  const std::string d = diff_frames(golden, frames);
  EXPECT_TRUE(d.empty()) << file << " (golden) vs this run: " << d
                         << "\nIf the change is intended, rerun with TREEDUCE_REGEN_GOLDEN=1.";
}

std::string series(const std::string& metric, const std::string& sw, const std::string& label,
                   const std::string& value) {
  return metric + "{switch=\"" + sw + "\"," + label + "=\"" + value + "\"}";
}

/// The config file golden/<cfg> says what the test assumes; its switch is named "pcap-" and the
/// file's stem.
void check_config(const std::string& cfg, const std::vector<dp::TreeConfig>& trees) {
  const std::string name = "pcap-" + cfg.substr(0, cfg.find('.'));
  const sd::ConfigResult r = sd::load_config_file(golden_dir() + cfg);
  ASSERT_TRUE(r.config) << r.error;
  const sd::SwitchConfig& c = *r.config;
  EXPECT_EQ(sd::validate(c), "");
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(c.data.ip, kDataIp);
  EXPECT_EQ(c.data.port, dp::kDefaultUdpPort);
  EXPECT_EQ(c.burst, kBurst);
  ASSERT_EQ(c.ports.size(), 1u);
  EXPECT_EQ(c.ports[0].name, kPortName);
  EXPECT_EQ(c.ports[0].ip, kPortIp);
  ASSERT_TRUE(c.ports[0].mac);
  EXPECT_EQ(*c.ports[0].mac, kPortMac);
  const auto want_n = neighbours();
  ASSERT_EQ(c.neighbors.size(), want_n.size());
  for (std::size_t i = 0; i < want_n.size(); ++i) {
    EXPECT_EQ(c.neighbors[i].ip, want_n[i].ip) << "neighbour " << i;
    EXPECT_EQ(std::memcmp(c.neighbors[i].mac.data(), want_n[i].mac, 6), 0) << "neighbour " << i;
    EXPECT_EQ(c.neighbors[i].port, kPortName);
  }
  ASSERT_EQ(c.trees.size(), trees.size());
  for (std::size_t i = 0; i < trees.size(); ++i) {
    EXPECT_TRUE(c.trees[i].tree == trees[i])
        << cfg << ": tree " << trees[i].tree_id << " is not what the test expects";
  }
}

/// Runs a scenario end to end; `semantics` checks the daemon's output by hand. Returns the
/// daemon's log.
using Semantics = std::function<void(const std::vector<Frame>& out)>;
std::string run_scenario(const std::string& name, const std::string& cfg,
                         const std::vector<dp::TreeConfig>& trees, const Input& input,
                         const Semantics& semantics, const Counts& want_drops = {},
                         const Counts& want_events = {}, Counts want_daemon = {}) {
  check_config(cfg, trees);
  Reference ref(trees);
  const std::vector<Frame> want = ref.run(input.frames);

  // The reference agrees with what the scenario means to provoke.
  for (const auto& [reason, n] : want_drops) {
    bool found = false;
    for (std::size_t i = 0; i < dp::kNumDropReasons; ++i) {
      if (dp::name(static_cast<dp::DropReason>(i)) == reason) {
        EXPECT_EQ(ref.core.counters().drops[i], n) << "reference drop " << reason;
        found = true;
      }
    }
    EXPECT_TRUE(found) << reason;
  }
  for (std::size_t i = 1; i < dp::kNumDropReasons; ++i) {
    const std::string reason(dp::name(static_cast<dp::DropReason>(i)));
    if (want_drops.count(reason) == 0) {
      EXPECT_EQ(ref.core.counters().drops[i], 0u) << "reference drop " << reason;
    }
  }
  for (const auto& [event, n] : want_events) {
    bool found = false;
    for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
      if (dp::name(static_cast<dp::Event>(i)) == event) {
        EXPECT_EQ(ref.core.counters().events[i], n) << "reference event " << event;
        found = true;
      }
    }
    EXPECT_TRUE(found) << event;
  }
  want_daemon["neighbor_ignored"] += input.fillers;
  for (const auto& [c, n] : want_daemon) {
    EXPECT_EQ(ref.daemon[c], n) << "reference daemon counter " << c;
  }

  const Run r = run_daemon(cfg, input.frames);
  EXPECT_FALSE(r.timed_out) << "treeduce-switch ran for 30 s and was killed; its log:\n" << r.log;
  EXPECT_EQ(r.exit_code, 0) << "treeduce-switch failed; its log:\n" << r.log;
  if (r.exit_code != 0) return r.log;

  // 1. The daemon sends what the core and answer_neighbor produce; it sets the MACs.
  EXPECT_EQ(r.out.size(), want.size()) << "frames sent";
  const std::string d = diff_frames(want, r.out, 12);
  EXPECT_TRUE(d.empty()) << "the daemon's output (from byte 12 on) differs from the in-process "
                            "dp::Core's: "
                         << d;
  for (std::size_t i = 0; i < std::min(want.size(), r.out.size()); ++i) {
    EXPECT_EQ(std::memcmp(r.out[i].data(), want[i].data(), 12), 0)
        << "frame " << i << ": Ethernet addresses"
        << hex(Frame(r.out[i].begin(), r.out[i].begin() + 12)) << " want"
        << hex(Frame(want[i].begin(), want[i].begin() + 12));
  }

  // 2. Counters: every core drop reason and event, the daemon's counters, the port's.
  const std::string sw = "pcap-" + cfg.substr(0, cfg.find('.'));
  EXPECT_FALSE(r.metrics.empty()) << "no --final-stats output";
  const auto metric = [&](const std::string& key) {
    const auto it = r.metrics.find(key);
    EXPECT_NE(it, r.metrics.end()) << key << " missing from --final-stats";
    return it == r.metrics.end() ? -1.0 : it->second;
  };
  for (std::size_t i = 1; i < dp::kNumDropReasons; ++i) {
    const std::string reason(dp::name(static_cast<dp::DropReason>(i)));
    EXPECT_EQ(metric(series("treeduce_switch_drops_total", sw, "reason", reason)),
              static_cast<double>(ref.core.counters().drops[i]))
        << "drops, reason " << reason;
  }
  for (std::size_t i = 0; i < dp::kNumEvents; ++i) {
    const std::string event(dp::name(static_cast<dp::Event>(i)));
    EXPECT_EQ(metric(series("treeduce_switch_events_total", sw, "event", event)),
              static_cast<double>(ref.core.counters().events[i]))
        << "event " << event;
  }
  for (std::size_t i = 0; i < sd::kNumSwitchdCounters; ++i) {
    const std::string c(sd::name(static_cast<sd::SwitchdCounter>(i)));
    EXPECT_EQ(metric(series("treeduce_switch_daemon_total", sw, "counter", c)),
              static_cast<double>(ref.daemon[c]))
        << "daemon counter " << c;
  }
  for (std::uint16_t id : ref.trees) {
    const dp::Counters* tc = ref.core.tree_counters(id);
    for (std::size_t i = 1; i < dp::kNumDropReasons; ++i) {
      const std::string reason(dp::name(static_cast<dp::DropReason>(i)));
      const auto it = std::find_if(r.metrics.begin(), r.metrics.end(), [&](const auto& kv) {
        return kv.first.starts_with("treeduce_tree_drops_total{") &&
               kv.first.find("tree=\"" + std::to_string(id) + "\"") != std::string::npos &&
               kv.first.ends_with("reason=\"" + reason + "\"}");
      });
      if (it == r.metrics.end()) {
        ADD_FAILURE() << "tree " << id << " drops " << reason << " missing from --final-stats";
        continue;
      }
      EXPECT_EQ(it->second, static_cast<double>(tc->drops[i])) << it->first;
    }
  }
  std::uint64_t in_bytes = 0, out_bytes = 0;
  for (const Frame& f : input.frames) in_bytes += f.size();
  for (const Frame& f : want) out_bytes += f.size();
  const auto port = [&](const std::string& m) {
    return metric(m + "{switch=\"" + sw + "\",port=\"" + kPortName + "\"}");
  };
  EXPECT_EQ(port("treeduce_port_rx_packets_total"), static_cast<double>(input.frames.size()));
  EXPECT_EQ(port("treeduce_port_rx_bytes_total"), static_cast<double>(in_bytes));
  EXPECT_EQ(port("treeduce_port_tx_packets_total"), static_cast<double>(want.size()));
  EXPECT_EQ(port("treeduce_port_tx_bytes_total"), static_cast<double>(out_bytes));

  // 3. What the output means, checked by hand (before any golden file is blessed).
  semantics(r.out);

  // 4. Golden files: the input (so that a change in how it is built shows) and the output.
  check_golden(name + "-in.pcap", input.frames);
  check_golden(name + "-out.pcap", r.out);
  return r.log;
}

// ---- semantic helpers ------------------------------------------------------------------------

/// Output frame `f` is a treeduce frame from the switch to `dst` with a valid IPv4 header and
/// consistent lengths.
void expect_from_switch(const Frame& f, const dp::Endpoint& dst, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_GE(f.size(), dp::kFrameHeaderBytes);
  const dp::EtherHdr eth = eth_of(f);
  EXPECT_EQ(std::memcmp(eth.dst, dst.mac, 6), 0) << "Ethernet destination: the neighbour's MAC";
  EXPECT_EQ(std::memcmp(eth.src, kPortMac.data(), 6), 0) << "Ethernet source: the port's MAC";
  const dp::Ipv4Hdr ip = ip_of(f);
  EXPECT_EQ(dp::ipv4_checksum(ip), 0) << "IPv4 checksum";
  EXPECT_EQ(ip.total_length.get(), f.size() - kIpOff);
  EXPECT_EQ(ip.src_addr.get(), kDataIp);
  EXPECT_EQ(ip.dst_addr.get(), dst.ip);
  const dp::UdpHdr udp = udp_of(f);
  EXPECT_EQ(udp.src_port.get(), dp::kDefaultUdpPort);
  EXPECT_EQ(udp.dst_port.get(), dst.port);
  EXPECT_EQ(udp.dgram_len.get(), f.size() - kUdpOff);
}

struct Want {
  dp::Opcode opcode;
  std::uint32_t chunk;
  std::uint16_t child;  ///< header field
  std::uint16_t ncontrib;
  Frame payload;
};
void expect_td(const Frame& f, const dp::TreeConfig& t, const Want& w, const std::string& what) {
  SCOPED_TRACE(what);
  const dp::TdHdr h = td_of(f);
  EXPECT_EQ(h.version, dp::kProtocolVersion);
  EXPECT_EQ(h.opcode, static_cast<std::uint8_t>(w.opcode));
  EXPECT_EQ(h.tree_id.get(), t.tree_id);
  EXPECT_EQ(h.chunk.get(), w.chunk);
  EXPECT_EQ(h.slot.get(), w.chunk % t.slots);
  EXPECT_EQ(h.slot_ver, (w.chunk / t.slots) % 2);
  EXPECT_EQ(h.child.get(), w.child);
  EXPECT_EQ(h.ncontrib.get(), w.ncontrib);
  EXPECT_EQ(h.reason, 0);
  EXPECT_EQ(h.key.get(), t.key);
  EXPECT_TRUE(payload_of(f) == w.payload) << "payload";
}

/// A NACK to `to` refusing `refused` (the CONTRIB as sent) for `reason`.
void expect_nack(const Frame& f, const Frame& refused, const dp::Endpoint& to,
                 dp::DropReason reason, const std::string& what) {
  SCOPED_TRACE(what);
  expect_from_switch(f, to, what);
  EXPECT_EQ(f.size(), dp::kFrameHeaderBytes) << "a NACK has no payload";
  const dp::TdHdr n = td_of(f);
  dp::TdHdr echo = td_of(refused);
  echo.version = dp::kProtocolVersion;
  echo.opcode = static_cast<std::uint8_t>(dp::Opcode::nack);
  echo.reason = static_cast<std::uint8_t>(reason);
  echo.count.set(0);
  echo.ncontrib.set(0);
  // The key field: the MAC under the key the refused CONTRIB carried, never a key.
  echo.key = proto::nack_mac(td_of(refused).key, echo);
  EXPECT_EQ(n.reason, static_cast<std::uint8_t>(reason))
      << "NACK reason " << static_cast<int>(n.reason) << ", want " << dp::name(reason);
  EXPECT_EQ(std::memcmp(&n, &echo, sizeof n), 0) << "the NACK echoes the refused header";
  EXPECT_NE(n.key, td_of(refused).key) << "the key never travels back";
}

Frame add_f32(const std::vector<std::vector<float>>& xs) {
  std::vector<float> s(xs[0].size(), 0.0f);
  for (const auto& x : xs) {
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += x[i];
  }
  return elems_f32(s);
}

// ---- the harness can fail --------------------------------------------------------------------

TEST(PcapHarness, DiffNamesFrameAndOffset) {
  const Frame a =
      to_switch(host(0), td(basic_tree(), dp::Opcode::contrib, 0, 0, 4), elems_f32({1, 2, 3, 4}));
  Frame b = a;
  b[50] ^= 1;
  EXPECT_EQ(diff_frames({a, a}, {a, a}), "");
  const std::string d = diff_frames({a, a}, {a, b});
  EXPECT_NE(d.find("frame 1 differs at byte 50"), std::string::npos) << d;
  EXPECT_NE(diff_frames({a}, {a, a}).find("want 1 frames, got 2"), std::string::npos);
  EXPECT_EQ(diff_frames({a}, {b}, 51), "") << "bytes before `from` are not compared";
}

TEST(PcapHarness, PcapRoundTrip) {
  char tmpl[] = "/tmp/tdpcap-rt-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/x.pcap";
  const std::vector<Frame> frames = {
      arp(host(0), 1, kPortIp),
      to_switch(host(1), td(large_tree(), dp::Opcode::contrib, 1, 0, 1024),
                elems_f32(ramp(1024, 1, 0)))};
  write_pcap(path, frames);
  std::vector<Frame> back;
  std::string error;
  EXPECT_TRUE(read_pcap(path, &back, &error)) << error;
  EXPECT_EQ(diff_frames(frames, back), "");
  fs::remove_all(tmpl);
}

// ---- scenario 1: a leaf switch ---------------------------------------------------------------

/// Two hosts under a leaf. Chunks 0-3 (the last one short) go up as partials; a duplicate while
/// accumulating is dropped, a duplicate while waiting on the parent re-sends the partial; the
/// parent's RESULTs are multicast; a duplicate after the result gets it by unicast; a duplicate
/// and a stale RESULT are dropped; chunk 8 reuses chunk 0's slot version.
TEST(SwitchdPcap, Leaf) {
  const dp::TreeConfig t = leaf_tree();
  const auto h0 = [](std::uint32_t c) { return ramp(c == 3 ? 10 : 64, 1.0f, float(c)); };
  const auto h1 = [](std::uint32_t c) { return ramp(c == 3 ? 10 : 64, -2.0f, 100.0f * c); };
  const auto result = [](std::uint32_t c) { return ramp(c == 3 ? 10 : 64, 3.0f, 7.0f + c); };
  const auto contrib = [&](unsigned i, std::uint32_t c) {
    const auto v = i == 0 ? h0(c) : h1(c);
    return to_switch(host(i),
                     td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(i), c,
                        static_cast<std::uint16_t>(v.size())),
                     elems_f32(v));
  };
  const auto parent_result = [&](std::uint32_t c) {
    const auto v = result(c);
    return to_switch(kParent,
                     td(t, dp::Opcode::result, t.index_at_parent, c,
                        static_cast<std::uint16_t>(v.size()), DType::f32, ReduceOp::sum, 0, 4),
                     elems_f32(v));
  };
  Input in;
  // Phase A: partials up.
  in.add(contrib(0, 0));
  in.add(contrib(0, 0));  // duplicate while accumulating: duplicate_pending
  in.add(contrib(1, 0));  // -> partial 0
  in.add(contrib(1, 1));
  in.add(contrib(0, 1));  // -> partial 1
  in.add(contrib(1, 1));  // duplicate while waiting on the parent -> partial 1 again
  in.add(contrib(0, 2));
  in.add(contrib(1, 2));  // -> partial 2
  in.add(contrib(0, 3));
  in.add(contrib(1, 3));  // -> partial 3 (10 elements)
  in.next_burst();
  // Phase B: the parent's RESULTs, multicast.
  for (std::uint32_t c = 0; c < 4; ++c) in.add(parent_result(c));
  in.next_burst();
  // Phase C: duplicates and stale traffic, then chunk 4 (slot 0, version 1).
  in.add(contrib(0, 2));     // after the result: unicast RESULT 2 to host 0
  in.add(parent_result(0));  // duplicate_result
  in.add(to_switch(
      kParent, td(t, dp::Opcode::result, t.index_at_parent, 9, 64, DType::f32, ReduceOp::sum, 0, 4),
      elems_f32(result(9))));  // stale_result: slot 1 holds chunk 1
  in.add(to_switch(kParent,
                   td(t, dp::Opcode::result, 0, 3, static_cast<std::uint16_t>(result(3).size()),
                      DType::f32, ReduceOp::sum, 0, 4),
                   elems_f32(result(3))));  // bad_child: RESULTs name our index at the parent
  in.add(contrib(0, 4));
  in.add(contrib(1, 4));  // -> partial 4
  in.next_burst();
  // Phase D: RESULT 4, then chunk 8 reuses slot 0 version 0.
  in.add(parent_result(4));
  in.add(contrib(1, 8));
  in.add(contrib(0, 8));  // -> partial 8

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 5u + 8u + 2u + 3u);
    const auto partial = [&](std::uint32_t c) {
      return Want{dp::Opcode::contrib, c, t.index_at_parent, 2, add_f32({h0(c), h1(c)})};
    };
    const auto res = [&](std::uint32_t c, std::uint16_t i) {
      return Want{dp::Opcode::result, c, i, 4, elems_f32(result(c))};
    };
    std::size_t k = 0;
    for (std::uint32_t c : {0u, 1u, 1u, 2u, 3u}) {
      expect_from_switch(out[k], kParent, "partial " + std::to_string(c));
      expect_td(out[k], t, partial(c), "partial " + std::to_string(c));
      ++k;
    }
    EXPECT_EQ(out[1], out[2]) << "the re-sent partial is the partial";
    EXPECT_EQ(out[4].size(), dp::kFrameHeaderBytes + 40) << "chunk 3 carries 10 elements";
    for (std::uint32_t c = 0; c < 4; ++c) {
      for (std::uint16_t i = 0; i < 2; ++i, ++k) {
        const std::string what = "RESULT " + std::to_string(c) + " to host " + std::to_string(i);
        expect_from_switch(out[k], host(i), what);
        expect_td(out[k], t, res(c, i), what);
      }
    }
    EXPECT_EQ(out[k], out[5 + 2 * 2]) << "the unicast RESULT 2 is the multicast one";
    expect_td(out[k++], t, res(2, 0), "unicast RESULT 2");
    expect_from_switch(out[k], kParent, "partial 4");
    expect_td(out[k++], t, partial(4), "partial 4");
    for (std::uint16_t i = 0; i < 2; ++i, ++k) {
      expect_from_switch(out[k], host(i), "RESULT 4");
      expect_td(out[k], t, res(4, i), "RESULT 4");
    }
    expect_from_switch(out[k], kParent, "partial 8");
    expect_td(out[k], t, partial(8), "partial 8");
  };
  run_scenario(
      "leaf", "leaf.yaml", {t}, in, semantics,
      {{"duplicate_pending", 1}, {"duplicate_result", 1}, {"stale_result", 1}, {"bad_child", 1}},
      {{"contrib_accepted", 12},
       {"partial_sent", 6},
       {"partial_resent", 1},
       {"result_multicast", 5},
       {"result_unicast", 1},
       {"slot_reused", 1},
       {"nack_sent", 0}});
}

// ---- scenario 2: a root with three children --------------------------------------------------

/// Root of 4 hosts: two hosts and a switch child that sums two. f16, bf16, i32 and f32 chunks
/// with sum, min and max; a deterministic tree gives the child-order sum whatever the arrival
/// order, where the plain tree gives the arrival-order sum.
TEST(SwitchdPcap, Root) {
  const dp::TreeConfig t = root_tree(20, false);
  const dp::TreeConfig det = root_tree(21, true);
  const dp::Endpoint kids[3] = {host(0), host(1), kSubSwitch};
  Input in;
  struct Chunk {
    DType d;
    ReduceOp op;
    std::vector<int> order;
  };
  const std::vector<Chunk> chunks = {
      {DType::f16, ReduceOp::sum, {0, 1, 2}},  {DType::bf16, ReduceOp::sum, {2, 0, 1}},
      {DType::i32, ReduceOp::sum, {1, 2, 0}},  {DType::f32, ReduceOp::min, {0, 2, 1}},
      {DType::f32, ReduceOp::max, {2, 1, 0}},  {DType::i32, ReduceOp::min, {1, 0, 2}},
      {DType::bf16, ReduceOp::max, {0, 1, 2}}, {DType::f16, ReduceOp::max, {2, 0, 1}},
  };
  // Child k's values for chunk c: small integers and halves, exact in f16 and bf16.
  const auto vals = [](std::uint32_t c, int k, std::size_t n) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>((static_cast<int>(i * (k + 2) + c * 5) % 41) - 20) * 0.5f +
             static_cast<float>(k);
    }
    return v;
  };
  const auto payload = [](DType d, const std::vector<float>& v) {
    if (d == DType::f32) return elems_f32(v);
    if (d == DType::i32) {
      std::vector<std::int32_t> iv(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) iv[i] = static_cast<std::int32_t>(v[i] * 1000);
      return elems_i32(iv);
    }
    return elems_16(v, d);
  };
  const auto count_of = [&](DType d) {
    return static_cast<std::uint16_t>(t.payload_bytes / treeduce::dtype_size(d));
  };
  for (std::uint32_t c = 0; c < chunks.size(); ++c) {
    const Chunk& ch = chunks[c];
    for (int k : ch.order) {
      in.add(to_switch(kids[k],
                       td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), c, count_of(ch.d),
                          ch.d, ch.op, 2, k == 2 ? 2 : 1),
                       payload(ch.d, vals(c, k, count_of(ch.d)))));
    }
  }
  // Deterministic tree: values whose fp32 sum depends on the order; chunks 0 and 1 carry the
  // same data in opposite arrival orders. The plain tree gets the same data as chunk 8.
  const std::vector<float> x[3] = {std::vector<float>(64, 1e8f), std::vector<float>(64, -1e8f),
                                   std::vector<float>(64, 1.0f)};
  for (std::uint32_t c = 0; c < 2; ++c) {
    for (int k : c == 0 ? std::vector<int>{0, 1, 2} : std::vector<int>{2, 1, 0}) {
      in.add(to_switch(kids[k],
                       td(det, dp::Opcode::contrib, static_cast<std::uint16_t>(k), c, 64,
                          DType::f32, ReduceOp::sum, 0, k == 2 ? 2 : 1),
                       elems_f32(x[k])));
    }
  }
  for (int k : {2, 1, 0}) {
    in.add(to_switch(kids[k],
                     td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), 8, 64, DType::f32,
                        ReduceOp::sum, 2, k == 2 ? 2 : 1),
                     elems_f32(x[k])));
  }

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 33u);
    for (std::uint32_t c = 0; c < chunks.size(); ++c) {
      const Chunk& ch = chunks[c];
      const std::size_t n = count_of(ch.d);
      std::vector<float> want(n);
      for (std::size_t i = 0; i < n; ++i) {
        float acc = ch.op == ReduceOp::sum ? 0.0f : vals(c, 0, n)[i];
        for (int k = 0; k < 3; ++k) {
          float v = vals(c, k, n)[i];
          if (ch.d == DType::i32) v *= 1000;
          if (k == 0 && ch.op != ReduceOp::sum) acc = v;
          acc = ch.op == ReduceOp::sum   ? acc + v
                : ch.op == ReduceOp::min ? std::min(acc, v)
                                         : std::max(acc, v);
        }
        want[i] = ch.d == DType::i32 ? acc / 1000 : acc;
      }
      for (std::uint16_t i = 0; i < 3; ++i) {
        const Frame& f = out[c * 3 + i];
        const std::string what =
            "chunk " + std::to_string(c) + " (" + std::string(treeduce::name(ch.d)) + " " +
            std::string(treeduce::name(ch.op)) + ") to child " + std::to_string(i);
        expect_from_switch(f, kids[i], what);
        expect_td(f, t, Want{dp::Opcode::result, c, i, 4, payload(ch.d, want)}, what);
        EXPECT_EQ(td_of(f).dtype, static_cast<std::uint8_t>(ch.d));
        EXPECT_EQ(td_of(f).op, static_cast<std::uint8_t>(ch.op));
        EXPECT_EQ(td_of(f).seq.get(), 2u);
      }
    }
    const Frame child_order = elems_f32(std::vector<float>(64, (1e8f + -1e8f) + 1.0f));
    const Frame arrival_order = elems_f32(std::vector<float>(64, (1.0f + -1e8f) + 1e8f));
    ASSERT_NE(child_order, arrival_order) << "the data must make the order visible";
    for (std::uint32_t c = 0; c < 2; ++c) {
      for (std::uint16_t i = 0; i < 3; ++i) {
        expect_td(out[24 + c * 3 + i], det, Want{dp::Opcode::result, c, i, 4, child_order},
                  "deterministic chunk " + std::to_string(c));
      }
    }
    for (std::uint16_t i = 0; i < 3; ++i) {
      expect_td(out[30 + i], t, Want{dp::Opcode::result, 8, i, 4, arrival_order},
                "plain tree, arrival order");
    }
  };
  run_scenario("root", "root.yaml", {t, det}, in, semantics, {},
               {{"contrib_accepted", 33},
                {"result_multicast", 11},
                {"slot_reused", 0},
                {"partial_sent", 0}});
}

// ---- scenario 3: refusals --------------------------------------------------------------------

/// Every NACK reason, each answered to the sender; stale chunks and sequences, RESULTs at a
/// root, NACKs and unknown opcodes dropped silently. The tree still works afterwards.
TEST(SwitchdPcap, Refusals) {
  const dp::TreeConfig t = basic_tree();
  const auto ok_td = [&](std::uint16_t child_i, std::uint32_t chunk, std::uint16_t count = 8,
                         std::uint32_t seq = 0) {
    return td(t, dp::Opcode::contrib, child_i, chunk, count, DType::f32, ReduceOp::sum, seq);
  };
  const Frame p8 = elems_f32(ramp(8, 1, 0));
  struct Refused {
    Frame frame;
    dp::Endpoint sender;
    dp::DropReason reason;
  };
  std::vector<Refused> nacked;
  Input in;
  const auto refuse = [&](const dp::Endpoint& from, dp::TdHdr h, const Frame& payload,
                          dp::DropReason reason) {
    Frame f = to_switch(from, h, payload);
    in.add(f);
    nacked.push_back({f, from, reason});
  };
  dp::TdHdr h = ok_td(0, 0);
  h.key.set(kBasicKey + 1);
  refuse(host(0), h, p8, dp::DropReason::bad_key);
  h = ok_td(0, 0);
  h.tree_id.set(std::uint16_t{99});
  refuse(host(0), h, p8, dp::DropReason::unknown_tree);
  h = ok_td(0, 0);
  h.version = 2;
  refuse(host(0), h, p8, dp::DropReason::bad_version);
  refuse(host(0), ok_td(7, 0), p8, dp::DropReason::bad_child);
  refuse(kStranger, ok_td(0, 0), p8, dp::DropReason::bad_source);
  refuse(host(0), ok_td(0, 0, 0), {}, dp::DropReason::bad_count);
  refuse(host(0), ok_td(0, 0, 65), elems_f32(ramp(65, 1, 0)), dp::DropReason::bad_count);
  refuse(host(0), ok_td(0, 0, 8), elems_f32(ramp(9, 1, 0)), dp::DropReason::bad_length);
  h = ok_td(1, 0);
  h.dtype = static_cast<std::uint8_t>(DType::i32);
  refuse(host(1), h, p8, dp::DropReason::bad_dtype_op);
  h = ok_td(1, 0);
  h.op = static_cast<std::uint8_t>(ReduceOp::min);
  refuse(host(1), h, p8, dp::DropReason::bad_dtype_op);
  h = ok_td(0, 0);
  h.slot.set(std::uint16_t{1});
  refuse(host(0), h, p8, dp::DropReason::bad_slot);
  h = ok_td(0, 0);
  h.ncontrib.set(std::uint16_t{2});
  refuse(host(0), h, p8, dp::DropReason::bad_ncontrib);
  in.add(to_switch(host(0), ok_td(0, 0, 8), p8));  // accepted: chunk 0 has 8 elements
  refuse(host(1), ok_td(1, 0, 9), elems_f32(ramp(9, 1, 0)), dp::DropReason::chunk_mismatch);
  const std::size_t n_nacks = nacked.size();
  // Silent drops.
  in.add(to_switch(host(0), ok_td(0, 9), p8));         // accepted: slot 1 version 0 holds chunk 9
  in.add(to_switch(host(1), ok_td(1, 1), p8));         // stale_chunk
  in.add(to_switch(host(0), ok_td(0, 2, 8, 5), p8));   // accepted: chunk 2 of collective 5
  in.add(to_switch(host(1), ok_td(1, 2, 8, 4), p8));   // stale_seq: same chunk, other seq
  in.add(to_switch(host(1), ok_td(1, 10, 8, 3), p8));  // stale_seq: newer chunk, older seq
  h = td(t, dp::Opcode::result, 0, 0, 8, DType::f32, ReduceOp::sum, 0, 2);
  in.add(to_switch(host(0), h, p8));  // unexpected_result: a root gets no RESULT
  h.key.set(0);
  in.add(to_switch(host(0), h, p8));  // bad_key, not answered: only CONTRIBs are
  h = ok_td(0, 0);
  h.opcode = static_cast<std::uint8_t>(dp::Opcode::nack);
  h.reason = static_cast<std::uint8_t>(dp::DropReason::bad_key);
  in.add(to_switch(host(0), h, {}));  // nack_received
  h.opcode = 9;
  in.add(to_switch(host(0), h, p8));  // bad_opcode
  // The tree still works: chunk 3 from both.
  in.add(to_switch(host(0), ok_td(0, 3), elems_f32(ramp(8, 2, 1))));
  in.add(to_switch(host(1), ok_td(1, 3), elems_f32(ramp(8, 3, 5))));

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), n_nacks + 2);
    for (std::size_t i = 0; i < n_nacks; ++i) {
      expect_nack(out[i], nacked[i].frame, nacked[i].sender, nacked[i].reason,
                  "NACK " + std::string(dp::name(nacked[i].reason)));
    }
    for (std::uint16_t i = 0; i < 2; ++i) {
      expect_from_switch(out[n_nacks + i], host(i), "RESULT 3");
      expect_td(out[n_nacks + i], t,
                Want{dp::Opcode::result, 3, i, 2, add_f32({ramp(8, 2, 1), ramp(8, 3, 5)})},
                "RESULT 3");
    }
  };
  const std::string log =
      run_scenario("refusals", "basic.yaml", {t}, in, semantics,
                   {{"bad_key", 2},
                    {"unknown_tree", 1},
                    {"bad_version", 1},
                    {"bad_child", 1},
                    {"bad_source", 1},
                    {"bad_count", 2},
                    {"bad_length", 1},
                    {"bad_dtype_op", 2},
                    {"bad_slot", 1},
                    {"bad_ncontrib", 1},
                    {"chunk_mismatch", 1},
                    {"stale_chunk", 1},
                    {"stale_seq", 2},
                    {"unexpected_result", 1},
                    {"nack_received", 1},
                    {"bad_opcode", 1}},
                   {{"nack_sent", 13}, {"contrib_accepted", 5}, {"result_multicast", 1}});
  // The probes are in the log (rate-limited lines from the neighbour thread, the last ones
  // written at shutdown); the other refusals are not.
  EXPECT_NE(log.find("probe from 10.1.0.99: 1 refused as bad_source (not the member's address), "
                     "last for tree " +
                     std::to_string(t.tree_id)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("probe from 10.1.0.10: "), std::string::npos) << log;
  EXPECT_NE(log.find("refused as bad_key (wrong job key)"), std::string::npos) << log;
  EXPECT_EQ(log.find("probe from 10.1.0.11"), std::string::npos)
      << "host 1's refusals (bad_dtype_op, chunk_mismatch) are no probes:\n"
      << log;
}

// ---- scenario 4: malformed frames ------------------------------------------------------------

/// Frames that are not treeduce traffic for this switch: no output, each counted under its
/// reason. Ethernet padding after a valid datagram is fine.
TEST(SwitchdPcap, Malformed) {
  const dp::TreeConfig t = basic_tree();
  const Frame p = elems_f32(ramp(16, 1, 0));
  const Frame good = to_switch(host(0), td(t, dp::Opcode::contrib, 0, 0, 16), p);
  Input in;
  in.add(Frame(good.begin(), good.begin() + 60));  // too_short: cut inside the treeduce header
  in.add(Frame(good.begin(), good.begin() + 20));  // too_short: a runt
  {
    Frame f = good;  // not_ipv4: an IPv6 EtherType
    dp::EtherHdr e = eth_of(f);
    e.ether_type.set(std::uint16_t{0x86DD});
    dp::store_header(f.data(), e);
    in.add(f);
  }
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) { ip.version_ihl = 0x65; }));  // ip_bad_header
  {
    // ip_bad_header: IPv4 options (one word of NOPs), lengths and checksum right.
    Frame f(good.begin(), good.begin() + kUdpOff);
    f.insert(f.end(), 4, std::uint8_t{1});
    f.insert(f.end(), good.begin() + kUdpOff, good.end());
    dp::Ipv4Hdr ip = ip_of(f);
    ip.version_ihl = 0x46;
    ip.total_length.set(static_cast<std::uint16_t>(f.size() - kIpOff));
    ip.hdr_checksum.set(0);
    dp::store_header(f.data() + kIpOff, ip);
    ip.hdr_checksum.set(dp::inet_checksum(f.data() + kIpOff, 24));
    dp::store_header(f.data() + kIpOff, ip);
    ASSERT_EQ(dp::inet_checksum(f.data() + kIpOff, 24), 0);
    in.add(f);
  }
  in.add(with_ip(
      good, [](dp::Ipv4Hdr& ip) { ip.hdr_checksum.raw ^= 0x0100; }, true));  // checksum
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) {  // ip_bad_length: longer than the frame
    ip.total_length.set(static_cast<std::uint16_t>(ip.total_length.get() + 1));
  }));
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) {  // ip_bad_length: shorter than IPv4 + UDP
    ip.total_length.set(std::uint16_t{24});
  }));
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) {  // udp_bad_length: the UDP length says more
    ip.total_length.set(std::uint16_t{40});
  }));
  {
    // too_short: IPv4 and UDP lengths agree, but the datagram holds 12 bytes of the treeduce
    // header; the frame keeps its length (as Ethernet padding would).
    Frame f = good;
    dp::Ipv4Hdr ip = dp::load_header<dp::Ipv4Hdr>(f.data() + kIpOff);
    ip.total_length.set(std::uint16_t{20 + 8 + 12});
    ip.hdr_checksum.set(0);
    ip.hdr_checksum.set(dp::ipv4_checksum(ip));
    dp::store_header(f.data() + kIpOff, ip);
    dp::UdpHdr u = udp_of(f);
    u.dgram_len.set(std::uint16_t{8 + 12});
    dp::store_header(f.data() + kUdpOff, u);
    in.add(f);
  }
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) { ip.fragment.set(std::uint16_t{0x2000}); }));
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) { ip.fragment.set(std::uint16_t{0x0010}); }));
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) { ip.protocol = 6; }));  // not_udp (TCP)
  {
    Frame f = good;  // wrong_port
    dp::UdpHdr u = udp_of(f);
    u.dst_port.set(static_cast<std::uint16_t>(dp::kDefaultUdpPort + 1));
    dp::store_header(f.data() + kUdpOff, u);
    in.add(f);
  }
  {
    Frame f = good;  // udp_bad_length: a UDP length 4 bytes short of the IPv4 datagram
    dp::UdpHdr u = udp_of(f);
    u.dgram_len.set(static_cast<std::uint16_t>(u.dgram_len.get() - 4));
    dp::store_header(f.data() + kUdpOff, u);
    in.add(f);
  }
  in.add(with_ip(good, [](dp::Ipv4Hdr& ip) { ip.dst_addr.set(ipv4(10, 0, 0, 77)); }));
  // Frames longer than any treeduce frame (jumbo frames sent to a 1500-byte port arrive in
  // segments): counted once, as rx_too_long, and never offered to the core.
  for (std::size_t len : {std::size_t{9000}, std::size_t{16000}}) {
    Frame f = good;
    f.resize(len, std::uint8_t{0});
    in.add(f);
  }
  // Positive controls: a valid CONTRIB with 10 bytes of Ethernet padding, then its sibling.
  {
    Frame f = good;
    f.insert(f.end(), 10, std::uint8_t{0});
    in.add(f);
  }
  const Frame p1 = elems_f32(ramp(16, -1, 9));
  in.add(to_switch(host(1), td(t, dp::Opcode::contrib, 1, 0, 16), p1));

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 2u) << "only the positive control's RESULT";
    for (std::uint16_t i = 0; i < 2; ++i) {
      expect_from_switch(out[i], host(i), "RESULT 0");
      expect_td(out[i], t,
                Want{dp::Opcode::result, 0, i, 2, add_f32({ramp(16, 1, 0), ramp(16, -1, 9)})},
                "RESULT 0");
    }
  };
  run_scenario("malformed", "basic.yaml", {t}, in, semantics,
               {{"too_short", 3},
                {"not_ipv4", 1},
                {"ip_bad_header", 2},
                {"ip_bad_checksum", 1},
                {"ip_bad_length", 2},
                {"ip_fragment", 2},
                {"not_udp", 1},
                {"wrong_port", 1},
                {"udp_bad_length", 2},
                {"not_for_us", 1}},
               {{"contrib_accepted", 2},
                {"result_multicast", 1},
                {"nack_sent", 0},
                {"rx_frames", in.frames.size() - 2}},
               {{"rx_too_long", 2}});
}

// ---- scenario 5: ARP and ICMP ----------------------------------------------------------------

/// ARP requests for the port's and the data address are answered, as are ICMP echo requests to
/// either; ARP for another address, ARP replies, echo replies and a bad ICMP checksum are not.
TEST(SwitchdPcap, Neighbor) {
  Input in;
  const std::vector<Frame> asked = {
      arp(host(0), 1, kPortIp),
      arp(host(1), 1, kDataIp),
      icmp_echo(host(0), kPortIp, 8, 0x1234, 1, 32),
      icmp_echo(host(1), kDataIp, 8, 0x4321, 7, 100),
  };
  in.add(asked[0]);
  in.add(arp(host(0), 1, ipv4(10, 1, 0, 201)));  // another address: ignored
  in.add(asked[1]);
  in.add(arp(host(1), 2, kPortIp, kPortMac));  // a reply to us: ignored (learned)
  in.add(asked[2]);
  in.add(icmp_echo(host(0), kPortIp, 8, 1, 2, 16, true));  // bad ICMP checksum: malformed
  in.add(icmp_echo(host(0), kPortIp, 0, 1, 3, 16));        // an echo reply: ignored
  in.add(asked[3]);

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 4u);
    for (std::size_t i = 0; i < 2; ++i) {
      SCOPED_TRACE("ARP reply " + std::to_string(i));
      const dp::Endpoint who = host(static_cast<unsigned>(i));
      const std::uint32_t ip = i == 0 ? kPortIp : kDataIp;
      ASSERT_EQ(out[i].size(), dp::kArpFrameBytes);
      const dp::EtherHdr e = eth_of(out[i]);
      EXPECT_EQ(std::memcmp(e.dst, who.mac, 6), 0);
      EXPECT_EQ(std::memcmp(e.src, kPortMac.data(), 6), 0);
      EXPECT_EQ(e.ether_type.get(), dp::kEtherTypeArp);
      const auto a = dp::load_header<dp::ArpHdr>(out[i].data() + sizeof e);
      EXPECT_EQ(a.oper.get(), 2);
      EXPECT_EQ(std::memcmp(a.sha, kPortMac.data(), 6), 0);
      EXPECT_EQ(a.spa.get(), ip);
      EXPECT_EQ(std::memcmp(a.tha, who.mac, 6), 0);
      EXPECT_EQ(a.tpa.get(), who.ip);
    }
    for (std::size_t i = 2; i < 4; ++i) {
      SCOPED_TRACE("echo reply " + std::to_string(i));
      const Frame& req = asked[i];
      const Frame& rep = out[i];
      const dp::Endpoint who = host(static_cast<unsigned>(i - 2));
      ASSERT_EQ(rep.size(), req.size());
      const dp::EtherHdr e = eth_of(rep);
      EXPECT_EQ(std::memcmp(e.dst, who.mac, 6), 0);
      EXPECT_EQ(std::memcmp(e.src, kPortMac.data(), 6), 0);
      const dp::Ipv4Hdr ip = ip_of(rep);
      EXPECT_EQ(dp::ipv4_checksum(ip), 0);
      EXPECT_EQ(ip.src_addr.get(), i == 2 ? kPortIp : kDataIp);
      EXPECT_EQ(ip.dst_addr.get(), who.ip);
      EXPECT_EQ(rep[kUdpOff], 0) << "echo reply";
      EXPECT_EQ(dp::inet_checksum(rep.data() + kUdpOff, rep.size() - kUdpOff), 0);
      EXPECT_TRUE(std::equal(rep.begin() + kUdpOff + 4, rep.end(), req.begin() + kUdpOff + 4))
          << "identifier, sequence and data come back";
    }
  };
  run_scenario("neighbor", "basic.yaml", {basic_tree()}, in, semantics, {}, {{"rx_frames", 0}},
               {{"arp_requests_in", 2},
                {"arp_replies_out", 2},
                {"echo_replies_out", 2},
                {"neighbor_ignored", 3},
                {"neighbor_malformed", 1}});
}

// ---- large frames ----------------------------------------------------------------------------

/// 4 KiB payloads (4170-byte frames): f32 and bf16 sums, a short last chunk, a unicast repeat.
TEST(SwitchdPcap, LargePayload) {
  const dp::TreeConfig t = large_tree();
  const auto v = [](unsigned k, std::uint32_t c, std::size_t n) {
    return ramp(n, k == 0 ? 1.0f : -0.5f, static_cast<float>(c * 10 + k));
  };
  Input in;
  for (unsigned k : {0u, 1u}) {
    in.add(to_switch(host(k), td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), 0, 1024),
                     elems_f32(v(k, 0, 1024))));
  }
  for (unsigned k : {1u, 0u}) {
    in.add(to_switch(
        host(k), td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), 1, 2048, DType::bf16),
        elems_16(v(k, 1, 2048), DType::bf16)));
  }
  in.next_burst();
  in.add(to_switch(host(1), td(t, dp::Opcode::contrib, 1, 0, 1024), elems_f32(v(1, 0, 1024))));
  for (unsigned k : {0u, 1u}) {
    in.add(to_switch(host(k), td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), 2, 1000),
                     elems_f32(v(k, 2, 1000))));
  }

  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 7u);
    std::vector<float> bf(2048);
    for (std::size_t i = 0; i < bf.size(); ++i) bf[i] = v(0, 1, 2048)[i] + v(1, 1, 2048)[i];
    const Frame r0 = add_f32({v(0, 0, 1024), v(1, 0, 1024)});
    for (std::uint16_t i = 0; i < 2; ++i) {
      ASSERT_EQ(out[i].size(), dp::kFrameHeaderBytes + 4096);
      expect_from_switch(out[i], host(i), "RESULT 0");
      expect_td(out[i], t, Want{dp::Opcode::result, 0, i, 2, r0}, "RESULT 0");
      expect_from_switch(out[2 + i], host(i), "RESULT 1");
      expect_td(out[2 + i], t, Want{dp::Opcode::result, 1, i, 2, elems_16(bf, DType::bf16)},
                "RESULT 1 (bf16)");
      expect_from_switch(out[5 + i], host(i), "RESULT 2");
      expect_td(out[5 + i], t,
                Want{dp::Opcode::result, 2, i, 2, add_f32({v(0, 2, 1000), v(1, 2, 1000)})},
                "RESULT 2 (1000 elements)");
    }
    EXPECT_EQ(out[4], out[1]) << "the unicast repeat of RESULT 0 to host 1";
  };
  run_scenario("large", "large.yaml", {t}, in, semantics, {},
               {{"contrib_accepted", 6}, {"result_multicast", 3}, {"result_unicast", 1}});
}

// ---- a re-sent partial and the parent's RESULT in one RX burst -------------------------------

/// A host's retransmission (which makes the leaf re-send its partial) and the parent's RESULT
/// arrive in the same RX burst: the re-sent partial must still carry the partial sum, not the
/// RESULT that the next frame of the burst wrote into the same slot memory.
TEST(SwitchdPcap, ResentPartialAndResultInOneBurst) {
  const dp::TreeConfig t = leaf_tree();
  const std::vector<float> a = ramp(64, 1, 0), b = ramp(64, 2, 1), r = ramp(64, 5, 3);
  Input in;
  in.add(to_switch(host(0), td(t, dp::Opcode::contrib, 0, 0, 64), elems_f32(a)));
  in.add(to_switch(host(1), td(t, dp::Opcode::contrib, 1, 0, 64), elems_f32(b)));
  in.next_burst();
  in.add(to_switch(host(1), td(t, dp::Opcode::contrib, 1, 0, 64), elems_f32(b)));
  in.add(to_switch(
      kParent, td(t, dp::Opcode::result, t.index_at_parent, 0, 64, DType::f32, ReduceOp::sum, 0, 4),
      elems_f32(r)));
  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 4u);
    const Want partial{dp::Opcode::contrib, 0, t.index_at_parent, 2, add_f32({a, b})};
    expect_td(out[0], t, partial, "partial");
    expect_td(out[1], t, partial, "re-sent partial");
    for (std::uint16_t i = 0; i < 2; ++i) {
      expect_td(out[2 + i], t, Want{dp::Opcode::result, 0, i, 4, elems_f32(r)}, "RESULT");
    }
  };
  run_scenario("resend-race", "leaf.yaml", {t}, in, semantics, {},
               {{"partial_sent", 1}, {"partial_resent", 1}, {"result_multicast", 1}});
}

// wide.yaml: a root of 64 children, the ports 50000-50063 of host 0.
constexpr std::uint64_t kWideKey = 0x5749444557494445ull;
dp::Endpoint wide_child(unsigned i) {
  return endpoint({0x02, 0, 0, 0, 0x01, 0}, ipv4(10, 1, 0, 10),
                  static_cast<std::uint16_t>(50000 + i));
}

/// One RX burst completes a chunk of 64 children and then brings 31 copies of a child's
/// CONTRIB, each answered with the RESULT again: 95 frames of one core call share one payload.
/// The daemon sends them as multicasts of at most 64 frames (a longer one overran its arrays).
TEST(SwitchdPcap, WideMulticastAndResendsInOneBurst) {
  dp::TreeConfig t;
  t.tree_id = 50;
  t.key = kWideKey;
  t.role = dp::Role::root;
  for (unsigned i = 0; i < proto::kMaxChildren; ++i) t.children.push_back(child(wide_child(i)));
  t.slots = 2;
  t.payload_bytes = 256;
  const auto vals = [](unsigned k) { return ramp(64, 1, static_cast<float>(k)); };
  Input in;
  const auto contrib = [&](unsigned k) {
    in.add(to_switch(wide_child(k),
                     td(t, dp::Opcode::contrib, static_cast<std::uint16_t>(k), 0, 64),
                     elems_f32(vals(k))));
  };
  for (unsigned k = 0; k < 31; ++k) contrib(k);
  in.next_burst();
  for (unsigned k = 31; k < 63; ++k) contrib(k);
  in.next_burst();
  contrib(63);  // completes the chunk: the RESULT to all 64
  for (unsigned i = 0; i < 31; ++i) contrib(0);
  ASSERT_EQ(in.frames.size() % kBurst, 0u);

  std::vector<float> sum(64, 0.0f);
  for (unsigned k = 0; k < proto::kMaxChildren; ++k) {
    const std::vector<float> v = vals(k);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  const Semantics semantics = [&](const std::vector<Frame>& out) {
    ASSERT_EQ(out.size(), 95u);
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto k = static_cast<std::uint16_t>(i < 64 ? i : 0);
      const std::string what =
          "frame " + std::to_string(i) + ", RESULT to child " + std::to_string(k);
      expect_from_switch(out[i], wide_child(k), what);
      expect_td(out[i], t, Want{dp::Opcode::result, 0, k, 64, elems_f32(sum)}, what);
    }
  };
  run_scenario("wide", "wide.yaml", {t}, in, semantics, {},
               {{"contrib_accepted", 64}, {"result_multicast", 1}, {"result_unicast", 31}});
}

}  // namespace
