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


def test_overlapping_buffers_are_refused_unless_in_place():
    """sendbuf and recvbuf that overlap other than as in place (the same memory, or a gathering
    rank's own block) raise before anything is sent: the algorithms would read what they wrote
    (MPI forbids it). The same memory as two objects is in place."""
    teams = pycoll.local_teams(3)
    t = teams[0]
    posted = t.ctx.posted
    b = np.zeros(12)
    cases = {
        "allreduce": lambda: t.allreduce(b[0:6], b[2:8]),
        "scan": lambda: t.scan(b[0:6], b[1:7]),
        "reduce_scatter": lambda: t.reduce_scatter(b[0:6], b[4:6]),
        "allgather (another rank's block)": lambda: t.allgather(b[2:4], b[0:6]),
        "gatherv (past its block)": lambda: t.gatherv(b[1:3], b[0:6], [2, 2, 2], root=0),
        "scatter (the root's output astride its block)": lambda: t.scatter(b[0:6], b[1:3], root=0),
        "alltoall": lambda: t.alltoall(b[0:6], b[3:9]),
        "alltoallv": lambda: t.alltoallv(b[0:6], b[1:7], [2, 2, 2], [2, 2, 2]),
    }
    for name, call in cases.items():
        with pytest.raises(ValueError, match="overlap") as info:
            call()
        assert isinstance(info.value, ValueError), name
    assert t.ctx.posted == posted
    xs = [np.arange(4.0) + r for r in range(3)]
    pycoll.wait_all([tm.allreduce(x, x.view()) for tm, x in zip(teams, xs)])  # (in place, two objects)
    assert all((x == np.arange(4.0) * 3 + 3).all() for x in xs), xs
    rs = [np.repeat(np.arange(3.0), 2) for _ in range(3)]
    pycoll.wait_all([tm.allgather(rv[2 * r:2 * r + 2], rv) for r, (tm, rv) in enumerate(zip(teams, rs))])
    assert all((rv == np.repeat(np.arange(3.0), 2)).all() for rv in rs), rs
    # v-layouts: a sendbuf in a gap of the blocks, disjoint regions of one workspace: legal
    bs = [np.full(8, float(r)) for r in range(3)]
    pycoll.wait_all([tm.allgatherv(b[0:2], b, [2, 2, 2], [2, 4, 6]) for tm, b in zip(teams, bs)])
    assert all((b[2:] == np.repeat(np.arange(3.0), 2)).all() for b in bs), bs
    ws = [np.concatenate([np.arange(6.0) + 10 * r, np.zeros(6)]) for r in range(3)]
    pycoll.wait_all([tm.alltoallv(w[0:6], w[6:12], [2] * 3, [2] * 3) for tm, w in zip(teams, ws)])
    assert all((w[6:] == [2 * r + k + 10 * s for s in range(3) for k in range(2)]).all()
               for r, w in enumerate(ws)), ws
    with pytest.raises(ValueError, match="counts or displacements differ"):
        t.alltoallv(ws[0], ws[0], [2] * 3, [2] * 3, [0, 2, 4], [6, 8, 10])


def test_buffer_errors_are_pycoll_errors_raised_before_anything_is_sent():
    import pycoll.buffers

    team = pycoll.local_teams(1)[0]
    posted = team.ctx.posted
    with pytest.raises(pycoll.BufferError, match="contiguous") as info:
        team.allreduce(np.ones(8)[::2], np.empty(4))
    assert isinstance(info.value, pycoll.PycollError) and isinstance(info.value, ValueError)
    assert pycoll.buffers.BufferError is pycoll.BufferError and team.ctx.posted == posted


def test_send_and_recv_block_isend_and_irecv_return_engine_requests():
    import threading
    import warnings

    from pycoll.engine.request import Request

    a, b = pycoll.local_teams(2)
    req = b.irecv(np.zeros(3), 0, tag="q")
    assert isinstance(req, Request) and not req.done
    a.send(np.arange(3.0), 1, tag="q")  # blocks until the buffer may be reused: here at once
    req.wait(5)
    assert req.done
    # a blocking recv waits for its message (sent by another thread here)
    out = np.zeros(2)
    sender = threading.Timer(0.05, lambda: a.isend(np.full(2, 5.0), 1, tag="late").wait())
    sender.start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (ignoring the result warns about nothing)
        b.recv(out, 0, tag="late")
    sender.join()
    assert (out == 5.0).all()
    # the result of send/recv still answers as the Request they used to return, with a warning
    done = a.send(np.ones(1), 1, tag="old")
    with pytest.warns(DeprecationWarning, match="team.isend"):
        done.wait()
    b.recv(np.zeros(1), 0, tag="old")
    # raw messages outside the engine: the team's p2p channel, matched with the engine's by tag
    raw = a.p2p.isend(np.full(4, 2, np.uint8), 1, "raw")
    got = np.zeros(4, np.uint8)
    b.recv(got, 0, tag="raw")
    assert raw.test() and (got == 2).all()


def test_isend_inside_a_task_keeps_the_raw_request_with_a_warning():
    from pycoll.tasks.task import Task
    from pycoll.tl.base import TransportRequest

    a, b = pycoll.local_teams(2)
    seen = []

    class OldStyle(Task):
        def post(self) -> None:
            self.req = a.isend(np.ones(2), 1, tag="in-task")  # the old way: raw, polled below
            seen.append(self.req)

        def progress(self) -> None:
            if self.req.test():
                self.complete()

    got = np.zeros(2)
    recv = b.irecv(got, 0, tag="in-task")
    with pytest.warns(DeprecationWarning, match="team.p2p.isend"):
        a.ctx.submit(OldStyle("old")).wait(5)
    recv.wait(5)
    assert isinstance(seen[0], TransportRequest) and (got == 1).all()
