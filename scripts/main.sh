#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a verified allreduce sweep on a
# `treeduce lab` (docs/lab.md): `treeduce lab up` of lab/examples/main-two-level.yaml (a manager,
# three treeduce-switch processes in a 2-level tree, four host namespaces), `treeduce lab run` of
# treeduce-perf (libtreeduce) on the four ranks with the table printed as it goes, a check of every
# rank's verification line, and `treeduce lab down` on success, failure or Ctrl-C.
#   scripts/main.sh [--loss 0.02] [--mtu 1500] [--topology leaf] [--keep-logs] [-- perf args]
# --help lists every option. (The allreduce benchmark, with Gloo/MPI and DPDK hosts, is
# scripts/bench.sh on lab/tools/treeduce-fabric; kernels: build/bench/treeduce-bench-kernels.)
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  cat <<'EOF'
usage: scripts/main.sh [options] [-- treeduce-perf arguments]

Brings up a treeduce lab (manager, treeduce-switch processes, 4 host namespaces), runs
treeduce-perf on its 4 ranks with `treeduce lab run`, checks every rank's verification and
takes the lab down (also on failure and Ctrl-C). Needs root for the namespaces (uses sudo).

  --topology T        two-level (lab/examples/main-two-level.yaml: leaf0 + leaf1 + spine,
                      the default) or leaf (`lab up --leaf 4`: one switch)
  --loss F            every switch port drops this fraction of what it receives (0 to 0.99)
  --mtu M             MTU of the data links, 1280 to 8400 (default 8300: jumbo frames)
  --payload B         payload bytes per packet, a power of two 256 to 8192
                      (default: the largest that fits the MTU)
  --slots N           window each rank asks for, a power of two 1 to 4096 (default 64)
  --no-gso            the ranks send without UDP GSO (default: GSO, cut by the hosts' veths)
  --idle-sleep-us US  the switches' longest idle sleep (default 200; 0 busy-polls)
  --name NAME         the lab's name (default main)
  --keep-logs         keep the lab's directory (logs, configurations, `lab status`) in
                      /tmp/treeduce-main.* (it is kept on a failure anyway)
  -h, --help          this help

treeduce-perf's default arguments:
  -b 4096 -e 4194304 -f 8 -d f32,bf16,f16,e4m3,e5m2,i32 -o sum,max -n 5 -w 1
Gloo/MPI baselines and DPDK hosts are the benchmark's: scripts/bench.sh.
EOF
}

die_usage() {
  echo "main.sh: $1" >&2
  echo "(scripts/main.sh --help lists the options)" >&2
  exit 2
}

is_pow2() { [[ "$1" =~ ^[0-9]+$ ]] && [ "$1" -gt 0 ] && [ $(($1 & ($1 - 1))) -eq 0 ]; }

topology=two-level loss="" mtu=8300 payload="" slots=64 gso=1 idle_sleep="" name=main keep_logs=0
perf_args=(-b 4096 -e 4194304 -f 8 -d f32,bf16,f16,e4m3,e5m2,i32 -o sum,max -n 5 -w 1)
args=("$@")
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; perf_args=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    --topology | --loss | --mtu | --payload | --slots | --idle-sleep-us | --name)
      [ $# -ge 2 ] || die_usage "$1 needs a value."
      case "$1" in
        --topology) topology=$2 ;;
        --loss) loss=$2 ;;
        --mtu) mtu=$2 ;;
        --payload) payload=$2 ;;
        --slots) slots=$2 ;;
        --idle-sleep-us) idle_sleep=$2 ;;
        --name) name=$2 ;;
      esac
      shift 2 ;;
    --no-gso) gso=0; shift ;;
    --gso) gso=1; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    --hosts | --compare | --json-out | --rto-us)
      die_usage "$1 is the benchmark's: scripts/bench.sh (or lab/tools/treeduce-fabric $1)." ;;
    *) die_usage "unknown option '$1'." ;;
  esac
done
case "$topology" in
  two-level | leaf) ;;
  *) die_usage "--topology is two-level or leaf, not '$topology'." ;;
esac
if [ -n "$loss" ] && ! [[ "$loss" =~ ^[0-9]*\.?[0-9]+$ ]] ||
  ! awk -v f="${loss:-0}" 'BEGIN { exit !(f >= 0 && f <= 0.99) }'; then
  die_usage "--loss is a fraction from 0 to 0.99, not '$loss'."
fi
if ! [[ "$mtu" =~ ^[0-9]+$ ]] || [ "$mtu" -lt 1280 ] || [ "$mtu" -gt 8400 ]; then
  die_usage "--mtu is 1280 to 8400, not '$mtu'."
fi
# IPv4 + UDP + the treeduce header around the payload: every datagram goes with DF set.
overhead=60
if [ -z "$payload" ]; then
  payload=8192
  while [ $((payload + overhead)) -gt "$mtu" ]; do payload=$((payload / 2)); done
elif ! is_pow2 "$payload" || [ "$payload" -lt 256 ] || [ "$payload" -gt 8192 ]; then
  die_usage "--payload is a power of two from 256 to 8192, not '$payload'."
elif [ $((payload + overhead)) -gt "$mtu" ]; then
  die_usage "a $payload-byte payload needs an MTU of at least $((payload + overhead)), not $mtu."
fi
if ! is_pow2 "$slots" || [ "$slots" -gt 4096 ]; then
  die_usage "--slots is a power of two from 1 to 4096, not '$slots'."
fi
if [ -n "$idle_sleep" ] &&
  { ! [[ "$idle_sleep" =~ ^[0-9]+$ ]] || [ "$idle_sleep" -gt 100000 ]; }; then
  die_usage "--idle-sleep-us is 0 to 100000, not '$idle_sleep'."
fi

# Packages and the build, as the user who ran us (root re-runs only the lab part).
if [ "${TREEDUCE_MAIN_BUILT:-}" != 1 ]; then
  . scripts/deps.sh
  treeduce_install_deps
  [ -f build/build.ninja ] || meson setup build >/dev/null
  echo "[0/3] building (ninja -C build) ..."
  ninja -C build >/dev/null
fi

# Network namespaces and veth pairs need root.
if [ "$(id -u)" -ne 0 ]; then
  exec sudo env TREEDUCE_MAIN_BUILT=1 "$BASH" "$PWD/scripts/main.sh" "${args[@]}"
fi

# What a user runs, installed (prefix /usr/local unless `meson setup --prefix` said otherwise):
# the treeduce CLI, the switch, the manager, libtreeduce and its headers and pkg-config file, and
# what their meson files install beside them (docs/install.md lists it).
if [ "${TREEDUCE_MAIN_INSTALL:-1}" = 1 ]; then
  if ! meson install -C build --no-rebuild --quiet >"${TMPDIR:-/tmp}/treeduce-install.log" 2>&1; then
    echo "main job: FAILED (meson install -C build; its output is in" \
      "${TMPDIR:-/tmp}/treeduce-install.log)" >&2
    exit 1
  fi
  command -v ldconfig >/dev/null 2>&1 && ldconfig
  echo "      installed under $(meson introspect build --buildoptions |
    python3 -c 'import json,sys; print(next(o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"))')" \
    "(TREEDUCE_MAIN_INSTALL=0 skips it)"
fi

cli=$PWD/build/control/cli/treeduce
perf=$PWD/build/host/treeduce-perf
hosts=(h0 h1 h2 h3)
lab_dir=${TREEDUCE_LAB_ROOT:-/run/treeduce/lab}/$name
tmp=$(mktemp -d /tmp/treeduce-main-run.XXXXXX)
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs_since() { local d=$(($(now_ms) - $1)); printf '%d.%d' $((d / 1000)) $((d % 1000 / 100)); }

# Ctrl-C or SIGTERM: the command that runs (lab up, lab run) stops by itself, then the lab goes;
# the exit status is then 128 + the signal (130, 143).
interrupted=0 child="" owned=0 taken_down=0
on_signal() {
  [ "$interrupted" -ne 0 ] || interrupted=$2
  if [ -n "$child" ]; then kill "-$1" "$child" 2>/dev/null || true; fi
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM

keep_lab_dir() {
  local keep
  keep=$(mktemp -d /tmp/treeduce-main.XXXXXX)
  "$cli" lab status --name "$name" >"$keep/status.txt" 2>&1 || true
  cp -a "$lab_dir/." "$keep/" 2>/dev/null || true
  echo "      the lab's logs, configurations and status are in $keep"
}

take_down() {
  [ "$owned" -eq 1 ] && [ "$taken_down" -eq 0 ] || return 0
  taken_down=1
  if ! "$cli" lab down --name "$name" >/dev/null; then
    echo "main.sh: \`treeduce lab down --name $name\` failed; run it again to remove the lab" >&2
    return 1
  fi
}
stop_if_interrupted() {
  [ "$interrupted" -ne 0 ] || return 0
  echo "interrupted: taking the lab down"
  take_down
  echo "main job: interrupted; lab removed"
  exit "$interrupted"
}
# Whatever ends the script (an unexpected error too) takes the lab down.
trap 'take_down; rm -rf "$tmp"' EXIT

if [ "$topology" = leaf ]; then
  up_args=(--leaf 4)
  shape="leaf0 (treeduce-switch)"
else
  up_args=("$PWD/lab/examples/main-two-level.yaml")
  shape="leaf0 + leaf1 + spine (treeduce-switch on memif and af_packet)"
fi
up_args+=(--name "$name" --mtu "$mtu")
[ -n "$loss" ] && up_args+=(--loss "$loss")
[ -n "$idle_sleep" ] && up_args+=(--idle-sleep-us "$idle_sleep")
loss_text=""
if [ -n "$loss" ] && awk -v f="$loss" 'BEGIN { exit !(f > 0) }'; then
  loss_text=", $(awk -v f="$loss" 'BEGIN { printf "%g", f * 100 }') % loss on every link"
fi
gso_text=""
[ "$gso" -eq 1 ] && gso_text=", UDP GSO"

echo "[1/3] treeduce lab up '$name': manager, $shape, 4 host namespaces (kernel UDP on veth to" \
  "af_packet, MTU $mtu, $payload-byte payloads, $slots-slot window$gso_text)$loss_text ..."
set +e
"$cli" lab up "${up_args[@]}" >"$tmp/up.out" 2>"$tmp/up.err"
rc=$?
set -e
if [ "$rc" -eq 0 ]; then owned=1; fi
stop_if_interrupted
if [ "$rc" -ne 0 ]; then
  # A failed up removes what it made (docs/lab.md); its sentence says why.
  sed 's/^/      /' "$tmp/up.err" >&2
  echo "main job: FAILED (treeduce lab up exited with $rc)" >&2
  exit 1
fi
sed -n '1s/^/      /p' "$tmp/up.out"
echo "      state and logs in $lab_dir" \
  "(\`${SUDO_USER:+sudo }$cli lab status --name $name\` while it runs)"

# UDP GSO needs the hosts' veths to cut the super-datagrams (a veth passes them on whole):
# segmentation offload off in every host, as treeduce-fabric does.
if [ "$gso" -eq 1 ]; then
  for h in "${hosts[@]}"; do
    [ "$interrupted" -eq 0 ] || break
    if ! "$cli" lab exec --name "$name" "$h" -- ethtool -K eth0 \
      tx-udp-segmentation off >"$tmp/ethtool.out" 2>&1 && [ "$interrupted" -eq 0 ]; then
      cat "$tmp/ethtool.out" >&2
      echo "main.sh: cannot turn UDP segmentation offload off on $h's veth" \
        "(is ethtool installed?)" >&2
      keep_lab_dir
      echo "main job: FAILED (see above)"
      exit 1
    fi
  done
fi

stop_if_interrupted

echo "[2/3] allreduce: treeduce lab run of treeduce-perf on ${hosts[*]} (4 ranks, libtreeduce)," \
  "every result checked"
t0=$(now_ms)
# Rank 0's lines are the table: shown without their [h0] prefix, the other lines as they come.
# The filter ignores Ctrl-C and SIGTERM and reads until lab run, which they stop, is done.
mkfifo "$tmp/run.fifo"
(
  trap '' INT TERM
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$tmp/run.log"
    case "$line" in
      "[h0] "*) printf '%s\n' "${line#\[h0\] }" ;;
      *) printf '      %s\n' "$line" ;;
    esac
  done <"$tmp/run.fifo"
) &
filter=$!
run_env=(TREEDUCE_PAYLOAD_BYTES="$payload" TREEDUCE_SLOTS="$slots" TREEDUCE_UDP_GSO="$gso")
# A session of its own: Ctrl-C reaches lab run once, from on_signal, not also from the terminal.
setsid env "${run_env[@]}" "$cli" lab run --name "$name" --hosts "$(IFS=,; echo "${hosts[*]}")" \
  -- "$perf" "${perf_args[@]}" >"$tmp/run.fifo" 2>&1 </dev/null &
child=$!
while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done
set +e
wait "$child"
rc=$?
set -e
child=""
wait "$filter" || true

# The verification: lab run's status, rank 0's summary and every rank's own account.
failed=""
[ "$rc" -eq 0 ] || failed="treeduce lab run exited with $rc"
summary=$(sed -n 's/^\[h0\] # verified: //p' "$tmp/run.log" | tail -n 1)
if [ -z "$failed" ] && [[ ! "$summary" =~ ^0\ wrong\ elements ]]; then
  failed="rank 0 printed no '# verified: 0 wrong elements' line"
fi
for r in 0 1 2 3; do
  own="^\[${hosts[$r]}\] treeduce-perf: rank $r: 0 failed operations, 0 wrong elements"
  if [ -z "$failed" ] && ! grep -q "$own" "$tmp/run.log"; then
    failed="rank $r (${hosts[$r]}) did not report 0 failed operations and 0 wrong elements"
  fi
done
[ "$interrupted" -eq 0 ] || failed=interrupted

echo "[3/3] treeduce lab down ($(secs_since "$t0") s of allreduce)"
if [ -n "$failed" ] && [ "$failed" != interrupted ]; then
  keep_logs=1
fi
if [ "$keep_logs" -eq 1 ]; then keep_lab_dir; fi
take_down || failed=${failed:-"treeduce lab down failed"}
if [ "$failed" = interrupted ]; then
  echo "main job: interrupted; lab removed"
  exit "$interrupted"
elif [ -n "$failed" ]; then
  echo "main job: FAILED ($failed); lab removed" >&2
  exit 1
fi
echo "main job: every allreduce verified (${summary%%;*}); lab removed"
