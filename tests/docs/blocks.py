"""The fenced code blocks of the documentation's Markdown pages (docs/**/*.md and README.md).

A block whose info string starts with ``python`` is run by test_docs_code.py unless the line
before its opening fence (blank lines skipped) is an opt-out comment::

    <!-- no-run: why it cannot run in a test -->
    ```python
    ...
    ```
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
#: the opt-out marker, with its reason.
NO_RUN = re.compile(r"^\s*<!--\s*no-run\b:?\s*(?P<why>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
#: a block that needs torch: skipped, saying why, where torch is not installed.
TORCH = re.compile(r"^\s*(import torch|from torch|import pycoll\.torch|from pycoll\.torch)", re.M)


@dataclass
class Block:
    """One fenced block: the page (relative to the checkout), the line of its first code line
    (1-based), its language, code, and the opt-out reason (None: it runs)."""

    page: str
    line: int
    lang: str
    code: str
    no_run: Optional[str]

    @property
    def runs(self) -> bool:
        return self.lang == "python" and self.no_run is None

    @property
    def needs_torch(self) -> bool:
        return bool(TORCH.search(self.code))


def pages() -> List[Path]:
    """Every Markdown page of the documentation (not the build output), then the README."""
    found = sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)
    return [*found, ROOT / "README.md"]


def blocks(path: Path) -> List[Block]:
    """The fenced blocks of ``path``, in order."""
    lines = path.read_text(encoding="utf-8").split("\n")
    out: List[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m.group("fence"), len(m.group("indent"))
        words = m.group("info").strip().split()
        lang = words[0].lower() if words else ""
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = NO_RUN.match(lines[j]) if j >= 0 else None
        body: List[str] = []
        k = i + 1
        while k < len(lines) and not (lines[k].strip().startswith(fence[0] * len(fence))
                                      and not lines[k].strip().strip(fence[0])):
            body.append(lines[k][indent:] if lines[k][:indent].isspace() else lines[k])
            k += 1
        rel = str(path.relative_to(ROOT))
        out.append(Block(rel, i + 2, lang, "\n".join(body) + "\n",
                         (marker.group("why") or "no reason given") if marker else None))
        i = k + 1
    return out
