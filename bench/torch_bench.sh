#!/usr/bin/env bash
# The treeduce backend's benchmark (docs/performance.md, "PyTorch backend") on a lab of one leaf
# and four hosts, brought up and taken down here: bench/torch_bench.py (DDP step time treeduce vs
# Gloo, 16 MiB allreduce through the backend vs libtreeduce directly), then treeduce-perf's own
# 16 MiB float32 allreduce on the same lab. Needs root and a build with the Python extension.
# Usage: sudo bench/torch_bench.sh [BUILD_DIR [MTU]]
#   MTU 1500 (default): 1024-byte payloads, 64 slots (libtreeduce's defaults);
#   MTU 8300: jumbo frames, 8192-byte payloads and 64 slots, as scripts/main.sh runs the fabric.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
mtu=${2:-1500}
cli=$build/control/cli/treeduce
name=torchbench$$
env=(env GLOO_SOCKET_IFNAME=mgmt0 PYTHONPATH="$build/python/site")
if [ "$mtu" -ge 8224 ]; then env+=(TREEDUCE_PAYLOAD_BYTES=8192 TREEDUCE_SLOTS=64); fi
trap '"$cli" lab down --name "$name" >/dev/null 2>&1 || true' EXIT
"$cli" lab up --leaf 4 --name "$name" --mtu "$mtu"
"$cli" lab run --name "$name" -- "${env[@]}" /usr/bin/python3 -W ignore "$src/bench/torch_bench.py"
"$cli" lab run --name "$name" -- "${env[@]}" "$build/host/treeduce-perf" \
  -b 16777216 -e 16777216 -d f32 -o sum -n 10 -w 1
