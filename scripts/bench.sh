#!/usr/bin/env bash
# The benchmark report: installs what is missing, builds (release), then
#   1. records the machine (date, commit, kernel, CPU, memory, DPDK, Open MPI and Gloo versions);
#   2. runs the allreduce comparison on the emulated fabric (lab/tools/treeduce-fabric: 4 host
#      ranks, treeduce-perf with --compare gloo,mpi), rank 0's output in OUT/allreduce.txt, one
#      JSON object per (size, type, op) in OUT/allreduce.jsonl;
#   3. runs the switch daemon benchmark (bench/treeduce-bench-switchd --json: Mpps per lcore next
#      to dpdk-testpmd, lcores per 100G/400G port) into OUT/switchd.json;
#   4. plots the comparison with gnuplot (bench/plot_allreduce.gp) and writes OUT/report.md: the
#      machine, the commands, the tables, and MET/MISSED for each target.
# Usage:
#   scripts/bench.sh [--quick] [--out DIR] [--topology leaf|two-level] [--hosts udp|dpdk]
#                    [--reps N] [--no-switchd] [--no-build] [-- treeduce-perf arguments]
#   scripts/bench.sh --report-only DIR   # re-plots, rewrites DIR/report.md from DIR/allreduce.jsonl
# OUT is ${TREEDUCE_BENCH_OUT:-build/bench-report}, made afresh (an existing OUT is replaced only if
# an earlier run of this script made it). --quick: a smoke run (sizes up to 1 MiB, 5 iterations,
# one short switch benchmark round). --reps: the switch benchmark's undisturbed runs per row
# (default 3). --hosts: how treeduce's ranks reach the switch: udp (default; kernel UDP sockets on
# veth pairs to the switch's af_packet ports) or dpdk (libtreeduce's DPDK transport on memif:
# kernel bypass; leaf only). Gloo and MPI always use kernel TCP on the hosts' management network
# (veth pairs on a Linux bridge). The fabric runs with jumbo frames (MTU 8300, 8 KiB payloads), a
# 64-slot window, UDP GSO and a 10 ms first retransmission timeout (docs/performance.md says why).
# --no-build: use the binaries as they are. The fabric needs root: the script runs it with sudo
# when it is not root. Environment: TREEDUCE_BUILD_DIR (default build, a release build; when build
# exists with another build type, build-bench),
# TREEDUCE_SWITCHD_ARGS (more switch benchmark options, e.g. "--payloads 1024 --fanins 8").
# Exit status: 0 when every run exited 0 and every result was verified (wrong = 0), whether or not
# the targets were met (report.md says MET or MISSED); 1 when anything failed, 2 on bad usage.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

usage() {
  sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

quick=0
build=1
switchd=1
report_only=""
topology=leaf
hosts=udp
builddir=${TREEDUCE_BUILD_DIR:-build}
reps=""
out=${TREEDUCE_BENCH_OUT:-$builddir/bench-report}
perf_args=()
invocation="scripts/bench.sh $*"
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --no-build) build=0 ;;
    --no-switchd) switchd=0 ;;
    --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
    --topology) [ $# -ge 2 ] || usage; topology=$2; shift ;;
    --hosts) [ $# -ge 2 ] || usage; hosts=$2; shift ;;
    --reps) [ $# -ge 2 ] || usage; reps=$2; shift ;;
    --report-only) [ $# -ge 2 ] || usage; report_only=$2; shift ;;
    --) shift; perf_args=("$@"); break ;;
    -h | --help) usage 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done
case $hosts in
  udp | dpdk) ;;
  *) echo "bench.sh: --hosts udp|dpdk" >&2; exit 2 ;;
esac
case $topology in
  leaf | two-level) ;;
  *) echo "bench.sh: --topology leaf|two-level" >&2; exit 2 ;;
esac
case $reps in '' | [1-9] | [1-9][0-9]) ;; *) echo "bench.sh: --reps takes 1-99" >&2; exit 2 ;; esac

# report DIR: from DIR/allreduce.jsonl (and DIR/switchd.json or .txt, DIR/machine.txt,
# DIR/runs.tsv when present) writes DIR/allreduce_<type>_<op>.dat, the PNGs and DIR/report.md.
# Returns 1 when a run failed or a result was not verified.
report() {
  python3 - "$1" "$repo/bench/plot_allreduce.gp" <<'PY'
import json, math, os, shutil, subprocess, sys

out, gp = sys.argv[1], sys.argv[2]
failures, warnings = [], []

def path(name):
    return os.path.join(out, name)

def read(name):
    try:
        with open(path(name)) as f:
            return f.read()
    except OSError:
        return None

# ---- inputs -----------------------------------------------------------------------------------
machine = []  # (key, value)
for line in (read("machine.txt") or "").splitlines():
    if "=" in line:
        k, v = line.split("=", 1)
        machine.append((k.strip(), v.strip()))
runs = []  # (stage, rc, command)
for line in (read("runs.tsv") or "").splitlines():
    parts = line.split("\t", 2)
    if len(parts) == 3:
        runs.append((parts[0], parts[1], parts[2]))
for stage, rc, cmd in runs:
    if rc != "0":
        failures.append(f"`{stage}` exited with status {rc}")

rows = []
text = read("allreduce.jsonl")
if text is None:
    failures.append("no allreduce.jsonl")
else:
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            r["size"] = int(r["size"])
            r["treeduce"]["time_us"] = float(r["treeduce"]["time_us"])
            rows.append(r)
        except (ValueError, KeyError, TypeError) as e:
            failures.append(f"allreduce.jsonl line {n} unreadable ({type(e).__name__}: {e})")
    if not rows:
        failures.append("allreduce.jsonl has no results")

IMPLS = [("treeduce", "treeduce"), ("gloo", "Gloo ring"), ("mpi", "MPI_Allreduce")]

def get(r, impl, key):
    v = r.get(impl)
    if not isinstance(v, dict):
        return None
    x = v.get(key)
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None

def in_network(r):
    t = r.get("treeduce")
    return isinstance(t, dict) and t.get("path") == "network"

def speedup(r, impl):
    # Only what treeduce-perf computed, and only for rows reduced in the network: a host-side
    # or failed treeduce row is no figure of in-network reduction.
    return get(r, impl, "speedup") if in_network(r) else None

# A full run asked for both baselines (--compare gloo,mpi): a missing one is a failure.
missing = {}
for r in rows:
    for impl, name in IMPLS[1:]:
        if get(r, impl, "time_us") is None:
            missing.setdefault((name, r.get("type"), r.get("op")), []).append(r["size"])
for (name, t, o), sizes in missing.items():
    (failures if runs else warnings).append(
        f"no {name} result (absent, or null: it failed on a rank) for {t} {o} at "
        + ", ".join(f"{n} B" for n in sizes))
for r in rows:
    for impl, name in IMPLS:
        w = get(r, impl, "wrong")
        if w:
            failures.append(f"{name}: {int(w)} wrong elements at {r['size']} B {r.get('type')} "
                            f"{r.get('op')}")
    p = r["treeduce"].get("path", "network")
    if p == "FAILED":
        failures.append(f"treeduce: the allreduce failed at {r['size']} B {r.get('type')} "
                        f"{r.get('op')}")
    elif p != "network":
        warnings.append(f"treeduce took the host fallback (path {p}) at {r['size']} B "
                        f"{r.get('type')} {r.get('op')}: not an in-network figure")

def human(n):
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            return f"{n / k:g} {unit}"
    return f"{n} B"

def num(x):
    """3 significant digits (GB/s, ratios)."""
    if x is None:
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{max(0, 2 - int(math.floor(math.log10(abs(x)))))}f}"

def us(x):
    """Microseconds: 0.1 us below 1 ms."""
    if x is None:
        return "-"
    return f"{x:.0f}" if x >= 1000 else f"{x:.1f}" if x >= 1 else f"{x:.2f}"

# ---- data files and plots ---------------------------------------------------------------------
combos = []
for r in rows:
    c = (str(r.get("type", "?")), str(r.get("op", "?")))
    if c not in combos:
        combos.append(c)
by_combo = {c: sorted((r for r in rows if (str(r.get("type", "?")), str(r.get("op", "?"))) == c),
                      key=lambda r: r["size"]) for c in combos}

for name in os.listdir(out):  # the plots of an earlier report of this directory
    if name.startswith("allreduce_") and name.endswith((".dat", ".png")):
        os.remove(path(name))
gnuplot = shutil.which("gnuplot")
if gnuplot is None:
    failures.append("gnuplot not found: no plots")
plots = {}
for c, rs in by_combo.items():
    stem = f"allreduce_{c[0]}_{c[1]}"
    cols = ["size", "treeduce_time_us", "treeduce_algbw_GBps", "gloo_time_us", "gloo_algbw_GBps",
            "gloo_speedup", "mpi_time_us", "mpi_algbw_GBps", "mpi_speedup", "treeduce_min_us",
            "gloo_min_us", "mpi_min_us"]
    with open(path(stem + ".dat"), "w") as f:
        f.write(f"# {c[0]} {c[1]}; '?' = not measured\n# " + " ".join(cols) + "\n")
        for r in rs:
            v = [r["size"], get(r, "treeduce", "time_us"), get(r, "treeduce", "algbw_GBps"),
                 get(r, "gloo", "time_us"), get(r, "gloo", "algbw_GBps"), speedup(r, "gloo"),
                 get(r, "mpi", "time_us"), get(r, "mpi", "algbw_GBps"), speedup(r, "mpi"),
                 get(r, "treeduce", "min_us"), get(r, "gloo", "min_us"), get(r, "mpi", "min_us")]
            f.write(str(v[0]) + "".join(" ?" if x is None else f" {x:.6g}" for x in v[1:]) + "\n")
    if gnuplot is None:
        continue
    ranks = rs[0].get("ranks", "?")
    label = f"{c[0]} {c[1]}, {ranks} ranks"
    p = subprocess.run([gnuplot, "-e", f"datafile='{path(stem + '.dat')}'; "
                        f"outprefix='{path(stem)}'; label='{label}'", gp],
                       capture_output=True, text=True)
    pngs = [png for png in (stem + ".png", stem + "_speedup.png") if os.path.exists(path(png))]
    if p.returncode != 0 or len(pngs) != 2:
        failures.append(f"gnuplot failed for {stem} (status {p.returncode}): "
                        + " ".join(p.stderr.split())[:300])
    plots[c] = pngs

# ---- targets ----------------------------------------------------------------------------------
MIB, KIB4 = 1 << 20, 4096
targets = []  # (verdict, text)
for c, rs in by_combo.items():
    ranks = rs[0].get("ranks")
    tag = f"{c[0]} {c[1]}, {ranks} ranks"
    note = "" if ranks == 4 else f" (the target is for 4 ranks; this run had {ranks})"
    big = [r for r in rs if r["size"] >= MIB]
    small = [r for r in rs if r["size"] <= KIB4]
    # Bandwidth: treeduce algbw >= 2x Gloo ring's at every size >= 1 MiB.
    pts, ok, measured = [], True, bool(big)
    for r in big:
        a, b = get(r, "treeduce", "algbw_GBps"), get(r, "gloo", "algbw_GBps")
        if a is None or not b or not in_network(r):
            measured = False
            continue
        ok = ok and a >= 2 * b
        pts.append(f"{human(r['size'])}: {num(a)} vs {num(b)} GB/s = {a / b:.2f}x")
    verdict = "NOT MEASURED" if not measured else "MET" if ok else "MISSED"
    targets.append((verdict, f"**{verdict}**: {tag}, sizes >= 1 MiB, treeduce algbw >= 2x Gloo "
                    f"ring's{note}: " + ("; ".join(pts) if pts else "no such size with Gloo")))
    # Latency: treeduce time <= 0.5x Gloo's at every size <= 4 KiB (mean time; min alongside).
    pts, ok, measured = [], True, bool(small)
    for r in small:
        a, b = get(r, "treeduce", "time_us"), get(r, "gloo", "time_us")
        if a is None or not b or not in_network(r):
            measured = False
            continue
        ok = ok and a <= 0.5 * b
        am, bm = get(r, "treeduce", "min_us"), get(r, "gloo", "min_us")
        mins = f" (min {us(am)} vs {us(bm)} us = {am / bm:.2f}x)" if am and bm else ""
        pts.append(f"{human(r['size'])}: {us(a)} vs {us(b)} us = {a / b:.2f}x{mins}")
    verdict = "NOT MEASURED" if not measured else "MET" if ok else "MISSED"
    targets.append((verdict, f"**{verdict}**: {tag}, sizes <= 4 KiB, treeduce latency <= 0.5x "
                    f"Gloo's (mean time_us){note}: " + ("; ".join(pts) if pts else
                                                       "no such size with Gloo")))

# ---- switch benchmark -------------------------------------------------------------------------
switch_md = []
sw_text, sw_json = read("switchd.json"), None
if sw_text is not None:
    try:
        sw_json = json.loads(sw_text)
    except ValueError as e:
        failures.append(f"switchd.json unreadable ({e})")
if sw_json is not None:
    if not sw_json.get("ok", False):
        failures.append("switch benchmark: checks failed (\"ok\": false in switchd.json)")
    switch_md.append(f"Medians of {sw_json.get('reps', '?')} undisturbed runs per row, "
                     f"{sw_json.get('measure_ms', '?')} ms windows, "
                     f"{sw_json.get('inflight', '?')} frames in flight. "
                     f"Checks: {'all passed' if sw_json.get('ok') else '**FAILED**'}.\n")
    switch_md.append("| DUT | payload B | fan-in | rx Mpps / lcore | Gbps reduced | vs macswap "
                     "| vs csum | DUT ns/pkt busy | capacity Mpps | cap. vs macswap | gen busy "
                     "| window full | lcores 100G | lcores 400G | runs (discarded) | checked "
                     "| mismatches | counters agree |")
    switch_md.append("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|")
    for r in sw_json.get("rows", []):
        def f(k, nd=2, pct=False):
            x = r.get(k)
            if not isinstance(x, (int, float)) or not math.isfinite(x):
                return "-"
            return f"{100 * x:.0f}%" if pct else f"{x:.{nd}f}"
        dut = "gen max TX (rxonly)" if r.get("dut") == "rxonly" else r.get("dut", "?")
        runs_n = len(r.get("runs_mpps", []))
        switch_md.append(
            f"| {dut} | {r.get('payload', '?')} | {r.get('fanin') or '-'} | {f('rx_mpps')} "
            f"| {f('gbps_reduced', 1)} | {f('vs_macswap')} | {f('vs_csum')} "
            f"| {f('dut_ns_per_pkt_busy', 0)} | {f('capacity_mpps')} "
            f"| {f('capacity_vs_macswap')} | {f('gen_busy', pct=True)} "
            f"| {f('window_full', pct=True)} | {f('lcores_100g', 0)} | {f('lcores_400g', 0)} "
            f"| {runs_n} ({r.get('runs_discarded', '?')}) | {r.get('checked', '?')} "
            f"| {r.get('mismatches', '?')} | {'yes' if r.get('counters_agree') else '**no**'} |")
    sw = [r for r in sw_json.get("rows", []) if r.get("dut") == "switch"]
    if sw:
        switch_md.append("\nLcores per port, for the switch (lcores scaling linearly, memif-like "
                         "I/O costs):\n")
        switch_md.append("| payload B | fan-in | Mpps / lcore | Gbps reduced / lcore "
                         "| lcores for 100G | lcores for 400G |")
        switch_md.append("|--:|--:|--:|--:|--:|--:|")
        for r in sw:
            def g(k, nd):
                x = r.get(k)
                return f"{x:.{nd}f}" if isinstance(x, (int, float)) else "-"
            switch_md.append(f"| {r.get('payload')} | {r.get('fanin')} | {g('rx_mpps', 2)} "
                             f"| {g('gbps_reduced', 1)} | {g('lcores_100g', 0)} "
                             f"| {g('lcores_400g', 0)} |")
    switch_md.append("\nRaw: [switchd.json](switchd.json).")
elif read("switchd.txt") is not None:
    txt = read("switchd.txt")
    if "all checks passed" not in txt:
        failures.append("switch benchmark: no \"all checks passed\" in switchd.txt")
    switch_md.append("The benchmark's own output, verbatim:\n")
    switch_md.append(txt.rstrip())
else:
    switch_md.append("Not run.")

# ---- report.md --------------------------------------------------------------------------------
md = ["# treeduce benchmark report", ""]
if failures:
    md.append("**FAILED**: these results are incomplete or unverified:")
    md += [f"- {x}" for x in failures]
else:
    md.append("**All runs completed and every result was verified** (wrong = 0). "
              "Targets: see below.")
if warnings:
    md.append("")
    md.append("Warnings:")
    md += [f"- {x}" for x in warnings]
md += ["", "## Machine", ""]
if machine:
    md += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine]
else:
    md.append("Not recorded (no machine.txt).")
md += ["", "## Commands", ""]
invocation = (read("invocation.txt") or "").strip()
if runs:
    md.append("```sh")
    if invocation:
        md.append(f"# {invocation}")
    md += [f"{cmd}    # exit status {rc}" for stage, rc, cmd in runs]
    md.append("```")
else:
    md.append("Not recorded (no runs.tsv): a report from an existing allreduce.jsonl.")

md += ["", "## Allreduce: treeduce against Gloo ring and MPI_Allreduce", "",
       "time = mean per operation, min = fastest iteration, algbw = size / time; speedup = "
       "baseline time / treeduce time (> 1: treeduce faster). Raw: [allreduce.jsonl]"
       "(allreduce.jsonl)" + (", rank 0's output: [allreduce.txt](allreduce.txt)"
                              if read("allreduce.txt") is not None else "") + ".", ""]
md.append("### Targets")
md.append("")
md += [f"- {t}" for _, t in targets] or ["- no results"]
for c, rs in by_combo.items():
    r0 = rs[0]
    md += ["", f"### {c[0]} {c[1]}: {r0.get('ranks', '?')} ranks, {r0.get('iters', '?')} "
           f"iterations after {r0.get('warmup', '?')} warm-up", ""]
    md.append("| size | treeduce us (min) | treeduce GB/s | path | Gloo us (min) | Gloo GB/s "
              "| vs Gloo | MPI us (min) | MPI GB/s | vs MPI | wrong (td/Gloo/MPI) |")
    md.append("|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|---|")
    for r in rs:
        def t(impl):
            a, m = get(r, impl, "time_us"), get(r, impl, "min_us")
            return us(a) + (f" ({us(m)})" if m is not None else "")
        def sp(impl):
            s = speedup(r, impl)
            return "-" if s is None else f"{s:.2f}x"
        wrong = "/".join("-" if get(r, i, "wrong") is None else str(int(get(r, i, "wrong")))
                         for i, _ in IMPLS)
        if any(get(r, i, "wrong") for i, _ in IMPLS):
            wrong = f"**{wrong}**"
        md.append(f"| {human(r['size'])} | {t('treeduce')} "
                  f"| {num(get(r, 'treeduce', 'algbw_GBps'))} "
                  f"| {r['treeduce'].get('path', '?')} | {t('gloo')} "
                  f"| {num(get(r, 'gloo', 'algbw_GBps'))} | {sp('gloo')} | {t('mpi')} "
                  f"| {num(get(r, 'mpi', 'algbw_GBps'))} | {sp('mpi')} | {wrong} |")
    if plots.get(c):
        md.append("")
        md += [f"![{c[0]} {c[1]}: {png}]({png})" for png in plots[c]]
md += ["", "## Switch daemon throughput (treeduce-bench-switchd)", ""] + switch_md
if failures:
    tail = read("allreduce.txt")
    if tail:
        md += ["", "## Last lines of the allreduce run", "", "```"]
        md += tail.rstrip().splitlines()[-30:]
        md.append("```")
md.append("")
with open(path("report.md"), "w") as f:
    f.write("\n".join(md))

for v, t in targets:
    print(f"bench: target {v}: " + t.split(": ", 1)[1].split(":", 1)[0], file=sys.stderr)
for x in warnings:
    print(f"bench: warning: {x}", file=sys.stderr)
for x in failures:
    print(f"bench: FAILED: {x}", file=sys.stderr)
print(f"bench: report in {path('report.md')}", file=sys.stderr)
sys.exit(1 if failures else 0)
PY
}

if [ -n "$report_only" ]; then
  [ -d "$report_only" ] || { echo "bench.sh: no directory $report_only" >&2; exit 2; }
  report "$(realpath "$report_only")"
  exit
fi

# shellcheck source=scripts/deps.sh
. scripts/deps.sh
treeduce_install_deps

# Benchmarks want a release build; an existing build directory is never reconfigured (scripts/
# test.sh and people use it): one of another build type is left alone for build-bench.
buildtype_of() {
  python3 -c 'import json, sys
print(next(o["value"] for o in json.load(open(sys.argv[1] + "/meson-info/intro-buildoptions.json"))
           if o["name"] == "buildtype"))' "$1" 2>/dev/null || echo unknown
}
if [ -f "$builddir/build.ninja" ] && [ "$(buildtype_of "$builddir")" != release ]; then
  if [ -n "${TREEDUCE_BUILD_DIR:-}" ]; then
    echo "bench.sh: $builddir is a $(buildtype_of "$builddir") build; benchmarks need release" >&2
    exit 2
  fi
  echo "bench.sh: $builddir is a $(buildtype_of "$builddir") build; using build-bench" >&2
  builddir=build-bench
fi
if [ "$build" -eq 1 ]; then
  if [ ! -f "$builddir/build.ninja" ]; then
    meson setup "$builddir" -Dbuildtype=release -Dtests=true -Dbenchmarks=true >/dev/null
  fi
  ninja -C "$builddir" lab/tools/treeduce-fabric host/treeduce-perf \
    dataplane/switchd/treeduce-switch control/treeduce-manager bench/treeduce-bench-switchd \
    >/dev/null
fi

# OUT afresh: only a directory this script made (it has the marker) is replaced.
out=$(realpath -m "$out")
if [ -e "$out" ]; then
  if [ ! -f "$out/.treeduce-bench-report" ]; then
    echo "bench.sh: $out exists and is not a bench report; choose another --out" >&2
    exit 2
  fi
  rm -rf -- "$out"
fi
mkdir -p "$out"
: >"$out/.treeduce-bench-report"
echo "$invocation" >"$out/invocation.txt"

# The machine.
first_line() { "$@" 2>/dev/null | head -n 1 || true; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
{
  echo "date (UTC) = $(date -u '+%Y-%m-%d %H:%M:%S')"
  echo "commit = $commit"
  echo "kernel = $(uname -r)"
  echo "CPU = $(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n 1), $(nproc) CPUs"
  echo "memory = $(awk '/^MemTotal:/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)"
  echo "load average (1/5/15 min) = $(cut -d ' ' -f 1-3 /proc/loadavg)"
  echo "compiler = $(first_line c++ --version)"
  echo "DPDK = $(pkg-config --modversion libdpdk 2>/dev/null || echo unknown)"
  echo "Open MPI = $(first_line mpirun --version)"
  echo "Gloo (libgloo-dev) = $(dpkg-query -W -f='${Version}' libgloo-dev 2>/dev/null ||
    echo unknown)"
} >"$out/machine.txt"

# run STAGE COMMAND...: runs it, records "STAGE<TAB>status<TAB>command" in runs.tsv.
status=0
record() {
  local stage=$1 rc=$2
  shift 2
  printf '%s\t%s\t%s\n' "$stage" "$rc" "$*" >>"$out/runs.tsv"
  [ "$rc" -eq 0 ] || status=1
}

# The allreduce comparison: rank 0's output streams to the terminal and to allreduce.txt.
if [ ${#perf_args[@]} -eq 0 ]; then
  if [ "$quick" -eq 1 ]; then
    perf_args=(-b 4096 -e 1048576 -f 4 -d f32 -o sum -n 5 -w 1)
  else
    perf_args=(-b 4096 -e 16777216 -f 4 -d f32 -o sum -n 20 -w 3)
  fi
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "bench.sh: the fabric needs root: run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
# Made here, so that it stays ours when the fabric (root) truncates and writes it.
: >"$out/allreduce.jsonl"
baselines=gloo,mpi
fabric=("$builddir/lab/tools/treeduce-fabric" --compare "$baselines" --topology "$topology"
  --hosts "$hosts" --mtu 8300 --payload 8192 --slots 64 --rto-us 10000
  --json-out "$out/allreduce.jsonl" -- "${perf_args[@]}")
echo "== allreduce: ${fabric[*]}" >&2
set +e
"${sudo[@]}" "${fabric[@]}" 2>&1 | tee "$out/allreduce.txt"
rc=${PIPESTATUS[0]}
set -e
record allreduce "$rc" "${sudo[*]}${sudo[*]:+ }${fabric[*]}"

# The switch daemon benchmark (busy-polls both CPUs: nothing else should run meanwhile).
if [ "$switchd" -eq 1 ]; then
  sw=("$builddir/bench/treeduce-bench-switchd" --json)
  if [ "$quick" -eq 1 ]; then
    sw+=(--reps "${reps:-1}" --payloads 1024 --fanins 8 --warmup-ms 200 --measure-ms 500)
  else
    sw+=(--reps "${reps:-3}")
  fi
  # shellcheck disable=SC2206  # word splitting of the extra options is intended
  sw+=(${TREEDUCE_SWITCHD_ARGS:-})
  echo "== switch daemon: ${sw[*]}" >&2
  set +e
  "${sw[@]}" >"$out/switchd.json" 2>"$out/switchd.log"
  rc=$?
  set -e
  record switchd "$rc" "${sw[*]}"
  if [ "$rc" -ne 0 ]; then
    echo "bench.sh: treeduce-bench-switchd exited with status $rc; its stderr:" >&2
    tail -n 20 "$out/switchd.log" >&2
  fi
fi

report "$out" || status=1
exit $status
