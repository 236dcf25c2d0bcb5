#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run): installs what is missing, then
#   1. release build: every suite (unit, integration, slow), then `meson install` of it;
#   2. debug build with AddressSanitizer + UndefinedBehaviorSanitizer: every suite but slow;
#   3. clang build of the libFuzzer targets (ASan + UBSan): a short fuzz run of each.
# Ends with one line "tests: N passed, N failed, N skipped" over all builds; exits non-zero when
# anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/deps.sh
treeduce_install_deps

jobs=$(nproc)
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}

status=0
built=" "  # the build directories whose build succeeded
# run_build DIR TARGET [meson test args...] -- [setup args...]; TARGET "all" builds everything.
run_build() {
  local dir=$1 target=$2
  shift 2
  local test_args=() setup_args=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do test_args+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  setup_args=("$@")
  echo "== $dir: build" >&2
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "${setup_args[@]}" >/dev/null
  else
    meson setup "$dir" "${setup_args[@]}" >/dev/null
  fi
  local targets=() started=$SECONDS
  [ "$target" = all ] || targets=("$target")
  if ! ninja -C "$dir" -j "$jobs" "${targets[@]}" >/dev/null; then
    echo "== $dir: BUILD FAILED" >&2
    ninja -C "$dir" -j1 "${targets[@]}" | tail -40
    status=1
    return
  fi
  built+="$dir "
  echo "== $dir: built in $((SECONDS - started)) s; test" >&2
  started=$SECONDS
  meson test -C "$dir" --no-rebuild --print-errorlogs --num-processes "$jobs" "${test_args[@]}" ||
    status=1
  echo "== $dir: tested in $((SECONDS - started)) s" >&2
}

run_build build all -- -Dbuildtype=release
# What a user runs is installed by this command too (as by scripts/main.sh; docs/install.md).
# (whatever the tests said, once the build succeeded; not `ninja -n` saying 'no work to do': the
# Python package's site directory is rebuilt on every run, so that never came and nothing was
# installed).
if [ "${TREEDUCE_TEST_INSTALL:-1}" = 1 ] && [[ "$built" == *" build "* ]]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  echo "== build: install" >&2
  if ! "${sudo[@]}" meson install -C build --no-rebuild --quiet >build/meson-logs/install.log 2>&1; then
    echo "== build: INSTALL FAILED (build/meson-logs/install.log)" >&2
    tail -20 build/meson-logs/install.log
    status=1
  else
    "${sudo[@]}" ldconfig 2>/dev/null || true
  fi
fi
# Unoptimised and sanitized, every test runs several times slower: the timeouts, guards against
# hangs, scale with it, and the longest randomized tests check fewer random cases
# (tests/sanitized.h). -O1 would run them 2-3x faster but takes three times as long to build.
run_build build-asan all --no-suite slow --timeout-multiplier 3 -- -Dbuildtype=debug \
  -Db_sanitize=address,undefined -Db_lundef=false -Dbenchmarks=false
CXX=clang++ run_build build-fuzz fuzz-targets --suite fuzz -- -Dfuzz=enabled \
  -Dbenchmarks=false -Db_sanitize=address,undefined -Db_lundef=false

python3 - build build-asan build-fuzz <<'PY'
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for d in sys.argv[1:]:
    try:
        lines = open(f"{d}/meson-logs/testlog.json").read().splitlines()
    except OSError:
        counts["failed"] += 1
        continue
    for line in lines:
        r = json.loads(line)["result"]
        counts["passed" if r in ("OK", "EXPECTEDFAIL") else "skipped" if r == "SKIP" else "failed"] += 1
print(f"tests: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
PY
exit $status
