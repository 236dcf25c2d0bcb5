#!/usr/bin/env bash
# The first experiment a researcher runs with in-network gradient compression (docs/pytorch.md,
# "Loss curves"): the same DDP training (examples/ddp_train.py, 4 ranks on a lab of one leaf,
# brought up and taken down here) with the gradients reduced in the network as float32, bf16,
# FP8 E4M3 and FP8 E5M2; loss per epoch into OUT/loss.jsonl and OUT/loss.dat, plotted by gnuplot
# into OUT/ddp-loss-curves.png. Needs root and a build with the Python extension.
# Usage: sudo bench/torch_loss_curves.sh [BUILD_DIR [OUT [EPOCHS]]]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
out=${2:-$src/docs/img}
epochs=${3:-30}
mkdir -p "$out"
cli=$build/control/cli/treeduce
name=torchloss$$
trap '"$cli" lab down --name "$name" >/dev/null 2>&1 || true' EXIT
"$cli" lab up --leaf 4 --name "$name" >/dev/null
rm -f "$out/loss.jsonl"
for hook in none bf16 fp8-e4m3 fp8-e5m2; do
  "$cli" lab run --name "$name" -- env PYTHONPATH="$build/python/site" /usr/bin/python3 -W ignore \
    "$src/examples/ddp_train.py" --backend treeduce --hook "$hook" --epochs "$epochs" --steps 20 \
    --lr 0.02 --json-out "$out/loss.jsonl"
done
# One row per epoch: epoch, then the loss of each hook in the order above.
/usr/bin/python3 - "$out/loss.jsonl" "$out/loss.dat" <<'PY'
import json, sys
rows = {}
hooks = ["none", "bf16", "fp8-e4m3", "fp8-e5m2"]
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows.setdefault(r["epoch"], {})[r["hook"]] = r["loss"]
with open(sys.argv[2], "w") as f:
    f.write("# epoch " + " ".join(hooks) + "\n")
    for e in sorted(rows):
        f.write(f"{e} " + " ".join(f"{rows[e].get(h, '?')}" for h in hooks) + "\n")
PY
gnuplot -e "datafile='$out/loss.dat'; outfile='$out/ddp-loss-curves.png'" "$src/bench/plot_loss.gp"
echo "wrote $out/ddp-loss-curves.png, $out/loss.dat, $out/loss.jsonl"
