// The Wireshark dissector (lab/wireshark/treeduce.lua) read by tshark, against the C++ side:
// frames of every element type, operation, opcode and reason are built with the protocol
// library, captured to a pcap file, decoded by tshark with the dissector, and every decoded
// header field and element value is compared with what was built. The golden captures of the
// switch's pcap tests are decoded too and compared with parse_frame().
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "../support/pcap_file.h"
#include "treeduce/aggregation/convert.h"
#include "treeduce/aggregation/dtype.h"
#include "treeduce/protocol/reasons.h"
#include "treeduce/protocol/wire.h"

namespace treeduce::proto {
namespace {

using Frame = treeduce::testing::PcapFrame;

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << cmd << " failed";
  return out;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  std::istringstream in(s);
  while (std::getline(in, cur, sep)) out.push_back(cur);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

using treeduce::testing::write_pcap;

std::vector<Frame> read_pcap(const std::string& path) {
  std::vector<Frame> out;
  std::string error;
  EXPECT_TRUE(treeduce::testing::read_pcap(path, &out, &error)) << error;
  return out;
}

constexpr const char* kFields[] = {
    "treeduce.version",    "treeduce.opcode",      "treeduce.dtype",       "treeduce.op",
    "treeduce.tree_id",    "treeduce.child",       "treeduce.slot",        "treeduce.slot_ver",
    "treeduce.reason",     "treeduce.count",       "treeduce.ncontrib",    "treeduce.chunk",
    "treeduce.seq",        "treeduce.key",         "treeduce.value.float", "treeduce.value.int",
    "treeduce.value.uint", "treeduce.value.index", "treeduce.nack_mac"};
constexpr std::size_t kNumFields = std::size(kFields);

// One line of fields per frame, fields separated by tabs, repeated values by commas.
std::vector<std::vector<std::string>> tshark(const std::string& pcap) {
  std::string cmd = "tshark -n -r " + pcap + " -X lua_script:" + TREEDUCE_DISSECTOR +
                    " -o treeduce.elements:64 -T fields -E separator=/t -E occurrence=a"
                    " -E aggregator=,";
  for (const char* f : kFields) cmd += std::string(" -e ") + f;
  cmd += " 2>/dev/null";
  std::vector<std::vector<std::string>> rows;
  for (const std::string& line : split(run(cmd), '\n')) {
    if (line.empty()) continue;
    rows.push_back(split(line, '\t'));
    EXPECT_EQ(rows.back().size(), kNumFields) << line;
    rows.back().resize(kNumFields);
  }
  return rows;
}

std::string hex_key(std::uint64_t k) {
  char s[32];
  std::snprintf(s, sizeof s, "0x%016llx", static_cast<unsigned long long>(k));
  return s;
}

// The header fields as tshark prints them, from the frame's own bytes: a NACK's bytes 24-31 are
// its MAC (treeduce.nack_mac, the last column), no key.
std::vector<std::string> header_fields(const TdHdr& h) {
  const bool nack = h.opcode == static_cast<std::uint8_t>(Opcode::nack);
  return {std::to_string(h.version),        std::to_string(h.opcode),
          std::to_string(h.dtype),          std::to_string(h.op),
          std::to_string(h.tree_id.get()),  std::to_string(h.child.get()),
          std::to_string(h.slot.get()),     std::to_string(h.slot_ver),
          std::to_string(h.reason),         std::to_string(h.count.get()),
          std::to_string(h.ncontrib.get()), std::to_string(h.chunk.get()),
          std::to_string(h.seq.get()),      nack ? "" : hex_key(h.key.get())};
}

const Endpoint kHost{{0x02, 0, 0, 0, 0, 1}, 0x0A010001, 50000};
const Endpoint kSwitch{{0x02, 0, 0, 0, 0, 2}, 0x0A000001, kDefaultUdpPort};

Frame frame(const Endpoint& src, const Endpoint& dst, const TdHdr& h, const Frame& payload) {
  Frame f(kFrameHeaderBytes + payload.size());
  f.resize(build_frame(f.data(), src, dst, h, payload.data(), payload.size()));
  return f;
}

TdHdr header(Opcode opc, DType d, ReduceOp op, std::uint16_t count) {
  TdHdr h{};
  h.version = kProtocolVersion;
  h.opcode = static_cast<std::uint8_t>(opc);
  h.dtype = static_cast<std::uint8_t>(d);
  h.op = static_cast<std::uint8_t>(op);
  h.tree_id.set(7);
  h.child.set(3);
  h.slot.set(5);
  h.slot_ver = 1;
  h.count.set(count);
  h.ncontrib.set(2);
  h.chunk.set(0x80000005u);
  h.seq.set(41);
  h.key.set(0x1122334455667788ull);
  return h;
}

// Elements of every type with their expected decoded values: float value, integer value, or
// (value, index) for pairs. Special values (NaN, infinities, -0, subnormals, extremes) included.
struct Expected {
  std::vector<double> floats;
  std::vector<std::string> ints;  // as tshark prints int64/uint64
  std::vector<std::int32_t> indices;
};

template <class T>
void put(Frame& p, T v) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(&v);
  p.insert(p.end(), b, b + sizeof v);
}

Frame payload_of(DType d, Expected* e) {
  Frame p;
  const std::array<float, 8> f = {0.0f, -0.0f, 1.5f, -2.25f, INFINITY, -INFINITY, NAN, 1e-40f};
  switch (d) {
    case DType::f32:
      for (float x : f) {
        put(p, x);
        e->floats.push_back(x);
      }
      break;
    case DType::f64:
      for (double x : {0.0, -0.0, 0.1, -1e300, 4.9e-324, double{INFINITY}, double{NAN}, 1.0 / 3}) {
        put(p, x);
        e->floats.push_back(x);
      }
      break;
    case DType::f16:
    case DType::bf16:
      for (std::uint16_t b : {0x0000, 0x8000, 0x3C00, 0x0001, 0x7C00, 0x7E01, 0xFBFF, 0x4248}) {
        put(p, b);
        e->floats.push_back(d == DType::f16 ? agg::f16_to_f32(b) : agg::bf16_to_f32(b));
      }
      break;
    case DType::e4m3:
    case DType::e5m2:
      for (std::uint8_t b : {0x00, 0x80, 0x01, 0x38, 0x7E, 0x7F, 0xFF, 0x7C}) {
        put(p, b);
        e->floats.push_back(d == DType::e4m3 ? agg::e4m3_to_f32(b) : agg::e5m2_to_f32(b));
      }
      break;
    case DType::i8:
      for (std::int8_t v : {0, -1, 127, -128, 5}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::u8:
      for (std::uint8_t v : {0, 255, 128, 7}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::i16:
      for (std::int16_t v : {0, -1, 32767, -32768}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::u16:
      for (std::uint16_t v : {0, 65535, 32768}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::i32:
      for (std::int32_t v : {0, -1, std::numeric_limits<std::int32_t>::max(),
                             std::numeric_limits<std::int32_t>::min()}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::u32:
      for (std::uint32_t v : {0u, 0xFFFFFFFFu, 0x80000000u}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::i64:
      for (std::int64_t v :
           {std::int64_t{0}, std::int64_t{-1}, std::numeric_limits<std::int64_t>::max(),
            std::numeric_limits<std::int64_t>::min()}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::u64:
      for (std::uint64_t v : {std::uint64_t{0}, ~std::uint64_t{0}, std::uint64_t{1} << 63}) {
        put(p, v);
        e->ints.push_back(std::to_string(v));
      }
      break;
    case DType::f32_i32:
      for (auto [v, i] : {std::pair{1.5f, 7}, std::pair{-0.0f, -1}, std::pair{NAN, 2147483647}}) {
        put(p, v);
        put(p, std::int32_t{i});
        e->floats.push_back(v);
        e->indices.push_back(i);
      }
      break;
    case DType::f64_i32:
      for (auto [v, i] : {std::pair{2.5, 9}, std::pair{-double{INFINITY}, -2147483647 - 1}}) {
        put(p, v);
        put(p, std::int32_t{i});
        put(p, std::uint32_t{0xDEADBEEF});  // padding: not decoded
        e->floats.push_back(v);
        e->indices.push_back(i);
      }
      break;
    case DType::i32_i32:
      for (auto [v, i] : {std::pair{-5, 3}, std::pair{2147483647, 0}}) {
        put(p, std::int32_t{v});
        put(p, std::int32_t{i});
        e->ints.push_back(std::to_string(v));
        e->indices.push_back(i);
      }
      break;
  }
  return p;
}

// tshark prints a double with 15 significant digits (and NaN as "nan"): equal to that precision,
// with the sign of zero and infinities exact.
::testing::AssertionResult same_value(double want, const std::string& got) {
  if (std::isnan(want)) {
    if (got.find("nan") != std::string::npos || got.find("NaN") != std::string::npos)
      return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "want NaN, got " << got;
  }
  double g = 0;
  try {
    g = std::stod(got);
  } catch (const std::out_of_range&) {  // subnormals: stod reports ERANGE but parses them
    g = std::strtod(got.c_str(), nullptr);
  } catch (const std::exception&) {
    return ::testing::AssertionFailure() << "want " << want << ", got \"" << got << "\"";
  }
  const bool close = g == want || std::fabs(g - want) <= 5e-15 * std::fabs(want);
  if (close && std::signbit(g) == std::signbit(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "want " << want << ", got " << got;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("treeduce-dissector-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

TEST(Dissector, DecodesEveryTypeOpcodeAndReason) {
  std::vector<Frame> frames;
  std::vector<Expected> want;
  std::vector<TdHdr> headers;
  // A CONTRIB to the switch's port (port table) and a RESULT to a host's port (heuristic) of
  // every element type, with every operation in turn.
  for (DType d : kAllDTypes) {
    for (Opcode opc : {Opcode::contrib, Opcode::result}) {
      Expected e;
      const Frame p = payload_of(d, &e);
      const auto op = kAllReduceOps[(static_cast<std::size_t>(d) * 2 + (opc == Opcode::result)) %
                                    kNumReduceOps];
      const TdHdr h = header(opc, d, op, static_cast<std::uint16_t>(p.size() / dtype_size(d)));
      frames.push_back(opc == Opcode::contrib ? frame(kHost, kSwitch, h, p)
                                              : frame(kSwitch, kHost, h, p));
      headers.push_back(h);
      want.push_back(e);
    }
  }
  // A NACK of every reason, to a host's port.
  for (std::size_t r = 0; r < kNumReasons; ++r) {
    TdHdr h = header(Opcode::nack, DType::f32, ReduceOp::sum, 0);
    h.reason = static_cast<std::uint8_t>(r);
    h.ncontrib.set(0);
    h.key = nack_mac(be64::of(0x0123456789ABCDEFull), h);
    frames.push_back(frame(kSwitch, kHost, h, {}));
    headers.push_back(h);
    want.emplace_back();
  }
  const std::string pcap = temp_path("all.pcap");
  write_pcap(pcap, frames);
  const auto rows = tshark(pcap);
  std::filesystem::remove(pcap);
  ASSERT_EQ(rows.size(), frames.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(::testing::Message()
                 << "frame " << i + 1 << " dtype " << name(static_cast<DType>(headers[i].dtype)));
    const auto fields = header_fields(headers[i]);
    for (std::size_t k = 0; k < fields.size(); ++k) EXPECT_EQ(rows[i][k], fields[k]) << kFields[k];
    const bool nack = headers[i].opcode == static_cast<std::uint8_t>(Opcode::nack);
    EXPECT_EQ(rows[i][18], nack ? hex_key(headers[i].key.get()) : "") << "treeduce.nack_mac";
    const auto floats = split(rows[i][14], ',');
    const auto ints = split(rows[i][15].empty() ? rows[i][16] : rows[i][15], ',');
    const auto idx = split(rows[i][17], ',');
    ASSERT_EQ(floats.size(), want[i].floats.size());
    for (std::size_t k = 0; k < floats.size(); ++k)
      EXPECT_TRUE(same_value(want[i].floats[k], floats[k])) << "element " << k;
    ASSERT_EQ(ints.size(), want[i].ints.size());
    for (std::size_t k = 0; k < ints.size(); ++k) EXPECT_EQ(ints[k], want[i].ints[k]);
    ASSERT_EQ(idx.size(), want[i].indices.size());
    for (std::size_t k = 0; k < idx.size(); ++k)
      EXPECT_EQ(idx[k], std::to_string(want[i].indices[k]));
  }
}

TEST(Dissector, GoldenCapturesMatchTheParser) {
  const std::string dir = std::string(TREEDUCE_SOURCE_ROOT) + "/tests/switchd/golden";
  std::size_t checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".pcap") continue;
    // The malformed input holds frames that are not treeduce at all; its output is checked.
    if (entry.path().filename() == "malformed-in.pcap") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const auto frames = read_pcap(entry.path().string());
    const auto rows = tshark(entry.path().string());
    ASSERT_EQ(rows.size(), frames.size());
    for (std::size_t i = 0; i < frames.size(); ++i) {
      TdHdr h;
      const Frame& fr = frames[i];
      const bool udp =
          fr.size() >= kFrameHeaderBytes && fr[12] == 0x08 && fr[13] == 0x00 && fr[23] == 17;
      if (!udp) {  // ARP, ICMP: not treeduce
        EXPECT_EQ(rows[i][0], "") << "frame " << i + 1;
        continue;
      }
      std::memcpy(&h, fr.data() + kFrameHeaderBytes - sizeof(TdHdr), sizeof h);
      const auto fields = header_fields(h);
      for (std::size_t k = 0; k < fields.size(); ++k)
        EXPECT_EQ(rows[i][k], fields[k]) << "frame " << i + 1 << " " << kFields[k];
      ++checked;
    }
  }
  EXPECT_GT(checked, 100u);
}

}  // namespace
}  // namespace treeduce::proto
