"""Native programs on one host's single-copy point-to-point path (``native/exec_shm.c``), sharing
the descriptor rings with the transport's Python code: messages that came before their program,
ranks running natively beside ranks running in Python, tagged and native collectives interleaved,
more messages in flight than a ring holds, a failed program's buffers kept while a peer may read
them, a rank whose collective failed still there (tests/procs/scripts/shm_programs.py, under
mpiexec).
The program of every algorithm is checked against its Python form in tests/coll/test_programs.py;
a rank killed in the middle of one in tests/procs/test_shm.py."""

import pytest


@pytest.mark.parametrize("mode,n", [("early", 2), ("early", 3), ("mixed", 2), ("mixed", 3),
                                    ("interleaved", 3), ("many", 2), ("many", 4), ("held", 2), ("failed", 2)])
def test_native_programs_share_the_rings(mode, n, mpirun):
    mpirun(n, "tests/procs/scripts/shm_programs.py", mode, timeout=180)
