#!/usr/bin/env bash
# The main job. Until the emulated fabric exists (host library issue), it runs the aggregation
# kernel benchmark on this machine and prints its table. Extra arguments go to the benchmark
# (for example --benchmark_filter=L2).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
treeduce_install_deps

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build bench/treeduce-bench-kernels >/dev/null

exec ./build/bench/treeduce-bench-kernels --benchmark_counters_tabular=true "$@"
