"""How often a team made from MPI looks for a peer's mismatch news when it posts
(:meth:`pycoll.news.MPINews.pending`): about every ``PROBE_S`` whatever the call rate (every post
when calls are slower, at most every ``PROBE_POSTS`` posts when they are fast), on a clock the test
drives (no timing), with a stand-in for the status communicator."""

from types import SimpleNamespace

import pytest

from pycoll import news
from pycoll.news import PROBE_POSTS, PROBE_S, MPINews


class Comm:
    """The status communicator's Iprobe, counted (no news waits)."""

    def __init__(self) -> None:
        self.probes = 0

    def Iprobe(self, tag: int) -> bool:  # noqa: N802 - mpi4py's name
        assert tag == news.NEWS_TAG
        self.probes += 1
        return False


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(news.time, "monotonic", lambda: now[0])
    return now


def posts(probe: MPINews, clock: list, n: int, every_s: float) -> None:
    for _ in range(n):
        clock[0] += every_s
        assert probe.pending() is False


def test_slow_posts_look_at_every_post(clock):
    comm = Comm()
    probe = MPINews(comm, SimpleNamespace(), None, b"id")
    posts(probe, clock, 50, 2 * PROBE_S)
    assert comm.probes == 50


def test_fast_posts_look_about_every_probe_s_and_at_most_every_probe_posts(clock):
    comm = Comm()
    probe = MPINews(comm, SimpleNamespace(), None, b"id")
    step = PROBE_S / 20  # (20 posts in PROBE_S)
    posts(probe, clock, 2000, step)
    assert 2000 * step / PROBE_S * 0.8 <= comm.probes <= 2000 * step / PROBE_S * 2, comm.probes
    comm.probes = 0
    posts(probe, clock, 64 * 100, PROBE_S / 10000)  # (faster than PROBE_POSTS in PROBE_S)
    assert 100 <= comm.probes <= 110, comm.probes
    comm.probes = 0
    posts(probe, clock, 3, 10 * PROBE_S)  # slower again: the next posts look at once
    assert comm.probes >= 2, comm.probes


def test_news_that_waits_is_taken_at_a_post(clock):
    class Waiting(Comm):
        def Iprobe(self, tag: int) -> bool:  # noqa: N802
            super().Iprobe(tag)
            return True

    probe = MPINews(Waiting(), SimpleNamespace(), None, b"id")
    taken = []
    probe.look = lambda: taken.append(1) or False  # (it failed the team's calls: not looking again)
    clock[0] += 1.0
    assert probe.pending() is True and taken == [1]
    assert PROBE_POSTS >= 1
