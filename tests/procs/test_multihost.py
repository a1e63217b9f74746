"""Two hosts on one machine (network namespaces joined by a veth pair): hierarchical collectives
with the node level on each host's shared segment and the leader level across the veth link."""


from tests.launch import need_ucx


def test_two_hosts_tcp(hosts):
    """3 ranks on host A, 2 on host B (uneven); between hosts the store-bootstrapped TCP transport."""
    hosts("tests/procs/scripts/two_hosts.py", [3, 2], "tcp", timeout=150)


def test_two_hosts_ucx_tcp(hosts):
    """The same with every team on UCX, forced onto TCP (UCX_TLS=tcp: every message goes over
    UCX's TCP transport, within a host too; between the namespaces UCX takes TCP anyway, as
    between machines); the node level keeps each host's shared segment for its collectives."""
    need_ucx()
    hosts("tests/procs/scripts/two_hosts.py", [3, 2], "ucx", timeout=150,
          env={"PYCOLL_TLS": "ucx,shm", "UCX_TLS": "tcp"})


def test_a_host_cut_off_is_lost_in_seconds_a_stopped_rank_is_not(hosts):
    """A host that leaves the network without closing its connections: its rank is lost within
    PYCOLL_PEER_SILENCE (1.5 s), not PYCOLL_TIMEOUT; a rank stopped (SIGSTOP) for longer than that
    is not lost: its host still answers, and its collective completes when it resumes."""
    for mode in ("cut", "cut-idle"):
        out = hosts("tests/procs/scripts/host_silence.py", [1, 1], mode, timeout=60)
        assert "rank 0 lost rank 1 after" in out, out
    out = hosts("tests/procs/scripts/host_silence.py", [1, 1], "stop", timeout=60)
    assert "rank 0 waited" in out, out


def test_a_host_cut_off_is_lost_in_seconds_over_ucx(hosts):
    """The same over UCX (forced onto TCP): pycoll sets UCX's TCP_USER_TIMEOUT to the silence and
    pings the peers it waits on, so a host cut off while this rank only receives is lost within
    2 s; a stopped rank is not lost."""
    need_ucx()
    env = {"PYCOLL_TLS": "ucx", "UCX_TLS": "tcp"}
    out = hosts("tests/procs/scripts/host_silence.py", [1, 1], "cut-idle", "ucx", timeout=60, env=env)
    assert "rank 0 lost rank 1 after" in out, out
    out = hosts("tests/procs/scripts/host_silence.py", [1, 1], "stop", "ucx", timeout=60, env=env)
    assert "rank 0 waited" in out, out
