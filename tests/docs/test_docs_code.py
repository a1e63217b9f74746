"""The documentation's code runs, and the documentation holds together.

* Every ``python`` block of docs/**/*.md and README.md runs (blocks.py finds them; a block that
  cannot run in a test is marked ``<!-- no-run: why -->`` in the Markdown). The blocks of one page
  run in order, each in a namespace of its own, in ONE ``mpiexec -n 2`` launch (tests/launch.py's
  ``mpirun``: wall-clock limit, failing ranks named with their tracebacks, nothing left behind), so
  that examples written for several ranks run as such and a page costs one launch.
* Opt-outs stay few, and each says why.
* Every page is reachable from docs/index.md through toctrees (Sphinx's strict build, run by
  .ci/run, checks it too; this finds it without building).
* The README stays a short door for users.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.docs.blocks import DOCS, ROOT, blocks, pages

#: the most blocks that may opt out of running (a launch command, a fragment needing a cluster).
MAX_NO_RUN = 4
RANKS = 2


def _has_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


def _runnable_pages() -> list:
    return [p for p in pages() if any(b.runs for b in blocks(p))]


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_page_code_runs(page: Path, mpirun, tmp_path: Path) -> None:
    todo = [b for b in blocks(page) if b.runs]
    if not _has_torch():  # the torch blocks are skipped, the others run
        todo = [b for b in todo if not b.needs_torch]
        if not todo:
            pytest.skip("torch is not installed (pip install torch==2.13.0)")
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([{"file": str(ROOT / b.page), "line": b.line, "code": b.code}
                                for b in todo]))
    mpirun(RANKS, "tests/docs/run_blocks.py", str(spec), timeout=120)


def test_opt_outs_are_few_and_explained() -> None:
    skipped = [b for p in pages() for b in blocks(p) if b.lang == "python" and b.no_run is not None]
    assert len(skipped) <= MAX_NO_RUN, [f"{b.page}:{b.line}" for b in skipped]
    for b in skipped:
        assert b.no_run != "no reason given", f"{b.page}:{b.line}: say why it cannot run"


def _toctree_entries(page: Path) -> list:
    """The documents named in ``page``'s toctrees, as paths of .md files."""
    text = page.read_text(encoding="utf-8")
    found = []
    for tree in re.finditer(r"```\{toctree\}\n(.*?)```", text, re.S):
        for line in tree.group(1).split("\n"):
            line = line.strip()
            if line and not line.startswith(":"):
                found.append((page.parent / f"{line}.md").resolve())
    return found


def test_every_page_is_reachable_from_the_index() -> None:
    seen, todo = set(), [(DOCS / "index.md").resolve()]
    while todo:
        page = todo.pop()
        if page in seen:
            continue
        seen.add(page)
        for entry in _toctree_entries(page):
            assert entry.exists(), f"{page.relative_to(ROOT)} names {entry} in a toctree"
            todo.append(entry)
    docs = {p.resolve() for p in pages() if p.parent != ROOT}
    assert docs - seen == set(), sorted(str(p.relative_to(ROOT)) for p in docs - seen)


def test_readme_is_a_short_door_for_users() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    for word in ("issue", "session", "firecracker"):
        assert word not in text.lower(), word
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), target
