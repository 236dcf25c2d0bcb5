// libFuzzer target over treeduce-switch's configuration loader (docs/switch-config.md): any text
// is either a configuration that holds what the document promises (ports named, addresses and
// sizes in their ranges, static trees with a role and children) or one error sentence naming
// where; never a crash, a hang or an exception out of parse_config_yaml. Seeds: the documented
// and installed examples (tests/fuzz/corpus-switch-config/).
#include <cstddef>
#include <cstdint>
#include <string>

#include "config.h"

namespace {

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const treeduce::switchd::ConfigResult r = treeduce::switchd::parse_config_yaml(text, "f.yaml");
  if (!r.config) {
    check(!r.error.empty());
    check(r.error.rfind("f.yaml", 0) == 0);  // every error names the file
    return 0;
  }
  const auto& c = *r.config;
  check(!c.ports.empty());
  for (const auto& p : c.ports) {
    check(!p.name.empty());
    check(p.prefix <= 32);
    check(p.mtu == 0 || (p.mtu >= 68 && p.mtu <= 65535));
  }
  return 0;
}
