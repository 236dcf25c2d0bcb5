"""DDP communication hooks that compress gradients for the reduction in the network
(docs/pytorch.md, "Gradient compression"). Register one with::

    from treeduce.torch import hooks
    ddp_model.register_comm_hook(state=None, hook=hooks.fp8_e4m3_hook)   # or bf16_hook, ...

`state` is the process group (None: the default group). Every hook returns the bucket averaged
over the ranks, as DDP's default reduction does.

- bf16_hook: the bucket rounded to bfloat16 (nearest even), summed as bf16 (the switch sums in
  binary32 and rounds the sum once), averaged in float32. Error per element: at most
  2^-9 |g_r| per rank's rounding plus 2^-9 |sum| for the sum's, divided by the world size.
- fp8_e4m3_hook, fp8_e5m2_hook: a MAX allreduce of the bucket's largest |g| first (every rank
  then uses the same scale s = FP8_MAX / (world_size * max)), the bucket scaled by s and rounded
  to FP8 (nearest even; e4m3 saturating, which cannot happen at that scale), summed as FP8 in the
  network (binary32 inside, one rounding), widened, divided by s and the world size. So the sum
  cannot overflow, and the error per element is at most 2^-4 (e4m3) or 2^-3 (e5m2) of each rank's
  |g_r| plus the same of |sum|, relative; elements below max * 2^-9 / (448 / world) (e4m3) or
  max * 2^-16 / (57344 / world) (e5m2) are subnormal or flush to 0: their absolute error is up
  to half the smallest subnormal, 2^-10 (e4m3) or 2^-17 (e5m2), divided by s.

On a group that is not treeduce's (Gloo, for comparison runs; or a treeduce group that goes to
Gloo because another treeduce group of the process is alive) the hooks compute the same
numbers on the hosts: the scale's MAX allreduce, each rank's values rounded to FP8 with
treeduce's own conversion, a float32 sum (exact for E4M3 values: their exponents span 17 bits),
the sum rounded once to FP8. That is the switch's arithmetic, so loss curves compare.
"""

import torch
import torch.distributed as dist

from treeduce import _C

__all__ = ["bf16_hook", "fp8_e4m3_hook", "fp8_e5m2_hook", "fp8_hook", "HOOKS"]

_FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _group(state):
    return state if state is not None else dist.distributed_c10d._get_default_group()


def _is_treeduce(group):
    """Whether the group reduces through libtreeduce: a treeduce group that routes everything to
    Gloo (a second one alive in the process) is not."""
    try:
        return bool(_C.info(group)["offloaded"])
    except RuntimeError:
        return False


def bf16_hook(state, bucket):
    """Gradients reduced as bfloat16."""
    group = _group(state)
    world = group.size()
    buf = bucket.buffer()
    compressed = buf.to(torch.bfloat16)
    if not _is_treeduce(group):
        # Gloo has no bfloat16: the same numbers on the hosts, the bf16 values summed in
        # float32 and the sum rounded once, as the switch does.
        fut = dist.all_reduce(compressed.float(), group=group, async_op=True).get_future()

        def done_hosts(f):
            buf.copy_(f.value()[0].to(torch.bfloat16))
            return buf.div_(world)

        return fut.then(done_hosts)
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def done(f):
        buf.copy_(f.value()[0])
        return buf.div_(world)

    return fut.then(done)


def fp8_hook(state, bucket, fmt="e4m3"):
    """Gradients reduced as FP8 (`fmt` e4m3 or e5m2) with a per-bucket scale."""
    group = _group(state)
    buf = bucket.buffer()
    if buf.dtype != torch.float32:
        raise TypeError(f"treeduce: the FP8 hook takes float32 gradients, not {buf.dtype}")
    if _is_treeduce(group):
        work = _C.fp8_allreduce(group, buf, fmt, True)
        return work.get_future().then(lambda f: f.value()[0])
    return _fp8_on_hosts(group, buf, fmt)


def _fp8_on_hosts(group, buf, fmt):
    world = group.size()
    amax = buf.abs().max().reshape(1) if buf.numel() else torch.zeros(1)
    if torch.isnan(buf).any():
        amax.fill_(float("nan"))
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    a = float(amax[0])
    if not (a == a) or a in (float("inf"), float("-inf")):
        buf.fill_(float("nan"))
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut
    # float32 arithmetic in the order of the extension's, so that results are bit-identical
    f32 = torch.float32
    scale = (torch.tensor(_FP8_MAX[fmt], dtype=f32) / (torch.tensor(world, dtype=f32) *
                                                        torch.tensor(a, dtype=f32))
             if a > 0 else torch.tensor(1.0, dtype=f32))
    back = torch.tensor(1.0, dtype=f32) / scale / torch.tensor(world, dtype=f32)
    q = buf.mul(scale).contiguous()
    _C.fp8_round(q, fmt)
    fut = dist.all_reduce(q, group=group, async_op=True).get_future()

    def done(f):
        s = f.value()[0]
        _C.fp8_round(s, fmt)
        buf.copy_(s)
        return buf.mul_(back)

    return fut.then(done)


def fp8_e4m3_hook(state, bucket):
    """Gradients reduced as OCP FP8 E4M3 (3 mantissa bits, range +-448)."""
    return fp8_hook(state, bucket, "e4m3")


def fp8_e5m2_hook(state, bucket):
    """Gradients reduced as OCP FP8 E5M2 (2 mantissa bits, range +-57344)."""
    return fp8_hook(state, bucket, "e5m2")


HOOKS = {"none": None, "bf16": bf16_hook, "fp8": fp8_e4m3_hook, "fp8-e4m3": fp8_e4m3_hook,
         "fp8-e5m2": fp8_e5m2_hook}
