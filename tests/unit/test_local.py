"""The in-process transport and local teams; the custom-schedule example."""

import numpy as np
import pytest

import pycoll
from pycoll import Schedule
from pycoll.tasks.p2p import RecvTask, SendTask


def test_local_p2p_expected_and_unexpected():
    a, b = pycoll.local_teams(2)
    out = np.zeros(4)
    r = b.irecv(out, 0, tag="x")  # posted first
    assert not r.test()
    s = a.isend(np.arange(4.0), 1, tag="x")
    assert s.test() and r.test()
    np.testing.assert_array_equal(out, np.arange(4.0))
    a.isend(np.full(4, 7.0), 1, tag="y")  # unexpected: buffered, send complete at once
    out2 = np.zeros(4)
    assert b.irecv(out2, 0, tag="y").test()
    assert (out2 == 7).all()


def test_local_fifo_per_tag_and_tag_isolation():
    a, b = pycoll.local_teams(2)
    for v in (1.0, 2.0):
        a.isend(np.full(2, v), 1, tag=5)
    a.isend(np.full(2, 9.0), 1, tag=6)
    outs = [np.zeros(2) for _ in range(3)]
    assert b.irecv(outs[2], 0, tag=6).test()
    assert b.irecv(outs[0], 0, tag=5).test() and b.irecv(outs[1], 0, tag=5).test()
    assert [o[0] for o in outs] == [1.0, 2.0, 9.0]
    assert a.transport.fabric.pending_messages() == 0


def test_local_truncation_and_bad_peer():
    a, b = pycoll.local_teams(2)
    a.isend(np.zeros(8), 1)
    r = b.irecv(np.zeros(2), 0)
    with pytest.raises(pycoll.TransportError, match="larger than the receive buffer"):
        r.test()
    with pytest.raises(ValueError, match="peer 5"):
        a.isend(np.zeros(1), 5)
    with pytest.raises(ValueError):
        pycoll.local_teams(0)


def test_send_recv_tasks_in_schedules_across_64_ranks():
    n = 64
    teams = pycoll.local_teams(n)
    bufs = [np.full(3, float(r)) for r in range(n)]
    outs = [np.zeros(3) for _ in range(n)]
    reqs = []
    for r, team in enumerate(teams):  # a ring shift: send to the right, receive from the left
        s = Schedule([SendTask(team, bufs[r], (r + 1) % n, "ring"),
                      RecvTask(team, outs[r], (r - 1) % n, "ring")], name=f"shift{r}")
        reqs.append(team.ctx.submit(s))
    pycoll.wait_all(reqs)
    assert [o[0] for o in outs] == [float((r - 1) % n) for r in range(n)]
    assert "receive of 24 B from rank 63" in reqs[0].task.tasks[1].describe()


def test_custom_schedule_example_runs():
    from examples.custom_schedule import main

    main(4)
    main(8, count=1000)
