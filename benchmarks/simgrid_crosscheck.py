"""pycoll's simulator against SimGrid's SMPI on the same platform: MPI_Allreduce by SMPI's recursive
doubling (``rdb``), ring (``lr``) and Rabenseifner (``rab_rdb``) on 64 hosts, next to ``pycoll sim``'s
rd, ring and rabenseifner with the same latency and bandwidth; on a non-blocking crossbar and on a
2:1 fat tree of 8 hosts per leaf (SimGrid's FAT_TREE cluster; pycoll's ``--nodes-per-leaf 8
--oversubscription 2``).

Needs SimGrid's ``smpicc`` and ``smpirun`` (Debian: ``apt install libsimgrid-dev``). SMPI runs with
its plain model (``network/model:CM02``, no cross traffic, computation not simulated); pycoll's with
free reductions. A SimGrid cluster's route crosses the sender's and the receiver's private links
(two latencies: 1 us each for pycoll's 2 us), on the fat tree two more between leaves (0.5 us each
link, so messages within a leaf take 1 us there and 2 us in pycoll's model).

    python benchmarks/simgrid_crosscheck.py
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

from pycoll.sim import Machine, programs, run

HERE = os.path.dirname(os.path.abspath(__file__))
N, BW = 64, 12.5e9
PLATFORM = """<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="c" prefix="h" suffix="" radical="0-{last}" speed="1Gf" bw="12.5GBps" lat="{lat}"
           sharing_policy="SPLITDUPLEX"{topology}/>
</platform>
"""
CASES = [("rdb", "rd"), ("lr", "ring"), ("rab_rdb", "rabenseifner")]


def smpi(exe: str, platform: str, hosts: str, alg: str, nbytes: int) -> float:
    """SMPI's simulated time of one allreduce (us)."""
    cmd = ["smpirun", "-np", str(N), "-platform", platform, "-hostfile", hosts, f"--cfg=smpi/allreduce:{alg}",
           "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0", "--cfg=smpi/simulate-computation:no",
           "--log=root.thres:critical", exe, str(nbytes)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    return float(re.search(r"TIME_US ([\d.]+)", out).group(1))


def main() -> int:
    if not (shutil.which("smpicc") and shutil.which("smpirun")):
        print("SimGrid's smpicc/smpirun not found (Debian: apt install libsimgrid-dev)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "allreduce")
        subprocess.run(["smpicc", "-O2", "-o", exe, os.path.join(HERE, "simgrid", "allreduce.c")], check=True,
                       capture_output=True, timeout=120)
        hosts = os.path.join(tmp, "hosts.txt")
        with open(hosts, "w") as f:
            f.write("".join(f"h{i}\n" for i in range(N)))
        flat, tree = os.path.join(tmp, "flat.xml"), os.path.join(tmp, "tree.xml")
        with open(flat, "w") as f:
            f.write(PLATFORM.format(last=N - 1, lat="1us", topology=""))
        with open(tree, "w") as f:
            f.write(PLATFORM.format(last=N - 1, lat="0.5us",
                                    topology=' topology="FAT_TREE" topo_parameters="2;8,8;1,4;1,1"'))
        base = dict(alpha=2e-6, bandwidth=BW, reduce_bw=math.inf, copy_bw=math.inf)
        machines = {flat: Machine(**base), tree: Machine(**base, contention=True, nodes_per_leaf=8,
                                                          oversubscription=2)}
        print(f"# allreduce on {N} hosts, 12.5 GB/s, 2 us; us: SimGrid SMPI / pycoll sim (ratio)")
        print(f"{'bytes':>9} {'network':>9} {'algorithm':>13} {'smpi_us':>10} {'pycoll_us':>10} {'ratio':>6}")
        worst = {}
        for nbytes in (8, 64 << 10, 1 << 20, 16 << 20):
            for platform, name in ((flat, "crossbar"), (tree, "fat tree")):
                for smpi_alg, alg in CASES:
                    if name == "fat tree" and alg == "rabenseifner" or alg == "ring" and nbytes // 4 < N:
                        continue  # (SMPI's ring runs another algorithm on fewer elements than ranks)
                    theirs = smpi(exe, platform, hosts, smpi_alg, nbytes)
                    ours = run(programs("allreduce", alg, N, nbytes), machines[platform]).time * 1e6
                    small = "8 B" if nbytes < 1024 else "64 KiB and more"
                    worst[small] = max(worst.get(small, 0.0), abs(ours / theirs - 1))
                    print(f"{nbytes:>9} {name:>9} {alg:>13} {theirs:>10.2f} {ours:>10.2f} "
                          f"{ours / theirs:>6.3f}")
        print("# largest difference: " + ", ".join(f"{k} {v:.1%}" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
