// Reading and writing pcap files of Ethernet frames in tests (libpcap), shared by the switch's
// golden tests and the Wireshark dissector's test.
#pragma once

#include <gtest/gtest.h>
#include <pcap/pcap.h>

#include <cstdint>
#include <string>
#include <vector>

namespace treeduce::testing {

using PcapFrame = std::vector<std::uint8_t>;

/// Writes `frames` to `path`, one microsecond apart (readable in tcpdump); a failure is a test
/// failure.
inline void write_pcap(const std::string& path, const std::vector<PcapFrame>& frames) {
  pcap_t* dead = pcap_open_dead(DLT_EN10MB, 65535);
  ASSERT_NE(dead, nullptr);
  pcap_dumper_t* d = pcap_dump_open(dead, path.c_str());
  ASSERT_NE(d, nullptr) << path << ": " << pcap_geterr(dead);
  for (std::size_t i = 0; i < frames.size(); ++i) {
    pcap_pkthdr h{};
    h.ts.tv_sec = 0;
    h.ts.tv_usec = static_cast<suseconds_t>(i);
    h.caplen = h.len = static_cast<bpf_u_int32>(frames[i].size());
    pcap_dump(reinterpret_cast<u_char*>(d), &h, frames[i].data());
  }
  pcap_dump_close(d);
  pcap_close(dead);
}

/// The frames of a pcap file, appended to `*out`; false (and `*error`) when it cannot be read or
/// a frame was truncated by the capture.
inline bool read_pcap(const std::string& path, std::vector<PcapFrame>* out, std::string* error) {
  char err[PCAP_ERRBUF_SIZE] = {};
  pcap_t* p = pcap_open_offline(path.c_str(), err);
  if (p == nullptr) {
    *error = path + ": " + err;
    return false;
  }
  pcap_pkthdr* h = nullptr;
  const u_char* data = nullptr;
  int rc;
  while ((rc = pcap_next_ex(p, &h, &data)) == 1) {
    if (h->caplen != h->len) {
      *error = path + ": frame " + std::to_string(out->size()) + " truncated by the capture";
      pcap_close(p);
      return false;
    }
    out->emplace_back(data, data + h->caplen);
  }
  if (rc != PCAP_ERROR_BREAK) {
    *error = path + ": " + pcap_geterr(p);
    pcap_close(p);
    return false;
  }
  pcap_close(p);
  return true;
}

}  // namespace treeduce::testing
