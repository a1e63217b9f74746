"""Traffic accounting of a team: what its transports counted, summed with its sub-teams'.

The transports count payload bytes and messages per peer (:class:`pycoll.tl.base.Traffic`);
:func:`team_traffic` maps the counters of a team's node, rail and one-rank sub-teams back to the
team's own ranks and adds them up, so a hierarchical collective's traffic reads per team peer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    from pycoll.team import Team

FIELDS = ("sent", "received", "msgs_sent", "msgs_received")


def team_traffic(team: Team, include_self: bool = True, subteams: bool = True) -> Dict[Any, Dict[str, int]]:
    """See :meth:`pycoll.Team.traffic`."""
    with team.ctx.lock:
        out = {r: dict.fromkeys(FIELDS, 0) for r in range(team.size)}
        parts: List[Tuple[Dict[Any, Dict[str, int]], Sequence[int]]] = [
            (team.transport.traffic.snapshot(), range(team.size))]
        topo = team.topology
        if subteams and topo is not None:
            me = team.rank
            for sub, members in ((team.levels.node, lambda: topo.members(topo.nodes[me])),
                                 (team.levels.rail, lambda: topo.rail(topo.local_rank(me))),
                                 (team.levels.alone, lambda: [me])):
                if sub is not None and sub is not team:
                    ranks = members()
                    if len(ranks) == sub.size:
                        parts.append((sub.traffic(), ranks))
        for counts, members in parts:
            for peer, figures in counts.items():
                if peer != "total":
                    mine = out[members[peer]]
                    for name, value in figures.items():
                        mine[name] += value
        if not include_self:
            del out[team.rank]
        total = dict.fromkeys(FIELDS, 0)
        for figures in out.values():
            for name, value in figures.items():
                total[name] += value
        out["total"] = total  # type: ignore[index]
        return out


def reset_traffic(team: Team) -> None:
    """Count traffic from zero again (the team's transport and its sub-teams')."""
    with team.ctx.lock:
        team.transport.traffic.reset()
        for sub in team.levels.all():
            if sub is not team:
                sub.reset_traffic()
