"""An mpi4py program that knows nothing of treeduce (Debian's python3-mpi4py, buffers from the
array module): MPI_Allreduce, MPI_Reduce, MPI_Bcast and MPI_Iallreduce on MPI_COMM_WORLD and on an
MPI_Comm_split, each result checked. tests/mpi/test_mpi_lab.cpp runs it under `lab run --mpi`
with and without libtreeduce-mpi and compares the digests of the integer results.

Prints "mpi_check.py: rank R: N checks, W wrong, digest D"; exit status 1 when W > 0."""
import hashlib
import sys
from array import array

from mpi4py import MPI

world = MPI.COMM_WORLD
checks = 0
wrong = 0
digest = hashlib.sha256()


def expect(ok, what):
    global checks, wrong
    checks += 1
    if not ok:
        wrong += 1
        if wrong < 10:
            print(f"mpi_check.py: rank {world.Get_rank()}: {what} wrong", file=sys.stderr)


def ival(r, i):
    return (r * 7 + i * 13) % 1000 - 500


def cases(comm, tag):
    rank, size = comm.Get_rank(), comm.Get_size()
    n = 70000
    src = array("i", (ival(rank, i) for i in range(n)))
    out = array("i", bytes(4 * n))
    comm.Allreduce(src, out, op=MPI.SUM)
    want = [sum(ival(r, i) for r in range(size)) for i in range(n)]
    expect(list(out) == want, f"{tag} int sum")
    digest.update(out.tobytes())
    inplace = array("i", src)
    comm.Allreduce(MPI.IN_PLACE, inplace, op=MPI.MIN)
    expect(list(inplace) == [min(ival(r, i) for r in range(size)) for i in range(n)],
           f"{tag} int min in place")
    digest.update(inplace.tobytes())
    red = array("i", bytes(4 * n))
    comm.Reduce(src, red, op=MPI.SUM, root=0)
    if rank == 0:
        expect(list(red) == want, f"{tag} reduce")
    d = array("d", ((i % 2 * 2 - 1) / (1.0 + rank + i % 13) for i in range(20000)))
    dout = array("d", bytes(8 * len(d)))
    comm.Allreduce(d, dout, op=MPI.SUM)
    ok = True
    for i in range(len(d)):
        vals = [(i % 2 * 2 - 1) / (1.0 + r + i % 13) for r in range(size)]
        m = (size - 1) * 2.0**-53
        bound = 2 * m / (1 - m) * sum(abs(v) for v in vals) * (1 + 2.0**-53)
        ok = ok and abs(dout[i] - sum(vals)) <= bound + 1e-300
    expect(ok, f"{tag} double sum")
    b = array("B", ((i * 31 + 7) % 256 if rank == 0 else 0 for i in range(100000)))
    comm.Bcast(b, root=0)
    expect(list(b) == [(i * 31 + 7) % 256 for i in range(100000)], f"{tag} bcast")
    digest.update(b.tobytes())
    iout = array("i", bytes(4 * n))
    req = comm.Iallreduce(src, iout, op=MPI.SUM)
    req.Wait()
    expect(list(iout) == want, f"{tag} iallreduce")
    comm.Barrier()


cases(world, "world")
half = world.Split(world.Get_rank() % 2, world.Get_rank())
cases(half, "split")
half.Free()
print(f"mpi_check.py: rank {world.Get_rank()}: {checks} checks, {wrong} wrong, "
      f"digest {digest.hexdigest()[:16]}", flush=True)
sys.exit(0 if wrong == 0 else 1)
