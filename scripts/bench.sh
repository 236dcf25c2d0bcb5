#!/usr/bin/env bash
# The benchmark report: installs what is missing, builds (release), then
#   1. records the machine (date, commit, kernel, CPU, memory, DPDK, Open MPI and Gloo versions);
#   2. for each host kind (--hosts), runs the allreduce comparison on the emulated fabric
#      (lab/tools/treeduce-fabric: 4 host ranks on one leaf, treeduce-perf with --compare
#      gloo,mpi), rank 0's output in OUT/allreduce-KIND.txt, one JSON object per (size, type, op)
#      in OUT/allreduce-KIND.jsonl; then back to back on the same kind of fabric (treeduce-perf
#      --back-to-back 32 at 256 KiB: 32 allreduces issued non-blocking, then waited for, against
#      the same 32 one after the other) into OUT/b2b-KIND.txt and .jsonl;
#   3. fast without tuning: 1 MiB on kernel UDP hosts with libtreeduce's defaults (window, payload
#      from the MTU, adaptive retransmission timeout) and with the benchmark's settings (64 slots,
#      a fixed 10 ms timeout), at MTU 1500 and 8300, into OUT/tuning-MTU-defaults|tuned.txt/.jsonl
#      (both with the fabric's UDP GSO, and the payload libtreeduce would take from the MTU);
#   4. runs the switch daemon benchmark (bench/treeduce-bench-switchd --json: Mpps per lcore next
#      to dpdk-testpmd, lcores per 100G/400G port, and the per-packet target at 1 KiB, fan-in 8:
#      the switch against testpmd macswap + treeduce-bench-switch-core) into OUT/switchd.json;
#   5. plots the comparison with gnuplot (bench/plot_allreduce.gp) and writes OUT/report.md: the
#      machine, the commands, MET/MISSED for each target (by how much when missed, and the ranks'
#      CPU time per allreduce: where the time goes), the tables.
# Usage:
#   scripts/bench.sh [--quick] [--out DIR] [--hosts all|KIND[,KIND...]] [--topology leaf|two-level]
#                    [--reps N] [--no-switchd] [--no-back-to-back] [--no-tuning] [--no-build]
#                    [-- treeduce-perf arguments]
#   scripts/bench.sh --report-only DIR   # re-plots, rewrites DIR/report.md from DIR's results
# OUT is ${TREEDUCE_BENCH_OUT:-build/bench-report}, made afresh (an existing OUT is replaced only if
# an earlier run of this script made it). --quick: a smoke run (sizes up to 1 MiB, 5 iterations,
# back to back 2 iterations, tuning runs 5, one short switch benchmark round). --reps: the switch
# benchmark's undisturbed runs per row (default 3). --no-back-to-back, --no-tuning, --no-switchd
# leave those stages out (their targets then say NOT MEASURED). --hosts: how treeduce's ranks reach
# the switch, a comma list of dpdk (libtreeduce's DPDK transport on memif in zero-copy mode: kernel
# bypass; leaf only), udp (kernel UDP sockets on veth pairs to the switch's af_packet ports, with
# UDP GSO) and af_xdp (libtreeduce's AF_XDP transport on the same veths); all (the default) =
# dpdk,udp,af_xdp on a leaf, udp,af_xdp on two levels. Gloo and MPI always use kernel TCP on the
# hosts' management network (veth pairs on a Linux bridge). The fabric runs with jumbo frames (MTU
# 8300, 8 KiB payloads), a 64-slot window and a 10 ms first retransmission timeout
# (docs/performance.md says why). treeduce-perf arguments after -- replace the sweep's (default -b
# 256 -e 16777216 -f 4 -d f32 -o sum -n 20 -w 3), not those of the back-to-back and tuning runs.
# --no-build: use the binaries as they are. The fabric needs root: the script runs it with sudo when
# it is not root. Environment: TREEDUCE_BUILD_DIR (default build, a release build; when build exists
# with another build type, build-bench), TREEDUCE_SWITCHD_ARGS (more switch benchmark options, e.g.
# "--payloads 1024 --fanins 8").
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
b2b=1
tuning=1
report_only=""
topology=leaf
hosts=all
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
    --no-back-to-back) b2b=0 ;;
    --no-tuning) tuning=0 ;;
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
case $topology in
  leaf | two-level) ;;
  *) echo "bench.sh: --topology leaf|two-level" >&2; exit 2 ;;
esac
if [ "$hosts" = all ]; then
  if [ "$topology" = leaf ]; then hosts=dpdk,udp,af_xdp; else hosts=udp,af_xdp; fi
fi
kinds=()
IFS=, read -r -a hosts_list <<<"$hosts"
for k in "${hosts_list[@]}"; do
  case $k in
    udp | af_xdp | dpdk) ;;
    *) echo "bench.sh: --hosts takes all or a comma list of dpdk, udp, af_xdp (not '$k')" >&2
       exit 2 ;;
  esac
  case " ${kinds[*]:-} " in *" $k "*) ;; *) kinds+=("$k") ;; esac
done
if [ ${#kinds[@]} -eq 0 ]; then
  echo "bench.sh: --hosts takes all or a comma list of dpdk, udp, af_xdp" >&2
  exit 2
fi
if [ "$topology" = two-level ] && [[ " ${kinds[*]} " == *" dpdk "* ]]; then
  echo "bench.sh: --hosts dpdk needs --topology leaf" >&2
  exit 2
fi
case $reps in '' | [1-9] | [1-9][0-9]) ;; *) echo "bench.sh: --reps takes 1-99" >&2; exit 2 ;; esac

# report DIR: from DIR's results (allreduce-KIND.jsonl, b2b-KIND.jsonl, switchd.json or .txt,
# machine.txt, runs.tsv when present; an allreduce.jsonl of an older report too) writes
# DIR/allreduce_*.dat, the PNGs and DIR/report.md. Returns 1 when a run failed or a result was not
# verified.
report() {
  python3 - "$1" "$repo/bench/plot_allreduce.gp" <<'PY'
import json, math, os, re, shutil, subprocess, sys

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
ncpu = None
for k, v in machine:
    m = re.search(r"(\d+) CPUs", v) if k == "CPU" else None
    if m:
        ncpu = int(m.group(1))
runs = []  # (stage, rc, command)
for line in (read("runs.tsv") or "").splitlines():
    parts = line.split("\t", 2)
    if len(parts) == 3:
        runs.append((parts[0], parts[1], parts[2]))
for stage, rc, cmd in runs:
    if rc != "0":
        failures.append(f"`{stage}` exited with status {rc}")

# Host kinds: what the ranks used to reach the switch. "" = an older report's allreduce.jsonl.
KINDS = {"dpdk": "kernel-bypass hosts (libtreeduce's DPDK transport on memif)",
         "udp": "kernel UDP hosts (sockets on veth, af_packet at the switch)",
         "af_xdp": "AF_XDP hosts (libtreeduce's AF_XDP transport on veth, af_packet at the switch)",
         "": "hosts as run"}
ORDER = ["dpdk", "udp", "af_xdp"]

def kind_name(k):
    return KINDS.get(k, f"{k} hosts")

def load(name):
    """The JSON Lines of `name`: a list of rows, or None when the file is absent."""
    text = read(name)
    if text is None:
        return None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            r["size"] = int(r["size"])
            if not isinstance(r["treeduce"], dict):
                raise TypeError("treeduce is not an object")
            rows.append(r)
        except (ValueError, KeyError, TypeError) as e:
            failures.append(f"{name} line {n} unreadable ({type(e).__name__}: {e})")
    if not rows:
        failures.append(f"{name} has no results")
    return rows

sweeps, b2bs = {}, {}  # kind -> rows
tuning = {}  # (MTU, "defaults" or "tuned") -> rows
for name in sorted(os.listdir(out)):
    m = re.fullmatch(r"(allreduce|b2b)-([a-z0-9_]+)\.jsonl", name)
    if m:
        (sweeps if m.group(1) == "allreduce" else b2bs)[m.group(2)] = load(name) or []
    m = re.fullmatch(r"tuning-(\d+)-(defaults|tuned)\.jsonl", name)
    if m:
        tuning[(int(m.group(1)), m.group(2))] = load(name) or []
if read("allreduce.jsonl") is not None and not sweeps:
    sweeps[""] = load("allreduce.jsonl") or []
kinds = sorted(set(sweeps) | set(b2bs), key=lambda k: (ORDER.index(k) if k in ORDER else 99, k))
if not kinds:
    failures.append("no allreduce results (no allreduce-KIND.jsonl)")

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

def short(x, goal):
    """How far a figure that must reach `goal` (higher is better) is from it."""
    return "" if x >= goal else f" (short by {goal - x:.2f}, {100 * (goal - x) / goal:.0f}%)"

def over(x, goal):
    """How far a figure that must stay at or below `goal` is above it."""
    return "" if x <= goal else f" ({x - goal:.2f} over, {100 * (x - goal) / goal:.0f}%)"

# ---- checks -----------------------------------------------------------------------------------
def check_row(r, where):
    """Wrong elements of any backend fail the report, as does a failed treeduce; a row reduced on
    the hosts is only a warning (not an in-network figure)."""
    for impl, name in IMPLS + [("sequential", "sequential")]:
        w = get(r, impl, "wrong")
        if w:
            failures.append(f"{name}: {int(w)} wrong elements at {r['size']} B "
                            f"{r.get('type')} {r.get('op')}{where}")
    p = r["treeduce"].get("path", "network")
    if p == "FAILED":
        failures.append(f"treeduce: the allreduce failed at {r['size']} B {r.get('type')} "
                        f"{r.get('op')}{where}")
    elif p != "network":
        warnings.append(f"treeduce took the host fallback (path {p}) at {r['size']} B "
                        f"{r.get('type')} {r.get('op')}{where}: not an in-network figure")

for k in kinds:
    where = f" ({k} hosts)" if k else ""
    for r in sweeps.get(k, []):
        for impl, name in IMPLS[1:]:
            if get(r, impl, "time_us") is None:
                # A full run asks for both baselines (--compare gloo,mpi): a missing one fails.
                (failures if runs else warnings).append(
                    f"no {name} result (absent, or null: it failed on a rank) for {r.get('type')} "
                    f"{r.get('op')} at {r['size']} B{where}")
    for r in sweeps.get(k, []) + b2bs.get(k, []):
        check_row(r, where)
    for r in b2bs.get(k, []):
        if get(r, "sequential", "time_us") is None:
            failures.append(f"back to back{where}: no sequential result at {r['size']} B")
for (mtu, how), rows in sorted(tuning.items()):
    for r in rows:
        check_row(r, f" (kernel UDP hosts, MTU {mtu}, {how})")

def combos_of(rows):
    cs = []
    for r in rows:
        c = (str(r.get("type", "?")), str(r.get("op", "?")))
        if c not in cs:
            cs.append(c)
    return {c: sorted((r for r in rows if (str(r.get("type", "?")), str(r.get("op", "?"))) == c),
                      key=lambda r: r["size"]) for c in cs}

by_kind = {k: combos_of(sweeps.get(k, [])) for k in kinds}

# ---- data files and plots ---------------------------------------------------------------------
for name in os.listdir(out):  # the plots of an earlier report of this directory
    if name.startswith("allreduce_") and name.endswith((".dat", ".png")):
        os.remove(path(name))
gnuplot = shutil.which("gnuplot")
if gnuplot is None and any(by_kind.values()):
    failures.append("gnuplot not found: no plots")
plots = {}
for k in kinds:
    for c, rs in by_kind[k].items():
        stem = "allreduce_" + (f"{k}_" if k else "") + f"{c[0]}_{c[1]}"
        cols = ["size", "treeduce_time_us", "treeduce_algbw_GBps", "gloo_time_us",
                "gloo_algbw_GBps", "gloo_speedup", "mpi_time_us", "mpi_algbw_GBps", "mpi_speedup",
                "treeduce_min_us", "gloo_min_us", "mpi_min_us"]
        with open(path(stem + ".dat"), "w") as f:
            f.write(f"# {c[0]} {c[1]}, {kind_name(k)}; '?' = not measured\n# "
                    + " ".join(cols) + "\n")
            for r in rs:
                v = [r["size"], get(r, "treeduce", "time_us"), get(r, "treeduce", "algbw_GBps"),
                     get(r, "gloo", "time_us"), get(r, "gloo", "algbw_GBps"), speedup(r, "gloo"),
                     get(r, "mpi", "time_us"), get(r, "mpi", "algbw_GBps"), speedup(r, "mpi"),
                     get(r, "treeduce", "min_us"), get(r, "gloo", "min_us"),
                     get(r, "mpi", "min_us")]
                f.write(str(v[0]) + "".join(" ?" if x is None else f" {x:.6g}" for x in v[1:])
                        + "\n")
        if gnuplot is None:
            continue
        label = f"{c[0]} {c[1]}, {rs[0].get('ranks', '?')} ranks" + (f", {k} hosts" if k else "")
        # The large-size target the plot shades: >= 2x Gloo's algbw for kernel-bypass hosts (and
        # in reports from before the host kinds), >= 1x for hosts without DPDK.
        big = 1 if k in ("udp", "af_xdp") else 2
        p = subprocess.run([gnuplot, "-e", f"datafile='{path(stem + '.dat')}'; "
                            f"outprefix='{path(stem)}'; label='{label}'; gloo_big={big}", gp],
                           capture_output=True, text=True)
        pngs = [png for png in (stem + ".png", stem + "_speedup.png") if os.path.exists(path(png))]
        if p.returncode != 0 or len(pngs) != 2:
            failures.append(f"gnuplot failed for {stem} (status {p.returncode}): "
                            + " ".join(p.stderr.split())[:300])
        plots[(k, c)] = pngs

# ---- targets ----------------------------------------------------------------------------------
MIB, KIB4 = 1 << 20, 4096
BIG = [MIB, 4 * MIB, 16 * MIB]
targets = []  # (verdict, the target, the figures)
SWITCH_TARGET = ("the switch at 1 KiB, fan-in 8: ns/pkt <= 1.1x (testpmd macswap's + "
                 "treeduce-bench-switch-core's, same run)")

def verdict(measured, ok):
    return "NOT MEASURED" if not measured else "MET" if ok else "MISSED"

def tag(c, rs):
    ranks = rs[0].get("ranks")
    return f"{c[0]} {c[1]}" + ("" if ranks == 4 else f" ({ranks} ranks; the targets are for 4)")

# A target whose host kinds have no rows is NOT MEASURED, never left out: not asked for (--hosts,
# or --topology two-level, where dpdk hosts do not run), or a run that gave no results (a failure
# above). A report from before the host kinds (one allreduce.jsonl) has none of them.
OLD = "" in sweeps
TARGET_KINDS = kinds if OLD else ORDER + [k for k in kinds if k not in ORDER]

def absent(ks):
    why = []
    for k in ks:
        if OLD:
            why.append(f"{k} hosts: this report's results predate the host kinds")
        elif k in sweeps:
            why.append(f"{k} hosts gave no results (see the failures)")
        elif k in b2bs:
            why.append(f"{k} hosts ran only back to back (no allreduce-{k}.jsonl)")
        else:
            why.append(f"{k} hosts not run (--hosts"
                       + ("; dpdk hosts run on one leaf only)" if k == "dpdk" else ")"))
    return "; ".join(why)

# Kernel-bypass hosts: algbw >= 2.0x Gloo ring's and >= 1.5x MPI's at 1, 4 and 16 MiB.
BYPASS_TARGET = "algbw >= 2.0x Gloo ring's and >= 1.5x MPI's at 1, 4 and 16 MiB"
if not by_kind.get("dpdk"):
    targets.append(("NOT MEASURED", f"kernel-bypass hosts: {BYPASS_TARGET}", absent(["dpdk"])))
for c, rs in by_kind.get("dpdk", {}).items():
    at = {r["size"]: r for r in rs}
    pts, ok, measured = [], True, True
    for n in BIG:
        r = at.get(n)
        g, m = (speedup(r, "gloo"), speedup(r, "mpi")) if r else (None, None)
        if g is None or m is None:
            measured = False
            pts.append(f"{human(n)}: " + ("not in this run" if r is None else "no figure"))
            continue
        ok = ok and g >= 2.0 and m >= 1.5
        pts.append(f"{human(n)}: {g:.2f}x Gloo's{short(g, 2.0)}, {m:.2f}x MPI's{short(m, 1.5)}")
    v = verdict(measured, ok)
    targets.append((v, f"kernel-bypass hosts, {tag(c, rs)}: {BYPASS_TARGET}", "; ".join(pts)))

# Hosts without DPDK (AF_XDP or kernel UDP, whichever is faster): >= 1.0x Gloo's ring at 1-16 MiB.
nodpdk = [k for k in ("udp", "af_xdp") if by_kind.get(k)]
if not nodpdk:
    targets.append(("NOT MEASURED", "hosts without DPDK (AF_XDP or kernel UDP, the faster): "
                    "algbw >= 1.0x Gloo ring's at 1-16 MiB", absent(["udp", "af_xdp"])))
else:
    cs = []
    for k in nodpdk:
        cs += [c for c in by_kind[k] if c not in cs]
    for c in cs:
        sizes = sorted({r["size"] for k in nodpdk for r in by_kind[k].get(c, [])
                        if MIB <= r["size"] <= 16 * MIB})
        pts, ok, measured = [], True, bool(sizes)
        for n in sizes:
            got = []
            for k in nodpdk:
                r = next((r for r in by_kind[k].get(c, []) if r["size"] == n), None)
                g = speedup(r, "gloo") if r else None
                if g is not None:
                    got.append((g, k))
            if not got:
                measured = False
                pts.append(f"{human(n)}: no figure")
                continue
            best, bk = max(got)
            ok = ok and best >= 1.0
            pts.append(f"{human(n)}: " + (", ".join(f"{k} {g:.2f}x" for g, k in got) + ", the "
                                          "faster " if len(got) > 1 else "")
                       + f"{bk} {best:.2f}x{short(best, 1.0)}")
        missing = [k for k in ("udp", "af_xdp") if k not in nodpdk]
        rs0 = next(by_kind[k][c] for k in nodpdk if c in by_kind[k])
        v = verdict(measured, ok)
        targets.append((v, f"hosts without DPDK (AF_XDP or kernel UDP, the faster), "
                        f"{tag(c, rs0)}: algbw >= 1.0x Gloo ring's at 1-16 MiB"
                        + (f" ({absent(missing)})" if missing else ""),
                        "; ".join(pts) if pts else "no such size in this run"))

# Small messages, per host kind: time <= 1.0x MPI's, and (the first target) <= 0.5x Gloo's.
SMALL_GOALS = (("mpi", 1.0, "MPI's"), ("gloo", 0.5, "Gloo ring's"))
for k in TARGET_KINDS:
    if not by_kind.get(k):
        for _, goal, what in SMALL_GOALS:
            targets.append(("NOT MEASURED", f"{kind_name(k)}, sizes <= 4 KiB: time <= "
                            f"{goal:.1f}x {what} (mean time_us)",
                            absent([k]) if k else "no results"))
        continue
    for c, rs in by_kind[k].items():
        small = [r for r in rs if r["size"] <= KIB4]
        for impl, goal, what in SMALL_GOALS:
            pts, ok, measured = [], True, bool(small)
            for r in small:
                a, b = get(r, "treeduce", "time_us"), get(r, impl, "time_us")
                if a is None or not b or not in_network(r):
                    measured = False
                    pts.append(f"{human(r['size'])}: no figure")
                    continue
                ok = ok and a <= goal * b
                am, bm = get(r, "treeduce", "min_us"), get(r, impl, "min_us")
                mins = f" (min {us(am)} vs {us(bm)} us = {am / bm:.2f}x)" if am and bm else ""
                pts.append(f"{human(r['size'])}: {us(a)} vs {us(b)} us = {a / b:.2f}x"
                           f"{over(a / b, goal)}{mins}")
            v = verdict(measured, ok)
            targets.append((v, f"{kind_name(k)}, {tag(c, rs)}, sizes <= 4 KiB: time <= "
                            f"{goal:.1f}x {what} (mean time_us)",
                            "; ".join(pts) if pts else "no such size in this run"))

# Back to back, per host kind: N allreduces issued non-blocking then waited for, >= 1.5x the algbw
# of the same N one after the other.
for k in kinds:
    rows = b2bs.get(k)
    if rows is None:
        continue
    pts, ok, measured = [], True, bool(rows)
    for r in rows:
        b2b_n = r.get("back_to_back", "N")
        x = get(r, "sequential", "speedup") if in_network(r) else None
        a, b = get(r, "treeduce", "time_us"), get(r, "sequential", "time_us")
        if x is None or a is None or b is None:
            measured = False
            pts.append(f"{human(r['size'])}: no figure")
            continue
        ok = ok and x >= 1.5
        retx = r["treeduce"].get("retransmits")
        # What the machine's CPUs allow at the CPU time each allreduce cost every rank back to
        # back (mean over the ranks, polling included): on N CPUs it takes at least
        # ranks x that / N (never below the measured x; the switch's CPU comes on top).
        bound = ""
        cpu, ranks = get(r, "treeduce", "cpu_us"), r.get("ranks") or 0
        if ncpu and ranks and cpu:
            floor = ranks * cpu / ncpu
            bound = (f"; the {ranks} ranks' CPU alone ({us(cpu)} us each per allreduce back to "
                     f"back, polling included) needs {us(floor)} us of the {ncpu} CPUs per "
                     f"allreduce, so at that CPU cost at most {b / floor:.2f}x here")
        pts.append(f"{b2b_n} x {human(r['size'])} {r.get('type')} {r.get('op')}: {us(a)} us per "
                   f"allreduce back to back, {us(b)} one after the other: {x:.2f}x{short(x, 1.5)}"
                   + (f", {retx} retransmissions" if isinstance(retx, int) else "") + bound)
    v = verdict(measured, ok)
    targets.append((v, f"{kind_name(k)}, back to back: >= 1.5x the algbw of the same "
                    "allreduces one after the other", "; ".join(pts) or "no result"))
for k in TARGET_KINDS:
    if k and k not in b2bs:
        targets.append(("NOT MEASURED", f"{kind_name(k)}, back to back: >= 1.5x the algbw of "
                        "the same allreduces one after the other",
                        "not run (--no-back-to-back)" if k in sweeps else absent([k])))

# Fast without tuning: libtreeduce's defaults within 1.2x the benchmark's settings at MTU 1500
# and 8300, and no retransmission with the defaults.
TUNING_TARGET = ("fast without tuning, kernel UDP hosts, 1 MiB f32 sum: libtreeduce's defaults "
                 "(window, payload from the MTU, adaptive timeout) take <= 1.2x the time of the "
                 "benchmark's settings (64 slots, a fixed 10 ms timeout) at MTU 1500 and 8300, "
                 "without a retransmission")
pts, ok, measured = [], True, bool(tuning)
for mtu in (1500, 8300):
    d = next(iter(tuning.get((mtu, "defaults")) or []), None)
    t = next(iter(tuning.get((mtu, "tuned")) or []), None)
    a = get(d, "treeduce", "time_us") if d and in_network(d) else None
    b = get(t, "treeduce", "time_us") if t and in_network(t) else None
    if a is None or b is None:
        measured = False
        pts.append(f"MTU {mtu}: " + ("not run" if d is None and t is None else "no figure"))
        continue
    retx = d["treeduce"].get("retransmits")
    x = a / b
    ok = ok and x <= 1.2 and retx == 0
    pts.append(f"MTU {mtu}: defaults {us(a)} us with {retx} retransmissions, tuned {us(b)} us "
               f"({t['treeduce'].get('retransmits')}): {x:.2f}x{over(x, 1.2)}")
targets.append((verdict(measured, ok), TUNING_TARGET,
                "; ".join(pts) if tuning else "the tuning runs were not made"))

# The switch at 1 KiB, fan-in 8: ns/pkt <= 1.1x (macswap's + the switch core's), one run.
sw_text, sw_json = read("switchd.json"), None
if sw_text is not None:
    try:
        sw_json = json.loads(sw_text)
    except ValueError as e:
        failures.append(f"switchd.json unreadable ({e})")
sw_target = None
if sw_json is not None:
    sw_target = next((t for t in sw_json.get("target", []) if t.get("dut") == "switch"
                      and t.get("payload") == 1024 and t.get("fanin") == 8), None)
if sw_target is None:
    why = ("the switch benchmark was not run" if sw_text is None and read("switchd.txt") is None
           else "no 1 KiB, fan-in 8 row with switch, macswap and core in the switch benchmark")
    targets.append(("NOT MEASURED", SWITCH_TARGET, why))
else:
    t = sw_target
    ratio, share = t.get("ratio"), t.get("min_cpu_share")
    ns = [t.get(x) for x in ("switch_ns", "macswap_ns", "core_ns")]
    if not all(isinstance(x, (int, float)) for x in ns + [ratio]):
        ratio = None
    fig = (f"{ns[0]:.0f} ns against {ns[1]:.0f} + {ns[2]:.1f} ns = {ratio:.2f}x"
           if ratio is not None else "")
    if not isinstance(ratio, (int, float)):
        targets.append(("NO VERDICT", SWITCH_TARGET, "no undisturbed run of the switch, macswap "
                        "and the core in the same round (every run discarded: another process "
                        "had their CPUs)"))
    elif not t.get("valid"):
        share_s = f"{100 * share:.0f}%" if isinstance(share, (int, float)) else "?"
        targets.append(("NO VERDICT", SWITCH_TARGET, f"{fig}, but a process had only {share_s} "
                        "of its CPU (a verdict needs 95% for each)"))
    else:
        v = "MET" if ratio <= 1.1 else "MISSED"
        targets.append((v, SWITCH_TARGET, f"{fig}{over(ratio, 1.1)}"))

# Where the time goes: the ranks' CPU time per allreduce at the largest size of each kind.
cpu_lines = []
for k in kinds:
    for c, rs in by_kind[k].items():
        r = rs[-1]
        ranks = r.get("ranks") or 0
        parts = []
        for impl, name in IMPLS:
            cpu, tm, per = (get(r, impl, "cpu_us"), get(r, impl, "time_us"),
                            get(r, impl, "cpu_ms_per_MiB"))
            if cpu is None or not tm:
                continue
            s = f"{name} {cpu / 1000:.2f} ms ({num(per)} ms/MiB)"
            if ncpu and ranks:
                s += (f", {ranks} ranks' CPU = {100 * ranks * cpu / (ncpu * tm):.0f}% of the "
                      f"{ncpu} CPUs over its {us(tm)} us")
            parts.append(s)
        if parts:
            cpu_lines.append(f"{kind_name(k)}, {c[0]} {c[1]} at {human(r['size'])}: a rank's "
                             "process CPU per allreduce: " + "; ".join(parts))
    # The switches' CPU time while the ranks ran (treeduce-fabric's line), against the time
    # treeduce's own allreduces took in that run (rows x (iterations + warm-up) x mean time).
    fabric_text = read(f"allreduce-{k}.txt" if k else "allreduce.txt") or ""
    m = re.search(r"switch CPU while the ranks ran: (.*)", fabric_text)
    if m:
        cpu_s = sum(float(x) for x in re.findall(r" ([0-9.]+) s \(", m.group(1)))
        td_s = sum(((r.get("iters") or 0) + (r.get("warmup") or 0))
                   * (get(r, "treeduce", "time_us") or 0) for r in sweeps.get(k, [])) / 1e6
        if cpu_s > 0 and td_s > 0:
            share = (f"at most {100 * cpu_s / td_s:.0f}% of one CPU while treeduce ran"
                     if cpu_s < td_s else
                     "more CPU time than treeduce's allreduces lasted, so its share while they "
                     "ran cannot be told from the rest")
            cpu_lines.append(f"{kind_name(k)}: the switch used {cpu_s:.2f} s of CPU while the "
                             f"ranks ran, and treeduce's allreduces lasted about {td_s:.2f} s of "
                             f"that run (the rest: the baselines, start-up): {share} "
                             f"({m.group(1)})")
    # The machine's CPUs over the same run (every backend): the kernel's interrupt work for the
    # packets is charged to no process, so the processes' CPU times above do not show it.
    m = re.search(r"machine CPU while the ranks ran: (.*)", fabric_text)
    if m:
        cpu_lines.append(f"{kind_name(k)}: the machine's CPUs while the ranks ran (every "
                         f"backend; interrupt work is no process's): {m.group(1)}")

# ---- switch benchmark -------------------------------------------------------------------------
switch_md = []
if sw_json is not None:
    for r in sw_json.get("rows", []):
        row = f"{r.get('dut')} at {r.get('payload')} B, fan-in {r.get('fanin') or '-'}"
        if not r.get("runs_mpps"):
            failures.append(f"switch benchmark: no undisturbed run of {row} (all "
                            f"{r.get('runs_discarded', '?')} discarded: another process had "
                            "the CPUs)")
        elif r.get("mismatches") or r.get("bad_frames") or not r.get("counters_agree"):
            failures.append(f"switch benchmark: checks failed for {row} ({r.get('mismatches')} "
                            f"wrong sums, {r.get('bad_frames')} bad frames, counters "
                            f"{'agree' if r.get('counters_agree') else 'disagree'})")
    if not sw_json.get("ok", False) and not any(x.startswith("switch benchmark") for x in failures):
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
    if sw_json.get("target"):
        switch_md.append("\nPer packet, against I/O + core (the target's figures; a verdict only "
                         "when every process had >= 95% of its CPU):\n")
        switch_md.append("| switch | payload B | fan-in | switch ns/pkt | macswap ns/pkt "
                         "| core ns/pkt | switch / (macswap + core) | least CPU share |")
        switch_md.append("|---|--:|--:|--:|--:|--:|--:|--:|")
        for t in sw_json["target"]:
            def g(key, nd):
                x = t.get(key)
                return f"{x:.{nd}f}" if isinstance(x, (int, float)) else "-"
            share = t.get("min_cpu_share")
            switch_md.append(f"| {t.get('dut')} | {t.get('payload')} | {t.get('fanin')} "
                             f"| {g('switch_ns', 0)} | {g('macswap_ns', 0)} | {g('core_ns', 1)} "
                             f"| {g('ratio', 2)}{'' if t.get('valid') else ' (no verdict)'} "
                             f"| {'-' if share is None else f'{100 * share:.0f}%'} |")
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
    md.append("Not recorded (no runs.tsv): a report from existing results.")

md += ["", "## Targets", "",
       "Each a ratio of times measured in this run, on the same sizes and ranks (x = baseline "
       "time / treeduce time: above 1, treeduce is faster; \"time = Nx\" = treeduce's time / the "
       "baseline's).", ""]
md += [f"- **{v}**: {what}: {detail}" for v, what, detail in targets] or ["- no results"]
if cpu_lines:
    md += ["", "Where the time goes: every rank, the switch, the manager and the baselines' "
           "processes share this machine's CPUs, so a backend whose four ranks keep the CPUs busy "
           "for most of an allreduce is bound by CPU time, not by the network. A rank's process "
           "CPU time (user + system, every thread; the mean over the ranks):", ""]
    md += [f"- {x}" for x in cpu_lines]
    md += ["", "Profiles (where a rank's and the switch's CPU time goes, per function and system "
           "call): docs/performance.md, sections \"Allreduce against Gloo and Open MPI (4 "
           "ranks)\" (its parts \"Issue 16's targets in one report\" and \"Reading\"), "
           "\"Issue 16: back to back, and fast without tuning\", \"AF_XDP hosts (issue 16)\", "
           "\"Issue 16: small messages\", \"Issue 16: fewer copies on the DPDK transport\" and "
           "\"Switch daemon throughput\" (its part \"Issue 16: the switch's per-packet "
           "path\")."]

for k in kinds:
    md += ["", f"## Allreduce, {kind_name(k)}: treeduce against Gloo ring and MPI_Allreduce", ""]
    raw = [f"[allreduce-{k}.jsonl](allreduce-{k}.jsonl)" if k else
           "[allreduce.jsonl](allreduce.jsonl)"]
    txt = f"allreduce-{k}.txt" if k else "allreduce.txt"
    if read(txt) is not None:
        raw.append(f"rank 0's output: [{txt}]({txt})")
    md.append("time = rank 0's mean per operation, min = its fastest iteration, algbw = size / "
              "time; x = baseline time / treeduce time (> 1: treeduce faster); CPU = a rank's "
              "process CPU time per MiB allreduced (ms, the mean over the ranks); retx = rank 0's "
              "retransmissions during the row. Raw: " + ", ".join(raw) + ".")
    for c, rs in by_kind[k].items():
        r0 = rs[0]
        md += ["", f"### {c[0]} {c[1]}: {r0.get('ranks', '?')} ranks, {r0.get('iters', '?')} "
               f"iterations after {r0.get('warmup', '?')} warm-up", ""]
        md.append("| size | treeduce us (min) | GB/s | CPU | retx | path | Gloo us (min) | GB/s "
                  "| CPU | x | MPI us (min) | GB/s | CPU | x | wrong (td/Gloo/MPI) |")
        md.append("|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|")
        for r in rs:
            def t(impl):
                a, m = get(r, impl, "time_us"), get(r, impl, "min_us")
                return us(a) + (f" ({us(m)})" if m is not None else "")
            def sp(impl):
                s = speedup(r, impl)
                return "-" if s is None else f"{s:.2f}x"
            def cpu(impl):
                return num(get(r, impl, "cpu_ms_per_MiB"))
            wrong = "/".join("-" if get(r, i, "wrong") is None else str(int(get(r, i, "wrong")))
                             for i, _ in IMPLS)
            if any(get(r, i, "wrong") for i, _ in IMPLS):
                wrong = f"**{wrong}**"
            retx = r["treeduce"].get("retransmits")
            md.append(f"| {human(r['size'])} | {t('treeduce')} "
                      f"| {num(get(r, 'treeduce', 'algbw_GBps'))} | {cpu('treeduce')} "
                      f"| {retx if isinstance(retx, int) else '-'} "
                      f"| {r['treeduce'].get('path', '?')} | {t('gloo')} "
                      f"| {num(get(r, 'gloo', 'algbw_GBps'))} | {cpu('gloo')} | {sp('gloo')} "
                      f"| {t('mpi')} | {num(get(r, 'mpi', 'algbw_GBps'))} | {cpu('mpi')} "
                      f"| {sp('mpi')} | {wrong} |")
        if plots.get((k, c)):
            md.append("")
            md += [f"![{c[0]} {c[1]}, {k or 'hosts'}: {png}]({png})" for png in plots[(k, c)]]
    rows = b2bs.get(k)
    if rows:
        b2b_n = rows[0].get("back_to_back", "N")
        md += ["", f"### Back to back ({b2b_n} allreduces per iteration)", "",
               f"Per iteration {b2b_n} allreduces into {b2b_n} buffers issued non-blocking "
               "(`iallreduce`) and then waited for, against the same ones one after the other; "
               "times per allreduce; x = sequential time / back-to-back time. Raw: "
               f"[b2b-{k}.jsonl](b2b-{k}.jsonl).", "",
               "| size | type op | back to back us (min) | GB/s | CPU | retx | sequential us (min) "
               "| GB/s | CPU | x | wrong |", "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
        for r in rows:
            def t2(impl):
                a, m = get(r, impl, "time_us"), get(r, impl, "min_us")
                return us(a) + (f" ({us(m)})" if m is not None else "")
            x = get(r, "sequential", "speedup")
            retx = r["treeduce"].get("retransmits")
            wrong = "/".join("-" if get(r, i, "wrong") is None else str(int(get(r, i, "wrong")))
                             for i in ("treeduce", "sequential"))
            md.append(f"| {human(r['size'])} | {r.get('type')} {r.get('op')} | {t2('treeduce')} "
                      f"| {num(get(r, 'treeduce', 'algbw_GBps'))} "
                      f"| {num(get(r, 'treeduce', 'cpu_ms_per_MiB'))} "
                      f"| {retx if isinstance(retx, int) else '-'} | {t2('sequential')} "
                      f"| {num(get(r, 'sequential', 'algbw_GBps'))} "
                      f"| {num(get(r, 'sequential', 'cpu_ms_per_MiB'))} "
                      f"| {'-' if x is None else f'{x:.2f}x'} | {wrong} |")
if tuning:
    md += ["", "## Fast without tuning: kernel UDP hosts, 1 MiB f32 sum", "",
           "libtreeduce's defaults (`--slots 0`: the window its payload gives, 64 slots at "
           "1 KiB payloads and 32 at 8 KiB; the payload from the MTU, 1 KiB at 1500 and 8 KiB "
           "at 8300; the adaptive retransmission timeout) against the benchmark's settings (64 "
           "slots, a fixed 10 ms first timeout), one fabric each. Both with the same payload and "
           "with UDP GSO (the fabric's setting for kernel UDP hosts, not a libtreeduce default: "
           "docs/host.md, `TREEDUCE_UDP_GSO`). retx = rank 0's retransmissions (warm-up "
           "included); x = defaults' time / tuned time.", "",
           "| MTU | settings | time us (min) | GB/s | CPU ms/MiB | retx | x |",
           "|--:|---|--:|--:|--:|--:|--:|"]
    for (mtu, how), rows in sorted(tuning.items()):
        for r in rows:
            tm = get(r, "treeduce", "time_us")
            other = next(iter(tuning.get((mtu, "tuned")) or []), None)
            ot = get(other, "treeduce", "time_us") if other else None
            x = f"{tm / ot:.2f}x" if how == "defaults" and tm and ot else "-"
            retx = r["treeduce"].get("retransmits")
            md.append(f"| {mtu} | {how} | {us(tm)} ({us(get(r, 'treeduce', 'min_us'))}) "
                      f"| {num(get(r, 'treeduce', 'algbw_GBps'))} "
                      f"| {num(get(r, 'treeduce', 'cpu_ms_per_MiB'))} "
                      f"| {retx if isinstance(retx, int) else '-'} | {x} |")
md += ["", "## Switch daemon throughput (treeduce-bench-switchd)", ""] + switch_md
if failures:
    for k in kinds:
        tail = read(f"allreduce-{k}.txt" if k else "allreduce.txt")
        if tail:
            md += ["", f"## Last lines of the allreduce run ({k or 'hosts'})", "", "```"]
            md += tail.rstrip().splitlines()[-30:]
            md.append("```")
md.append("")
with open(path("report.md"), "w") as f:
    f.write("\n".join(md))

for v, what, _ in targets:
    print(f"bench: target {v}: {what}", file=sys.stderr)
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

# The allreduce comparisons, one fabric per host kind, then back to back on the same kind: rank 0's
# output streams to the terminal and to allreduce-KIND.txt (b2b-KIND.txt).
if [ ${#perf_args[@]} -eq 0 ]; then
  if [ "$quick" -eq 1 ]; then
    perf_args=(-b 256 -e 1048576 -f 4 -d f32 -o sum -n 5 -w 1)
  else
    perf_args=(-b 256 -e 16777216 -f 4 -d f32 -o sum -n 20 -w 3)
  fi
fi
b2b_n=32
if [ "$quick" -eq 1 ]; then
  b2b_args=(-b 262144 -e 262144 -d f32 -o sum -n 2 -w 1 --back-to-back "$b2b_n")
else
  b2b_args=(-b 262144 -e 262144 -d f32 -o sum -n 10 -w 2 --back-to-back "$b2b_n")
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "bench.sh: the fabric needs root: run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
# fabric STAGE NAME FABRIC-OPTIONS... -- PERF-ARGS...: one treeduce-fabric run, into NAME.txt and
# NAME.jsonl (made here, so that they stay ours when the fabric, as root, writes them).
tuned=(--mtu 8300 --payload 8192 --slots 64 --rto-us 10000)  # the benchmark's settings
fabric() {
  local stage=$1 name=$2
  shift 2
  : >"$out/$name.jsonl"
  local cmd=("$builddir/lab/tools/treeduce-fabric" --topology "$topology"
    --json-out "$out/$name.jsonl" "$@")
  echo "== $stage: ${cmd[*]}" >&2
  set +e
  "${sudo[@]}" "${cmd[@]}" 2>&1 | tee "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  set -e
  record "$stage" "$rc" "${sudo[*]}${sudo[*]:+ }${cmd[*]}"
}
for kind in "${kinds[@]}"; do
  fabric "allreduce $kind" "allreduce-$kind" --hosts "$kind" "${tuned[@]}" --compare gloo,mpi \
    -- "${perf_args[@]}"
  if [ "$b2b" -eq 1 ]; then
    fabric "back-to-back $kind" "b2b-$kind" --hosts "$kind" "${tuned[@]}" -- "${b2b_args[@]}"
  fi
done
# Fast without tuning: 1 MiB on kernel UDP hosts (libtreeduce's default transport) with
# libtreeduce's own defaults (window, payload from the MTU, adaptive retransmission timeout)
# against the benchmark's settings, at MTU 1500 and 8300.
if [ "$tuning" -eq 1 ]; then
  one_mib=(-b 1048576 -e 1048576 -d f32 -o sum -n "$([ "$quick" -eq 1 ] && echo 5 || echo 20)"
    -w 3)
  for mtu in 1500 8300; do
    fabric "defaults mtu $mtu" "tuning-$mtu-defaults" --hosts udp --mtu "$mtu" --slots 0 \
      -- "${one_mib[@]}"
    fabric "tuned mtu $mtu" "tuning-$mtu-tuned" --hosts udp --mtu "$mtu" --slots 64 \
      --rto-us 10000 -- "${one_mib[@]}"
  done
fi

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
