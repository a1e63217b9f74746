"""``pycoll.mpi.Comm(intercomm)``: collectives of an intercommunicator go to MPI unchanged, and
its Merge is pycoll's again (tests/procs/scripts/intercomm.py)."""


def test_an_intercommunicator_is_handed_to_mpi_and_its_merge_is_pycolls(mpirun):
    mpirun(4, "tests/procs/scripts/intercomm.py", timeout=120)
