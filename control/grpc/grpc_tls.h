/// @file
/// Transport security of every gRPC edge (docs/deploy.md, "TLS"): mutual TLS with one CA, or an
/// explicit insecure mode for labs and tests. Shared by the manager, the switch agent, the
/// `treeduce` CLI, the lab and libtreeduce's manager client.
///
/// Identities are certificate common names (CN): the manager's and each switch's certificates
/// name the daemon (a switch's CN is its topology name), an admin's carries the manager's admin CN
/// (kDefaultAdminName unless configured), a job's host certificate any other name.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace treeduce::tls {

/// CN of the manager's certificate that switch agents accept calls from by default.
inline constexpr const char* kDefaultManagerName = "treeduce-manager";
/// CN of the admin identity by default.
inline constexpr const char* kDefaultAdminName = "treeduce-admin";

/// Trailing metadata of JobService.Join answers that holds the job's credential (manager.proto).
inline constexpr const char* kCredentialMetadata = "treeduce-job-credential";

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

/// "" when `o` says what to do: all three paths, or insecure alone. Otherwise one sentence for
/// `who` (the program) naming `how` (its flags or variables, e.g. "--tls-ca, --tls-cert and
/// --tls-key" and "--insecure").
std::string check(const TlsOptions& o, const std::string& how_files,
                  const std::string& how_insecure);

/// Server credentials: mutual TLS requiring and verifying a client certificate against the CA,
/// or insecure. nullptr and a sentence in `*error` when a file cannot be read. The files are
/// watched (TlsOptions::reload_seconds): new handshakes use what they hold then.
std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsOptions& o,
                                                            std::string* error);
/// Channel credentials presenting this end's certificate and verifying the server's against the
/// CA (and its name against the address used, as usual for TLS). nullptr and a sentence in
/// `*error` when a file cannot be read. Watched like the server's.
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsOptions& o,
                                                              std::string* error);

/// A channel to `target` with `creds` (from channel_credentials(o)) and `args`, checking the
/// server's certificate against o.server_name when that is set (with TLS).
std::shared_ptr<grpc::Channel> channel(const std::string& target,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const TlsOptions& o,
                                       grpc::ChannelArguments args = grpc::ChannelArguments());

/// The CN of the verified client certificate of the call; "" without TLS.
std::string peer_name(const grpc::ServerContext& ctx);
/// True when the call came over TLS (the server runs with certificates).
bool peer_authenticated(const grpc::ServerContext& ctx);

/// TREEDUCE_TLS_CA, TREEDUCE_TLS_CERT, TREEDUCE_TLS_KEY, TREEDUCE_TLS_SERVER_NAME (the
/// manager's certificate name when it is not the address dialled) and TREEDUCE_INSECURE
/// (libtreeduce, the CLI and the lab's tools read these). TREEDUCE_INSECURE is 1, or 0 / empty /
/// unset; any other value leaves `insecure` false and puts a sentence in `*error` (when given).
TlsOptions from_environment(std::string* error = nullptr);

}  // namespace treeduce::tls
