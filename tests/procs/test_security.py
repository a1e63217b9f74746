"""A stranger on loopback against a running job: it knows the store's address and pycoll's
source, not the job's key, and tries to run code in a rank (a pickle planted among the status
questions), change a result (a man in the middle of the TCP mesh, or hellos as rank 1), revoke the
team, leave a rank out of its shrink, or make the store allocate 1 GiB. Each attempt is refused and
the job's sums, agreement and shrink stay right.

Jobs launched by ``pycoll run`` (its own key per job) meet a stranger that guesses where the team's
entries are from pycoll's source; jobs whose ranks are given ``PYCOLL_JOB_KEY`` meet one that is
told where they are (as a process that sniffs the store's traffic could learn), so that their MACs
are what refuses it. Teams made with ``Team.from_mpi`` share a key over MPI. Everything in one
process: tests/unit/test_security.py; the threat model: docs/guide/security.md."""

import secrets
import subprocess
import sys
import time
from typing import Dict, Tuple

import pytest

from pycoll.store import TCPStore
from tests.launch import ROOT, child_env, kill_group, launched

JOB = str(ROOT / "tests" / "procs" / "scripts" / "attacked_job.py")
STRANGER = str(ROOT / "tests" / "procs" / "scripts" / "stranger.py")
RIGHT = "RESULT agree=True revoked=False shrunk=2 sum=3"


def _space(server: TCPStore, timeout: float = 20.0) -> str:
    """Where the job's team keeps its entries: what a sniffer of the store learns from the key of
    rank 0's first address."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server._server.cond:
            found = [k for k in server._server.data if k.endswith("/addr0/0")]
        if found:
            return found[0][:-len("/addr0/0")]
        time.sleep(0.01)
    pytest.fail("the job's rank 0 wrote no address within 20 s")


def attack(how: str, what: str, tmp_path) -> Tuple[Dict[int, str], set]:
    """Run the two-rank job (``how``: "run" under ``pycoll run``, "key" as two processes given a
    key) with a stranger attacking ``what``: (each rank's output, the files the stranger and its
    payloads left in tmp_path). A rank still running 30 s on is killed and named."""
    server = TCPStore(port=0, is_master=True, timeout=30)
    port = str(server.port)
    outs: Dict[int, str] = {}
    with launched(f"job attacked by {what}") as tag:
        clean = child_env({"PYCOLL_TLS": "tcp", "PYCOLL_TIMEOUT": "20", **tag}, drop=["PYCOLL_JOB_KEY"])
        stranger = subprocess.Popen([sys.executable, STRANGER, port, what, str(tmp_path)], env=clean,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)
        if how == "run":
            cli = [sys.executable, "-m", "pycoll.cli", "run", "-n", "2", "--timeout", "40", "--"]
            procs = [_start([*cli, sys.executable, "-u", JOB, port], clean)]
        else:
            keyed = dict(clean, PYCOLL_JOB_KEY=secrets.token_hex(32))
            procs = [_start([sys.executable, "-u", JOB, port, str(r)], keyed) for r in (0, 1)]
        try:
            # the guesser reads pycoll's source; the sniffer is told where the team's entries lie
            stranger.stdin.write(("pycoll/team1" if how == "run" else _space(server)) + "\n")
            stranger.stdin.flush()
            deadline = time.monotonic() + 30
            for i, p in enumerate(reversed(procs)):  # (rank 1 first: rank 0 may wait for it in vain)
                try:
                    out = p.communicate(timeout=max(0.1, deadline - time.monotonic()))[0]
                except subprocess.TimeoutExpired:
                    kill_group(p)
                    out = p.communicate()[0] + "\n(killed by the test: still running)"
                if "REFUSED" in out:  # (rank 1 refused the bootstrap: rank 0 waits for it until killed)
                    deadline = time.monotonic() + 1
                outs[len(procs) - 1 - i] = out
        finally:
            for p in [*procs, stranger]:
                kill_group(p)
            said = stranger.communicate()[0]
            server.close()
    if how == "run":
        outs = {r: "\n".join(line for line in outs[0].splitlines() if f"RANK {r} " in line) for r in (0, 1)}
    outs[-1] = said  # (the stranger's own output)
    return outs, {p.name for p in tmp_path.iterdir()}


def _start(cmd, env) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _report(outs: Dict[int, str]) -> str:
    return "\n".join(f"--- {'stranger' if r < 0 else f'rank {r}'}:\n{o[-3000:]}"
                     for r, o in sorted(outs.items()))


def _job_was_right(outs: Dict[int, str], keyed: bool = True) -> None:
    for r in (0, 1):
        assert f"RANK {r} KEYED {keyed}" in outs[r], _report(outs)
        assert f"RANK {r} {RIGHT}" in outs[r] and "WRONG" not in outs[r], _report(outs)


@pytest.mark.parametrize("how", ["run", "key"])
@pytest.mark.parametrize("what", ["pickle", "revoke", "shrink", "store"])
def test_a_stranger_cannot_run_code_revoke_shrink_or_grow_the_store(how, what, tmp_path):
    """pickle: no code of the stranger's runs in a rank (its file is not made); revoke: the team
    is not revoked; shrink: the agreement is the ranks' and the shrink keeps both; store: its 1 GiB
    length prefix is refused at once. The job's results are right throughout."""
    outs, files = attack(how, what, tmp_path)
    ran = {f for f in files if f.startswith("pwned")}
    assert not ran, f"the stranger's pickle ran: {files}\n{_report(outs)}"
    _job_was_right(outs)
    if what == "store":
        assert "store-refused" in files, f"{files}\n{_report(outs)}"


def test_a_man_in_the_middle_of_the_mesh_is_refused(tmp_path):
    """The stranger rewrites rank 0's address in the store to its own listener, to relay the
    traffic between the ranks and change its payloads: rank 1 refuses the entry (it is not signed
    with the job's key) and its bootstrap fails, and no rank computes a wrong sum (rank 0, which
    waits for rank 1 in vain, is ended by the test)."""
    outs, files = attack("key", "mitm", tmp_path)
    assert "mitm-in-the-middle" not in files and "WRONG" not in outs[0] + outs[1], _report(outs)
    assert "RANK 1 REFUSED AuthError: refused" in outs[1] and "/addr0" in outs[1], _report(outs)


@pytest.mark.parametrize("what", ["mitm", "hello"])
def test_a_job_of_pycoll_run_gives_a_guessing_stranger_nothing_to_act_on(what, tmp_path):
    """Under ``pycoll run`` the stranger looks for rank 0's address where pycoll's source would put
    it without a key (it is not there), or says hellos as rank 1 to every listener of the job's
    processes (refused): the job's results are right."""
    outs, files = attack("run", what, tmp_path)
    assert "mitm-in-the-middle" not in files, _report(outs)
    if what == "hello":
        assert any(f.startswith("hellos-") and f != "hellos-0" for f in files), f"{files}\n{_report(outs)}"
    _job_was_right(outs)


MPI_JOB = """
import os, pickle, sys
import numpy as np
from mpi4py import MPI
import pycoll
from pycoll import Team
from tests.rank import run_rank

def unpickled(*args, **kwargs):
    raise RuntimeError("mpi4py unpickled what a peer sent")

MPI.pickle.__init__(pickle.dumps, unpickled)  # (any lowercase receive of pycoll's now raises)

def main():
    assert not os.environ.get("PYCOLL_JOB_KEY")
    team = Team.from_mpi(MPI.COMM_WORLD)
    x = np.full(100, float(team.rank + 1))
    team.allreduce(x).wait()
    assert (x == 3).all()
    asked = team.planner.peer_status  # (questions and answers over MPI as JSON, never pickles)
    answers = asked.ask(("u", ("grads", 1), 0), timeout_s=5.0)
    assert answers == {1 - team.rank: {"posted": False, "count": 0, "waits_on": [], "mark": b""}}, answers
    team.barrier().wait()
    team.close()

run_rank(main)
"""


def test_a_team_from_mpi_shares_a_key_of_its_own_over_mpi(tmp_path, mpirun):
    """Under a plain mpiexec (no PYCOLL_JOB_KEY), a team made from MPI draws its key on rank 0 and
    sends it over MPI (its sealed exchanges then pass on both ranks); its bootstrap and its status
    questions unpickle nothing (mpi4py's unpickler raises in these ranks)."""
    script = tmp_path / "mpi_job.py"
    script.write_text(MPI_JOB)
    env = {"PYCOLL_TLS": "mpi"}
    mpirun(2, str(script), timeout=60, env=env)
