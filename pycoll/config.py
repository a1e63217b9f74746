"""``PYCOLL_*`` settings: one table, read from the environment, listed by ``pycoll info``.

Every setting is declared once in :data:`SETTINGS` with its parser, default and description. Code
reads a setting with :func:`get`; the value is parsed from the environment at each call, so tests
may set variables at run time.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Tuple

from pycoll.errors import ConfigError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
          "TIB": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(text: str) -> int:
    """Parse a byte count such as ``4096``, ``64K``, ``4M``, ``1.5G`` or ``inf`` (-> ``math.inf``
    is not an int, so ``inf`` and ``0`` both mean "no limit" where a limit is asked for: returns 0)."""
    s = str(text).strip()
    if s.lower() in ("inf", "infinity", "unlimited", "none", "off"):
        return 0
    m = _SIZE_RE.match(s)
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(f"cannot parse byte count {text!r} (examples: 4096, 64K, 4M, 1G, inf)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _nonneg_int(text: str, name: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise ConfigError(f"{name} must be a count >= 0, got {text!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be a count >= 0, got {text!r}")
    return value


def _nonneg_float(text: str, name: str) -> float:
    try:
        value = float(str(text).strip())
    except ValueError:
        raise ConfigError(f"{name} must be a number >= 0, got {text!r}") from None
    if not value >= 0 or value == math.inf:
        raise ConfigError(f"{name} must be a finite number >= 0, got {text!r}")
    return value


def parse_seconds(text: str) -> float:
    """Parse a duration in seconds; ``0``, ``inf`` or ``none`` mean no limit (returns ``math.inf``)."""
    s = str(text).strip().lower()
    if s in ("inf", "infinity", "none", "off", "0"):
        return math.inf
    try:
        value = float(s.rstrip("s"))
    except ValueError:
        raise ConfigError(f"cannot parse duration {text!r} (seconds, e.g. 30 or 2.5; 0 = none)") from None
    if value < 0:
        raise ConfigError(f"duration must be >= 0, got {text!r}")
    return value if value > 0 else math.inf


def parse_list(text: str) -> List[str]:
    """Parse a comma-separated list (``mpi,shm``)."""
    return [item.strip() for item in str(text).split(",") if item.strip()]


def parse_ranks_per_node(text: str) -> Tuple[int, ...]:
    """``PYCOLL_RANKS_PER_NODE``: ``""`` (off), ``k`` or ``a,b,c`` (positive integers)."""
    s = str(text).strip()
    if not s:
        return ()
    try:
        counts = tuple(int(x) for x in s.split(","))
    except ValueError:
        raise ConfigError(f"PYCOLL_RANKS_PER_NODE must be a rank count or a list of counts "
                          f"(e.g. 4 or 3,3,2), got {text!r}") from None
    if not counts or any(c < 1 for c in counts):
        raise ConfigError(f"PYCOLL_RANKS_PER_NODE counts must be >= 1, got {text!r}")
    return counts


def parse_check(text: str) -> str:
    """Parse PYCOLL_CHECK: on (or auto, its older name), all (or 1, always) or off (or 0, none)."""
    s = str(text).strip().lower()
    s = {"1": "all", "always": "all", "0": "off", "none": "off", "auto": "on"}.get(s, s)
    if s not in ("on", "all", "off"):
        raise ConfigError(f"PYCOLL_CHECK must be on, all or off, got {text!r}")
    return s


def parse_flag(text: str) -> bool:
    """Parse an on/off setting: 1, on, yes, true or 0, off, no, false."""
    s = str(text).strip().lower()
    if s in ("1", "on", "yes", "true"):
        return True
    if s in ("0", "off", "no", "false"):
        return False
    raise ConfigError(f"expected 1 or 0 (on or off), got {text!r}")


#: The shortest ``PYCOLL_JOB_KEY`` accepted (characters).
MIN_KEY_CHARS = 16


def parse_key(text: str) -> bytes:
    """Parse PYCOLL_JOB_KEY: any text of at least :data:`MIN_KEY_CHARS` characters, as bytes
    (``b""``: unset)."""
    s = str(text).strip()
    if not s:
        return b""
    if len(s) < MIN_KEY_CHARS:
        raise ConfigError(f"PYCOLL_JOB_KEY must be at least {MIN_KEY_CHARS} characters (got {len(s)}); "
                          "make one with: python -c 'import secrets; print(secrets.token_hex(32))'")
    return s.encode()


def parse_level(text: str) -> str:
    """Parse a logging level name."""
    s = str(text).strip().upper()
    if s not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"PYCOLL_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, got {text!r}")
    return s


@dataclass(frozen=True)
class Setting:
    """One ``PYCOLL_*`` environment variable."""

    name: str
    default: str
    parse: Callable[[str], Any]
    doc: str
    secret: bool = False  # (pycoll info says whether it is set, never its value)


SETTINGS: Dict[str, Setting] = {}


def _declare(name: str, default: str, parse: Callable[[str], Any], doc: str, secret: bool = False) -> None:
    SETTINGS[name] = Setting(name, default, parse, doc, secret)


_declare("PYCOLL_CREDIT_BYTES", "inf", parse_bytes,
         "Most bytes in flight per process (ByteScheduler's credit): a task that takes credit posts only "
         "while it fits, or when nothing else is in flight. 0 or inf: no limit.")
_declare("PYCOLL_BW_LIMIT", "inf", parse_bytes,
         "Bandwidth limit for experiments, in bytes per second per process (200MB, 1.5G): one token bucket "
         "per process, shared by all its teams and transports like one NIC, delays every point-to-point "
         "send (tcp, mpi, ucx, local, shm's single-copy messages) until the bucket holds its bytes, and "
         "releases sends in the order they were posted. Not limited: receives, sends to the rank itself, "
         "and collectives that move data through the shared segment or peers' memory directly (untagged "
         "calls' shm and cma algorithms): for limited runs use PYCOLL_TLS without shm. Read "
         "when a team's transport is made. 0 or inf: no limit.")
_declare("PYCOLL_PARTITION_BYTES", "inf", parse_bytes,
         "Tasks that can be split (collectives, copies) larger than this are split into fragments of at "
         "most this size that inherit the parent's priority. Must be equal on all ranks. 0 or inf: no "
         "partitioning.")
_declare("PYCOLL_SCHED_PARTITION_BYTES", "4M", parse_bytes,
         "Partition size of pycoll.scheduling (ByteScheduler's partition): scheduled tensors are cut into "
         "parts of at most this size, each a collective of its own. Must be equal on all ranks. 0: whole "
         "tensors.")
_declare("PYCOLL_SCHED_TUNING", "credit", str,
         "What pycoll.scheduling's auto-tuner tunes from measured step time: credit, partition, "
         "'credit,partition' or off. Rank 0 decides; every rank applies at the same step.")
_declare("PYCOLL_SCHED_DRIFT", "0.25", float,
         "Relative change of the step time (median of the last steps vs the tuned one) that makes the "
         "auto-tuner search again.")
_declare("PYCOLL_NUM_SERVERS", "0", lambda t: _nonneg_int(t, "PYCOLL_NUM_SERVERS"),
         "Summation servers for push_pull (BytePS): the last K ranks of MPI's world run pycoll's server "
         "loop when the program makes its team from COMM_WORLD, and the team is the other ranks (the "
         "workers). pycoll run --servers K sets it.")
_declare("PYCOLL_TIMEOUT", "300", parse_seconds,
         "Seconds a collective may take before it fails with pycoll.TimeoutError naming what it waited "
         "on. 0 or inf: wait forever.")
_declare("PYCOLL_SPIN_US", "20", lambda t: _nonneg_float(t, "PYCOLL_SPIN_US"),
         "Microseconds a waiting rank polls before it sleeps (on the flag of a collective on the shared "
         "segment, else in short naps), when its host's ranks do not outnumber its cores (when they do, a "
         "waiting rank yields its core at once); also the longest a repeated native program over UCX "
         "polls in the one native call that starts it. Longer: a rank whose peer is briefly late stays "
         "awake, at the price of a busy core while it waits. Read when a team's engine is made.")
_declare("PYCOLL_PEER_SILENCE", "1.5", parse_seconds,
         "Seconds a peer's host may leave data of this rank unacknowledged on a TCP connection, while this "
         "rank waits for that peer, before the peer is lost (pycoll.PeerLostError): a host that is gone, or "
         "cut off the network, without closing its connections (where nothing of its own is in flight, "
         "the waiting rank sends a small ping to be acknowledged). The host of a stopped process "
         "(SIGSTOP, a debugger) still acknowledges, so such a peer is not lost. Also UCX's TCP_USER_TIMEOUT "
         "for UCX's TCP connections (where UCX_TCP_USER_TIMEOUT is not set). At least 1; 0 or inf: "
         "never (only PYCOLL_TIMEOUT ends the wait). Read when a TCP or UCX transport is made.")
_declare("PYCOLL_TLS", "shm,mpi,tcp", parse_list,
         "Transports pycoll may use, in order of preference: shm (a shared segment when all ranks of a team "
         "share a host), mpi (teams from mpi4py communicators), tcp (teams from a store), ucx (UCX's tag "
         "API for point to point, for teams from MPI or a store, when listed before mpi/tcp, e.g. "
         "'ucx,shm'; UCX's own UCX_TLS picks its transports; PYCOLL_UCX_LIB names a libucp.so to load "
         "instead of the libucx-cu12 wheel's).")
_declare("PYCOLL_MPIEXEC", "", str,
         "The mpiexec that pycoll run and pycoll perf start ranks with (a path); empty: the one the mpich "
         "wheel puts next to Python, else the first on PATH. For a machine with several MPIs.")
_declare("PYCOLL_UCX_LIB", "", str,
         "Path of a libucp.so for the ucx transport to load instead of the one MPICH already loaded or the "
         "libucx wheel's.")
_declare("PYCOLL_UCX_PEER_ERRORS", "auto", str,
         "UCX peer error mode (a dead peer is reported at once): auto = for ranks on other nodes only (the "
         "mode rules out UCX's shared-memory transports), 1 = every rank, 0 = none (a dead peer is then "
         "found by PYCOLL_TIMEOUT).")
_declare("PYCOLL_NODE_ID", "", str,
         "Name of this process's node, instead of its hostname (set per process: one machine acting as "
         "several nodes, e.g. one value per network namespace). Ranks with equal names share a node.")
_declare("PYCOLL_RANKS_PER_NODE", "", parse_ranks_per_node,
         "Pretend the launcher's ranks sit k per node in rank order (k), or a, b, c ranks on successive "
         "nodes (a,b,c), so that one machine tests hierarchical algorithms. Empty: group by hostname.")
_declare("PYCOLL_NODE_TLS", "", parse_list,
         "Transports of node sub-teams (hierarchical algorithms' node level), as PYCOLL_TLS; empty: "
         "PYCOLL_TLS.")
_declare("PYCOLL_LEADER_TLS", "", parse_list,
         "Transports of leader and rail sub-teams (the level between nodes), as PYCOLL_TLS; empty: "
         "PYCOLL_TLS.")
_declare("PYCOLL_TUNE", "", str,
         "Algorithm selection rules that come before the defaults, e.g. "
         "'allreduce:0-4K:rd#allreduce:4K-inf:ring;bcast:0-inf:knomial' (fields: byte range LO-HI, "
         "team=LO-HI, mem=host|cuda, algorithm). pycoll info prints the effective table.")
_declare("PYCOLL_TRACE", "", str,
         "Write a Chrome/Perfetto timeline (Trace Event JSON; open in ui.perfetto.dev or chrome://tracing) "
         "to this file, one per rank: '{rank}' in the name is replaced by the rank, else '.rank<r>' goes "
         "before the extension (trace.json -> trace.rank0.json; the launcher's rank, else the pid). It "
         "shows each task's queue wait (held back by priority or credit) and communication span with "
         "name, priority, bytes and credit, plus the program's spans (pycoll.trace.tracer().span). "
         "Written at exit and by pycoll.trace.flush(). Combine and draw with 'pycoll trace merge' and "
         "'pycoll trace plot'. Empty: no tracing (no cost).")
_declare("PYCOLL_TRACE_INSTRUCTIONS", "0", parse_flag,
         "1 (with PYCOLL_TRACE): a native program's instructions show in the timeline too, each a span "
         "from when its executor issued it to when it was done (send, recv with its peer and bytes; "
         "reduce, copy, check), under the collective's own span. Costs two clock reads per instruction. "
         "Read when a program's task is made.")
_declare("PYCOLL_CHECK", "on", parse_check,
         "How ranks that call a collective with arguments that must agree and do not (collective, count, "
         "dtype, op, root) are caught, so that they raise pycoll.MismatchError instead of computing a "
         "wrong result. on (auto is its older name): off the shared segment (MPI, TCP, UCX, several "
         "hosts, tagged calls) every message carries a 32-byte mark of its call and of the team's calls "
         "before it, which every receive compares: a rank that finds another mark raises, the team then "
         "takes no more calls, and the other ranks raise at their next call at the latest; the v-forms "
         "(and rejected calls) exchange a fingerprint of the call before moving data (every rank raises "
         "and the team goes on). all: that exchange before every collective too (every rank names every "
         "rank's call). off: neither (rejections still exchange). On the shared segment every call is "
         "signed, but the other ranks of a rooted collective (bcast, reduce, gather(v), scatter(v)) check "
         "the root's call alone (on: past the segment's first 8 collectives, but on the powers of two; "
         "off: always; all: never): a rank whose call matches the root's then returns while the root and "
         "the ranks that differ raise, and a later call (usually its next) raises PeerLostError (a "
         "gather's other ranks return without waiting for the root and compare their call with the "
         "root's within their next two calls or when the team closes: MismatchError if it differed, "
         "else PeerLostError within three calls). Must be equal on all ranks.")
_declare("PYCOLL_NATIVE_PROGRAMS", "1", parse_flag,
         "1: the point-to-point algorithms that lower to programs (pycoll info lists them) run as native "
         "programs where the team's transport has an executor (UCX, one host's shared memory), for "
         "untagged calls on an engine without a credit or bandwidth limit: no Python per step. 0: they "
         "run in Python. Read when a team is made.")
_declare("PYCOLL_ABORT_ON_ERROR", "1", parse_flag,
         "1: an uncaught exception on a rank of an MPI job ends the whole job (MPI_Abort at exit, as "
         "'python -m mpi4py' does), instead of the rank waiting in MPI_Finalize while its peers wait "
         "for it until their timeout; 0: leave it to the program.")
_declare("PYCOLL_JOB_KEY", "", parse_key,
         "The job's secret (at least 16 characters; pycoll run makes a random one per job and hands it to "
         "its ranks): teams made from a store sign their store entries and TCP hellos with it and act on no "
         "entry or connection that lacks its MAC, and their store entries lie under names derived from it. "
         "Set it yourself, the same on every rank, for a store-made team launched otherwise (torchrun: "
         "export it before torchrun starts). Unset: a store-made team is only as safe as its store. Teams "
         "made from MPI draw a key of their own on rank 0 and share it over MPI. pycoll info never prints "
         "it. See the security guide.", secret=True)
_declare("PYCOLL_LOG_LEVEL", "WARNING", parse_level,
         "Level of the 'pycoll' logger (DEBUG, INFO, WARNING, ERROR).")


def get(name: str) -> Any:
    """The parsed value of setting ``name`` (from the environment, else its default)."""
    setting = SETTINGS[name]
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return setting.parse(setting.default)
    try:
        return setting.parse(raw)
    except ConfigError as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None


def describe() -> List[Tuple[str, str, str]]:
    """(name, effective value as text, description) for every setting, for ``pycoll info``."""
    rows = []
    for name, setting in SETTINGS.items():
        raw = os.environ.get(name)
        shown = raw if raw else f"{setting.default} (default)"
        if setting.secret:
            shown = "(set: not shown)" if raw and raw.strip() else "(unset)"
        rows.append((name, shown, setting.doc))
    return rows
