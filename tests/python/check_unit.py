"""The treeduce package without a network (meson test python-torch-unit): FP8 rounding against
the formats' definitions, the FP8 hook's error bound, a one-rank treeduce group on the host path
made with init_method file:// (no launcher variables: rank, world and job come from the group,
and the process's environment is left alone), bad input refused with a sentence, a second group
alive at once going to Gloo (and the hooks knowing it), a group made after both were destroyed
offloaded again. Exits 0 when every check passed."""

import ctypes
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist

import treeduce.torch as tt
from treeduce.torch import hooks

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def fp8_values(fmt):
    """Every finite non-negative value of the format, from its definition."""
    e_bits, m_bits, bias = (4, 3, 7) if fmt == "e4m3" else (5, 2, 15)
    vals = []
    for e in range(2**e_bits):
        for m in range(2**m_bits):
            if fmt == "e4m3" and e == 15 and m == 7:
                continue  # NaN
            if fmt == "e5m2" and e == 31:
                continue  # inf, NaN
            vals.append((m / 2**m_bits) * 2.0**(1 - bias) if e == 0
                        else (1 + m / 2**m_bits) * 2.0**(e - bias))
    return torch.tensor(sorted(vals), dtype=torch.float32)


for fmt, fmax in (("e4m3", 448.0), ("e5m2", 57344.0)):
    v = fp8_values(fmt)
    check(float(v.max()) == fmax, f"{fmt}: largest value {float(v.max())}")
    both = torch.cat([v, -v])
    check(torch.equal(tt.fp8_round(both.clone(), fmt), both), f"{fmt}: every value rounds to itself")
    # Midpoints between neighbours round to the one with an even mantissa (ties to even).
    mid = (v[1:] + v[:-1]) / 2
    r = tt.fp8_round(mid.clone(), fmt)
    lo_even = (torch.arange(len(v) - 1) % 2 == 0)  # v[i] has an even mantissa when i is even
    want = torch.where(lo_even, v[:-1], v[1:])
    check(torch.equal(r, want), f"{fmt}: ties to even")
    # Anything else goes to the nearest.
    x = torch.rand(100000, generator=torch.Generator().manual_seed(1)) * fmax
    r = tt.fp8_round(x.clone(), fmt)
    idx = torch.searchsorted(v, x).clamp(1, len(v) - 1)
    near = torch.minimum((v[idx] - x).abs(), (v[idx - 1] - x).abs())
    check(bool(((r - x).abs() <= near).all()), f"{fmt}: nearest")
check(float(tt.fp8_round(torch.tensor([1e6, -1e6]), "e4m3")[0]) == 448.0, "e4m3 saturates")
check(float(tt.fp8_round(torch.tensor([1e6]), "e5m2")[0]) == float("inf"), "e5m2 overflows to inf")

with tempfile.TemporaryDirectory() as d:
    for v in ("RANK", "WORLD_SIZE", "TREEDUCE_RANK", "TREEDUCE_WORLD_SIZE", "TREEDUCE_JOB",
              "TORCHELASTIC_RUN_ID", "TREEDUCE_MANAGER", "TREEDUCE_STATIC_LEAF"):
        os.environ.pop(v, None)
    os.environ.update(TREEDUCE_PATH="host", TREEDUCE_FALLBACK_STORE=os.path.join(d, "gloo"),
                      TREEDUCE_FALLBACK_ADDRESS="127.0.0.1", TREEDUCE_BIND="127.0.0.1")
    dist.init_process_group("treeduce", init_method="file://" + os.path.join(d, "store"),
                            rank=0, world_size=1, timeout=timedelta(seconds=20))
    info = tt.info()
    check(info["path"] == "host" and "asked for" in info["reason"], f"info: {info}")
    x = torch.arange(10, dtype=torch.float32)
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    check(torch.equal(x, torch.arange(10, dtype=torch.float32)), "one-rank AVG")
    # The FP8 allreduce on one rank: quantisation error alone, within 2^-4 relative (e4m3) of
    # each element above the scaled subnormal range.
    g = torch.randn(5000, generator=torch.Generator().manual_seed(2))
    y = g.clone()
    tt.fp8_allreduce(y, "e4m3").wait()
    big = g.abs() > g.abs().max() * 2.0**-8
    check(bool(((y - g).abs()[big] <= 2.0**-4 * g.abs()[big]).all()), "e4m3 relative bound")
    check(bool(((y - g).abs() <= 2.0**-4 * g.abs() + g.abs().max() / 448 * 2.0**-10).all()),
          "e4m3 absolute bound below the normals")
    for bad, sentence in ((lambda: tt.fp8_allreduce(torch.ones(3, dtype=torch.float64)),
                           "takes a contiguous float32 CPU tensor"),
                          (lambda: tt.fp8_round(torch.ones(3), "e3m4"), "neither e4m3 nor e5m2"),
                          (lambda: dist.all_reduce(torch.ones(2, dtype=torch.int64),
                                                   op=dist.ReduceOp.AVG),
                           "AVG is defined on floating-point tensors only"),
                          # A pair MPI's rule refuses: libtreeduce's sentence, raised by wait().
                          (lambda: dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BAND),
                           "allreduce of 1 tensor(s) with BAND failed (invalid_argument): The "
                           "pair f32 band is not a reduction")):
        try:
            bad()
            check(False, f"not refused: {sentence}")
        except (RuntimeError, TypeError) as e:
            check(sentence in str(e), f"refusal says '{sentence}': {e}")
    # The group's rank, size and job reach libtreeduce without touching the process's
    # environment (os.environ is a copy: ask the C library).
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    for v in ("TREEDUCE_RANK", "TREEDUCE_WORLD_SIZE", "TREEDUCE_JOB"):
        check(libc.getenv(v.encode()) is None, f"{v} was set in the process's environment")
    # A second treeduce group while the first is alive goes to Gloo, and the hooks know it.
    second = dist.new_group(ranks=[0], backend="treeduce")
    check(tt.info(second)["path"] == "gloo", f"second group: {tt.info(second)}")
    check(not hooks._is_treeduce(second), "the hooks take a Gloo-routed treeduce group for treeduce")
    check(hooks._is_treeduce(dist.group.WORLD), "the hooks do not take the first group for treeduce")
    dist.destroy_process_group()  # every group

    # Both destroyed: a new group gets libtreeduce's communicator again. An empty
    # TREEDUCE_RANK or TREEDUCE_WORLD_SIZE is unset, as everywhere in libtreeduce.
    os.environ.update(TREEDUCE_RANK="", TREEDUCE_WORLD_SIZE="")
    dist.init_process_group("treeduce", init_method="file://" + os.path.join(d, "store2"),
                            rank=0, world_size=1, timeout=timedelta(seconds=20))
    check(tt.info()["path"] == "host", f"a group after the first two: {tt.info()}")
    x = torch.arange(4, dtype=torch.int32)
    dist.all_reduce(x)
    check(torch.equal(x, torch.arange(4, dtype=torch.int32)), "one-rank SUM after re-init")
    dist.destroy_process_group()

print(f"{'FAILED' if failures else 'ok'}: {len(failures)} failures")
sys.exit(1 if failures else 0)
