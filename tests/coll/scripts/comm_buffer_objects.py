"""Run under mpiexec by tests/coll/test_mpi.py: every kind of buffer object mpi4py accepts (ndarray,
bytearray, bytes, mmap, memoryview, array.array, MPI.buffer, a torch CPU tensor), bare and in list
specifications, called once and many times in a row (the repeats take the fast path of a repeated
call), blocking, non-blocking and persistent: the values are MPI's at every call, with the buffers'
contents, counts and places changing between calls; and the objects are pycoll's only while a call
runs (a bytearray resizes and an mmap closes after a blocking call, as under mpi4py; during a
non-blocking call they do not, as under mpi4py)."""

import array
import mmap

import numpy as np
from mpi4py import MPI

from pycoll.mpi import Comm
from tests.rank import run_rank

N = 16  # bytes of every buffer
CALLS = 12  # calls in a row on the same objects: past the repeat, into the express lane


def objects():
    """Fresh buffer objects of N bytes, by kind."""
    made = {"ndarray": np.zeros(N, np.uint8), "bytearray": bytearray(N), "mmap": mmap.mmap(-1, N),
            "memoryview": memoryview(bytearray(N)), "array": array.array("B", bytes(N)),
            "MPI.buffer": MPI.buffer(bytearray(N))}
    try:
        import torch
    except ImportError:  # (torch is in the test extra; without it, the rest)
        pass
    else:
        made["torch"] = torch.zeros(N, dtype=torch.uint8)
    return made


def view(obj):
    """A numpy view of ``obj``'s bytes (the test's own: it is dropped at once)."""
    if type(obj).__module__ == "torch":
        return obj.numpy()
    return np.frombuffer(obj, np.uint8)


def forms(obj):
    """The forms one object is passed in: bare, and each list specification of its bytes."""
    return {"bare": lambda: obj, "[buf, BYTE]": lambda: [obj, MPI.BYTE],
            "[buf, count, BYTE]": lambda: [obj, N, MPI.BYTE],
            "[buf, (count, displ), BYTE]": lambda: [obj, (N - 4, 4), MPI.BYTE]}


def check_bcast(comm, world, r):
    """Bcast and Allreduce on each kind and form, CALLS times in a row on the same objects (the
    same list object too, and a fresh list each call), the root's values changing every call."""
    for kind, obj in objects().items():
        for form, spec in forms(obj).items():
            for same_list in (True, False):
                made = spec()
                for call in range(CALLS):
                    buf = view(obj)
                    want = (np.arange(N) * 3 + call + 7 * (form == "bare")) % 251
                    buf[:] = want if r == 0 else 0
                    del buf
                    comm.Bcast(made if same_list else spec(), root=0)
                    got = view(obj).copy()
                    lo = 4 if "displ" in form else 0
                    expect = np.zeros(N, np.uint8) if r else want.astype(np.uint8)
                    expect[lo:] = want[lo:]
                    assert np.array_equal(got, expect), f"Bcast {kind} {form} call {call}: {got} != {expect}"
                out = np.zeros(N, np.uint8)
                lo = 4 if "displ" in form else 0
                recv = [out, N - lo, MPI.BYTE]
                for call in range(CALLS):
                    buf = view(obj)
                    buf[:] = (r + call) % 7
                    del buf
                    comm.Allreduce(made if same_list else spec(), recv, op=MPI.BOR)
                    want = np.zeros(N, np.uint8)
                    for q in range(world.size):
                        want |= (q + call) % 7
                    assert np.array_equal(out[:N - lo], want[lo:]), f"Allreduce {kind} {form} call {call}"


def check_changes(comm, r):
    """What changes between calls on the same objects is seen: a count changed in the same list,
    a bytearray resized (its memory moves), counts changed in place in the same lists (lists, and
    array.array as the OSU demos keep them), an mmap closed (an error, not a crash)."""
    buf = bytearray(N)
    spec = [buf, 4, MPI.BYTE]
    for count in (4, 4, 4, 8, 8, 2, 16):
        buf[:] = bytes([r + 1]) * len(buf) if r == 0 else bytes(len(buf))
        spec[1] = count
        comm.Bcast(spec, root=0)
        got = bytes(buf)
        assert got == bytes([1]) * (N if r == 0 else count) + bytes(0 if r == 0 else N - count), (count, got)
    grown = bytearray(8)
    for size in (8, 8, 8, 64, 64, 8, 8, 4096):
        if len(grown) != size:
            grown[:] = bytes(size)  # (resized: it is free to move, no export is held)
        grown[:] = bytes([size % 251]) * size if r == 0 else bytes(size)
        comm.Bcast(grown, root=0)
        assert bytes(grown) == bytes([size % 251]) * size, f"bytearray resized to {size}"
    n = comm.Get_size()
    counts, displs = [2] * n, [4 * q for q in range(n)]
    acounts, adispls = array.array("i", counts), array.array("i", displs)  # (as the OSU demos)
    out, aout = bytearray(4 * n), bytearray(4 * n)
    spec, aspec = [out, counts, displs, MPI.BYTE], [aout, (acounts, adispls), MPI.BYTE]
    for c in (2, 2, 2, 3, 3, 4, 1, 1):  # (the counts change in place, in the same lists)
        for q in range(n):
            counts[q] = acounts[q] = c
        out[:], aout[:] = bytes(4 * n), bytes(4 * n)
        mine = bytearray([r + 1]) * c
        comm.Allgatherv([mine, MPI.BYTE], spec)
        comm.Allgatherv([mine, c, MPI.BYTE], aspec)
        want = b"".join(bytes([q + 1]) * c + bytes(4 - c) for q in range(n))
        assert bytes(out) == want and bytes(aout) == want, (c, bytes(out), bytes(aout), want)
    m = mmap.mmap(-1, N)
    for _ in range(3):
        comm.Bcast([m, MPI.BYTE], root=0)
    m.close()  # (closable: nothing holds an export)
    try:
        comm.Bcast([m, MPI.BYTE], root=0)
    except (ValueError, BufferError):  # (every rank closed it: each raises before anything is sent)
        pass
    else:
        raise AssertionError("a closed mmap was taken as a buffer")


def check_nonblocking_and_persistent(comm, r):
    """A non-blocking call holds its buffer (a bytearray cannot be resized until it is done, as
    under mpi4py); a persistent one until Free(); their values are MPI's, start after start."""
    buf = bytearray(N)
    for call in range(CALLS):
        buf[:] = bytes([call + 1]) * N if r == 0 else bytes(N)
        req = comm.Ibcast([buf, MPI.BYTE], root=0)
        try:
            buf.extend(b"x")
        except BufferError:
            pass
        else:
            raise AssertionError("a bytearray was resized under a non-blocking call")
        req.Wait()
        assert bytes(buf) == bytes([call + 1]) * N, call
    buf.extend(b"x")  # (done: free again)
    del buf[N:]
    out = bytearray(N)
    req = comm.Allreduce_init([buf, MPI.BYTE], [out, MPI.BYTE], op=MPI.MAX)
    for call in range(CALLS):
        buf[:] = bytes([r * 10 + call]) * N
        req.Start()
        req.Wait()
        assert bytes(out) == bytes([(comm.Get_size() - 1) * 10 + call]) * N, call
    try:
        out.extend(b"x")
    except BufferError:
        pass
    else:
        raise AssertionError("a bytearray was resized under a persistent call")
    req.Free()
    out.extend(b"x")


def main():
    world = MPI.COMM_WORLD
    comm = Comm(world)
    r = world.rank
    check_bcast(comm, world, r)
    check_changes(comm, r)
    check_nonblocking_and_persistent(comm, r)
    comm.team.close()


if __name__ == "__main__":
    run_rank(main)
