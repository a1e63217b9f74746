"""The shared-memory collectives in real processes (mpiexec) against numpy, and the same
collectives without the segment."""

import pytest

native = pytest.importorskip("pycoll.native", reason="the native module is not built")


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_shm_collectives_matrix(n, mpirun):
    mpirun(n, "tests/coll/scripts/shm_colls.py", "matrix" if n in (2, 3) else "quick", timeout=300)


@pytest.mark.parametrize("n", [3])
def test_same_collectives_without_shm(n, mpirun):
    mpirun(n, "tests/coll/scripts/shm_colls.py", "quick", timeout=180, env={"PYCOLL_TLS": "mpi"})


@pytest.mark.parametrize("n", [2, 3, 4])
def test_shm_reduce_allgather_reduce_scatter(n, mpirun):
    """reduce (every root), allgather(v), reduce_scatter(v) on small slots: many chunks, unequal
    and empty blocks, in place, mixed with the other segment collectives."""
    mpirun(n, "tests/coll/scripts/shm_colls.py", "blocks", timeout=180)


@pytest.mark.parametrize("n", [2, 4])
def test_shm_block_collectives_default_slot(n, mpirun):
    mpirun(n, "tests/coll/scripts/shm_colls.py", "blocks-default-slot", timeout=180)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_shm_gather_scatter_alltoall(n, mpirun):
    """gather(v), scatter(v), alltoall(v) on small slots: every root, many chunks, unequal, empty
    and gapped blocks, counts only at the root, in place, persistent, mixed with the others."""
    mpirun(n, "tests/coll/scripts/shm_colls.py", "data", timeout=240)


@pytest.mark.parametrize("n", [2, 3, 5])
def test_single_copy_bcast_gather_scatter_alltoall(n, mpirun):
    """The cma forms (each rank reads what it receives straight out of the sender's memory): as
    the segment forms' test, plus bcast from every root."""
    mpirun(n, "tests/coll/scripts/shm_colls.py", "data-cma", timeout=240)


@pytest.mark.parametrize("n", [2, 3])
def test_shm_large_outputs_streamed(n, mpirun):
    """Outputs from 16 MiB (non-temporal stores), unaligned, with a tail: allreduce, bcast,
    allgather, gather, scatter, alltoall."""
    mpirun(n, "tests/coll/scripts/shm_colls.py", "large", timeout=180)


def test_shm_gather_scatter_alltoall_default_slot(mpirun):
    mpirun(4, "tests/coll/scripts/shm_colls.py", "data-default-slot", timeout=240)


@pytest.mark.parametrize("n", [1, 2, 4])
def test_allreduce_of_arrays_every_rank_maps(n, mpirun):
    """team.alloc arrays: the mapped allreduce (each rank reduces its share straight out of the
    ranks' inputs into their outputs) for every dtype and op, in place and not, counts around its
    block, views at different offsets, a kept plan moved to another region, persistent, AVG;
    plain, strided and tagged calls keep their forms; unused memory is unmapped."""
    mpirun(n, "tests/coll/scripts/mapped_allreduce.py", "values", timeout=180)


@pytest.mark.parametrize("n", [3])
def test_alloc_and_mapped_allreduce_disagreements_raise(n, mpirun):
    """alloc with different sizes: MismatchError on every rank; one rank's buffer not from
    alloc while the others' are: MismatchError on every rank, not a hang or a wrong sum."""
    mpirun(n, "tests/coll/scripts/mapped_allreduce.py", "disagree", timeout=120)
