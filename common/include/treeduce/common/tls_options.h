/// @file
/// Where an end of a gRPC edge finds its TLS files (docs/deploy.md, "TLS"), and the
/// TREEDUCE_TLS_* variables that say it. Apart from control/grpc/grpc_tls.h, which makes gRPC
/// credentials from these options, so that libtreeduce's environment parser (which links no
/// gRPC) reads the variables with the same code as the `treeduce` CLI and tdr_comm_create().
#pragma once

#include <functional>
#include <string>

namespace treeduce::tls {

/// Where the PEM files are, or the explicit choice of no security.
struct TlsOptions {
  std::string ca;    ///< CA certificate(s) that peers' certificates must chain to
  std::string cert;  ///< this end's certificate (chain)
  std::string key;   ///< its private key
  bool insecure = false;
  /// Client side: the name the server's certificate must carry (a subject alternative name)
  /// when it differs from the host part of the address dialled, e.g. a manager dialled at
  /// 10.0.0.100:9300 whose certificate names manager.example. Empty: the address dialled.
  std::string server_name{};
  /// How often the files are read again (seconds): a renewed certificate, key or CA put in
  /// their place is used by every connection made after that (docs/deploy.md, "Renewing").
  unsigned reload_seconds = 60;
  /// The certificates are given (all three paths).
  bool secure() const { return !ca.empty() && !cert.empty() && !key.empty(); }
};

/// The value of a variable, or nullptr when it is not set (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

/// The variables `env` gives over `*o`: TREEDUCE_TLS_CA, TREEDUCE_TLS_CERT, TREEDUCE_TLS_KEY,
/// TREEDUCE_TLS_SERVER_NAME (the manager's certificate name when it is not the address dialled)
/// and TREEDUCE_INSECURE (1, or 0). A variable that is unset or empty leaves its field as it was.
/// TREEDUCE_INSECURE with any other value leaves `insecure` as it was and puts "TREEDUCE_INSECURE
/// is 'V'; it must be 0 or 1." in `*error` (when given); the other fields are read all the same.
void read_environment(const EnvLookup& env, TlsOptions* o, std::string* error);

/// read_environment() of the process's environment over default options (libtreeduce, the CLI
/// and the lab's tools read these): TREEDUCE_INSECURE unset, empty, 0 or malformed is not
/// insecure.
TlsOptions from_environment(std::string* error = nullptr);

}  // namespace treeduce::tls
