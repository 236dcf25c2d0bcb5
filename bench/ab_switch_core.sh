#!/usr/bin/env bash
# Two builds of treeduce-bench-switch-core, interleaved in one run (old, new, old, new, ...), so
# that a shared, noisy machine affects both alike; prints ns per packet (median and best of the
# rounds) and new/old ratios per row. Usage:
#   bench/ab_switch_core.sh OLD_BINARY NEW_BINARY [ROUNDS=5] [OUT_DIR=/tmp/treeduce-ab]
#   FILTER='det:0' bench/ab_switch_core.sh ...   (a --benchmark_filter regex; default: every row)
# Both runs are pinned to the last CPU (taskset). Needs python3 for the JSON.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,7p' "$0"; exit 2; }
old=$1 new=$2 rounds=${3:-5} out=${4:-/tmp/treeduce-ab}
cpu=$(($(nproc) - 1))
mkdir -p "$out"
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    bin=$old
    [ "$v" = new ] && bin=$new
    taskset -c "$cpu" "$bin" --benchmark_filter="${FILTER:-.}" --benchmark_min_time=0.3 \
      --benchmark_format=json >"$out/$v-$r.json"
  done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics as st, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for v in ("old", "new"):
    for r in range(1, rounds + 1):
        for b in json.load(open(f"{out}/{v}-{r}.json"))["benchmarks"]:
            rows.setdefault(b["name"], {}).setdefault(v, []).append(b["ns_per_pkt"])
print(f"{'benchmark':42} {'old med':>8} {'old min':>8} {'new med':>8} {'new min':>8} "
      f"{'new/old med':>12} {'new/old min':>12}")
for name, d in rows.items():
    o, n = d["old"], d["new"]
    print(f"{name:42} {st.median(o):8.1f} {min(o):8.1f} {st.median(n):8.1f} {min(n):8.1f} "
          f"{st.median(n) / st.median(o):12.3f} {min(n) / min(o):12.3f}")
PY
