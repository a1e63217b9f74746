"""The machine a simulation runs on: an alpha-beta-gamma model with nodes, and optionally links
shared among the messages that cross them (NICs, rails, a two-level fat tree).

Between two ranks a message of ``n`` bytes takes ``alpha + n / bandwidth``: ``alpha`` (latency)
and ``bandwidth`` are the network's between nodes and the node's within one (``ppn`` ranks per
node, consecutive ranks together). Each rank has one link out and one in: its messages go out one
after another, and arrive one after another. A reduction costs ``n / reduce_bw`` of the rank's
time, a copy ``n / copy_bw``, and posting a message ``overhead`` plus ``overhead_per_byte`` for
each of its bytes. A message of ``rendezvous_bytes`` or more (where set) takes ``rendezvous``
longer, within a node or not. These are LogGP's (LogGOPS's) parameters: L is ``alpha``, o
``overhead``, G ``1 / bandwidth``, O ``overhead_per_byte`` (paid by the sender and the receiver
as they post the message), and g ``gap``: two messages start on a rank's link out (or arrive on
its link in) at least ``gap`` apart, however small they are (on every link a message books:
not with ``contention``, whose flows share the links instead, nor for a node's messages its cores
copy with ``cpu_copies``; a slow rank's ``--slow`` factor does not stretch it).

Measured hosts move data at rates that depend on the size (caches, a transport's protocols): a
``*_by_size`` table (``{"4KiB" = "1GB/s", "1MiB" = "9GB/s", "64MiB" = "5GB/s"}``) gives the rate
at those sizes, and a size between two of them gets the per-byte time interpolated on the log of
the size (the first and last rates hold beyond them), as SimGrid's SMPI corrects its bandwidth by
size; ``alpha_by_size`` tables give the latency by size the same way. With ``cpu_copies`` a
message within a node is copied in by its receiver's core (one host's transports copy with the
ranks' own cores): its send is done once posted, and its receiver copies it once it is there
(alpha after the send), its receive is posted and its core is free of other copies and reductions;
without contention only; with ``together_by_size`` a copy (a message's, a copy's or a reduction's)
takes that many times longer where another core of the node copies at the same time (their caches
and memory are shared: the copy that finds another under way is the one slowed, an approximation
of both slowing). ``call`` is a rank's time starting a call (``pycoll sim --calls``: the
simulated loop's calls each begin with it). With ``half_duplex`` a rank's messages out and in
share one link (its sends and receives take turns: a host whose transport copies with its own
core, as TCP's stack does, sends and receives at once no faster than one after the other).

With ``contention`` the links are shared instead (:mod:`pycoll.sim.flows`, max-min fair): within
a node each rank's link out and in (``node_bandwidth``); between nodes the NICs (``nics`` per
node, ``bandwidth`` each; a node's ``k``-th rank uses NIC ``k % nics``: rails) and, when
``nodes_per_leaf`` is set, a two-level fat tree: nodes hang from leaf switches, ``nodes_per_leaf``
each, and a message between leaves also crosses its leaf's uplink and the other leaf's downlink,
of ``nodes_per_leaf * nics * bandwidth / oversubscription`` each (the spine is not blocking;
the uplinks of a leaf count as one, as if ECMP spread the flows evenly). A machine file is TOML::

    [network]              # between nodes
    alpha = "2us"
    bandwidth = "12.5GB/s" # per NIC
    rendezvous_bytes = 8192 # messages of this size and more pay ``rendezvous`` more latency
    rendezvous = "4us"     # (a protocol switch, as MPI's eager to rendezvous; LogGOPS's S)
    gap = "1us"            # LogGP's g: the least time between two messages' starts on a link
    bandwidth_by_size = {"64KiB" = "8GB/s", "16MiB" = "10GB/s"}  # (instead of bandwidth, where given)
    half_duplex = true     # a rank's sends and receives share its link (take turns)
    [node]                 # within a node
    ppn = 8
    nics = 1               # NICs (rails) per node
    alpha = "0.5us"
    bandwidth = "20GB/s"
    bandwidth_by_size = {"4KiB" = "1GB/s", "4MiB" = "14GB/s"}
    cpu_copies = true      # a message is copied in by its receiver's core
    together_by_size = {"4MiB" = 1.0, "16MiB" = 1.7}  # a copy beside another of the node's
    [fabric]               # links shared by the messages crossing them (max-min fair)
    contention = true      # (the default where [fabric] is given)
    nodes_per_leaf = 16    # 0: one switch that never blocks
    oversubscription = 4   # the leaves' downlinks : uplinks
    [faults]               # a rank that dies (pycoll sim --kill, --kill-node): when its peers know
    detect = "50ms"        # its process ended (the host said so: on one host pycoll's exit marker)
    silence = "1.5s"       # its whole node went silent (PYCOLL_PEER_SILENCE)
    [compute]
    reduce = "5GB/s"       # the reduction's throughput (bytes of output per second)
    copy = "10GB/s"        # 0 or "inf": free
    overhead = "0.2us"     # the time a rank spends posting a send or a receive (LogGP's o)
    overhead_per_byte = "0.05ns"  # and per byte of it (LogGOPS's O)
    call = "3us"           # the time a rank spends starting a call (pycoll sim --calls: each call)
    reduce_by_size = {"64KiB" = "20GB/s", "64MiB" = "5GB/s"}
    copy_by_size = {"64KiB" = "30GB/s", "64MiB" = "8GB/s"}
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Dict, Hashable, Tuple, Union

import tomllib

from pycoll.config import parse_bytes
from pycoll.errors import ConfigError

#: A rate by size: ((bytes, bytes per second), ...) in size order.
SizeTable = Tuple[Tuple[int, float], ...]

_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_RATE = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12, "kib/s": 2.0 ** 10,
         "mib/s": 2.0 ** 20, "gib/s": 2.0 ** 30, "gbit/s": 1e9 / 8, "gb": 1e9}


def seconds(value: Union[str, float, int]) -> float:
    """``"2us"``, ``"0.5 ms"``, ``1e-6`` (seconds) -> seconds."""
    if isinstance(value, (int, float)):
        return float(value)
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([a-zµ]*)\s*", value)
    if not m or (m.group(2) or "s") not in _TIME:
        raise ValueError(f"not a time: {value!r} (a number of seconds, or with s, ms, us, ns)")
    return float(m.group(1)) * _TIME[m.group(2) or "s"]


def rate(value: Union[str, float, int]) -> float:
    """``"12.5GB/s"``, ``"100Gbit/s"``, ``"inf"``, ``1e9`` (bytes per second) -> bytes per second."""
    if isinstance(value, (int, float)):
        return float(value) if value else math.inf
    if value.strip().lower() in ("inf", "0"):
        return math.inf
    m = re.fullmatch(r"\s*([0-9.eE+-]+)\s*([A-Za-z/]*)\s*", value)
    unit = (m.group(2) or "b/s").lower() if m else ""
    if not m or unit not in _RATE:
        raise ValueError(f"not a rate: {value!r} (bytes per second, or with B/s, MB/s, GB/s, GiB/s, Gbit/s)")
    return float(m.group(1)) * _RATE[unit]


def flag(value: Any) -> bool:
    """A TOML boolean (``true``/``false``), nothing else."""
    if not isinstance(value, bool):
        raise ValueError(f"not true or false: {value!r}")
    return value


@dataclass
class Machine:
    """The model's parameters (seconds, bytes per second); see the module doc."""

    alpha: float = 2e-6
    bandwidth: float = 12.5e9
    ppn: int = 1
    node_alpha: float = 0.5e-6
    node_bandwidth: float = 20e9
    reduce_bw: float = 5e9
    copy_bw: float = 10e9
    overhead: float = 0.0
    overhead_per_byte: float = 0.0
    gap: float = 0.0
    call: float = 0.0
    nics: int = 1
    rendezvous_bytes: int = 0
    rendezvous: float = 0.0
    detect: float = 0.05
    silence: float = 1.5
    contention: bool = False
    nodes_per_leaf: int = 0
    oversubscription: float = 1.0
    cpu_copies: bool = False
    half_duplex: bool = False
    #: Rates by size, ((bytes, bytes per second), ...) in size order (empty: the scalar holds).
    bandwidth_by_size: SizeTable = ()
    node_bandwidth_by_size: SizeTable = ()
    #: Latencies by size, ((bytes, seconds), ...) in size order (empty: alpha holds).
    alpha_by_size: SizeTable = ()
    node_alpha_by_size: SizeTable = ()
    reduce_by_size: SizeTable = ()
    copy_by_size: SizeTable = ()
    #: How many times longer a copy of a size takes while another core of its node copies too
    #: ((bytes, factor), ...; with ``cpu_copies``).
    together_by_size: SizeTable = ()

    @property
    def by_size(self) -> bool:
        """Whether the machine has any part of a measured host's model (rates by size, messages
        copied by cores, a call's cost, half-duplex links): the simulation then runs in Python
        (``native/sim.c`` has the plain model, LogGP's parameters included, only)."""
        return bool(self.call or self.cpu_copies or self.half_duplex or self.bandwidth_by_size
                    or self.node_bandwidth_by_size or self.alpha_by_size or self.node_alpha_by_size
                    or self.reduce_by_size or self.copy_by_size or self.together_by_size)

    def message(self, a: int, b: int, nbytes: int) -> tuple[float, float]:
        """(alpha, seconds per byte) of a message of ``nbytes`` from rank ``a`` to rank ``b``; the
        ``rendezvous`` latency is in alpha where it applies (not with a table: its rates hold it)."""
        if self.ppn > 1 and a // self.ppn == b // self.ppn:
            alpha, table, bw = self.node_alpha, self.node_bandwidth_by_size, self.node_bandwidth
            latencies = self.node_alpha_by_size
        else:
            alpha, table, bw = self.alpha, self.bandwidth_by_size, self.bandwidth
            latencies = self.alpha_by_size
        if latencies:
            alpha = interpolate(latencies, nbytes)
        elif not table and self.rendezvous_bytes and nbytes >= self.rendezvous_bytes:
            alpha += self.rendezvous
        return alpha, per_byte(table, bw, nbytes)

    def together(self, nbytes: int) -> float:
        """How many times longer a copy of ``nbytes`` takes while another core of the node copies."""
        return interpolate(self.together_by_size, nbytes) if self.together_by_size else 1.0

    def compute(self, reduce: bool, nbytes: int) -> float:
        """Seconds a reduction (``reduce``) or a copy of ``nbytes`` takes."""
        if reduce:
            return nbytes * per_byte(self.reduce_by_size, self.reduce_bw, nbytes)
        return nbytes * per_byte(self.copy_by_size, self.copy_bw, nbytes)

    def link(self, a: int, b: int) -> tuple[float, float]:
        """(alpha, seconds per byte) from rank ``a`` to rank ``b``."""
        if self.ppn > 1 and a // self.ppn == b // self.ppn:
            return self.node_alpha, 1.0 / self.node_bandwidth
        return self.alpha, 1.0 / self.bandwidth

    def route(self, a: int, b: int) -> Tuple[Hashable, ...]:
        """The links a message from rank ``a`` to rank ``b`` crosses (with ``contention``)."""
        ppn = self.ppn
        node_a, node_b = a // ppn, b // ppn
        if ppn > 1 and node_a == node_b:
            return ("tx", a), ("rx", b)
        nics = self.nics
        links: Tuple[Hashable, ...] = (("out", node_a, a % ppn % nics), ("in", node_b, b % ppn % nics))
        per_leaf = self.nodes_per_leaf
        if per_leaf and node_a // per_leaf != node_b // per_leaf:
            links += (("up", node_a // per_leaf), ("down", node_b // per_leaf))
        return links

    def capacity(self, link: Hashable) -> float:
        """The bandwidth of one of the links :meth:`route` gives (bytes per second)."""
        kind = link[0]  # type: ignore[index]
        if kind in ("tx", "rx"):
            return self.node_bandwidth
        if kind in ("out", "in"):
            return self.bandwidth
        return self.nodes_per_leaf * self.nics * self.bandwidth / self.oversubscription

    def describe(self) -> str:
        """One line: the parameters, in the units a machine file uses."""
        def bw(x: float) -> str:
            return "inf" if math.isinf(x) else f"{x / 1e9:g}GB/s"
        node = (f"; node of {self.ppn}: alpha {self.node_alpha * 1e6:g}us, {bw(self.node_bandwidth)}"
                if self.ppn > 1 else "")
        nics = f" x {self.nics} NICs" if self.nics > 1 else ""
        fabric = ""
        if self.contention:
            fabric = "; links shared (max-min)"
            if self.nodes_per_leaf:
                fabric += (f", fat tree of {self.nodes_per_leaf} nodes per leaf, "
                           f"oversubscribed {self.oversubscription:g}:1")
        rdv = ""
        if self.by_size:
            sized = any((self.bandwidth_by_size, self.node_bandwidth_by_size, self.alpha_by_size,
                         self.node_alpha_by_size, self.reduce_by_size, self.copy_by_size))
            parts = [what for what, on in (("rates and latencies by size", sized),
                                           ("messages copied by cores", self.cpu_copies),
                                           ("half duplex", self.half_duplex),
                                           (f"call {self.call * 1e6:g}us", self.call)) if on]
            rdv = f" ({', '.join(parts)})" if parts else ""
        elif self.rendezvous_bytes:
            rdv = f", +{self.rendezvous * 1e6:g}us from {self.rendezvous_bytes} B"
        gap = f", gap {self.gap * 1e6:g}us" if self.gap else ""
        per_byte = f" + {self.overhead_per_byte * 1e9:g}ns/B" if self.overhead_per_byte else ""
        return (f"network alpha {self.alpha * 1e6:g}us, {bw(self.bandwidth)}{nics}{gap}{rdv}{node}{fabric}; "
                f"reduce {bw(self.reduce_bw)}, copy {bw(self.copy_bw)}, overhead {self.overhead * 1e6:g}us"
                f"{per_byte}")


def interpolate(table: SizeTable, nbytes: int) -> float:
    """The value of a table at ``nbytes``: linear in the log of the size between its sizes, its
    first and last values beyond them."""
    if nbytes <= table[0][0]:
        return table[0][1]
    for (n0, v0), (n1, v1) in zip(table, table[1:]):
        if nbytes <= n1:
            w = math.log(nbytes / n0) / math.log(n1 / n0)
            return (1 - w) * v0 + w * v1
    return table[-1][1]


def per_byte(table: SizeTable, bandwidth: float, nbytes: int) -> float:
    """Seconds per byte at ``nbytes`` from a ``*_by_size`` table of rates (the per-byte times
    interpolated, see :func:`interpolate`), else from ``bandwidth``."""
    if not table:
        return 1.0 / bandwidth
    return interpolate(tuple((n, 1.0 / b) for n, b in table), nbytes)


def _sized(value: Any, read: Any, what: str) -> SizeTable:
    """A ``*_by_size`` table of a machine file (``{"4KiB" = "1GB/s", ...}``) read with ``read``
    (:func:`rate` or :func:`seconds`) as ((bytes, value), ...) in size order."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"not a table of sizes and {what}: {value!r} (e.g. {{\"4KiB\" = ...}})")
    rows = []
    for size, v in value.items():
        try:
            n = parse_bytes(size)
        except ConfigError:
            raise ValueError(f"not a size: {size!r} (e.g. 4096, 64KiB, 4MiB)") from None
        if isinstance(v, (bool, dict, list)):
            raise ValueError(f"{size} = {v!r}: not one of {what}")
        if any(n == m for m, _ in rows):
            raise ValueError(f"the size {size} twice (as {n} B)")
        x = read(v)
        if n <= 0 or not 0 <= x < math.inf or (read is rate and x == 0):
            raise ValueError(f"{size} = {v!r}: sizes must be positive, {what} positive and finite")
        rows.append((n, x))
    return tuple(sorted(rows))


def size_table(value: Any) -> SizeTable:
    """A ``*_by_size`` table of rates (``{"4KiB" = "1GB/s", ...}``)."""
    return _sized(value, rate, "rates")


def factor_table(value: Any) -> SizeTable:
    """A ``*_by_size`` table of factors of at least 1 (``{"16MiB" = 1.8, ...}``)."""
    rows = _sized(value, float, "factors")
    if any(f < 1 for _, f in rows):
        raise ValueError(f"factors must be at least 1: {value!r}")
    return rows


def time_table(value: Any) -> SizeTable:
    """A ``*_by_size`` table of times (``{"4KiB" = "5us", ...}``)."""
    return _sized(value, seconds, "times")


def load(path: str) -> Machine:
    """A machine from a TOML machine file (see the module doc); ValueError names what is wrong."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    return from_dict(doc, path)


#: Each key of a machine file: its table, its name there, the Machine field and how it is read.
_KEYS = {("network", "alpha"): ("alpha", seconds), ("network", "bandwidth"): ("bandwidth", rate),
         ("node", "ppn"): ("ppn", int), ("node", "alpha"): ("node_alpha", seconds),
         ("node", "bandwidth"): ("node_bandwidth", rate), ("compute", "reduce"): ("reduce_bw", rate),
         ("compute", "copy"): ("copy_bw", rate), ("compute", "overhead"): ("overhead", seconds),
         ("node", "nics"): ("nics", int), ("network", "rendezvous_bytes"): ("rendezvous_bytes", int),
         ("network", "rendezvous"): ("rendezvous", seconds), ("network", "gap"): ("gap", seconds),
         ("compute", "overhead_per_byte"): ("overhead_per_byte", seconds),
         ("faults", "detect"): ("detect", seconds),
         ("faults", "silence"): ("silence", seconds), ("fabric", "contention"): ("contention", flag),
         ("fabric", "nodes_per_leaf"): ("nodes_per_leaf", int),
         ("fabric", "oversubscription"): ("oversubscription", float),
         ("network", "bandwidth_by_size"): ("bandwidth_by_size", size_table),
         ("node", "bandwidth_by_size"): ("node_bandwidth_by_size", size_table),
         ("network", "alpha_by_size"): ("alpha_by_size", time_table),
         ("node", "alpha_by_size"): ("node_alpha_by_size", time_table),
         ("node", "cpu_copies"): ("cpu_copies", flag), ("network", "half_duplex"): ("half_duplex", flag),
         ("compute", "reduce_by_size"): ("reduce_by_size", size_table),
         ("compute", "copy_by_size"): ("copy_by_size", size_table),
         ("compute", "call"): ("call", seconds),
         ("node", "together_by_size"): ("together_by_size", factor_table)}


def from_dict(doc: Dict[str, Any], what: str = "machine") -> Machine:
    """A machine from the tables of a machine file."""
    m = Machine()
    m.contention = "fabric" in doc  # (a [fabric] table means shared links unless it says contention = false)
    tables = sorted({t for t, _ in _KEYS})
    for table, keys in doc.items():
        if table not in tables or not isinstance(keys, dict):
            raise ValueError(f"{what}: unknown table [{table}] (known: {', '.join(tables)})")
        for key, value in keys.items():
            if (table, key) not in _KEYS:
                known = sorted(k for t, k in _KEYS if t == table)
                raise ValueError(f"{what}: unknown key {key!r} in [{table}] (known: {', '.join(known)})")
            name, read = _KEYS[table, key]
            try:
                setattr(m, name, read(value))
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(f"{what}: [{table}] {key}: {exc}") from None
    if m.ppn < 1 or m.nics < 1:
        raise ValueError(f"{what}: ppn and nics must be at least 1")
    if m.nodes_per_leaf < 0 or m.oversubscription <= 0:
        raise ValueError(f"{what}: nodes_per_leaf must be at least 0 and oversubscription positive")
    for f in fields(m):
        v = getattr(m, f.name)
        if isinstance(v, tuple):
            continue  # (size tables: checked as read)
        if v < 0 or (f.name.endswith("bandwidth") or f.name.endswith("_bw")) and v == 0:
            raise ValueError(f"{what}: {f.name} must be positive")
    return m
