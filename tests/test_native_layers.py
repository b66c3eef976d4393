"""The native code is layered: no circle among the Rust core's modules (core/src, by the
`crate::` and `super::` paths of their code outside tests; a folder such as dwarf/ is
one module), so that a writer never imports the planner that imports it back."""

from __future__ import annotations

import graphlib
import re
from pathlib import Path

from testkit import REPO

CORE = REPO / "core/src"


def _circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of the graph, or [] where there is none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        return list(e.args[1])
    return []


def _without_tests(text: str) -> str:
    """The Rust source before its `#[cfg(test)] mod` (the core keeps its tests last)."""
    found = re.search(r"^\s*#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{", text, re.M)
    text = text[: found.start()] if found else text
    return re.sub(r"//.*", "", text)


def core_graph() -> dict[str, set[str]]:
    """Each top-level module of core/src and the top-level modules its code names."""
    files = {path: path.relative_to(CORE).parts[0].removesuffix(".rs") for path in CORE.rglob("*.rs")}
    names = set(files.values()) - {"lib"}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for path, module in files.items():
        if module == "lib":  # the crate's root declares them all
            continue
        code = _without_tests(path.read_text())
        named = re.findall(r"\bcrate::(\w+)", code)
        named += [w for group in re.findall(r"\bcrate::\{([^}]*)\}", code) for w in re.findall(r"\b(\w+)::", group)]
        # A file directly in core/src reaches its siblings by super::; one in a folder,
        # the folder's own modules (the same top-level module).
        if path.parent == CORE:
            named += re.findall(r"\bsuper::(\w+)", code)
        graph[module] |= {n for n in named if n in names and n != module}
    return graph


def test_the_core_modules_form_no_circle() -> None:
    graph = core_graph()
    assert {"plan", "addr_map", "assemble", "exposure", "dwarf"} <= graph.keys()
    assert "plan" in graph["assemble"]  # the reader sees the edges it should
    assert _circle(graph) == []
