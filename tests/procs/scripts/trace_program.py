"""Run under mpiexec by tests/procs/test_trace.py with PYCOLL_TRACE and PYCOLL_TRACE_INSTRUCTIONS:
native programs (``shm``: a team over a TCP store on one host's descriptor rings; ``ucx``: the
MPI world's team with PYCOLL_TLS=ucx), 12 rd allreduces, new arrays then the same ones (the
express lane); ``mpi``: rd's program run in Python over MPI (``team.run_program``) 12 times; for
the test to find their instructions in the timeline."""

import os
import sys

import numpy as np
from mpi4py import MPI

from pycoll import Team
from pycoll.lower import lower
from pycoll.store import TCPStore
from tests.rank import run_rank


def main(kind: str) -> None:
    world = MPI.COMM_WORLD
    if kind == "shm":
        server = TCPStore(port=0, is_master=True, timeout=60) if world.rank == 0 else None
        port = world.bcast(server.port if server is not None else None)
        team = Team.from_store(TCPStore("127.0.0.1", port, timeout=60), world.rank, world.size,
                               tls=["shm", "tcp"])
    else:
        team = Team.from_mpi(world)
    assert team.transport.name == kind, team.transport
    x = np.ones(100, np.float32)
    out = np.empty_like(x)
    setting = os.environ.pop("PYCOLL_TRACE_INSTRUCTIONS")  # (lowering runs the program on an
    program = lower("allreduce", "rd", world.size, 100)[world.rank]  # in-process team: not traced)
    os.environ["PYCOLL_TRACE_INSTRUCTIONS"] = setting
    for i in range(12):
        if i < 3:
            out = np.empty_like(x)
        if kind == "mpi":
            req = team.run_program(program, x, out)
        else:
            req = team.allreduce(x, out, algorithm="rd")
        assert ("[native]" in req.task.name) == (kind != "mpi"), req.task
        req.wait(timeout=30)
        assert (out == world.size).all()
    team.close()
    world.Barrier()  # (rank 0 serves the store: it stays until every rank is done with it)


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
