#!/usr/bin/env bash
# The issue-18 benchmark (docs/mpi.md, "Benchmark"; figures in docs/performance.md): in one lab
# of 4 hosts on one leaf, the same MPI program (treeduce-mpi-bench, an osu-style MPI_Allreduce
# sweep) without and with libtreeduce-mpi, treeduce-perf for libtreeduce's own time at the same
# sizes, and the cost of a passed-through call (each rank on MPI_COMM_SELF, where MPI_Allreduce
# is a copy, without and with the interposer). Prints the tables and the ratios.
#
#   sudo scripts/mpi-bench.sh [BUILD_DIR]      (default build; takes /tmp/treeduce-netns.lock)
#
# ITERS (default 50) sets the timed iterations per size.
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
iters=${ITERS:-50}
cli=$build/control/cli/treeduce
bench=$build/mpi/treeduce-mpi-bench
lib=$build/mpi/libtreeduce-mpi.so
perf=$build/host/treeduce-perf
for f in "$cli" "$bench" "$lib" "$perf"; do
  [ -e "$f" ] || { echo "mpi-bench.sh: $f is missing: build it first (ninja -C $build)." >&2; exit 1; }
done
out=$(mktemp -d /tmp/treeduce-mpi-bench-XXXXXX)
name=mpibench$$
exec 9>/tmp/treeduce-netns.lock
flock 9
trap '"$cli" lab down --name "$name" >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
"$cli" lab up --name "$name" >/dev/null
run() { "$cli" lab run --name "$name" --mpi -- "$@" 2>&1; }
sweep=(-b 1K -e 4M -f 4 -i "$iters" -w 5)
run "$bench" "${sweep[@]}" | tee "$out/plain"
run env LD_PRELOAD="$lib" TREEDUCE_MPI_STATS=1 "$bench" "${sweep[@]}" | tee "$out/offload"
run "$perf" -b 1024 -e 4194304 -f 4 -d f32 -o sum -n "$iters" -w 5 --json-out "$out/perf.json" \
  >/dev/null
self=(-s -b 4 -e 4 -i 200000 -w 1000)
run "$bench" "${self[@]}" | tee "$out/self-plain"
run env LD_PRELOAD="$lib" TREEDUCE_MPI_STATS=1 "$bench" "${self[@]}" | tee "$out/self-offload"
python3 - "$out" <<'PY'
import json, re, sys
d = sys.argv[1]
def rows(f):
    r = {}
    for l in open(f"{d}/{f}"):
        m = re.match(r"\[h0\]\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)", l)
        if m:
            r[int(m[1])] = float(m[2])
    return r
plain, off = rows("plain"), rows("offload")
perf = {}
for l in open(f"{d}/perf.json"):
    o = json.loads(l)
    perf[o["size"]] = o["treeduce"]["time_us"]
print("\n# size(B)  plain Open MPI(us)  libtreeduce-mpi(us)  libtreeduce(us)  mpi/plain  mpi/libtreeduce")
for s in sorted(plain):
    p, o, t = plain[s], off.get(s), perf.get(s)
    print(f"  {s:<8} {p:>18.1f} {o:>20.1f} {t:>16.1f} {o / p:>10.2f} {o / t:>16.2f}")
sp, so = rows("self-plain"), rows("self-offload")
for s in sp:
    print(f"\n# passed through (MPI_COMM_SELF, {s} B): plain {sp[s] * 1000:.0f} ns, "
          f"interposed {so[s] * 1000:.0f} ns, +{(so[s] - sp[s]) * 1000:.0f} ns per call")
PY
