// treeduce-dissector-gen TEMPLATE OUTPUT: writes the Wireshark dissector, the template with its
// "--@TABLES@" line replaced by the protocol's code tables as Lua. The tables come from the C++
// definitions (dtype.h, reasons.h, wire.h), so the dissector never drifts from the protocol.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "treeduce/aggregation/dtype.h"
#include "treeduce/protocol/reasons.h"
#include "treeduce/protocol/wire.h"

namespace {

std::string lua_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string tables() {
  using namespace treeduce;
  std::ostringstream o;
  o << "-- Generated from the C++ definitions by treeduce-dissector-gen: do not edit here.\n";
  o << "local DEFAULT_PORT = " << proto::kDefaultUdpPort << "\n";
  o << "local VERSION = " << int{proto::kProtocolVersion} << "\n";
  o << "local HEADER_BYTES = " << sizeof(proto::TdHdr) << "\n";
  o << "local DTYPES = {\n";
  for (DType d : kAllDTypes) o << "  [" << int(d) << "] = " << lua_string(name(d)) << ",\n";
  o << "}\nlocal DTYPE_SIZES = {\n";
  for (DType d : kAllDTypes) o << "  [" << int(d) << "] = " << dtype_size(d) << ",\n";
  o << "}\nlocal OPS = {\n";
  for (ReduceOp op : kAllReduceOps)
    o << "  [" << int(op) << "] = " << lua_string(name(op)) << ",\n";
  o << "}\nlocal REASONS = {\n";
  for (std::size_t r = 0; r < proto::kNumReasons; ++r)
    o << "  [" << r << "] = " << lua_string(proto::name(static_cast<proto::Reason>(r))) << ",\n";
  o << "}\nlocal REASON_TEXT = {\n";
  for (std::size_t r = 0; r < proto::kNumReasons; ++r) {
    o << "  [" << r << "] = " << lua_string(proto::description(static_cast<proto::Reason>(r)))
      << ",\n";
  }
  o << "}\n";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: treeduce-dissector-gen TEMPLATE OUTPUT\n";
    return 2;
  }
  std::ifstream in(argv[1]);
  if (!in) {
    std::cerr << "treeduce-dissector-gen: cannot read " << argv[1] << "\n";
    return 1;
  }
  std::ostringstream out;
  bool replaced = false;
  for (std::string line; std::getline(in, line);) {
    if (line == "--@TABLES@") {
      out << tables();
      replaced = true;
    } else {
      out << line << "\n";
    }
  }
  if (!replaced) {
    std::cerr << "treeduce-dissector-gen: " << argv[1] << " has no --@TABLES@ line\n";
    return 1;
  }
  std::ofstream f(argv[2]);
  f << out.str();
  f.close();
  if (!f) {
    std::cerr << "treeduce-dissector-gen: cannot write " << argv[2] << "\n";
    return 1;
  }
  return 0;
}
