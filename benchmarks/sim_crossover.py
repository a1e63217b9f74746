"""Where the ring allreduce overtakes recursive doubling, on a non-blocking network and on an
oversubscribed two-level fat tree: simulated (``pycoll.sim``, links shared max-min fairly) next to
the closed forms, sizes doubling.

Closed forms (``p`` nodes of one rank, ``L`` nodes per leaf, oversubscription ``o`` <= ``L``,
reductions free): recursive doubling's steps to partners less than ``L`` away stay in a leaf
(``a + n / B``); its ``log2(p / L)`` others send all ``L`` nodes of a leaf through an uplink of
``L * B / o`` at once (``a + o * n / B``). The ring's reduce-scatter and allgather send ``2(p-1)``
blocks of ``n / p``, one message per leaf on its uplink at a time: ``2(p-1)(a + n / (p B))``,
untouched by the tree.

    python benchmarks/sim_crossover.py                        # 64 nodes, 8 per leaf, 2:1
    python benchmarks/sim_crossover.py --oversubscription 4
"""

from __future__ import annotations

import argparse
import math

from pycoll.sim import Machine, programs, run


def rd_formula(p: int, n: int, m: Machine, tree: bool) -> float:
    steps = int(math.log2(p))
    crossing = max(0, steps - int(math.log2(m.nodes_per_leaf))) if tree else 0
    per_byte = (steps - crossing + crossing * m.oversubscription) / m.bandwidth
    return steps * m.alpha + n * per_byte


def ring_formula(p: int, n: int, m: Machine) -> float:
    return 2 * (p - 1) * (m.alpha + n / p / m.bandwidth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--ranks", type=int, default=64)
    ap.add_argument("--nodes-per-leaf", type=int, default=8)
    ap.add_argument("--oversubscription", type=float, default=2.0)
    ap.add_argument("--min-bytes", type=int, default=64 << 10)
    ap.add_argument("--max-bytes", type=int, default=4 << 20)
    args = ap.parse_args()
    p = args.ranks
    base = dict(alpha=2e-6, bandwidth=12.5e9, reduce_bw=math.inf, copy_bw=math.inf)
    flat = Machine(**base)
    tree = Machine(**base, contention=True, nodes_per_leaf=args.nodes_per_leaf,
                   oversubscription=args.oversubscription)
    print(f"# allreduce on {p} nodes; alpha 2us, 12.5GB/s, reductions free; fat tree: {args.nodes_per_leaf} "
          f"nodes per leaf, {args.oversubscription:g}:1 (times in us: simulated / closed form)")
    print(f"{'bytes':>9} | {'flat rd':>17} {'flat ring':>17} {'faster':>6} | {'tree rd':>17} "
          f"{'tree ring':>17} {'faster':>6}")
    n = args.min_bytes
    while n <= args.max_bytes:
        rd, ring = programs("allreduce", "rd", p, n), programs("allreduce", "ring", p, n)
        cells = []
        for m, on_tree in ((flat, False), (tree, True)):
            t_rd, t_ring = run(rd, m).time, run(ring, m).time
            f_rd, f_ring = rd_formula(p, n, m, on_tree), ring_formula(p, n, m)
            cells.append(f"{t_rd * 1e6:>8.1f} /{f_rd * 1e6:>7.1f} {t_ring * 1e6:>8.1f} /{f_ring * 1e6:>7.1f} "
                         f"{'rd' if t_rd < t_ring else 'ring':>6}")
        print(f"{n:>9} | {cells[0]} | {cells[1]}")
        n *= 2
    # the crossovers of the closed forms: rd = ring
    def cross(k: float) -> float:
        return (2 * (p - 1) - math.log2(p)) * flat.alpha * flat.bandwidth / (k - 2 * (p - 1) / p)
    steps = math.log2(p)
    crossing = steps - math.log2(args.nodes_per_leaf)
    print(f"# closed-form crossover: flat {cross(steps) / 1024:.0f} KiB, fat tree "
          f"{cross(steps - crossing + crossing * args.oversubscription) / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
