"""Algorithms for teams that span nodes: each is a schedule of collectives of the team's sub-teams
(the ranks of a node, one rank per node), which the caller hands it in ``args.node_team``,
``args.rail_team`` and ``args.leaders_team``. What they share: :mod:`.levels`."""
