#!/usr/bin/python3
"""The treeduce backend against Gloo in one run (docs/performance.md, "issue 17"): run on every
rank of a lab (bench/torch_bench.sh does it).

1. DDP step time of examples/ddp_train.py's model, treeduce (default group) and Gloo (a Gloo group
   of the same ranks) interleaved epoch by epoch, same data: mean step time each and the ratio.
2. A 16 MiB float32 allreduce through the backend (dist.all_reduce, a Work waited on) and
   through libtreeduce directly on the same communicator (treeduce._C.raw_allreduce),
   interleaved: mean time each and the ratio.
Rank 0 prints one JSON object.
"""

import argparse
import json
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import ddp_train  # noqa: E402
import treeduce.torch as tt  # noqa: E402
from treeduce import _C  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=6)
p.add_argument("--steps", type=int, default=20)
p.add_argument("--hidden", type=int, default=512)
p.add_argument("--iters", type=int, default=10, help="16 MiB allreduces per way")
a = p.parse_args()

dist.init_process_group("treeduce", timeout=timedelta(seconds=120))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
torch.set_num_threads(1)

args = ddp_train.parse_args(["--epochs", "1", "--steps", str(a.steps), "--hidden", str(a.hidden)])
nets = {"treeduce": ddp_train.model(a.hidden, 0), "gloo": ddp_train.model(a.hidden, 0)}
step_ms = {"treeduce": [], "gloo": []}
for e in range(a.epochs):
    for name, group in (("gloo", gloo), ("treeduce", None)):
        args.seed = e
        _, rec = ddp_train.train(args, group=group, net=nets[name], log=lambda s: None)
        step_ms[name].append(rec[0]["step_ms"])

n = 16 * 1024 * 1024 // 4
x = torch.ones(n)
backend_ms, raw_ms = [], []
for i in range(a.iters + 1):
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(x)
    t1 = time.perf_counter()
    dist.barrier()
    t2 = time.perf_counter()
    _C.raw_allreduce(dist.distributed_c10d._get_default_group(), x)
    t3 = time.perf_counter()
    if i > 0:  # the first of each is warm-up
        backend_ms.append(1e3 * (t1 - t0))
        raw_ms.append(1e3 * (t3 - t2))
    x.fill_(1.0)


def mean(v):
    return sum(v) / len(v)


if rank == 0:
    print(json.dumps({
        "ranks": world, "hidden": a.hidden, "epochs": a.epochs, "steps": a.steps,
        "ddp_step_ms": {"treeduce": mean(step_ms["treeduce"]), "gloo": mean(step_ms["gloo"])},
        "ddp_ratio_treeduce_over_gloo": mean(step_ms["treeduce"]) / mean(step_ms["gloo"]),
        "allreduce_16MiB_ms": {"backend": mean(backend_ms), "libtreeduce": mean(raw_ms),
                               "backend_min": min(backend_ms), "libtreeduce_min": min(raw_ms)},
        "allreduce_ratio_backend_over_libtreeduce": mean(backend_ms) / mean(raw_ms),
        "path": tt.info()["path"], "retransmits": tt.info()["retransmits"]}), flush=True)
dist.barrier()
dist.destroy_process_group()
