// treeduce-switch throughput on a memif port, next to dpdk-testpmd forwarding on the same port
// type, with the traffic generated in the same run (docs/performance.md "Switch daemon
// throughput").
//
// One DPDK process is the traffic generator (one lcore) and the orchestrator. For every device
// under test (DUT) it starts a child process pinned to the other CPU, connected by one memif
// pair (this process is the memif server, the DUT the client; a socket in a temp dir; its own
// --file-prefix; --no-huge), loads it, measures, stops it and reads its final counters. DUTs:
//   switch    treeduce-switch, one datapath lcore, a static root tree of fan-in F whose children
//             are F fake host addresses behind the generator's MAC (static neighbours, no ARP),
//             slots = in-flight frames / F, f32 sum, --idle-sleep-us 0;
//   io        dpdk-testpmd --forward-mode=io --port-topology=loop, one forwarding lcore;
//   macswap   the same, swapping the MAC addresses (writes every frame's first cache line);
//   csum      the same in csum mode with a non-zero UDP checksum in the frames: memif has no
//             checksum offload, so testpmd recomputes it in software over every payload byte;
//   rxonly    testpmd receiving and dropping, against an open-loop generator: the generator's
//             own maximum TX rate;
//   switch-base  with --switch-base PATH: another treeduce-switch binary (e.g. main's build) in
//             the same rounds, for a before/after in one run;
//   core      not a DUT: treeduce-bench-switch-core (--core-bench PATH, on by default) pinned to
//             the DUT's CPU in the same rounds, for each switch row's payload and fan-in. A last
//             table checks issue 16's target: switch ns/pkt busy <= 1.1 x (macswap's + core's).
// With --memif-zero-copy every DUT's memif client runs with zero-copy=yes (its EAL with
// --single-file-segments, so that the generator can map its memory): the DUT then reads and
// sends frames in place in its own mbufs, and only the generator copies.
// The loop is closed, like real hosts: the generator plays the F children of the tree and sends
// chunk c + S only after a RESULT of chunk c came back (any one of its F copies); for testpmd any
// returned frame returns one credit. The payload of chunk c from child i is known, so the
// RESULTs of a sample of chunks are checked element by element (f32 sums of small integers are
// exact).
//
// Per configuration: warm-up, a measured window, DUT stopped; rounds over all configurations until
// each has `--reps` (3) undisturbed runs; the table shows medians. Besides the rates it shows what
// bounds each row:
//   DUT ns/pkt busy  the DUT's busy time per received frame: testpmd's --record-core-cycles; for
//                    the switch, the window minus (empty polls x the cost of an empty poll,
//                    measured on the idle switch just before), from its Prometheus counters
//   capacity         1000 / that: what the DUT would do if the generator were infinitely fast
//   gen busy         share of the generator's time in loop iterations that moved frames
//   window full      share of its iterations that found no credit: ~100% when the DUT (or the
//                    link) is the bottleneck, low when the generator is
//   CPU gen/DUT      share of the window each process had a CPU; a run below --min-cpu (95%)
//                    shared its CPU with someone else and is discarded; before each run the
//                    bench waits for the machine to be idle
// The DUT's final counters must equal the generator's (every frame back, no drop, for the switch
// every CONTRIB accepted); sampled RESULTs must match the expected sums: else the run fails.
//
// Run (release build, nothing else busy on the two CPUs):
//   build/bench/treeduce-bench-switchd [--json] [--payloads 256,1024,4096] [--fanins 2,8]
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "treeduce/common/cpu_time.h"
#include "treeduce/dataplane/core.h"
#include "treeduce/protocol/wire.h"

extern char** environ;

namespace {

using namespace treeduce;
using namespace treeduce::dp;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kBurst = 32;
constexpr std::size_t kTplPerChild = 64;  // >= frames of one child in a TX burst
constexpr std::uint16_t kTreeId = 1;
constexpr std::uint64_t kKey = 0x7d5eed0042ull;
constexpr std::uint16_t kHostPort = 50000;
constexpr std::uint32_t kSwitchIp = 0x0A000001;  // 10.0.0.1, the switch's data address
constexpr std::uint32_t kHostNet = 0x0A010000;   // 10.1.0.0/16: child i is 10.1.0.(i+1)
constexpr std::size_t kTdOff = kFrameHeaderBytes - sizeof(TdHdr);
constexpr std::size_t kUdpCksumOff = sizeof(EtherHdr) + sizeof(Ipv4Hdr) + 6;
/// Ethernet preamble + SFD (8), FCS (4) and inter-frame gap (12): wire bytes beyond the frame.
constexpr double kWireOverhead = 24;

struct Options {
  std::vector<std::uint32_t> payloads{256, 1024, 4096};
  std::vector<std::uint32_t> fanins{2, 8};
  std::vector<std::string> duts{"switch", "io", "macswap", "csum", "rxonly"};
  std::uint32_t warmup_ms = 500, measure_ms = 2000, reps = 3;
  std::uint32_t inflight = 2048;  // frames in flight in the closed loop
  std::uint32_t sample = 4;       // check the RESULT of every n-th chunk
  double min_cpu = 0.95;          // a run counts when both processes had this share of a CPU
  /// The generator's own threshold (default: min_cpu). A switch's busy ns/pkt comes from its own
  /// poll counters and holds while the DUT has its CPU, even when a slowed generator feeds it
  /// less: --min-gen-cpu 0 keeps such runs for a switch-vs-switch comparison.
  double min_gen_cpu = -1;
  std::uint32_t max_rounds = 8;
  unsigned gen_cpu = 0, dut_cpu = 1;
  std::string switch_bin = TREEDUCE_SWITCH_BIN;
  /// A second treeduce-switch (e.g. main's build) measured as DUT "switch-base" in the same
  /// rounds: before/after in one run. Empty: none.
  std::string switch_base_bin;
  /// treeduce-bench-switch-core, run pinned to the DUT's CPU in the same rounds (DUT "core") for
  /// every switch row's payload and fan-in: the core's ns/pkt without I/O. Empty: not run.
  std::string core_bin = TREEDUCE_BENCH_SWITCH_CORE_BIN;
  std::string testpmd_bin = "dpdk-testpmd";
  bool json = false, keep = false;
  bool memif_zero_copy = false;  // every DUT's memif client with zero-copy=yes
};

std::vector<std::uint32_t> parse_list(const char* s) {
  std::vector<std::uint32_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(static_cast<std::uint32_t>(std::stoul(item)));
  return v;
}

std::uint32_t log2_ceil(std::uint32_t v) {
  std::uint32_t l = 0;
  while ((1u << l) < v) ++l;
  return l;
}

/// memif buffer size: one buffer per frame (as the switch's and testpmd's single-segment mbufs).
std::uint32_t memif_bsize(std::uint32_t payload) {
  return std::max<std::uint32_t>(2048, 1u << log2_ceil(payload + kFrameHeaderBytes));
}

// ---- child processes -------------------------------------------------------------------------

struct Child {
  pid_t pid = -1;
  int stdin_fd = -1;  // write end of the child's stdin (testpmd exits on a newline)
  std::string log;
};

/// The running DUT, for the signal handler: an interrupted bench must not leave a polling
/// switch behind on the other CPU.
volatile sig_atomic_t g_child = 0;

void on_signal(int sig) {
  if (g_child > 0) kill(g_child, SIGTERM);
  _exit(128 + sig);
}

Child spawn(const std::vector<std::string>& argv, const std::string& log, bool stdin_pipe) {
  Child c;
  c.log = log;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  int pfd[2] = {-1, -1};
  if (stdin_pipe && pipe(pfd) == 0) {
    posix_spawn_file_actions_adddup2(&fa, pfd[0], 0);
    posix_spawn_file_actions_addclose(&fa, pfd[1]);
  } else {
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  }
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (posix_spawnp(&c.pid, args[0], &fa, nullptr, args.data(), environ) != 0) c.pid = -1;
  g_child = c.pid;
  posix_spawn_file_actions_destroy(&fa);
  if (pfd[0] >= 0) {
    close(pfd[0]);
    c.stdin_fd = pfd[1];
  }
  return c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Asks the child to stop (a newline on stdin, else SIGTERM), waits up to 15 s, then kills it.
int stop_child(Child& c) {
  if (c.pid <= 0) return -1;
  if (c.stdin_fd >= 0) {
    if (write(c.stdin_fd, "\n", 1) != 1) kill(c.pid, SIGTERM);
  } else {
    kill(c.pid, SIGTERM);
  }
  int status = 0;
  const auto end = Clock::now() + std::chrono::seconds(15);
  while (waitpid(c.pid, &status, WNOHANG) == 0) {
    if (Clock::now() > end) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (c.stdin_fd >= 0) close(c.stdin_fd);
  c.pid = -1;
  g_child = 0;
  return status;
}

/// GET http://127.0.0.1:port/metrics; empty on failure.
std::string http_metrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(0x7F000001);
  std::string out;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, req, sizeof req - 1) == static_cast<ssize_t>(sizeof req - 1)) {
      char buf[8192];
      pollfd p{fd, POLLIN, 0};
      while (poll(&p, 1, 2000) > 0) {
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) break;
        out.append(buf, static_cast<std::size_t>(n));
      }
    }
  }
  close(fd);
  return out;
}

/// Sum of the samples of Prometheus text whose "name{labels}" starts with `name` and contains
/// `label` (may be empty).
double prom(const std::string& text, const std::string& name, const std::string& label = "") {
  double sum = 0;
  std::stringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line.compare(0, name.size(), name) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : ' ';
    if (next != '{' && next != ' ') continue;
    const std::size_t sp = line.rfind(' ');
    if (!label.empty() && line.substr(0, sp).find(label) == std::string::npos) continue;
    sum += std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return sum;
}

/// testpmd's "Accumulated forward statistics" RX-packets / TX-packets.
std::pair<double, double> testpmd_totals(const std::string& log) {
  const std::size_t at = log.rfind("Accumulated forward statistics");
  if (at == std::string::npos) return {-1, -1};
  const auto field = [&](const char* key) -> double {
    const std::size_t k = log.find(key, at);
    return k == std::string::npos ? -1 : std::strtod(log.c_str() + k + std::strlen(key), nullptr);
  };
  return {field("RX-packets:"), field("TX-packets:")};
}

// ---- the generator ---------------------------------------------------------------------------

/// Counters of the generator's loop (monotonic; a window is the difference of two snapshots).
struct GenCounters {
  std::uint64_t tx = 0, rx = 0;             // frames sent / received
  std::uint64_t iters = 0, win_full = 0;    // loop iterations; those that found no credit
  std::uint64_t idle_cycles = 0;            // cycles of iterations that moved nothing
  std::uint64_t checked = 0, mismatch = 0;  // sampled RESULTs compared element by element
  std::uint64_t bad = 0;                    // NACKs, malformed or unexpected frames
};

struct Row {
  std::string dut;
  std::uint32_t payload = 0, fanin = 0;
  std::vector<double> rx_mpps, tx_mpps, gen_busy, win_full, dut_mpps;
  std::vector<double> dut_ns;            // DUT busy time per received frame
  std::vector<double> gen_cpu, dut_cpu;  // share of the window each process got a CPU
  std::uint64_t checked = 0, mismatch = 0, bad = 0;
  bool counters_agree = true;
  std::uint32_t disturbed = 0;  // runs discarded: a process did not get its CPU
  std::string note;
};

std::string fmt(double v, int decimals, const char* suffix = "") {
  char b[32];
  std::snprintf(b, sizeof b, "%.*f%s", decimals, v, suffix);
  return b;
}

/// CPU time of the calling thread, seconds.
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

/// Share of the machine's CPU time that was busy over `ms`.
double machine_busy(int ms) {
  const MachineCpu a = MachineCpu::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return busy_share(a, MachineCpu::now());
}

/// Waits (up to `max_s` seconds) until the machine is quiet: our own processes are idle between
/// runs, so what is busy now is someone else, who would take a CPU from the next run.
void wait_quiet(int max_s) {
  const auto end = Clock::now() + std::chrono::seconds(max_s);
  while (machine_busy(300) > 0.1 && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(700));
  }
}

/// A treeduce-switch DUT: this build's, or the one of --switch-base.
bool is_switch(const std::string& dut) { return dut == "switch" || dut == "switch-base"; }

double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class Generator {
 public:
  Generator(std::uint16_t port, rte_mempool* tpl_pool) : port_(port), tpl_pool_(tpl_pool) {
    rte_ether_addr a;
    rte_eth_macaddr_get(port_, &a);
    std::memcpy(mac_, a.addr_bytes, 6);
  }
  const std::uint8_t* mac() const { return mac_; }

  /// Prepares frames for one configuration: `fanin` children (testpmd: 1), payload bytes, the
  /// window in chunks, whether the UDP checksum is set (csum mode).
  bool prepare(std::uint32_t payload, std::uint32_t fanin, std::uint32_t window, bool udp_cksum) {
    for (rte_mbuf* m : tpl_) rte_pktmbuf_free(m);
    tpl_.clear();
    payload_ = payload;
    fanin_ = fanin;
    window_ = window;
    elems_ = payload / 4;
    got_.assign(window, ~0u);
    next_ = low_ = 0;
    c_ = GenCounters{};
    Endpoint sw;
    sw.mac[0] = 0x02;
    sw.mac[5] = 0xfe;
    sw.ip = kSwitchIp;
    sw.port = kDefaultUdpPort;
    std::vector<float> values(elems_);
    for (std::uint32_t i = 0; i < fanin; ++i) {
      Endpoint me;
      std::memcpy(me.mac, mac_, 6);
      me.ip = kHostNet + i + 1;
      me.port = kHostPort;
      // Element 0 carries the chunk (written per frame); element k > 0 of child i is
      // (i + 1) * (k % 64): sums of small integers, exact in f32 whatever the order.
      for (std::uint32_t k = 1; k < elems_; ++k) values[k] = static_cast<float>((i + 1) * (k % 64));
      TdHdr h{};
      h.version = kProtocolVersion;
      h.opcode = static_cast<std::uint8_t>(Opcode::contrib);
      h.dtype = static_cast<std::uint8_t>(DType::f32);
      h.op = static_cast<std::uint8_t>(ReduceOp::sum);
      h.tree_id.set(kTreeId);
      h.child.set(static_cast<std::uint16_t>(i));
      h.count.set(static_cast<std::uint16_t>(elems_));
      h.ncontrib.set(std::uint16_t{1});
      h.key.set(kKey);
      for (std::size_t t = 0; t < kTplPerChild; ++t) {
        rte_mbuf* m = rte_pktmbuf_alloc(tpl_pool_);
        if (m == nullptr) return false;
        auto* d = reinterpret_cast<std::uint8_t*>(
            rte_pktmbuf_append(m, static_cast<std::uint16_t>(kFrameHeaderBytes + payload)));
        if (d == nullptr) return false;
        build_frame(d, me, sw, h, values.data(), payload);
        if (udp_cksum) {
          d[kUdpCksumOff] = 0x12;
          d[kUdpCksumOff + 1] = 0x34;
        }
        tpl_.push_back(m);
      }
    }
    // The expected RESULT payload, element 0 aside: sum over children of (i + 1) * (k % 64).
    expect_.assign(elems_, 0);
    const float tri = static_cast<float>(fanin * (fanin + 1) / 2);
    for (std::uint32_t k = 1; k < elems_; ++k) expect_[k] = tri * static_cast<float>(k % 64);
    npend_ = pend_off_ = 0;
    return true;
  }

  /// Runs the loop until `until`. mode: 0 switch (closed loop on chunks), 1 testpmd forwarding
  /// (closed loop on frames), 2 open loop (TX only).
  void run(int mode, Clock::time_point until) {
    mode_ = mode;
    while (true) {
      if ((++c_.iters & 1023) == 0 && Clock::now() >= until) break;
      const std::uint64_t t0 = rte_rdtsc();
      bool moved = false;
      rte_mbuf* pkts[kBurst];
      const std::uint16_t n = rte_eth_rx_burst(port_, 0, pkts, kBurst);
      if (n != 0) {
        moved = true;
        for (std::uint16_t i = 0; i < n; ++i) receive(pkts[i]);
        rte_pktmbuf_free_bulk(pkts, n);
      }
      if (npend_ == pend_off_) fill();
      if (npend_ != pend_off_) {
        const std::uint16_t sent = rte_eth_tx_burst(port_, 0, pend_ + pend_off_,
                                                    static_cast<std::uint16_t>(npend_ - pend_off_));
        pend_off_ += sent;
        c_.tx += sent;
        moved |= sent != 0;
      }
      if (!moved) c_.idle_cycles += rte_rdtsc() - t0;
    }
  }

  /// Stops sending and receives until every frame in flight is back (or 500 ms): the DUT's
  /// counters then must equal the generator's.
  bool drain() {
    const auto end = Clock::now() + std::chrono::milliseconds(500);
    // Frames queued but not yet taken by the PMD: send them (a chunk is whole or not at all),
    // except open loop, where nothing comes back.
    while (mode_ != 2 && pend_off_ != npend_ && Clock::now() < end) {
      const std::uint16_t sent = rte_eth_tx_burst(port_, 0, pend_ + pend_off_,
                                                  static_cast<std::uint16_t>(npend_ - pend_off_));
      pend_off_ += sent;
      c_.tx += sent;
    }
    for (std::size_t i = pend_off_; i < npend_; ++i) rte_mbuf_refcnt_update(pend_[i], -1);
    npend_ = pend_off_ = 0;
    while (Clock::now() < end && in_flight() != 0) {
      rte_mbuf* pkts[kBurst];
      const std::uint16_t n = rte_eth_rx_burst(port_, 0, pkts, kBurst);
      for (std::uint16_t i = 0; i < n; ++i) receive(pkts[i]);
      rte_pktmbuf_free_bulk(pkts, n);
    }
    return in_flight() == 0;
  }

  /// Frames sent whose answer has not come back (switch: counted in RESULT copies).
  std::uint64_t in_flight() const { return mode_ == 2 ? 0 : c_.tx - c_.rx; }
  const GenCounters& counters() const { return c_; }

  /// Discards whatever a previous DUT left in the RX ring.
  void flush_rx() {
    rte_mbuf* pkts[kBurst];
    std::uint16_t n;
    while ((n = rte_eth_rx_burst(port_, 0, pkts, kBurst)) != 0) rte_pktmbuf_free_bulk(pkts, n);
  }

 private:
  /// Queues up to one burst of frames that the window allows.
  void fill() {
    npend_ = pend_off_ = 0;
    bool blocked = false;
    if (mode_ == 0) {
      while (npend_ + fanin_ <= kBurst) {
        if (next_ - low_ >= window_) {
          blocked = true;
          break;
        }
        const std::uint32_t c = next_++;
        for (std::uint32_t i = 0; i < fanin_; ++i) queue(i, c);
      }
    } else {
      while (npend_ < kBurst) {
        if (mode_ == 1 && c_.tx + npend_ - c_.rx >= window_) {
          blocked = true;
          break;
        }
        queue(0, next_++);
      }
    }
    if (blocked && npend_ == 0) ++c_.win_full;
  }

  /// Writes chunk c of child i into the child's next template and queues it. The PMD copies the
  /// frame into the memif ring and frees the mbuf; the extra reference keeps it as a template.
  void queue(std::uint32_t i, std::uint32_t c) {
    rte_mbuf* m = tpl_[i * kTplPerChild + (tpl_next_[i]++ % kTplPerChild)];
    auto* d = rte_pktmbuf_mtod(m, std::uint8_t*);
    const std::uint32_t slot = c % window_;
    const std::uint16_t slot_be = bswap_be(static_cast<std::uint16_t>(slot));
    std::memcpy(d + kTdOff + offsetof(TdHdr, slot), &slot_be, 2);
    d[kTdOff + offsetof(TdHdr, slot_ver)] = static_cast<std::uint8_t>((c / window_) % 2);
    const std::uint32_t chunk_be = bswap_be(c);
    std::memcpy(d + kTdOff + offsetof(TdHdr, chunk), &chunk_be, 4);
    const float v0 = static_cast<float>((c % 1024) + i);
    std::memcpy(d + kFrameHeaderBytes, &v0, 4);
    rte_mbuf_refcnt_update(m, 1);
    pend_[npend_++] = m;
  }

  void receive(rte_mbuf* m) {
    ++c_.rx;
    if (mode_ != 0) {
      if (m->pkt_len != kFrameHeaderBytes + payload_) ++c_.bad;
      return;
    }
    if (m->nb_segs != 1 || m->data_len < kFrameHeaderBytes) {
      ++c_.bad;
      return;
    }
    const auto* d = rte_pktmbuf_mtod(m, const std::uint8_t*);
    const TdHdr h = load_header<TdHdr>(d + kTdOff);
    if (h.opcode != static_cast<std::uint8_t>(Opcode::result) ||
        m->data_len != kFrameHeaderBytes + payload_ || h.count.get() != elems_ ||
        h.ncontrib.get() != fanin_) {
      ++c_.bad;
      return;
    }
    const std::uint32_t c = h.chunk.get();
    if (c - low_ >= next_ - low_) return;  // a copy of a chunk already acknowledged
    std::uint32_t& g = got_[c % window_];
    if (g == c) return;  // another copy of this chunk
    g = c;
    if (c % sample_ == 0) {
      ++c_.checked;
      float v0;
      std::memcpy(&v0, d + kFrameHeaderBytes, 4);
      const float want0 =
          static_cast<float>(fanin_ * (c % 1024) + fanin_ * (fanin_ - 1) / 2);  // exact
      if (v0 != want0 || std::memcmp(d + kFrameHeaderBytes + 4, expect_.data() + 1,
                                     (elems_ - 1) * sizeof(float)) != 0) {
        ++c_.mismatch;
      }
    }
    while (low_ != next_ && got_[low_ % window_] == low_) ++low_;
  }

 public:
  std::uint32_t sample_ = 4;

 private:
  std::uint16_t port_;
  rte_mempool* tpl_pool_;
  std::uint8_t mac_[6] = {};
  std::vector<rte_mbuf*> tpl_;
  std::uint32_t tpl_next_[kMaxChildren] = {};  // per child: next template
  std::uint32_t payload_ = 0, fanin_ = 1, window_ = 1, elems_ = 0;
  int mode_ = 0;
  std::uint32_t next_ = 0, low_ = 0;  // chunks (switch) or frames (testpmd)
  std::vector<std::uint32_t> got_;    // per slot: the last chunk a RESULT came back for
  std::vector<float> expect_;
  rte_mbuf* pend_[kBurst + kMaxChildren] = {};
  std::size_t npend_ = 0, pend_off_ = 0;
  GenCounters c_;
};

// ---- one configuration -----------------------------------------------------------------------

struct Bench {
  Options o;
  std::string dir;
  std::string prefix;
  Generator* gen = nullptr;
  std::uint16_t port = 0;
  std::string last_disturbed;  // the CPU shares of a discarded run

  std::string memif_args(std::uint32_t payload) const {
    return "--vdev=net_memif0,role=client,id=0,socket=" + dir +
           "/memif.sock,bsize=" + std::to_string(memif_bsize(payload)) +
           ",rsize=" + std::to_string(log2_ceil(2 * o.inflight)) +
           (o.memif_zero_copy ? ",zero-copy=yes" : "");
  }

  std::string write_switch_yaml(std::uint32_t payload, std::uint32_t fanin, std::uint32_t slots) {
    std::ostringstream y;
    char mac[32];
    const std::uint8_t* g = gen->mac();
    std::snprintf(mac, sizeof mac, "%02x:%02x:%02x:%02x:%02x:%02x", g[0], g[1], g[2], g[3], g[4],
                  g[5]);
    y << "name: bench\ndata: 10.0.0.1:47110\nports:\n  - {name: net_memif0, ip: 10.1.0.254/16}\n"
      << "neighbors:\n";
    for (std::uint32_t i = 0; i < fanin; ++i)
      y << "  - {ip: 10.1.0." << i + 1 << ", mac: \"" << mac << "\", port: net_memif0}\n";
    y << "idle_sleep_us: 0\nmbufs: 16384\nmetrics: 127.0.0.1:0\nlog_level: warn\n"
      << "final_stats: " << dir << "/switch.prom\ntrees:\n  - tree: " << kTreeId
      << "\n    key: " << kKey << "\n    role: root\n    children:\n";
    for (std::uint32_t i = 0; i < fanin; ++i)
      y << "      - {addr: 10.1.0." << i + 1 << ":" << kHostPort << ", hosts: 1}\n";
    y << "    slots: " << slots << "\n    payload_bytes: " << payload
      << "\n    dtypes: [f32]\n    ops: [sum]\n";
    const std::string path = dir + "/switch.yaml";
    std::ofstream(path) << y.str();
    return path;
  }

  std::vector<std::string> eal(const std::string& name, std::uint32_t payload) const {
    std::vector<std::string> a = {"--no-huge",
                                  "-m",
                                  "512",
                                  "--no-pci",
                                  "--file-prefix=" + prefix + name,
                                  "--log-level=lib.eal:warning",
                                  memif_args(payload)};
    // memif's zero-copy client shares its EAL memory with the server: one file per segment list
    // (--no-huge memory is then a memfd).
    if (o.memif_zero_copy) a.push_back("--single-file-segments");
    return a;
  }

  /// Waits for the memif link and a line in the DUT's log; the metrics port from the switch's.
  bool wait_ready(const Child& c, const std::string& line, int* metrics_port) {
    const auto end = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < end) {
      int status;
      if (waitpid(c.pid, &status, WNOHANG) == c.pid) return false;
      rte_eth_link l{};
      rte_eth_link_get_nowait(port, &l);
      const std::string log = read_file(c.log);
      const std::size_t at = log.find(line);
      if (l.link_status == RTE_ETH_LINK_UP && at != std::string::npos) {
        if (metrics_port != nullptr) {
          const std::size_t mp = log.find("metrics port ", at);
          *metrics_port = mp == std::string::npos ? 0 : std::atoi(log.c_str() + mp + 13);
        }
        return true;
      }
      gen->flush_rx();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  /// DUT "core": treeduce-bench-switch-core for this row's payload and fan-in (f32 sum, not
  /// deterministic), pinned to the DUT's CPU; its ns_per_pkt goes to dut_ns. Discarded like a
  /// DUT run when the process had less than --min-cpu of its CPU.
  void run_core(Row& r) {
    const std::string log = dir + "/core.json";
    const std::string filter =
        "--benchmark_filter=^BM_SwitchCore/payload:" + std::to_string(r.payload) +
        "/fanin:" + std::to_string(r.fanin) + "/det:0$";
    const auto t0 = Clock::now();
    Child c = spawn({"taskset", "-c", std::to_string(o.dut_cpu), o.core_bin, filter,
                     "--benchmark_min_time=1", "--benchmark_format=json"},
                    log, false);
    if (c.pid <= 0) {
      r.note = "cannot start taskset " + o.core_bin;
      return;
    }
    rusage ru{};
    int status = 0;
    while (wait4(c.pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    g_child = 0;
    const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
    const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    const std::string out = read_file(log);
    const std::size_t k = out.find("\"ns_per_pkt\": ");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || k == std::string::npos) {
      r.note = "treeduce-bench-switch-core gave no ns_per_pkt: " + out.substr(0, 300);
      return;
    }
    const double share = wall > 0 ? cpu / wall : 0;
    if (share < o.min_cpu) {
      ++r.disturbed;
      last_disturbed = "-/" + fmt(100 * share, 0, "%");
      return;
    }
    const double ns = std::strtod(out.c_str() + k + 14, nullptr);
    r.dut_ns.push_back(ns);
    r.rx_mpps.push_back(1e3 / ns);
    r.dut_cpu.push_back(share);
  }

  /// One run of one configuration: start the DUT, warm up, measure, drain, stop, cross-check.
  void run(Row& r) {
    if (r.dut == "core") return run_core(r);
    const bool sw = is_switch(r.dut);
    const int mode = sw ? 0 : r.dut == "rxonly" ? 2 : 1;
    const std::uint32_t fanin = sw ? r.fanin : 1;
    // The switch's window (= its slots) in chunks: a power of two.
    const std::uint32_t window = sw ? std::bit_floor(o.inflight / fanin) : o.inflight;
    if (!gen->prepare(r.payload, fanin, window, r.dut == "csum")) {
      r.note = "cannot allocate templates";
      return;
    }
    gen->sample_ = o.sample;
    const std::string cpu = std::to_string(o.dut_cpu);
    std::vector<std::string> argv;
    Child c;
    int metrics_port = 0;
    if (sw) {
      const std::string yaml = write_switch_yaml(r.payload, fanin, window);
      argv = {r.dut == "switch-base" ? o.switch_base_bin : o.switch_bin, "-l", cpu};
      for (std::string& a : eal("sw", r.payload)) argv.push_back(a);
      argv.insert(argv.end(), {"--", "--config", yaml});
      std::remove((dir + "/switch.prom").c_str());
      c = spawn(argv, dir + "/dut.log", false);
    } else {
      // Main lcore (blocked reading stdin) and forwarding lcore share the DUT's CPU.
      // stdbuf: testpmd's stdout is a file, and "Press enter to exit" must not wait in a buffer.
      argv = {"stdbuf", "-oL", o.testpmd_bin, "--lcores=0@" + cpu + ",1@" + cpu};
      for (std::string& a : eal("pmd", r.payload)) argv.push_back(a);
      argv.insert(argv.end(),
                  {"--", "--forward-mode=" + r.dut, "--port-topology=loop", "--nb-cores=1",
                   "--rxq=1", "--txq=1", "--burst=32", "--total-num-mbufs=16384",
                   "--mbuf-size=8576", "--no-mlockall", "--record-core-cycles"});
      c = spawn(argv, dir + "/dut.log", true);
    }
    if (c.pid <= 0 ||
        !wait_ready(c, sw ? " ready: " : "Press enter to exit", sw ? &metrics_port : nullptr)) {
      r.note = "DUT did not start: " + read_file(c.log).substr(0, 2000);
      stop_child(c);
      return;
    }
    gen->flush_rx();
    // The switch's cost of an empty poll, from its counters without traffic: its idle time
    // under load is then (empty polls) x (this).
    double empty_poll_ns = 0;
    if (metrics_port != 0) {
      const std::string i0 = http_metrics(metrics_port);
      const auto ti = Clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const std::string i1 = http_metrics(metrics_port);
      const double dt = std::chrono::duration<double, std::nano>(Clock::now() - ti).count();
      const double polls =
          prom(i1, "treeduce_lcore_polls_total") - prom(i0, "treeduce_lcore_polls_total");
      if (polls > 0) empty_poll_ns = dt / polls;
    }
    const auto t0 = Clock::now();
    gen->run(mode, t0 + std::chrono::milliseconds(o.warmup_ms));
    // The DUT's own counters at both ends of the window, fetched off the generator's loop.
    std::string m0, m1;
    std::thread s0;
    if (metrics_port != 0) s0 = std::thread([&] { m0 = http_metrics(metrics_port); });
    const GenCounters a = gen->counters();
    const double gen_cpu0 = thread_cpu_s(), dut_cpu0 = process_cpu_seconds(c.pid);
    const auto ta = Clock::now();
    gen->run(mode, ta + std::chrono::milliseconds(o.measure_ms));
    const GenCounters b = gen->counters();
    const auto tb = Clock::now();
    const double gen_cpu1 = thread_cpu_s(), dut_cpu1 = process_cpu_seconds(c.pid);
    if (s0.joinable()) s0.join();
    if (metrics_port != 0) m1 = http_metrics(metrics_port);
    const bool drained = gen->drain();
    const GenCounters z = gen->counters();
    const double secs = std::chrono::duration<double>(tb - ta).count();
    const double tsc = static_cast<double>(rte_get_tsc_hz()) * secs;
    // The machine is shared: a run in which either process did not have its CPU to itself
    // measures the neighbours, not the DUT. It is discarded (and run again, see main).
    const double gen_share = (gen_cpu1 - gen_cpu0) / secs;
    const double dut_share = (dut_cpu1 - dut_cpu0) / secs;
    const bool quiet = gen_share >= o.min_gen_cpu && dut_share >= o.min_cpu;
    if (!quiet) {
      ++r.disturbed;
      last_disturbed = fmt(100 * gen_share, 0, "%/") + fmt(100 * dut_share, 0, "%");
    }
    if (quiet) r.rx_mpps.push_back(static_cast<double>(b.tx - a.tx) / secs / 1e6);
    if (quiet) {
      r.tx_mpps.push_back(static_cast<double>(b.rx - a.rx) / secs / 1e6);
      r.gen_busy.push_back(1.0 - static_cast<double>(b.idle_cycles - a.idle_cycles) / tsc);
      r.win_full.push_back(static_cast<double>(b.win_full - a.win_full) /
                           static_cast<double>(std::max<std::uint64_t>(1, b.iters - a.iters)));
      r.gen_cpu.push_back(gen_share);
      r.dut_cpu.push_back(dut_share);
    }
    if (quiet && !m0.empty() && !m1.empty()) {
      // The scrapes are ~ms apart from the generator's window edges: a cross-check, not the
      // figure.
      const double rx =
          prom(m1, "treeduce_port_rx_packets_total") - prom(m0, "treeduce_port_rx_packets_total");
      const double polls =
          prom(m1, "treeduce_lcore_polls_total") - prom(m0, "treeduce_lcore_polls_total");
      const double busy =
          prom(m1, "treeduce_lcore_busy_polls_total") - prom(m0, "treeduce_lcore_busy_polls_total");
      r.dut_mpps.push_back(rx / secs / 1e6);
      const double idle_ns = (polls - busy) * empty_poll_ns;
      if (rx > 0 && empty_poll_ns > 0) r.dut_ns.push_back((secs * 1e9 - idle_ns) / rx);
    }
    r.checked += z.checked;
    r.mismatch += z.mismatch;
    r.bad += z.bad;
    const int status = stop_child(c);
    // The DUT's totals must equal the generator's: nothing lost, nothing extra.
    double dut_rx = -1, dut_tx = -1;
    if (sw) {
      const std::string p = read_file(dir + "/switch.prom");
      dut_rx = prom(p, "treeduce_port_rx_packets_total");
      dut_tx = prom(p, "treeduce_port_tx_packets_total");
      const double accepted = prom(p, "treeduce_switch_events_total", "\"contrib_accepted\"");
      const double drops = prom(p, "treeduce_switch_drops_total");
      const double daemon_drops = prom(p, "treeduce_switch_daemon_total", "\"tx_queue_full\"") +
                                  prom(p, "treeduce_switch_daemon_total", "\"tx_no_mbuf\"") +
                                  prom(p, "treeduce_switch_daemon_total", "\"tx_unresolved\"");
      if (accepted != static_cast<double>(z.tx) || drops != 0 || daemon_drops != 0) {
        r.counters_agree = false;
        r.note += "switch: accepted " + std::to_string(accepted) + " drops " +
                  std::to_string(drops) + " daemon drops " + std::to_string(daemon_drops) + "; ";
      }
    } else {
      const std::string log = read_file(c.log);
      std::tie(dut_rx, dut_tx) = testpmd_totals(log);
      // --record-core-cycles: busy cycles per packet over the whole run.
      const std::size_t k = log.rfind("CPU cycles/packet=");
      if (quiet && k != std::string::npos) {
        r.dut_ns.push_back(std::strtod(log.c_str() + k + 18, nullptr) * 1e9 /
                           static_cast<double>(rte_get_tsc_hz()));
      }
    }
    // Open loop: the frames still in the memif ring when the DUT stops are never received.
    const bool agree =
        mode == 2 ? dut_rx <= static_cast<double>(z.tx) &&
                        dut_rx + 2.0 * o.inflight >= static_cast<double>(z.tx)
                  : dut_rx == static_cast<double>(z.tx) && dut_tx == static_cast<double>(z.rx);
    if (!agree || !drained || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      r.counters_agree = false;
      r.note += "DUT rx " + std::to_string(dut_rx) + " tx " + std::to_string(dut_tx) +
                " vs generator tx " + std::to_string(z.tx) + " rx " + std::to_string(z.rx) +
                (drained ? "" : ", not drained") + ", exit status " + std::to_string(status) + "; ";
    }
  }
};

double line_mpps(double gbps, std::uint32_t payload) {
  return gbps * 1e3 / ((kFrameHeaderBytes + payload + kWireOverhead) * 8);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--json") {
      o.json = true;
    } else if (a == "--keep") {
      o.keep = true;
    } else if (a == "--memif-zero-copy") {
      o.memif_zero_copy = true;
    } else if (a == "--payloads") {
      o.payloads = parse_list(val());
    } else if (a == "--fanins") {
      o.fanins = parse_list(val());
    } else if (a == "--duts") {
      o.duts.clear();
      std::stringstream in(val());
      std::string d;
      while (std::getline(in, d, ',')) o.duts.push_back(d);
    } else if (a == "--warmup-ms") {
      o.warmup_ms = parse_list(val()).at(0);
    } else if (a == "--measure-ms") {
      o.measure_ms = parse_list(val()).at(0);
    } else if (a == "--reps") {
      o.reps = parse_list(val()).at(0);
    } else if (a == "--inflight") {
      o.inflight = parse_list(val()).at(0);
    } else if (a == "--sample") {
      o.sample = std::max(1u, parse_list(val()).at(0));
    } else if (a == "--min-cpu") {
      o.min_cpu = std::strtod(val(), nullptr);
    } else if (a == "--min-gen-cpu") {
      o.min_gen_cpu = std::strtod(val(), nullptr);
    } else if (a == "--max-rounds") {
      o.max_rounds = parse_list(val()).at(0);
    } else if (a == "--gen-cpu") {
      o.gen_cpu = parse_list(val()).at(0);
    } else if (a == "--dut-cpu") {
      o.dut_cpu = parse_list(val()).at(0);
    } else if (a == "--switch") {
      o.switch_bin = val();
    } else if (a == "--switch-base") {
      o.switch_base_bin = val();
    } else if (a == "--core-bench") {
      o.core_bin = val();
    } else if (a == "--testpmd") {
      o.testpmd_bin = val();
    } else {
      std::fprintf(stderr,
                   "usage: %s [--json] [--payloads 256,1024,4096] [--fanins 2,8] "
                   "[--duts switch,io,macswap,csum,rxonly] [--warmup-ms 500] [--measure-ms 2000] "
                   "[--reps 3] [--inflight 2048] [--sample 4] [--min-cpu 0.95] [--min-gen-cpu X] "
                   "[--max-rounds 8] "
                   "[--gen-cpu 0] [--dut-cpu 1] "
                   "[--switch PATH] [--switch-base PATH] [--core-bench PATH|''] [--testpmd PATH] "
                   "[--memif-zero-copy] [--keep]\n",
                   argv[0]);
      return 2;
    }
  }
  if (o.min_gen_cpu < 0) o.min_gen_cpu = o.min_cpu;
  if (!std::has_single_bit(o.inflight) || o.inflight < 64 || o.inflight > 8192) {
    std::fprintf(stderr, "--inflight must be a power of two from 64 to 8192\n");
    return 2;
  }
  char tmpl[] = "/tmp/treeduce-bench-switchd-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  Bench b;
  b.o = o;
  b.dir = tmpl;
  b.prefix = "tdbsw" + std::to_string(getpid());
  // The generator's EAL: one lcore, the memif server. The client sets ring and buffer sizes; the
  // server's rsize is the largest it accepts.
  const std::vector<std::string> eal = {
      argv[0],
      "-l",
      std::to_string(o.gen_cpu),
      "--no-huge",
      "-m",
      "1024",
      "--no-pci",
      "--file-prefix=" + b.prefix + "gen",
      "--log-level=lib.eal:warning",
      "--log-level=pmd.net.memif:error",
      "--vdev=net_memif0,role=server,id=0,socket=" + b.dir + "/memif.sock,rsize=14,bsize=8192"};
  std::vector<char*> eargv;
  for (const std::string& s : eal) eargv.push_back(const_cast<char*>(s.c_str()));
  if (rte_eal_init(static_cast<int>(eargv.size()), eargv.data()) < 0) {
    std::fprintf(stderr, "EAL initialisation failed\n");
    return 1;
  }
  std::uint16_t port = 0;
  if (rte_eth_dev_get_port_by_name("net_memif0", &port) != 0) {
    std::fprintf(stderr, "no memif port\n");
    return 1;
  }
  constexpr std::uint16_t kRoom = RTE_PKTMBUF_HEADROOM + 8448;
  rte_mempool* rx_pool = rte_pktmbuf_pool_create("gen_rx", 16383, 256, 0, kRoom, SOCKET_ID_ANY);
  rte_mempool* tpl_pool = rte_pktmbuf_pool_create("gen_tpl", 2047, 0, 0, kRoom, SOCKET_ID_ANY);
  rte_eth_conf conf{};
  if (rx_pool == nullptr || tpl_pool == nullptr || rte_eth_dev_configure(port, 1, 1, &conf) != 0 ||
      rte_eth_rx_queue_setup(port, 0, 1024, SOCKET_ID_ANY, nullptr, rx_pool) != 0 ||
      rte_eth_tx_queue_setup(port, 0, 1024, SOCKET_ID_ANY, nullptr) != 0 ||
      rte_eth_dev_start(port) != 0) {
    std::fprintf(stderr, "generator port set-up failed\n");
    return 1;
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  Generator gen(port, tpl_pool);
  b.gen = &gen;
  b.port = port;

  // Rows: per payload, the switch at each fan-in (main's build next to it, and the core
  // alone), then testpmd's modes.
  std::vector<Row> rows;
  for (std::uint32_t p : o.payloads) {
    for (const std::string& d : o.duts) {
      if (d == "switch") {
        std::vector<std::string> kinds{"switch"};
        if (!o.switch_base_bin.empty()) kinds.push_back("switch-base");
        if (!o.core_bin.empty()) kinds.push_back("core");
        for (std::uint32_t f : o.fanins) {
          for (const std::string& k : kinds) {
            Row r;
            r.dut = k;
            r.payload = p;
            r.fanin = f;
            rows.push_back(r);
          }
        }
      } else {
        Row r;
        r.dut = d;
        r.payload = p;
        rows.push_back(r);
      }
    }
  }
  // Rounds over every configuration, so that a noisy neighbour spreads over all rows; rounds
  // go on (up to max_rounds) for the rows that lack `reps` undisturbed runs.
  for (std::uint32_t rep = 0; rep < o.max_rounds; ++rep) {
    bool more = false;
    for (Row& r : rows) {
      if (r.rx_mpps.size() >= o.reps) continue;
      more = true;
      b.last_disturbed.clear();
      wait_quiet(20);
      b.run(r);
      if (!o.json) {
        std::fprintf(stderr, "round %u: %-8s %5u B fan-in %u: %s%s%s\n", rep + 1, r.dut.c_str(),
                     r.payload, r.fanin,
                     !b.last_disturbed.empty()
                         ? ("CPU gen/DUT " + b.last_disturbed + ", discarded").c_str()
                     : r.rx_mpps.empty() ? "-"
                                         : fmt(r.rx_mpps.back(), 2, " Mpps").c_str(),
                     r.note.empty() ? "" : "  ", r.note.substr(0, 300).c_str());
      }
    }
    if (!more) break;
  }
  rte_eth_dev_stop(port);
  rte_eth_dev_close(port);
  rte_eal_cleanup();
  if (!o.keep) {
    std::error_code ec;
    std::filesystem::remove_all(b.dir, ec);
  }

  // The table.
  // A reference row's measured Mpps, or its capacity (1 / busy ns per packet).
  const auto ref = [&](std::uint32_t p, const char* d, bool cap) {
    for (const Row& r : rows) {
      if (r.payload == p && r.dut == d) return cap ? 1e3 / median(r.dut_ns) : median(r.rx_mpps);
    }
    return std::numeric_limits<double>::quiet_NaN();
  };
  bool ok = true;
  std::ostringstream js;
  js << "{\"inflight\": " << o.inflight
     << ", \"memif_zero_copy\": " << (o.memif_zero_copy ? "true" : "false")
     << ", \"measure_ms\": " << o.measure_ms << ", \"reps\": " << o.reps << ", \"rows\": [";
  if (!o.json) {
    std::printf(
        "| DUT | payload | fan-in | rx Mpps/lcore | runs min-max | Gbps reduced | tx Mpps | vs "
        "macswap | vs csum "
        "| lcores 100G | lcores 400G | DUT ns/pkt busy | capacity Mpps | cap. vs macswap "
        "| cap. vs csum | DUT Mpps (own) | gen busy | window full | CPU gen/DUT | runs (discarded) "
        "| checked | mismatches |\n");
    std::printf(
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
        "\n");
  }
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (r.dut == "core") {
      ok = ok && !r.rx_mpps.empty();
      continue;  // in the table of the target, below
    }
    const double rx = median(r.rx_mpps), tx = median(r.tx_mpps);
    const double gbps = is_switch(r.dut) ? rx * r.payload * 8 / 1e3 : NAN;
    const double l100 = std::ceil(line_mpps(100, r.payload) / rx);
    const double l400 = std::ceil(line_mpps(400, r.payload) / rx);
    const double vmac = rx / ref(r.payload, "macswap", false);
    const double vcsum = rx / ref(r.payload, "csum", false);
    const double cap = r.dut_ns.empty() ? NAN : 1e3 / median(r.dut_ns);
    const double cmac = cap / ref(r.payload, "macswap", true);
    const double ccsum = cap / ref(r.payload, "csum", true);
    ok = ok && r.mismatch == 0 && r.bad == 0 && r.counters_agree && !r.rx_mpps.empty();
    const std::string fan = r.fanin != 0 ? std::to_string(r.fanin) : "-";
    if (!o.json) {
      std::string range = "-";
      if (!r.rx_mpps.empty()) {
        const auto [lo, hi] = std::minmax_element(r.rx_mpps.begin(), r.rx_mpps.end());
        range = fmt(*lo, 2) + "-" + fmt(*hi, 2);
      }
      const auto opt = [](const std::vector<double>& v, int d) {
        return v.empty() ? std::string("-") : fmt(median(v), d);
      };
      std::printf(
          "| %s | %u | %s | %.2f | %s | %s | %.2f | %.2f | %.2f | %.0f | %.0f | %s | %.2f | %.2f | "
          "%.2f "
          "| %s | %.0f%% | %.0f%% | %.0f%%/%.0f%% | %zu (%u) | %llu | %llu |\n",
          r.dut == "rxonly" ? "gen max TX (rxonly)" : r.dut.c_str(), r.payload, fan.c_str(), rx,
          range.c_str(), std::isnan(gbps) ? "-" : fmt(gbps, 1).c_str(), tx, vmac, vcsum, l100, l400,
          opt(r.dut_ns, 0).c_str(), cap, cmac, ccsum, opt(r.dut_mpps, 2).c_str(),
          100 * median(r.gen_busy), 100 * median(r.win_full), 100 * median(r.gen_cpu),
          100 * median(r.dut_cpu), r.rx_mpps.size(), r.disturbed,
          static_cast<unsigned long long>(r.checked), static_cast<unsigned long long>(r.mismatch));
      if (!r.note.empty()) std::printf("  note: %s\n", r.note.substr(0, 400).c_str());
    }
    const auto num = [](double v) {
      return std::isnan(v) ? std::string("null") : std::to_string(v);
    };
    js << (i ? ", " : "") << "{\"dut\": \"" << r.dut << "\", \"payload\": " << r.payload
       << ", \"fanin\": " << r.fanin << ", \"rx_mpps\": " << num(rx)
       << ", \"gbps_reduced\": " << num(gbps) << ", \"tx_mpps\": " << num(tx)
       << ", \"vs_macswap\": " << num(vmac) << ", \"vs_csum\": " << num(vcsum)
       << ", \"lcores_100g\": " << num(l100) << ", \"lcores_400g\": " << num(l400)
       << ", \"gen_busy\": " << num(median(r.gen_busy))
       << ", \"window_full\": " << num(median(r.win_full))
       << ", \"dut_own_mpps\": " << num(median(r.dut_mpps))
       << ", \"dut_ns_per_pkt_busy\": " << num(median(r.dut_ns))
       << ", \"capacity_mpps\": " << num(cap) << ", \"capacity_vs_macswap\": " << num(cmac)
       << ", \"capacity_vs_csum\": " << num(ccsum) << ", \"gen_cpu\": " << num(median(r.gen_cpu))
       << ", \"dut_cpu\": " << num(median(r.dut_cpu)) << ", \"runs_discarded\": " << r.disturbed
       << ", \"checked\": " << r.checked << ", \"mismatches\": " << r.mismatch
       << ", \"bad_frames\": " << r.bad
       << ", \"counters_agree\": " << (r.counters_agree ? "true" : "false") << ", \"runs_mpps\": [";
    for (std::size_t k = 0; k < r.rx_mpps.size(); ++k) js << (k ? ", " : "") << r.rx_mpps[k];
    js << "]}";
  }
  js << "]";
  // Issue 16's target: the switch's busy time per packet at most 1.1 x (macswap's + the core's),
  // same payload (and fan-in for the core), same run.
  const auto ns_of = [&](const char* d, std::uint32_t p, std::uint32_t f) {
    for (const Row& r : rows) {
      if (r.dut == d && r.payload == p && r.fanin == f) return median(r.dut_ns);
    }
    return std::numeric_limits<double>::quiet_NaN();
  };
  const auto range_of = [](const std::vector<double>& v) {
    if (v.empty()) return std::string("-");
    const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
    return fmt(*lo, 0) + "-" + fmt(*hi, 0);
  };
  if (!o.json && !o.core_bin.empty()) {
    std::printf(
        "\ntarget: switch ns/pkt busy <= 1.1 x (macswap ns/pkt busy + core ns/pkt), same run\n"
        "| switch | payload | fan-in | switch ns/pkt (runs) | macswap ns/pkt (runs) | core ns/pkt "
        "(runs) | switch / (macswap + core) | target 1.1 |\n|---|--:|--:|--:|--:|--:|--:|---|\n");
  }
  js << ", \"target\": [";
  bool first = true;
  for (const Row& r : rows) {
    if (!is_switch(r.dut) || o.core_bin.empty()) continue;
    const double sw = median(r.dut_ns), mac = ns_of("macswap", r.payload, 0),
                 core = ns_of("core", r.payload, r.fanin);
    const double ratio = sw / (mac + core);
    std::vector<double> mac_runs, core_runs;
    // The verdict holds only when every process had its CPU (the default --min-cpu discards
    // the other runs; with a lower one, contention inflates every figure differently).
    double share = std::min(median(r.gen_cpu), median(r.dut_cpu));
    for (const Row& x : rows) {
      if (x.dut == "macswap" && x.payload == r.payload) {
        mac_runs = x.dut_ns;
        share = std::min({share, median(x.gen_cpu), median(x.dut_cpu)});
      }
      if (x.dut == "core" && x.payload == r.payload && x.fanin == r.fanin) {
        core_runs = x.dut_ns;
        share = std::min(share, median(x.dut_cpu));
      }
    }
    const bool valid = !std::isnan(ratio) && share >= 0.95 && o.min_gen_cpu >= 0.95;
    const std::string verdict =
        !valid         ? "no verdict: a CPU share of " + fmt(100 * share, 0, "%") + " (< 95%)"
        : ratio <= 1.1 ? "met"
                       : "missed";
    if (!o.json) {
      std::printf("| %s | %u | %u | %s (%s) | %s (%s) | %s (%s) | %s | %s |\n", r.dut.c_str(),
                  r.payload, r.fanin, fmt(sw, 0).c_str(), range_of(r.dut_ns).c_str(),
                  fmt(mac, 0).c_str(), range_of(mac_runs).c_str(), fmt(core, 1).c_str(),
                  range_of(core_runs).c_str(), fmt(ratio, 2).c_str(), verdict.c_str());
    }
    const auto num = [](double v) {
      return std::isnan(v) ? std::string("null") : std::to_string(v);
    };
    js << (first ? "" : ", ") << "{\"dut\": \"" << r.dut << "\", \"payload\": " << r.payload
       << ", \"fanin\": " << r.fanin << ", \"switch_ns\": " << num(sw)
       << ", \"macswap_ns\": " << num(mac) << ", \"core_ns\": " << num(core)
       << ", \"ratio\": " << num(ratio) << ", \"min_cpu_share\": " << num(share)
       << ", \"valid\": " << (valid ? "true" : "false") << "}";
    first = false;
  }
  js << "], \"ok\": " << (ok ? "true" : "false") << "}\n";
  if (o.json) {
    std::fputs(js.str().c_str(), stdout);
  } else {
    std::printf("\nmemif: every DUT's client %s\n",
                o.memif_zero_copy ? "zero-copy (zero-copy=yes; the generator copies)"
                                  : "copying (the default; --memif-zero-copy for zero-copy)");
    std::printf("\nline rate, Mpps (frame = 74 B headers + payload + 24 B preamble/FCS/IFG):");
    for (std::uint32_t p : o.payloads)
      std::printf("  %u B: %.2f (100G) %.2f (400G)", p, line_mpps(100, p), line_mpps(400, p));
    std::printf("\n%s\n", ok ? "all checks passed" : "CHECKS FAILED");
  }
  return ok ? 0 : 1;
}
