"""A 1 GiB allreduce on 16,384 simulated ranks stays within 2 GiB of memory: buffers are never
touched, and each rank's program holds only its instructions. The two processes that record the
programs side by side count too (each at the larger one's peak)."""

import re
import sys

CODE = """
import resource, sys
from pycoll.cli import main
rc = main(["sim", "allreduce", "-n", "16384", "--algorithm", "rd", "--min-bytes", "1G", "--max-bytes", "1G",
           "--jobs", "2"])
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
      + 2 * resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
sys.exit(rc)
"""


def test_a_1_gib_allreduce_on_16384_ranks_fits_in_2_gib(run_cmd):
    rc, out, err = run_cmd([sys.executable, "-c", CODE], timeout=120)
    assert rc == 0 and "1073741824" in out, out + err
    peak_kib = int(re.search(r"PEAK_KIB (\d+)", out).group(1))
    assert peak_kib < 2 << 20, f"{peak_kib / 2**20:.2f} GiB"
