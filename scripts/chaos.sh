#!/usr/bin/env bash
# Chaos soak (issue 19; docs/lab.md, "Chaos soak"): a lab with several jobs looping exact
# allreduces (scripts/chaos_rank.c) while random faults hit it, then checks that nothing was
# wrong, nothing hung beyond the documented bound and nothing was left behind.
#
#   scripts/chaos.sh [--duration S | --faults N] [--seed N] [--build DIR] [--name LAB]
#                    [--topology ARGS] [--keep-logs DIR] [--skip-unless-root]
#
# Faults (kinds drawn from the seed, as are their targets and times; the same seed gives the same
# schedule): kill -9 of a switch (restarted after a pause), of the manager (restarted from its
# database), of a rank (its job ends; a new job takes its hosts), a loss burst on a link, a link
# flap (down, then up). Exit status 0 when every completed collective was exact (in the network
# or, said loudly, on the hosts), none took longer than the bound, every job ended by itself
# after the faults stopped, and the manager and every switch hold no job, tree, slot or lease;
# 1 otherwise; 2 on a bad command line (77, meson's skip, without root and --skip-unless-root:
# the slow suite's lab-chaos). Needs root (network namespaces); run it under
# `flock /tmp/treeduce-netns.lock` where other labs may start. --keep-logs DIR keeps the ranks'
# output, the fault log and the lab's own logs (switches, manager) there.
set -euo pipefail

duration=600
faults=0
seed=""
build=""
name="chaos"
topology="--fat-tree 4"
keep_logs=""
skip_unless_root=0
op_timeout_ms=20000
join_timeout_ms=20000
# Collectives per job run: a job that fell back stays on the host path, so jobs end and start
# again (a new tree each time, which the leftover checks then cover too).
per_run=1000
usage() {
  sed -n '6,7p' "$0" | sed 's/^# //' >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --duration) duration=${2:?}; faults=0; shift 2 ;;
    --faults) faults=${2:?}; shift 2 ;;
    --seed) seed=${2:?}; shift 2 ;;
    --build) build=${2:?}; shift 2 ;;
    --name) name=${2:?}; shift 2 ;;
    --topology) topology=${2:?}; shift 2 ;;
    --keep-logs) keep_logs=${2:?}; shift 2 ;;
    --skip-unless-root) skip_unless_root=1; shift ;;
    -h | --help) usage ;;
    *) echo "chaos.sh: unknown argument '$1'." >&2; usage ;;
  esac
done
for v in "$duration" "$faults"; do
  [[ $v =~ ^[0-9]+$ ]] || { echo "chaos.sh: --duration and --faults take a whole number." >&2; exit 2; }
done
[ -n "$seed" ] || seed=$(( $(date +%s) % 1000000 ))
[[ $seed =~ ^[0-9]+$ ]] || { echo "chaos.sh: --seed takes a whole number." >&2; exit 2; }
if [ "$(id -u)" -ne 0 ] && [ "$skip_unless_root" -eq 1 ]; then
  echo "chaos.sh: skipped: needs root (network namespaces)." >&2
  exit 77
fi
[ "$(id -u)" -eq 0 ] || { echo "chaos.sh needs root (network namespaces); run it with sudo." >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
[ -n "$build" ] || build=$root/build
build=$(cd "$build" && pwd)
cli=$build/control/cli/treeduce
for f in "$cli" "$build/dataplane/switchd/treeduce-switch" "$build/control/treeduce-manager" \
  "$build/host/treeduce-uninstalled.pc"; do
  [ -e "$f" ] || { echo "chaos.sh: $f is missing; build it (docs/lab.md, \"Chaos soak\")." >&2; exit 2; }
done

# The bound on one collective (docs/host.md section 5, docs/lab.md "Chaos soak"): an in-network
# attempt ends within op_timeout_ms, and its fallback on the hosts within Gloo's timeout, the larger
# of join_timeout_ms and op_timeout_ms. Anything longer is a hang.
bound_ms=$(( op_timeout_ms + (join_timeout_ms > op_timeout_ms ? join_timeout_ms : op_timeout_ms) ))

work=$(mktemp -d /tmp/treeduce-chaos.XXXXXX)
lab() { "$cli" lab "$@" --name "$name"; }
job_pids=()
cleanup() {
  touch "$work/stop" 2>/dev/null || true
  for p in "${job_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [ -n "$keep_logs" ] && [ -n "${state:-}" ]; then
    mkdir -p "$work/lab" && cp "$(dirname "$state")"/*.log "$work/lab/" 2>/dev/null || true
  fi
  lab down >/dev/null 2>&1 || true
  if [ -n "$keep_logs" ]; then mkdir -p "$keep_logs" && cp -r "$work"/. "$keep_logs"/ || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

PKG_CONFIG_PATH=$build/host cc -O2 "$root/scripts/chaos_rank.c" \
  $(PKG_CONFIG_PATH=$build/host pkg-config --cflags --libs treeduce) -o "$work/chaos_rank"

echo "chaos: seed $seed ($( [ "$faults" -gt 0 ] && echo "$faults faults" || echo "${duration} s")," \
  "lab '$name': $topology); collective bound $bound_ms ms"
# shellcheck disable=SC2086
lab up $topology >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
state=${TREEDUCE_LAB_ROOT:-/run/treeduce/lab}/$name/state.json
mapfile -t hosts < <(jq -r '.hosts[].name' "$state")
mapfile -t switches < <(jq -r '.switches[].name' "$state")
mapfile -t links < <("$cli" lab status --name "$name" 2>/dev/null |
  awk '/^LINK /{on=1; next} on && NF==0 {on=0} on {print $1}')
manager=$(jq -r '.manager' "$state")
[ "${#hosts[@]}" -ge 4 ] || { echo "chaos.sh: the topology needs at least 4 hosts." >&2; exit 2; }

# Jobs: the first half of the hosts, then pairs of the rest (the last one takes what is left), each
# spread over the leaves as the topology lists the hosts (every other host first).
spread=()
for ((i = 0; i < ${#hosts[@]}; i += 2)); do spread+=("${hosts[i]}"); done
for ((i = 1; i < ${#hosts[@]}; i += 2)); do spread+=("${hosts[i]}"); done
groups=()
half=$(( ${#spread[@]} / 2 ))
groups+=("$(IFS=,; echo "${spread[*]:0:half}")")
for ((i = half; i < ${#spread[@]}; i += 2)); do
  n=2; [ $(( i + 3 )) -gt ${#spread[@]} ] && n=$(( ${#spread[@]} - i ))
  groups+=("$(IFS=,; echo "${spread[*]:i:n}")")
  [ "$n" -gt 2 ] && break
done

# job_loop J HOSTS: job J's runs, one after another until the stop file exists.
job_loop() {
  local j=$1 hosts=$2 run=0
  while [ ! -e "$work/stop" ]; do
    run=$(( run + 1 ))
    echo "job$j run $run on $hosts" >>"$work/runs.log"
    "$cli" lab run --name "$name" --hosts "$hosts" --master-port $(( 29500 + j )) -- \
      "$work/chaos_rank" --stop "$work/stop" --tag "job$j.$run" \
      --op-timeout-ms "$op_timeout_ms" --join-timeout-ms "$join_timeout_ms" \
      --collectives "$per_run" \
      >>"$work/job$j.log" 2>&1 || true
  done
}
for j in "${!groups[@]}"; do
  job_loop "$j" "${groups[j]}" &
  job_pids+=($!)
  echo "chaos: job$j on ${groups[j]}"
done

# The fault schedule: bash's RANDOM seeded, so that a seed gives one schedule.
RANDOM=$seed
declare -A fault_count=()
# pick ARRAY sets target (no $(...): a subshell reseeds RANDOM, which would break the schedule)
pick() { local -n a=$1; target=${a[RANDOM % ${#a[@]}]}; }
pause() { sleep "$(( $1 + RANDOM % ($2 - $1 + 1) ))"; }
inject() {
  local kind=$1 target
  case $kind in
    kill-switch)
      pick switches
      echo "chaos: fault $n: kill -9 switch $target"
      lab fault kill "$target" >/dev/null || return 1
      pause 1 5
      lab fault restart "$target" >/dev/null || return 1 ;;
    kill-manager)
      echo "chaos: fault $n: kill -9 manager"
      lab fault kill manager >/dev/null || return 1
      pause 1 5
      lab fault restart manager >/dev/null || return 1 ;;
    kill-rank)
      local j=$(( RANDOM % ${#groups[@]} )) r=$(( RANDOM % 2 ))
      local pids
      # the pids of job j's ranks (their --tag names the job), in rank order as lab run starts them
      mapfile -t pids < <(pgrep -f -- "^$work/chaos_rank .*--tag job$j\\." | sort -n)
      if [ "${#pids[@]}" -gt "$r" ]; then
        echo "chaos: fault $n: kill -9 a rank of job$j (pid ${pids[r]})"
        kill -9 "${pids[r]}" 2>/dev/null || true
      else
        echo "chaos: fault $n: kill -9 a rank of job$j: none running (between runs)"
      fi ;;
    loss-burst)
      pick links
      local loss=$(( 10 + RANDOM % 41 ))
      echo "chaos: fault $n: loss 0.$loss on link $target"
      lab fault set "$target" --loss "0.$loss" >/dev/null || return 1
      pause 2 6
      lab fault clear "$target" >/dev/null || return 1 ;;
    link-flap)
      pick links
      echo "chaos: fault $n: link $target down"
      lab fault down "$target" >/dev/null || return 1
      pause 1 4
      lab fault up "$target" >/dev/null || return 1 ;;
  esac
  fault_count[$kind]=$(( ${fault_count[$kind]:-0} + 1 ))
}
kinds=(kill-switch kill-manager kill-rank loss-burst link-flap)
start=$SECONDS
n=0
fault_errors=0
sleep 5  # the jobs join first
while :; do
  if [ "$faults" -gt 0 ]; then [ "$n" -lt "$faults" ] || break
  else [ $(( SECONDS - start )) -lt "$duration" ] || break; fi
  n=$(( n + 1 ))
  kind=${kinds[RANDOM % ${#kinds[@]}]}
  if ! inject "$kind" 2>>"$work/faults.err"; then
    echo "chaos: fault $n ($kind) could not be injected or undone: $(tail -1 "$work/faults.err")"
    fault_errors=$(( fault_errors + 1 ))
  fi
  pause 2 8
done
echo "chaos: faults stopped after $(( SECONDS - start )) s; stopping the jobs"
lab fault clear >/dev/null 2>&1 || true
# Let every job that started after the last fault run a few collectives, then stop them all.
sleep 5
touch "$work/stop"
# A job must end within the bound of the collective it is in, plus its leave.
hangs=0
deadline=$(( SECONDS + bound_ms / 1000 + 30 ))
for p in "${job_pids[@]}"; do
  while kill -0 "$p" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 1; done
  if kill -0 "$p" 2>/dev/null; then
    echo "chaos: a job loop (pid $p) still runs $(( bound_ms / 1000 + 30 )) s after the stop: HANG"
    hangs=$(( hangs + 1 ))
  fi
done

# Outcomes, from every rank's lines.
cat "$work"/job*.log >"$work/all.log"
count() { grep -c -E "^\[[^]]*\] chaos: \S+ rank [0-9]+ $1" "$work/all.log" || true; }
ok_net=$(count "collective [0-9]+ ok-network")
ok_host=$(count "collective [0-9]+ ok-host")
failed=$(count "(collective|vote) [0-9]+ failed")
wrong=$(count "collective [0-9]+ WRONG")
join_failed=$(count "join failed")
slow=$(awk -v b="$bound_ms" '$2=="chaos:" && $6=="collective" && $9+0 > b' "$work/all.log" | wc -l)
hangs=$(( hangs + slow ))
runs=$(wc -l <"$work/runs.log")

# Nothing left behind: the manager's jobs, trees, slots and the switches' trees, once the leases
# of killed ranks have run out. Polled until clean or 60 s (the manager's lease is 5 s).
leftovers() {
  local out=""
  if ! "$cli" lab status --name "$name" >"$work/status.log" 2>&1; then
    out+="lab status says the lab is not healthy; "
  fi
  local jobs res sws
  # The manager takes queries of every job from the lab's admin identity only (docs/lab.md, "TLS").
  local tls=${state%/state.json}/tls
  local q=(env TREEDUCE_TLS_CA="$tls/ca.pem" TREEDUCE_TLS_CERT="$tls/admin.pem"
    TREEDUCE_TLS_KEY="$tls/admin.key" "$cli" -m "$manager" --json)
  jobs=$("${q[@]}" jobs 2>&1) || { echo "manager: $jobs"; return; }
  res=$("${q[@]}" resources 2>&1) || { echo "manager: $res"; return; }
  sws=$("${q[@]}" switches 2>&1) || { echo "manager: $sws"; return; }
  out+=$(jq -r '.[] | select(.state=="running" or .state=="gathering" or .tree_id!=null) |
    "job \(.job) \(.state) with tree \(.tree_id); "' <<<"$jobs")
  out+=$(jq -r '.[] | select(.trees_used!=0 or .slots_used!=0 or .bytes_used!=0) |
    "manager: \(.switch) \(.trees_used) trees, \(.slots_used) slots, \(.bytes_used) bytes; "' <<<"$res")
  out+=$(jq -r '.[] | select(.state!="up") | "manager: switch \(.switch) \(.state); "' <<<"$sws")
  local s port t
  while read -r s port; do
    t=$(curl -s "http://127.0.0.1:$port/metrics" | awk '$1 ~ /^treeduce_switch_trees({|$)/ {print $2}')
    [ "$t" = "0" ] || out+="switch $s: treeduce_switch_trees ${t:-unreadable}; "
  done < <(jq -r '.switches[] | "\(.name) \(.metrics_port)"' "$state")
  echo "$out"
}
left=""
settle=$(( SECONDS + 60 ))
while :; do
  left=$(leftovers)
  [ -n "$left" ] && [ "$SECONDS" -lt "$settle" ] || break
  sleep 2
done

fault_summary=""
for k in "${kinds[@]}"; do fault_summary+="$k ${fault_count[$k]:-0}, "; done
echo "chaos: seed $seed: $n faults (${fault_summary%, }; $fault_errors not injected or undone)"
echo "chaos: $runs job runs; $(( ok_net + ok_host + failed + wrong )) collectives over all ranks:" \
  "ok-network $ok_net, ok-host $ok_host, failed $failed, WRONG $wrong; joins failed $join_failed;" \
  "hangs $hangs (bound $bound_ms ms)"
echo "chaos: left behind: ${left:-nothing}"
status=0
if [ "$wrong" -ne 0 ]; then
  grep -E "collective [0-9]+ WRONG" "$work/all.log" | head -5
  status=1
fi
if [ "$hangs" -ne 0 ]; then
  awk -v b="$bound_ms" '$2=="chaos:" && $6=="collective" && $9+0 > b' "$work/all.log" | head -5
  status=1
fi
[ -z "$left" ] || status=1
[ "$fault_errors" -eq 0 ] || status=1
# A soak in which nothing reduced in the network tested nothing.
[ "$ok_net" -gt 0 ] || { echo "chaos: no collective completed in the network"; status=1; }
echo "chaos: $([ $status -eq 0 ] && echo PASS || echo FAIL)"
exit $status
