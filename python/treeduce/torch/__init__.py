"""The torch.distributed backend "treeduce" (docs/pytorch.md).

Importing this module registers it::

    import torch.distributed as dist
    import treeduce.torch
    dist.init_process_group("treeduce")   # env:// variables, as torchrun and `treeduce lab run` set

allreduce, allreduce_coalesced, reduce, broadcast and barrier go through libtreeduce (in the
network when the job has a tree, on the hosts otherwise, loudly); every other operation goes
through a Gloo process group made from the same store, said once on rank 0's stderr.
"""

import atexit
import os

import torch
import torch.distributed as dist

from treeduce import _C

__all__ = ["BACKEND", "info", "offloads", "fp8_allreduce", "fp8_round"]

BACKEND = "treeduce"


def _gloo(store, rank, world_size, timeout):
    """The Gloo group of the operations the network does not reduce. Torch's Gloo binds to what
    the host name resolves to unless GLOO_SOCKET_IFNAME names an interface; without it, this
    binds to TREEDUCE_FALLBACK_ADDRESS when set (libtreeduce's host path uses that address too,
    and `treeduce lab run` sets it to the host's management address)."""
    prefixed = dist.PrefixStore("treeduce-gloo/", store)  # apart from the backend's own keys
    address = os.environ.get("TREEDUCE_FALLBACK_ADDRESS")
    if os.environ.get("GLOO_SOCKET_IFNAME") or not address:
        return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=address)]
    return dist.ProcessGroupGloo(prefixed, rank, world_size, opts)


def _create(store, rank, world_size, timeout):
    return _C.create_process_group(store, rank, world_size, timeout,
                                   _gloo(store, rank, world_size, timeout))


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create)
    # Before the interpreter finalizes: every group's completion thread done with its futures'
    # Python callbacks (one running after finalization has begun would abort the process).
    atexit.register(_C._quiesce_all)


def _group(group):
    return group if group is not None else dist.distributed_c10d._get_default_group()


def info(group=None):
    """The group's path ('network', 'host' or 'gloo'), why it is not the network, libtreeduce's
    counters (network_ops, fallback_ops, retransmits, bytes, fallback_reason) and the operations
    that went through Gloo."""
    return _C.info(_group(group))


def offloads(dtype, op=dist.ReduceOp.SUM, group=None):
    """True when an allreduce of `dtype` with `op` would be reduced in the network now."""
    return _C.offloads(_group(group), dtype, int(op))


def fp8_allreduce(tensor, fmt="e4m3", average=True, group=None):
    """Sums a contiguous float32 CPU tensor over the ranks as FP8 in the network (see hooks.py):
    returns a Work whose future holds [tensor]."""
    return _C.fp8_allreduce(_group(group), tensor, fmt, average)


def fp8_round(tensor, fmt="e4m3"):
    """Rounds a contiguous float32 tensor in place to the nearest `fmt` value (nearest even;
    e4m3 saturates at +-448, e5m2 overflows to infinity): treeduce's own conversions."""
    return _C.fp8_round(tensor, fmt)
