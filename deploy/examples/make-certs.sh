#!/bin/sh
# Makes the certificates of a treeduce deployment with openssl (docs/deploy.md, "TLS"):
#   make-certs.sh DIR ca                      a CA: DIR/ca.pem and DIR/ca.key (keep ca.key offline)
#   make-certs.sh DIR NAME [SAN]...           DIR/NAME.pem and DIR/NAME.key, signed by DIR's CA,
#                                             with CN=NAME and the subject alternative names SAN
#                                             (IP:10.0.0.100, DNS:manager.example) that clients
#                                             dial the daemon at
# NAME is the identity: treeduce-manager for the manager, the switch's topology name for a
# switch, treeduce-admin (or the manager's --admin-name) for an operator, any other name for a
# job's hosts. P-256 keys; certificates valid for DAYS (default 825) days.
set -eu
if [ $# -lt 2 ]; then
  echo "usage: $0 DIR ca | $0 DIR NAME [IP:A.B.C.D|DNS:NAME]..." >&2
  exit 2
fi
dir=$1
name=$2
shift 2
days=${DAYS:-825}
mkdir -p "$dir"
umask 077
if [ "$name" = ca ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" -days "$days" -subj "/CN=treeduce CA" 2>/dev/null
  echo "$dir/ca.pem"
  exit 0
fi
if [ ! -f "$dir/ca.pem" ] || [ ! -f "$dir/ca.key" ]; then
  echo "$0: no CA in $dir: run '$0 $dir ca' first." >&2
  exit 1
fi
ext=$(mktemp)
trap 'rm -f "$ext" "$dir/$name.csr"' EXIT
{
  echo "basicConstraints=CA:FALSE"
  echo "extendedKeyUsage=serverAuth,clientAuth"
  if [ $# -gt 0 ]; then
    printf 'subjectAltName=%s' "$1"
    shift
    for san in "$@"; do printf ',%s' "$san"; done
    echo
  fi
} >"$ext"
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$dir/$name.key" -out "$dir/$name.csr" -subj "/CN=$name" 2>/dev/null
openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
  -CAserial "$dir/ca.srl" -CAcreateserial -days "$days" -out "$dir/$name.pem" \
  -extfile "$ext" 2>/dev/null
echo "$dir/$name.pem"
