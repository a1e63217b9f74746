"""The hierarchical algorithms (rab, split_rail, hier bcast and barrier) in real processes under
mpiexec (MPI and store bootstraps) with PYCOLL_RANKS_PER_NODE or a PYCOLL_NODE_ID per block of
ranks, over MPI, TCP and UCX. In process: tests/unit/test_hierarchical.py."""

import pytest

from tests.launch import need_ucx


@pytest.mark.parametrize("mode,rpn,quick", [("mpi", "4", False), ("store", "3", False), ("mpi", "2", True),
                                            ("mpi", "1,4,3", True), ("store", "5,3", True)])
def test_hierarchical_mpiexec(mode, rpn, quick, mpirun):
    """8 ranks as 2, 3 (uneven) and 4 nodes, every dtype and op, roots on every node; the node
    level on each node's shared segment, the level between nodes on MPI or TCP."""
    mpirun(8, "tests/procs/scripts/hierarchical.py", mode, *(["quick"] if quick else []), timeout=150,
           env={"PYCOLL_RANKS_PER_NODE": rpn})


@pytest.mark.parametrize("mode,rpn,ucx_tls", [("mpi", "4", None), ("store", "3", None)])
def test_hierarchical_ucx(mode, rpn, ucx_tls, mpirun):
    """Every team on UCX, the node level on each node's shared segment, the level between nodes
    as native programs for untagged collectives (in Python for tagged ones). (UCX forced onto TCP,
    UCX_TLS=tcp, took 25 s of the suite here: tests/procs/test_multihost.py runs UCX over TCP
    between two network namespaces.)"""
    need_ucx()
    env = {"PYCOLL_RANKS_PER_NODE": rpn, "PYCOLL_TLS": "ucx,shm", "EXPECT_NATIVE_LEVELS": "1"}
    if ucx_tls:
        env["UCX_TLS"] = ucx_tls
    mpirun(8, "tests/procs/scripts/hierarchical.py", mode, "quick", timeout=150, env=env)


def test_level_transports(mpirun):
    """PYCOLL_NODE_TLS / PYCOLL_LEADER_TLS: the team on MPI, its node level on MPI plus the shared
    segment, the level between nodes on UCX."""
    need_ucx()
    mpirun(8, "tests/procs/scripts/hierarchical.py", "mpi", "quick", timeout=150,
           env={"PYCOLL_RANKS_PER_NODE": "4", "PYCOLL_TLS": "shm,mpi", "PYCOLL_NODE_TLS": "shm,mpi",
                "PYCOLL_LEADER_TLS": "ucx", "EXPECT_TLS": "mpi,mpi,ucx"})


def test_node_id_per_rank_block(mpirun):
    """PYCOLL_NODE_ID given per block of ranks (as one would per host or network namespace)."""
    mpirun(6, "tests/procs/scripts/hierarchical.py", "mpi", "quick", "ids", timeout=120,
           groups=[(4, {"PYCOLL_NODE_ID": "n-a"}), (2, {"PYCOLL_NODE_ID": "n-b"})])
