"""What every torch script run by the tests shares."""

import os
import sys
import traceback


def run_rank(main, *args) -> None:
    """Run ``main(*args)``; print ``RANK r OK`` (the launcher helper looks for it) or the traceback
    and exit non-zero at once (``os._exit``: no rank waits in atexit for a dead peer)."""
    rank = os.environ.get("RANK") or os.environ.get("PMI_RANK") or "?"
    try:
        main(*args)
    except BaseException:
        print(f"RANK {rank} FAILED\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    print(f"RANK {rank} OK", flush=True)
