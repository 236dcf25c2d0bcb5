#!/usr/bin/python3
"""Trains a small classifier with DistributedDataParallel on N ranks (docs/pytorch.md).

Run it under `treeduce lab run` (or torchrun): every rank reads RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT.

    sudo build/control/cli/treeduce lab run -- env PYTHONPATH=$PWD/build/python/site \
        /usr/bin/python3 $PWD/examples/ddp_train.py --backend treeduce --hook fp8

The data is generated: inputs x ~ N(0, 1) in 64 dimensions, labels the argmax of a fixed random
two-layer "teacher" network (learnable, not trivial), a shard of its own per rank and step. The
model is an MLP (64 -> hidden -> hidden -> 10). Rank 0 prints one line per epoch: mean loss over
the epoch's steps on every rank, mean step time (forward, backward with the gradient allreduce,
optimizer step), and at the end the parameters' SHA-256 (bit-identical runs print the same) and,
for treeduce, the path the gradients took.
"""

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

IN, CLASSES = 64, 10


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gloo", "treeduce"], default="treeduce")
    p.add_argument("--hook", choices=["none", "bf16", "fp8", "fp8-e4m3", "fp8-e5m2"],
                   default="none", help="DDP communication hook (treeduce.torch.hooks)")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="steps per epoch")
    p.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="process group timeout in seconds (bounds every collective)")
    p.add_argument("--warmup", type=int, default=2, help="steps left out of the step time")
    p.add_argument("--json-out", help="rank 0 appends one JSON object per epoch to this file")
    # For tests: a rank that dies, and a point where every rank waits for a file.
    p.add_argument("--die-at-step", type=int, default=-1, help="(tests) SIGKILL --die-rank here")
    p.add_argument("--die-rank", type=int, default=1)
    p.add_argument("--pause-at-step", type=int, default=-1,
                   help="(tests) every rank writes FILE.ready.RANK here and waits for FILE.go")
    p.add_argument("--pause-file")
    p.add_argument("--ignore-sigterm", action="store_true",
                   help="(tests) outlive the launcher's SIGTERM after a rank died, to show the error")
    return p.parse_args(argv)


def teacher():
    g = torch.Generator().manual_seed(12345)
    return (torch.randn(IN, 32, generator=g), torch.randn(32, CLASSES, generator=g))


def batch(t, rank, step, n, seed):
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(n, IN, generator=g)
    y = (torch.tanh(x @ t[0]) @ t[1]).argmax(1)
    return x, y


def model(hidden, seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, CLASSES))


def params_sha256(m):
    h = hashlib.sha256()
    for p in m.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def pause(path, rank):
    with open(f"{path}.ready.{rank}", "w"):
        pass
    while not os.path.exists(f"{path}.go"):
        time.sleep(0.05)


def train(args, group=None, net=None, log=print):
    """Trains `net` (default: a new model) with DDP on `group`; returns (net, epoch records)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    net = net if net is not None else model(args.hidden, args.seed)
    ddp = DDP(net, process_group=group)
    if args.hook != "none":
        from treeduce.torch import hooks
        ddp.register_comm_hook(state=group, hook=hooks.HOOKS[args.hook])
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    t = teacher()
    records, step = [], 0
    for epoch in range(args.epochs):
        losses, times = [], []
        for _ in range(args.steps):
            if step == args.pause_at_step:
                pause(args.pause_file, rank)
            if step == args.die_at_step and rank == args.die_rank:
                os.kill(os.getpid(), signal.SIGKILL)
            x, y = batch(t, rank, step, args.batch, args.seed)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            if step >= args.warmup:
                times.append(dt)
            losses.append(loss.detach())
            step += 1
        mean = torch.stack(losses).mean().reshape(1)
        dist.all_reduce(mean, group=group)
        rec = {"epoch": epoch, "loss": float(mean[0]) / world,
               "step_ms": 1e3 * sum(times) / len(times) if times else float("nan")}
        records.append(rec)
        if rank == 0:
            log(f"epoch {epoch:3d}  loss {rec['loss']:.6f}  step {rec['step_ms']:.2f} ms")
    return net, records


def main():
    args = parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.backend == "treeduce":
        import treeduce.torch  # noqa: F401  registers the backend
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"ddp_train: {world} ranks, backend {args.backend}, hook {args.hook}, "
              f"hidden {args.hidden}, batch {args.batch}/rank, {args.epochs}x{args.steps} steps",
              flush=True)
    try:
        net, records = train(args, log=lambda s: print(s, flush=True))
    except Exception as e:  # noqa: BLE001
        # A collective failed (a rank died, the network and the host path failed): say it and
        # leave at once, without waiting for the group's teardown.
        print(f"rank {rank}: training stopped: {e}", file=sys.stderr, flush=True)
        os._exit(3)
    if rank == 0:
        print(f"params sha256 {params_sha256(net)}", flush=True)
        if args.backend == "treeduce":
            import treeduce.torch as tt
            print("treeduce: " + json.dumps(tt.info()), flush=True)
        if args.json_out:
            with open(args.json_out, "a") as f:
                for r in records:
                    f.write(json.dumps(dict(r, backend=args.backend, hook=args.hook,
                                            ranks=world)) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
