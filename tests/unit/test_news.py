"""How often a team made from MPI looks for a peer's mismatch news when it posts
(:meth:`pycoll.news.MPINews.pending`): at most every ``PROBE_S`` (a probe runs MPI's progress), and
at every post when posts are slower; on a clock the test drives (no timing), with a stand-in for
the status communicator."""

from types import SimpleNamespace

import pytest

from pycoll import news
from pycoll.news import PROBE_S, MPINews


class Comm:
    """The status communicator's Iprobe, counted (``waiting``: news waits)."""

    def __init__(self, waiting: bool = False) -> None:
        self.probes = 0
        self.waiting = waiting

    def Iprobe(self, tag: int) -> bool:  # noqa: N802 - mpi4py's name
        assert tag == news.NEWS_TAG
        self.probes += 1
        return self.waiting


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(news.time, "monotonic", lambda: now[0])
    return now


def posts(probe: MPINews, clock: list, n: int, every_s: float) -> None:
    for _ in range(n):
        clock[0] += every_s
        assert probe.pending() is False


def test_posts_look_for_news_at_most_every_probe_s_and_at_every_slower_post(clock):
    comm = Comm()
    probe = MPINews(comm, SimpleNamespace(), None, b"id")
    posts(probe, clock, 50, 2 * PROBE_S)  # slower posts: each looks
    assert comm.probes == 50
    comm.probes = 0
    posts(probe, clock, 2000, PROBE_S / 20)  # 20 posts in PROBE_S: one in about 20 looks
    assert 95 <= comm.probes <= 101, comm.probes
    comm.probes = 0
    posts(probe, clock, 3, 10 * PROBE_S)  # slower again: at once
    assert comm.probes == 3


def test_news_that_waits_is_taken_at_a_post(clock):
    probe = MPINews(Comm(waiting=True), SimpleNamespace(), None, b"id")
    taken = []
    probe.look = lambda: taken.append(1) or False  # (it failed the team's calls: no more looks)
    clock[0] += 1.0
    assert probe.pending() is True and taken == [1]
