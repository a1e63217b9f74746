"""PyTorch integration: the ``pycoll`` torch.distributed backend, a priority comm hook for DDP, and
:class:`ScheduledOptimizer` (training without the global barrier).

Importing this module registers the backend::

    import pycoll.torch
    import torch.distributed as dist

    dist.init_process_group("pycoll")            # under torchrun, pycoll run or mpiexec

Under ``torchrun`` the usual ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` are set. Under an
MPI launcher (``pycoll run``, ``mpiexec``) they are filled in on import from the launcher's own
variables (``PMI_RANK``/``PMI_SIZE``), and ``MASTER_ADDR``/``MASTER_PORT``, when missing, are agreed
through MPI (rank 0 picks a free port), so ``dist.init_process_group("pycoll")`` needs nothing more.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch.distributed as dist

from pycoll import config
from pycoll.team import Team
from pycoll.torch.backend import ProcessGroupPycoll, PycollWork, reduce_op
from pycoll.torch.hooks import PriorityHookState, priority_hook
from pycoll.torch.scheduled import ScheduledOptimizer
from pycoll.torch.tensors import as_numpy

BACKEND = "pycoll"


def create_process_group(opts: Any, backend_options: Any = None) -> ProcessGroupPycoll:
    """The creator torch calls for ``init_process_group("pycoll")`` and ``new_group``: a pycoll team
    bootstrapped through the group's c10d store (TCP between ranks, shared memory on a host)."""
    group = getattr(opts, "group_id", "") or "default_pg"
    timeout = opts.timeout.total_seconds() if getattr(opts, "timeout", None) is not None else None
    # torchrun may hand a restarted job the store of the last attempt: its keys are stale here
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    team = Team.from_store(opts.store, opts.group_rank, opts.group_size,
                           prefix=f"pycoll/{group}/attempt{attempt}")
    pg = ProcessGroupPycoll(team, timeout=timeout, group_name=group)
    servers = _num_servers()
    if servers and "PMI_SIZE" in os.environ and opts.group_size == int(os.environ["PMI_SIZE"]) - servers:
        # workers of a launch with summation servers (pycoll run --servers K): the workers' MPI team,
        # whose push_pull uses the servers (they wait in Team.from_mpi for exactly this call)
        from mpi4py import MPI  # noqa: PLC0415 - importing it initializes MPI: under an MPI launcher only

        pg.ps_team = Team.from_mpi(MPI.COMM_WORLD)
    return pg


def _num_servers() -> int:
    return config.get("PYCOLL_NUM_SERVERS")


def _register() -> None:
    if BACKEND in dist.Backend.backend_list:  # registered already (the module was reloaded)
        return
    dist.Backend.register_backend(BACKEND, create_process_group, extended_api=True, devices=["cpu"])


def _fill_launcher_env() -> None:
    """Translate an MPI launcher's variables into torch's env:// ones (only those not set)."""
    env = os.environ
    rank = env.get("PMI_RANK") or env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
    size = env.get("PMI_SIZE") or env.get("OMPI_COMM_WORLD_SIZE")
    if rank is None or size is None or "RANK" in env:
        return
    servers = _num_servers()
    if servers:  # the last K ranks are summation servers, not torch ranks
        if int(rank) >= int(size) - servers:
            return
        size = str(int(size) - servers)
    env.setdefault("RANK", rank)
    env.setdefault("WORLD_SIZE", size)
    local = env.get("MPI_LOCALRANKID") or env.get("OMPI_COMM_WORLD_LOCAL_RANK")
    if local is not None:
        env.setdefault("LOCAL_RANK", local)
    nlocal = env.get("MPI_LOCALNRANKS") or env.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if nlocal is not None:
        env.setdefault("LOCAL_WORLD_SIZE", nlocal)
    if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
        from mpi4py import MPI  # noqa: PLC0415 - importing it initializes MPI: under an MPI launcher only

        world = MPI.COMM_WORLD
        if servers:  # the workers only: the servers are waiting in Team.from_mpi
            world = world.Create_group(world.Get_group().Incl(list(range(int(size)))))
        where = bytearray(256)  # "host:port", sent with MPI's buffer Bcast (mpi4py's bcast pickles)
        if world.Get_rank() == 0:
            with socket.socket() as s:
                s.bind(("", 0))
                text = f"{env.get('MASTER_ADDR') or _host_address()}:{s.getsockname()[1]}".encode()[:255]
                where[:len(text)] = text
        world.Bcast([where, MPI.BYTE], root=0)
        host, _, port = bytes(where).rstrip(b"\0").decode().rpartition(":")
        env.setdefault("MASTER_ADDR", host)
        env.setdefault("MASTER_PORT", port)


def _host_address() -> str:
    """This host's address for peers (127.0.0.1 when the ranks share it)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


_register()
_fill_launcher_env()

__all__ = ["BACKEND", "PriorityHookState", "ProcessGroupPycoll", "PycollWork", "ScheduledOptimizer",
           "as_numpy", "create_process_group", "priority_hook", "reduce_op"]
