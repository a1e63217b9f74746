"""Call marks on one host's single-copy point-to-point path (ShmTransport's descriptors and the
native executor of ``native/exec_shm.c``; tests/procs/scripts/shm_marks.py, under mpiexec): ranks
that disagree at any call number raise MismatchError naming both calls, through the Python path,
native programs, and a native rank against a Python one (a message larger than its receive is
judged by its mark too); agreeing ranks get the right results natively and with a Python rank
among native ones, inline payloads (32 B and less) and large ones alike. The descriptor's wire format and
the refusal of forged descriptors: tests/unit/test_shm_marks.py."""

import pytest

PATHS = ["python", "native", "mixed"]


@pytest.mark.parametrize("path", PATHS)
def test_ranks_that_disagree_raise_at_any_call_number(path, mpirun):
    mpirun(2, "tests/procs/scripts/shm_marks.py", "mismatch", path, timeout=120)


@pytest.mark.parametrize("path,n", [("native", 2), ("mixed", 2), ("native", 3), ("mixed", 3)])
def test_agreeing_ranks_get_the_results(path, n, mpirun):
    mpirun(n, "tests/procs/scripts/shm_marks.py", "results", path, timeout=120)
