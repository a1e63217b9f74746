"""The layout rules of the code: no import circle between modules at module level, small modules,
a small Team. (Private-member access and imports inside functions are ruff's SLF001 and PLC0415,
enforced by ``ruff check`` with the project's settings.)"""

import ast
from pathlib import Path
from typing import Dict, List, Set

import pycoll

ROOT = Path(pycoll.__file__).parent

#: Modules allowed over 700 lines, and why.
LONG = {
    "pycoll.tl.ucx.transport": "the UCX transport: endpoints, tag encoding, unexpected messages, close "
                               "protocol and error handling belong together",
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _top_level_imports(path: Path, name: str, known: Set[str]) -> Set[str]:
    """pycoll modules imported when ``name`` is imported (module level, not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: Set[str] = set()
    body: List[ast.stmt] = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and not _is_type_checking(node):
            body.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            body.extend(node.body)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out.update(subs)  # ``from pycoll import algorithms`` imports a module
            if base in known and len(subs) < len(node.names):  # and names of ``base`` itself
                out.add(base)
    out.discard(name)
    return out


def test_no_import_circle_at_module_level() -> None:
    mods = _modules()
    graph = {name: _top_level_imports(path, name, set(mods)) for name, path in mods.items()}
    # importing a package's module runs the package's __init__ first: that edge is implicit and
    # does not make a circle (Python has the package half-initialised by then), so it is left out
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for dep in sorted(graph[m]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_modules_are_small() -> None:
    long = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    over = {name: n for name, n in long.items() if n > 700 and name not in LONG}
    assert not over, f"modules over 700 lines: {over}"
    assert long["pycoll.team"] < 400
