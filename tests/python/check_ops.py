"""Every operation of the treeduce backend against Gloo on the same ranks (docs/pytorch.md,
"Tests"). Run on 2-4 ranks with the env:// variables set (`treeduce lab run`, torchrun). Exits 0
when every check passed, 1 with each failure on stderr otherwise; the last line of rank 0 is a
JSON summary with the group's path and counters.

Inputs are small integers (in every type) where exact arithmetic allows an exact comparison
(sums, products, min, max of them are exact in any order and any rounding), random floats
otherwise, compared within the documented bound.
"""

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import treeduce.torch as tt

dist.init_process_group("treeduce", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
failures = []
checks = 0

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64,
          torch.int8, torch.uint8]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT]


def check(ok, what):
    global checks
    checks += 1
    if not ok:
        failures.append(what)
        print(f"rank {rank}: FAILED: {what}", file=sys.stderr, flush=True)


def exact_input(dtype, n, r, op):
    g = torch.Generator().manual_seed(1000 + 17 * r + n)
    if op == dist.ReduceOp.PRODUCT:
        v = torch.randint(0, 3, (n,), generator=g) - (1 if dtype != torch.uint8 else 0)
        v = torch.where(v == 0, torch.ones_like(v), v)
    elif dtype == torch.uint8:
        v = torch.randint(0, 60, (n,), generator=g)
    else:
        v = torch.randint(-30, 31, (n,), generator=g)
    return v.to(dtype)


def reference(x, op, group=None):
    """Gloo's result; for what Gloo refuses, the gathered inputs reduced here in float64/int64."""
    y = x.clone()
    try:
        dist.all_reduce(y, op=op, group=gloo)
        return y
    except RuntimeError:
        bits = x.view(torch.uint8) if x.dtype == torch.bfloat16 else x  # Gloo has no bf16, no int16
        parts = [torch.empty_like(bits) for _ in range(world)]
        dist.all_gather(parts, bits, group=gloo)
        parts = [p.view(x.dtype) for p in parts]
        wide = torch.float64 if x.is_floating_point() else torch.int64
        s = torch.stack([p.to(wide) for p in parts])
        if op == dist.ReduceOp.SUM:
            s = s.sum(0)
        elif op == dist.ReduceOp.PRODUCT:
            s = s.prod(0)
        elif op == dist.ReduceOp.MIN:
            s = s.min(0).values
        else:
            s = s.max(0).values
        return s.to(x.dtype)


# allreduce: every type and operation, exactly; sizes of one element, a partial packet, several
# windows; AVG on the float types.
for dtype in DTYPES:
    for op in OPS:
        for n in (1, 1000, 70000):
            x = exact_input(dtype, n, rank, op)
            want = reference(x, op)
            got = x.clone()
            dist.all_reduce(got, op=op)
            check(torch.equal(got, want), f"allreduce {dtype} {op} n={n}")
    if dtype.is_floating_point:
        x = exact_input(dtype, 4096, rank, dist.ReduceOp.SUM)
        want = reference(x, dist.ReduceOp.SUM)
        want = (want.double() / world).to(dtype)
        got = x.clone()
        dist.all_reduce(got, op=dist.ReduceOp.AVG)
        check(torch.equal(got, want), f"allreduce {dtype} AVG")
try:
    dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.AVG)
    check(False, "AVG of int32 was not refused")
except RuntimeError as e:
    check("AVG is defined on floating-point tensors only" in str(e), f"AVG int32 refusal: {e}")

# Random floats: within the documented bound of Gloo's result (treeduce sums in binary32 and
# rounds once; Gloo rounds at every step in the narrow types).
for dtype, eps in ((torch.float32, 2.0**-24), (torch.float16, 2.0**-11),
                   (torch.bfloat16, 2.0**-8), (torch.float64, 2.0**-53)):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(50000, generator=g, dtype=torch.float64).to(dtype)
    want = reference(x, dist.ReduceOp.SUM).double()
    got = x.clone()
    dist.all_reduce(got)
    absx = x.double().abs()
    dist.all_reduce(absx, group=gloo)
    bound = 2 * world * eps * absx + 1e-30
    check(bool(((got.double() - want).abs() <= bound).all()), f"allreduce random {dtype} bound")

# Non-contiguous tensors, allreduce_coalesced, several operations in flight.
x = torch.arange(200, dtype=torch.float32).reshape(10, 20) * (rank + 1)
view = x[:, ::2]
dist.all_reduce(view)
want = torch.arange(200, dtype=torch.float32).reshape(10, 20)[:, ::2] * (world * (world + 1) // 2)
check(torch.equal(view, want) and torch.equal(x[:, 1::2], (torch.arange(200.0).reshape(10, 20) * (rank + 1))[:, 1::2]),
      "allreduce of a non-contiguous view")
ts = [torch.full((n,), float(rank + 1)) for n in (3, 1000, 5, 7)]
dist.all_reduce_coalesced(ts)
s = world * (world + 1) // 2
check(all(bool((t == s).all()) for t in ts), "allreduce_coalesced")
works, bufs = [], []
for i in range(16):
    b = torch.full((5000 + i,), float(i + rank))
    bufs.append(b)
    works.append(dist.all_reduce(b, async_op=True))
futs = [w.get_future() for w in works[8:]]
for w in works[:8]:
    w.wait()
torch.futures.wait_all(futs)
check(all(works[i].is_completed() for i in range(16)), "16 in flight: every work completed")
check(all(bool((bufs[i] == world * i + world * (world - 1) // 2).all()) for i in range(16)),
      "16 in flight: results")

# reduce to every root, broadcast from every root (every type; NaN bits kept exactly).
for dtype in DTYPES:
    for root in range(world):
        x = exact_input(dtype, 3000, rank, dist.ReduceOp.SUM)
        want = reference(x, dist.ReduceOp.SUM)
        got = x.clone()
        dist.reduce(got, root, op=dist.ReduceOp.SUM)
        if rank == root:
            check(torch.equal(got, want), f"reduce {dtype} root {root}")
        else:
            check(torch.equal(got, x), f"reduce {dtype} root {root}: a non-root's tensor changed")
        b = exact_input(dtype, 1001, root, dist.ReduceOp.SUM) if rank == root else torch.zeros(1001, dtype=dtype)
        dist.broadcast(b, root)
        check(torch.equal(b, exact_input(dtype, 1001, root, dist.ReduceOp.SUM)), f"broadcast {dtype} root {root}")
nan = torch.tensor([0x7FC00001, 0xFF800000, 0x80000000], dtype=torch.int64).to(torch.int32).view(torch.float32)
b = nan.clone() if rank == 0 else torch.zeros(3)
dist.broadcast(b, 0)
check(torch.equal(b.view(torch.int32), nan.view(torch.int32)), "broadcast of NaN payloads, -inf, -0")
dist.barrier()

# Through Gloo: allgather, gather, scatter, alltoall, all_gather_object.
parts = [torch.empty(4) for _ in range(world)]
dist.all_gather(parts, torch.full((4,), float(rank)))
check(all(bool((parts[r] == r).all()) for r in range(world)), "allgather (Gloo)")
out = torch.empty(world * 2)
dist.all_to_all_single(out, torch.arange(world * 2, dtype=torch.float32) + 100 * rank)
check(torch.equal(out, torch.tensor([100.0 * r + 2 * rank + k for r in range(world) for k in range(2)])),
      "alltoall (Gloo)")
objs = [None] * world
dist.all_gather_object(objs, {"rank": rank})
check(objs == [{"rank": r} for r in range(world)], "all_gather_object (Gloo)")
try:
    dist.reduce_scatter(torch.empty(2), [torch.ones(2) for _ in range(world)])
    check(True, "reduce_scatter")
except RuntimeError as e:
    check("does not support reduce_scatter" in str(e), f"reduce_scatter: Gloo's own refusal: {e}")

info = tt.info()
if rank == 0:
    print(json.dumps({"checks": checks, "failures": len(failures), "info": info}), flush=True)
dist.barrier()
dist.destroy_process_group()
sys.exit(1 if failures else 0)
