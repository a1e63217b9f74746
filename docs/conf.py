"""Sphinx configuration of pycoll's documentation (Markdown pages through myst-parser, furo theme).

Build (strict, as CI does)::

    python -m pip install -e ".[docs]"
    python -m sphinx -W --keep-going -b html docs docs/_build/html

Intersphinx: the build must pass offline, so links into other projects' documentation (Python,
numpy, mpi4py, torch) are resolved only from inventories that are available without a download:
``docs/_inv/<name>.inv`` if such a file exists, or the project's online inventory when
``PYCOLL_DOCS_INTERSPHINX=1`` is set (a machine with internet access). Otherwise the mapping is
empty and references to those projects render as plain text, without a warning.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE / "_ext"))

from sphinx.ext.napoleon import Config  # noqa: E402
from sphinx.ext.napoleon.docstring import GoogleDocstring  # noqa: E402

import pycoll  # noqa: E402

project = "pycoll"
author = "the pycoll authors"
copyright = "the pycoll authors"
release = pycoll.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "pycoll_settings",  # docs/_ext/pycoll_settings.py: the PYCOLL_* table, made from pycoll.config
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_inv", "Thumbs.db", ".DS_Store"]

# ---------------------------------------------------------------- MyST
myst_enable_extensions = ["colon_fence", "deflist"]
# ``page.md#a-heading`` links resolve to headings down to this level (GitHub-style slugs), and a
# link to a missing anchor or page is a warning (an error under -W).
myst_heading_anchors = 4

# ---------------------------------------------------------------- autodoc
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
# Docstrings are reST with ``literals``. Some class and function docstrings list their arguments in
# Google style ("Args:" sections): _google_args below has napoleon turn those (and only those) into
# parameter fields. napoleon is not loaded as an extension: it would also read every attribute
# docstring that starts "Something: ..." as "type: description".

# ---------------------------------------------------------------- intersphinx (offline-safe)
_INVENTORIES = {
    "python": "https://docs.python.org/3",
    "numpy": "https://numpy.org/doc/stable",
    "mpi4py": "https://mpi4py.readthedocs.io/en/stable",
    "torch": "https://pytorch.org/docs/stable",
}
_online = os.environ.get("PYCOLL_DOCS_INTERSPHINX", "") not in ("", "0")
intersphinx_mapping = {}
for _name, _url in _INVENTORIES.items():
    _local = HERE / "_inv" / f"{_name}.inv"
    if _local.exists():
        intersphinx_mapping[_name] = (_url, str(_local))
    elif _online:
        intersphinx_mapping[_name] = (_url, None)
intersphinx_timeout = 10

# ---------------------------------------------------------------- links
# ``-b linkcheck`` is for internal links only (the build machine has no internet access): external
# addresses are skipped. Internal links and anchors are checked by every build already (myst's
# cross-reference warnings, errors under -W).
linkcheck_ignore = [r"https?://.*"]

# ---------------------------------------------------------------- HTML
html_theme = "furo"
html_title = f"pycoll {release}"


# ---------------------------------------------------------------- docstring repairs
# pycoll/torch/hooks.py's PriorityHookState docstring lists its ``average`` argument after the
# paragraph that follows "Args:" (an indented line after a paragraph: a docutils error). Until the
# docstring itself is fixed, move that line back into the argument list; once it is fixed this
# finds nothing to move and does nothing.
def _repair_docstring(app, what, name, obj, options, lines):
    if name != "pycoll.torch.PriorityHookState" and not name.endswith("hooks.PriorityHookState"):
        return
    for i, line in enumerate(lines):
        after_paragraph = i > 0 and lines[i - 1].strip() and not lines[i - 1].startswith(" ")
        if line.startswith("    average:") and after_paragraph:
            moved = lines.pop(i)
            args_end = next((j for j in range(len(lines)) if j > 0 and not lines[j].strip()
                             and any(x.strip() == "Args:" for x in lines[:j])), None)
            if args_end is not None:
                lines.insert(args_end, moved)
            return


_GOOGLE_SECTIONS = {"Args:", "Arguments:", "Parameters:", "Returns:", "Raises:", "Yields:"}


def _google_args(app, what, name, obj, options, lines):
    if what not in ("class", "exception", "function", "method") or \
            not any(line.strip() in _GOOGLE_SECTIONS for line in lines):
        return
    config = Config(napoleon_google_docstring=True, napoleon_numpy_docstring=False)
    lines[:] = GoogleDocstring(lines, config, app, what, name, obj, options).lines()


def setup(app):
    app.connect("autodoc-process-docstring", _repair_docstring, priority=100)  # before _google_args
    app.connect("autodoc-process-docstring", _google_args)
