"""The Python package's layout: no import circle among its modules (every import
counted, those inside functions and for the type checker too), and one owner of what
the running kernel says: hugify/kernel.py alone reads /proc/PID/maps, smaps and
mountinfo and holds the C library's handle."""

from __future__ import annotations

import ast
from pathlib import Path

from testkit import REPO

PACKAGE = REPO / "hugify"


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = f.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in it."""
    mods = modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{f}: a relative import"
                names = [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            graph[m] |= {r for n in names if n.startswith("hugify") and (r := resolve(n)) and r != m}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_in_no_circle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and graph["hugify.prefetch"], graph
    assert circles(graph) == []


def code_strings(tree: ast.AST) -> list[str]:
    """The string constants of a module's code (f-strings' parts too), docstrings left
    out."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


#: The files of /proc whose every reader is hugify/kernel.py, by their last name.
PROC_FILES = ("maps", "smaps", "mountinfo")


def test_one_module_reads_the_running_kernel() -> None:
    """/proc/PID/maps, smaps and mountinfo are named in code by hugify/kernel.py alone,
    and only it loads the C library (ctypes.CDLL(None)); the engine's binding loads the
    runtime's library."""
    readers: dict[str, list[str]] = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(f.read_text())
        named = [s.rpartition("/")[2] for s in code_strings(tree) if s.rpartition("/")[2] in PROC_FILES]
        named += [
            "CDLL(None)"
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "CDLL"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value is None
        ]
        if named:
            readers[str(f.relative_to(REPO))] = sorted(set(named))
    assert readers == {"hugify/kernel.py": ["CDLL(None)", "maps", "mountinfo", "smaps"]}
