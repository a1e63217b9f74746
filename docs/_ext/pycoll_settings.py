"""Sphinx extension: the ``pycoll-settings`` directive, a table of every ``PYCOLL_*`` setting.

The table is made at build time from :data:`pycoll.config.SETTINGS` (name, default, meaning), the
same declarations ``pycoll info`` prints, so the documentation cannot fall behind the code. In a
Markdown page::

    ```{pycoll-settings}
    ```
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from pycoll.config import SETTINGS  # (conf.py puts the checkout first on sys.path)


def _entry(*children: nodes.Node) -> nodes.entry:
    entry = nodes.entry()
    entry += nodes.paragraph("", "", *children)
    return entry


class SettingsTable(SphinxDirective):
    """Every setting of ``pycoll.config.SETTINGS``, in declaration order."""

    has_content = False

    def run(self) -> list:
        table = nodes.table(classes=["pycoll-settings"])
        group = nodes.tgroup(cols=3)
        table += group
        for width in (22, 12, 66):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        row = nodes.row()
        for title in ("variable", "default", "meaning"):
            row += _entry(nodes.Text(title))
        head += row
        group += head
        body = nodes.tbody()
        for name, setting in SETTINGS.items():
            row = nodes.row(ids=[nodes.make_id(name)])
            row += _entry(nodes.literal(name, name))
            row += _entry(nodes.literal(setting.default, setting.default) if setting.default
                          else nodes.emphasis("", "empty"))
            row += _entry(nodes.Text(setting.doc))
            body += row
        group += body
        return [table]


def setup(app: Sphinx) -> dict:
    app.add_directive("pycoll-settings", SettingsTable)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
