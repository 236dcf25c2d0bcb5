/// @file
/// Transport security of every gRPC edge (docs/deploy.md, "TLS"): mutual TLS with one CA, or an
/// explicit insecure mode for labs and tests. Shared by the manager, the switch agent, the
/// `treeduce` CLI, the lab and libtreeduce's manager client.
///
/// Identities are certificate common names (CN): the manager's and each switch's certificates
/// name the daemon (a switch's CN is its topology name), an admin's carries the manager's admin CN
/// (kDefaultAdminName unless configured), a job's host certificate any other name.
///
/// TlsOptions and from_environment() (TREEDUCE_TLS_*) are in treeduce/common/tls_options.h.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "treeduce/common/tls_options.h"

namespace treeduce::tls {

/// CN of the manager's certificate that switch agents accept calls from by default.
inline constexpr const char* kDefaultManagerName = "treeduce-manager";
/// CN of the admin identity by default.
inline constexpr const char* kDefaultAdminName = "treeduce-admin";

/// Trailing metadata of JobService.Join answers that holds the job's credential (manager.proto).
inline constexpr const char* kCredentialMetadata = "treeduce-job-credential";

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

}  // namespace treeduce::tls
