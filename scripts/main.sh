#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs lab/tools/treeduce-fabric: a manager,
# three treeduce-switch processes in a 2-level tree and four host ranks in their own network
# namespaces run a verified allreduce sweep (treeduce-perf on libtreeduce), print the table as it
# goes, and are torn down on success, failure or Ctrl-C. Arguments go to treeduce-fabric:
#   scripts/main.sh [--loss 0.02] [--keep-logs] [-- treeduce-perf arguments]
# (The aggregation kernel benchmark: build/bench/treeduce-bench-kernels.)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
treeduce_install_deps

[ -f build/build.ninja ] || meson setup build >/dev/null
ninja -C build lab/tools/treeduce-fabric host/treeduce-perf dataplane/switchd/treeduce-switch \
  control/treeduce-manager >/dev/null

# Network namespaces and veth pairs need root.
if [ "$(id -u)" -ne 0 ]; then
  exec sudo ./build/lab/tools/treeduce-fabric "$@"
fi
exec ./build/lab/tools/treeduce-fabric "$@"
