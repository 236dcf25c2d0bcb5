#include "treeduce/common/tls_options.h"

#include <cstdlib>

namespace treeduce::tls {

void read_environment(const EnvLookup& env, TlsOptions* o, std::string* error) {
  const auto set = [&env](const char* name, std::string* field) {
    const char* v = env(name);
    if (v != nullptr && *v != '\0') *field = v;
  };
  set("TREEDUCE_TLS_CA", &o->ca);
  set("TREEDUCE_TLS_CERT", &o->cert);
  set("TREEDUCE_TLS_KEY", &o->key);
  set("TREEDUCE_TLS_SERVER_NAME", &o->server_name);
  std::string insecure;
  set("TREEDUCE_INSECURE", &insecure);
  if (insecure == "0" || insecure == "1") {
    o->insecure = insecure == "1";
  } else if (!insecure.empty() && error != nullptr) {
    *error = "TREEDUCE_INSECURE is '" + insecure + "'; it must be 0 or 1.";
  }
}

TlsOptions from_environment(std::string* error) {
  TlsOptions o;
  read_environment([](const char* n) { return std::getenv(n); }, &o, error);
  return o;
}

}  // namespace treeduce::tls
