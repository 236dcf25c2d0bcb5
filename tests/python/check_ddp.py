"""DDP training on the treeduce backend against the same training on Gloo, in one run
(docs/pytorch.md, "Tests"): the same initial model, data and steps on the default group
(treeduce) and on a Gloo group. Arguments: HOOK STEPS. Prints, on rank 0, one JSON line: the
largest parameter difference, the treeduce model's SHA-256 (two deterministic runs must print
the same) and the group's path. Exits 1 when the difference is above the tolerance: 0 for the
FP8 hooks (the Gloo run computes the switch's arithmetic on the hosts: bit-identical), 1e-4 of
the largest parameter for float32 and bf16 (sums in another order: each step's sum within
2 x world x 2^-24 x sum|g| for float32, the documented bound; SGD carries that on).
"""

import json
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))
import ddp_train  # noqa: E402
import treeduce.torch as tt  # noqa: E402

hook, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("treeduce", timeout=timedelta(seconds=60))
rank = dist.get_rank()
gloo = dist.new_group(backend="gloo")
args = ddp_train.parse_args(["--hook", hook, "--epochs", "1", "--steps", str(steps),
                             "--hidden", "128", "--lr", "0.05"])
quiet = lambda s: None  # noqa: E731
a, _ = ddp_train.train(args, group=None, log=quiet)
b, _ = ddp_train.train(args, group=gloo, log=quiet)
diff = max(float((p - q).abs().max()) for p, q in zip(a.parameters(), b.parameters()))
scale = max(float(p.abs().max()) for p in a.parameters())
tol = 0.0 if hook.startswith("fp8") else 1e-4 * scale
ok = diff <= tol
if rank == 0:
    print(json.dumps({"hook": hook, "steps": steps, "max_diff": diff, "tolerance": tol, "ok": ok,
                      "sha256": ddp_train.params_sha256(a), "path": tt.info()["path"]}),
          flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
