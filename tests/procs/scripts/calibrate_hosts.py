"""One rank of ``pycoll sim calibrate`` across two hosts (tests/launch.py run_hosts sets RANK,
WORLD_SIZE, MASTER_ADDR/PORT): the calibration's own rank code, then ``RANK r OK``.

argv: the machine file to write, then calibrate's options."""

import os
import sys

from pycoll.sim import calibrate

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "--out", *sys.argv[1:]]
    calibrate.main()
    print(f"RANK {os.environ['RANK']} OK", flush=True)
