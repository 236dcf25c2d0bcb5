// Captures of a port's frames to a pcap file (`treeduce lab capture`): an lcore clones each frame
// it receives on or sends to a capturing port (an indirect mbuf sharing the frame's buffer: no
// copy on the lcore) into an MP/SC ring; this thread writes them with libpcap. Only with
// `faults: true`: a capture reads the jobs' traffic. docs/switch.md, "Captures".
#include <rte_cycles.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_ring_elem.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "datapath_impl.h"

namespace treeduce::switchd {

namespace {
constexpr unsigned kCaptureRing = 8192;  ///< frames in flight to the file
constexpr unsigned kCaptureMbufs = 8191;
constexpr std::uint32_t kSnapLen = 65535;  ///< the files' snap length, and the longest record
}  // namespace

Status Switch::Impl::create_capture() {
  if (!cfg.faults) return Status::Ok();
  const int socket = static_cast<int>(rte_socket_id());
  cap_pool = rte_pktmbuf_pool_create("td_cap", kCaptureMbufs, 256, 0, 0, socket);
  cap_ring =
      rte_ring_create_elem("td_cap", sizeof(CaptureRec), kCaptureRing, socket, RING_F_SC_DEQ);
  if (cap_pool == nullptr || cap_ring == nullptr)
    return resource_exhausted("cannot create the capture pool and ring.");
  return Status::Ok();
}

/// On an lcore: never blocks; a frame that finds no mbuf or a full ring is counted, not captured.
void Switch::Impl::capture(Worker& w, rte_mbuf* m) {
  rte_mbuf* c = rte_pktmbuf_clone(m, cap_pool);
  if (c == nullptr) return w.count(SwitchdCounter::capture_dropped);
  const CaptureRec r{c, rte_rdtsc()};
  if (rte_ring_mp_enqueue_elem(cap_ring, const_cast<CaptureRec*>(&r), sizeof r) != 0) {
    rte_pktmbuf_free(c);
    w.count(SwitchdCounter::capture_dropped);
  }
}

std::size_t Switch::Impl::write_captures() {
  CaptureRec recs[64];
  std::size_t written = 0;
  // At most a ring's worth per call: the caller holds cap_mu, which stop_capture and the
  // counters' snapshot (port_stats, under `mu`) also take.
  for (unsigned pass = 0; pass < kCaptureRing / 64; ++pass) {
    const unsigned n =
        rte_ring_sc_dequeue_burst_elem(cap_ring, recs, sizeof(CaptureRec), 64, nullptr);
    for (unsigned i = 0; i < n; ++i) {
      rte_mbuf* m = recs[i].m;
      CaptureFile* f = captures[port_index[m->port]].get();
      if (f != nullptr && recs[i].tsc >= f->tsc0) {
        pcap_pkthdr h{};
        const std::uint64_t ns =
            (recs[i].tsc - f->tsc0) * 1'000'000'000.0 / static_cast<double>(tsc_hz);
        const std::uint64_t t = static_cast<std::uint64_t>(f->t0.tv_nsec) + ns;
        h.ts.tv_sec = f->t0.tv_sec + static_cast<time_t>(t / 1'000'000'000);
        h.ts.tv_usec = static_cast<suseconds_t>(t % 1'000'000'000 / 1000);
        // The file's snap length: a longer frame (a port with MTU 65535) is cut, its length kept.
        h.len = m->pkt_len;
        h.caplen = std::min<std::uint32_t>(m->pkt_len, kSnapLen);
        const void* data = rte_pktmbuf_read(m, 0, h.caplen, f->buf.data());
        pcap_dump(reinterpret_cast<u_char*>(f->dumper), &h, static_cast<const u_char*>(data));
        ++f->frames;
        ++written;
      }
      rte_pktmbuf_free(m);
    }
    if (n < 64) return written;
  }
  return written;
}

void Switch::Impl::capture_loop() {
  if (cap_ring == nullptr) return;
  std::unique_lock l(cap_mu);
  while (!g_stop.load(std::memory_order_relaxed)) {
    if (cap_active == 0) {
      // No capture: asleep until one starts. g_stop is set from a signal handler, which cannot
      // notify; the bounded wait only makes the thread see it (the switch's own exit waits
      // longer than this).
      cap_cv.wait_for(l, std::chrono::milliseconds(100));
      continue;
    }
    if (write_captures() == 0) {
      l.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      l.lock();
    }
  }
}

Status Switch::start_capture(const std::string& port, const std::string& path) {
  Impl& s = *impl_;
  if (s.cap_ring == nullptr)
    return failed_precondition("Switch " + s.cfg.name +
                               " takes no captures; start it with faults: true (labs and tests "
                               "only).");
  std::size_t pi = 0;
  if (Status st = s.port_named(port, &pi); !st.ok()) return st;
  if (path.empty() || path.front() != '/')
    return invalid_argument("The capture file '" + path + "' is not an absolute path.");
  std::lock_guard l(s.cap_mu);
  if (s.captures[pi] != nullptr)
    return failed_precondition("Port " + port + " of " + s.cfg.name + " is already captured to " +
                               s.captures[pi]->path + ".");
  auto f = std::make_unique<CaptureFile>();
  f->path = path;
  f->dead = pcap_open_dead(DLT_EN10MB, kSnapLen);
  if (f->dead != nullptr) f->dumper = pcap_dump_open(f->dead, path.c_str());
  if (f->dumper == nullptr)
    return invalid_argument(
        "Switch " + s.cfg.name + " cannot write '" + path +
        "': " + (f->dead != nullptr ? pcap_geterr(f->dead) : std::strerror(ENOMEM)) + ".");
  f->buf.resize(kSnapLen);
  clock_gettime(CLOCK_REALTIME, &f->t0);
  f->tsc0 = rte_rdtsc();
  s.captures[pi] = std::move(f);
  ++s.cap_active;
  s.faults[pi].capture.store(true, std::memory_order_relaxed);
  s.cap_cv.notify_one();
  log("port %s: capturing to %s", port.c_str(), path.c_str());
  return Status::Ok();
}

Status Switch::stop_capture(const std::string& port, std::uint64_t* frames) {
  Impl& s = *impl_;
  std::size_t pi = 0;
  if (Status st = s.port_named(port, &pi); !st.ok()) return st;
  std::unique_lock l(s.cap_mu);
  if (s.captures[pi] == nullptr)
    return failed_precondition("Port " + port + " of " + s.cfg.name + " is not captured.");
  s.faults[pi].capture.store(false, std::memory_order_relaxed);
  l.unlock();
  // Every lcore passes a quiescent state after its last clone for this port: then every frame it
  // saw before the flag went down is in the ring.
  s.synchronize();
  l.lock();
  // Another stop of the same port may have finished while the lock was free.
  if (s.captures[pi] == nullptr)
    return failed_precondition("Port " + port + " of " + s.cfg.name + " is not captured.");
  s.write_captures();  // a ring's worth: all that was in it when the flag went down
  std::unique_ptr<CaptureFile> f = std::move(s.captures[pi]);
  --s.cap_active;
  *frames = f->frames;
  log("port %s: capture to %s stopped, %llu frame(s)", port.c_str(), f->path.c_str(),
      static_cast<unsigned long long>(f->frames));
  return Status::Ok();  // f closes the file
}

}  // namespace treeduce::switchd
