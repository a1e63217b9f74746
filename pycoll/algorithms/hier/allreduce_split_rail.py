"""Hierarchical allreduce "split_rail" (UCC's split-rail):

1. reduce-scatter in the node: local rank i gets the node's sum of block i;
2. local rank i allreduces block i with local rank i of every other node (its rail team), so
   every rail carries 1/k of the data between nodes at once;
3. allgather in the node.

With uneven nodes the buffer is cut into k = (fewest ranks on a node) blocks: local ranks past k
get empty blocks and sit out the rails. Pipelined in fragments like "rab" (options
``fragment_bytes``, ``depth``).
"""

from __future__ import annotations

from typing import List

import numpy as np

from pycoll.algorithms.base import CollArgs, block_bounds
from pycoll.algorithms.hier.levels import (
    PIPELINE_OPTIONS,
    HierSchedule,
    Part,
    add_average,
    check_sub_teams,
    fragments,
    level_op,
)
from pycoll.algorithms.options import options
from pycoll.algorithms.patterns import interleave
from pycoll.tasks.task import Task

NAME = "split_rail"
COLLECTIVES = ("allreduce",)
OPTIONS = PIPELINE_OPTIONS


def build(args: CollArgs) -> Task:
    opts = options(args, OPTIONS)
    check_sub_teams(args)
    node, rail = args.node_team, args.rail_team
    topo = args.topology
    k = min(topo.ppn) if topo is not None else 1
    me = node.rank
    op = level_op(args.op)
    sched = HierSchedule(args)
    frags = fragments(args, opts["fragment_bytes"])
    lag = opts["depth"]
    counts: List[List[int]] = []  # per fragment: the block of every local rank
    for lo, hi in frags:
        b = block_bounds(hi - lo, k)
        counts.append([b[i + 1] - b[i] if i < k else 0 for i in range(node.size)])
    # this rank's reduced block of every fragment (fragments are in flight together)
    starts = np.cumsum([0] + [c[me] for c in counts]).tolist()
    sched.own_scratch(starts[-1])
    scatters: List[Task] = []
    done: List[Task] = []

    def scatter(f: int) -> Task:
        lo, hi = frags[f]
        block = Part("own", starts[f], starts[f + 1])
        if node.size == 1:  # k == 1: the whole fragment is this rank's block
            return sched.copy(block, Part("src", lo, hi), f"{args.name}/copy{f}")
        return sched.level(node, "reduce_scatterv", Part("src", lo, hi), block, counts[f], op,
                           name="node-rs", frag=f)

    def gather(f: int) -> None:
        lo, hi = frags[f]
        block = Part("own", starts[f], starts[f + 1])
        after = [scatters[f]]
        if me < k and rail.size > 1:
            after = [sched.level(rail, "allreduce", block, None, op, name="rail", frag=f, after=after)]
        if node.size == 1:
            after = [sched.copy(Part("dst", lo, hi), block, f"{args.name}/out{f}", after=after)]
        else:
            after = [sched.level(node, "allgatherv", block, Part("dst", lo, hi), counts[f], None,
                                 name="node-ag", frag=f, after=after)]
        done.extend(after)

    interleave(len(frags), lag, lambda f: scatters.append(scatter(f)), gather)
    add_average(sched, args, done)
    return sched
