#!/usr/bin/env bash
# Installs the Debian 12 packages treeduce needs that are missing; installs nothing when all are
# there. Sourced by scripts/main.sh and scripts/test.sh; also runnable on its own.
set -euo pipefail

TREEDUCE_PACKAGES=(
  # build
  meson ninja-build g++ pkg-config python3 git
  # tests, benchmarks, style
  libgtest-dev libgmock-dev libbenchmark-dev clang-format
  # fuzzing (libFuzzer comes with clang's runtime)
  clang libclang-rt-14-dev
  # the Aggregation Manager: gRPC and protobuf, topology YAML, SQLite state, oneTBB, CLI11, JSON
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev libsqlite3-dev libtbb-dev libcli11-dev nlohmann-json3-dev
  # the DPDK switch: DPDK (dpdk-dev has dpdk-testpmd, the benchmark baseline), the metrics
  # endpoint, pcap files for golden tests, network namespaces and veth pairs for fabrics
  libdpdk-dev dpdk-dev libcpp-httplib-dev libpcap-dev iproute2 iputils-ping
  # the MAC of a NACK (HMAC-SHA256, protocol/src/wire.cpp)
  nettle-dev
  # the control plane's certificates: `treeduce lab up` makes its CA and certificates with the
  # openssl command, as does deploy/examples/make-certs.sh
  openssl
  # the host library: host-side reduction when the network path is not available
  libgloo-dev
  # the host library's ibverbs transport (rdma-core)
  libibverbs-dev
  # the host library's af_xdp transport: AF_XDP sockets (libxdp) and its XDP program (libbpf;
  # compiled with clang, above)
  libxdp-dev libbpf-dev
  # allreduce baselines next to treeduce (Open MPI's MPI_Allreduce over TCP), their plot, and
  # ethtool for the benchmark fabric's veth offloads
  libopenmpi-dev openmpi-bin gnuplot-nox ethtool
  # the Python package treeduce and its torch.distributed backend (python/, docs/pytorch.md)
  python3-torch libtorch-dev pybind11-dev
  # libtreeduce-mpi's lab test runs an mpi4py script (docs/mpi.md)
  python3-mpi4py
  # the chaos soak (scripts/chaos.sh) reads the manager's and switches' JSON with jq
  jq
  # the Wireshark dissector's test (tshark reads captures with lab/wireshark/treeduce.lua)
  tshark
)

treeduce_install_deps() {
  if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "treeduce: not a Debian system; install the equivalents of: ${TREEDUCE_PACKAGES[*]}" >&2
    return 0
  fi
  local missing=() p
  for p in "${TREEDUCE_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "treeduce: missing packages (${missing[*]}) and not root; run as root or install them" >&2
      return 1
    fi
  fi
  echo "treeduce: installing ${missing[*]}" >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  treeduce_install_deps
fi
