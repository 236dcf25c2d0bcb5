#include "grpc_tls.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace treeduce::tls {
namespace {

bool read_file(const std::string& path, const char* what, std::string* out, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  if (in) ss << in.rdbuf();
  if (!in || ss.str().empty()) {
    if (error) *error = "cannot read the TLS " + std::string(what) + " file " + path + ".";
    return false;
  }
  *out = ss.str();
  return true;
}

struct Pems {
  std::string ca, cert, key;
};

bool load(const TlsOptions& o, Pems* p, std::string* error) {
  return read_file(o.ca, "CA certificate", &p->ca, error) &&
         read_file(o.cert, "certificate", &p->cert, error) &&
         read_file(o.key, "private key", &p->key, error);
}

// gRPC's file watcher reads the three files now and every reload_seconds after: a renewed
// certificate takes effect without a restart. (It keeps what it had when a read fails or the
// key does not match the certificate, e.g. while the files are being replaced.) The files were
// read once before (load), so that a missing one is our sentence at start, not a failing
// handshake later.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> watcher(const TlsOptions& o) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      o.key, o.cert, o.ca, std::max(1u, o.reload_seconds));
}

}  // namespace

std::string check(const TlsOptions& o, const std::string& how_files,
                  const std::string& how_insecure) {
  const bool any = !o.ca.empty() || !o.cert.empty() || !o.key.empty();
  if (o.insecure && any) return "both certificates and " + how_insecure + " are given; choose one.";
  if (o.insecure || o.secure()) return "";
  if (any) return "give all of " + how_files + " (a CA, a certificate and its key).";
  return "no TLS certificates: give " + how_files + " (docs/deploy.md, \"TLS\"), or " +
         how_insecure + " to run without authentication in a lab or test.";
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TlsOptions& o,
                                                            std::string* error) {
  if (!o.secure()) return grpc::InsecureServerCredentials();
  Pems p;
  if (!load(o, &p, error)) return nullptr;
  grpc::experimental::TlsServerCredentialsOptions opt(watcher(o));
  opt.watch_root_certs();
  opt.watch_identity_key_cert_pairs();
  opt.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(opt);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TlsOptions& o,
                                                              std::string* error) {
  if (!o.secure()) return grpc::InsecureChannelCredentials();
  Pems p;
  if (!load(o, &p, error)) return nullptr;
  grpc::experimental::TlsChannelCredentialsOptions opt;
  opt.set_certificate_provider(watcher(o));
  opt.watch_root_certs();
  opt.watch_identity_key_cert_pairs();
  opt.set_verify_server_certs(true);  // against the CA, and its name against the address dialled
  return grpc::experimental::TlsCredentials(opt);
}

std::shared_ptr<grpc::Channel> channel(const std::string& target,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                       const TlsOptions& o, grpc::ChannelArguments args) {
  if (o.secure() && !o.server_name.empty()) args.SetSslTargetNameOverride(o.server_name);
  return grpc::CreateCustomChannel(target, creds, args);
}

std::string peer_name(const grpc::ServerContext& ctx) {
  const auto auth = ctx.auth_context();
  if (!auth) return "";
  const auto v = auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
  return v.empty() ? std::string() : std::string(v.front().data(), v.front().size());
}

bool peer_authenticated(const grpc::ServerContext& ctx) {
  const auto auth = ctx.auth_context();
  return auth && auth->IsPeerAuthenticated();
}

}  // namespace treeduce::tls
