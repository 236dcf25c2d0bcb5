#!/usr/bin/env bash
# Fails when a tracked C++ file differs from .clang-format's style (registered as a unit test).
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.cpp' '*.h' '*.inl' '*.cc' '*.hpp' 2>/dev/null || true)
[ -n "$files" ] || { echo "no tracked C++ files (not a git checkout?)"; exit 77; }
# shellcheck disable=SC2086
exec clang-format --dry-run --Werror $files
