#!/usr/bin/env bash
# The treeduce backend's benchmark (docs/performance.md, "issue 17") on a lab of one leaf and four
# hosts, brought up and taken down here: bench/torch_bench.py (DDP step time treeduce vs Gloo,
# 16 MiB allreduce through the backend vs libtreeduce directly), then treeduce-perf's own 16 MiB
# float32 allreduce on the same lab. Needs root and a build with the Python extension.
# Usage: sudo bench/torch_bench.sh [BUILD_DIR]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
cli=$build/control/cli/treeduce
name=torchbench$$
trap '"$cli" lab down --name "$name" >/dev/null 2>&1 || true' EXIT
"$cli" lab up --leaf 4 --name "$name"
"$cli" lab run --name "$name" -- env GLOO_SOCKET_IFNAME=mgmt0 PYTHONPATH="$build/python/site" \
  /usr/bin/python3 -W ignore "$src/bench/torch_bench.py"
"$cli" lab run --name "$name" -- "$build/host/treeduce-perf" -b 16777216 -e 16777216 -d f32 -o sum -n 10 -w 1
