"""Rank side of test_docs_code.py: run the Python blocks of one page, in order, each in a namespace
of its own, then report through tests/rank.py (``RANK <r> OK``, or ``FAILED`` with the traceback,
whose frames name the page and its line).

    mpiexec -n 2 python tests/docs/run_blocks.py BLOCKS.json
"""

import json
import sys
import warnings

from tests.rank import run_rank


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        blocks = json.load(f)
    # the documentation shows no deprecated call: a DeprecationWarning the examples' own lines
    # trigger (their module is ``__docs__``) fails the page
    warnings.filterwarnings("error", category=DeprecationWarning, module="__docs__")
    for block in blocks:
        # blank lines in front, so that line numbers in a traceback are the page's
        code = compile("\n" * (block["line"] - 1) + block["code"], block["file"], "exec")
        exec(code, {"__name__": "__docs__", "__file__": block["file"]})


if __name__ == "__main__":
    run_rank(main, sys.argv[1])
