"""The native code is layered: no circle among the Rust core's modules (core/src, by the
`crate::` and `super::` paths of their code outside tests; a folder such as dwarf/ is
one module), so that a writer never imports the planner that imports it back, nor among
the C runtime's (NAME.c with NAME.h, by their `#include "..."` lines and by the functions
each object file calls of another's), so that each file calls only those below it."""

from __future__ import annotations

import graphlib
import re
import subprocess
from pathlib import Path

from testkit import REPO
from testkit.runtime import RUNTIME, build_runtime

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


def runtime_modules() -> list[str]:
    return sorted({p.stem for p in RUNTIME.glob("*.[ch]")} - {"build-config"})


def runtime_includes() -> dict[str, set[str]]:
    """Each module of runtime/ and the modules whose headers its .c or .h includes."""
    modules = runtime_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m in modules:
        for path in (RUNTIME / f"{m}.c", RUNTIME / f"{m}.h"):
            if path.exists():
                graph[m] |= set(re.findall(r'^#include "(.+)\.h"', path.read_text(), re.M)) & set(modules) - {m}
    return graph


def runtime_calls(tmp_path: Path) -> dict[str, set[str]]:
    """Each module of runtime/ with a .c and the modules whose functions its object file
    calls (its undefined symbols that another object file defines)."""
    build_runtime("build-config.h")
    sources = sorted(RUNTIME.glob("*.c"))
    subprocess.run(["gcc", "-c", "-O0", "-fPIC", "-D_FILE_OFFSET_BITS=64", *sources], cwd=tmp_path, check=True)
    defined: dict[str, set[str]] = {}
    undefined: dict[str, set[str]] = {}
    for source in sources:
        obj = tmp_path / f"{source.stem}.o"
        symbols = subprocess.run(["nm", obj], capture_output=True, text=True, check=True).stdout.splitlines()
        defined[source.stem] = {s.split()[-1] for s in symbols if re.match(r"\S+ [TDBR] ", s)}
        undefined[source.stem] = {s.split()[-1] for s in symbols if re.match(r"\s+U ", s)}
    return {m: {n for n in defined if n != m and undefined[m] & defined[n]} for m in defined}


def test_the_runtime_modules_form_no_circle(tmp_path: Path) -> None:
    includes, calls = runtime_includes(), runtime_calls(tmp_path)
    assert {"hp_core", "hp_map", "hp_verdict", "audit"} <= includes.keys() & calls.keys()
    assert "hp_core" in includes["audit"] and "hp_core" in calls["audit"]  # the readers see edges
    assert (_circle(includes), _circle(calls)) == ([], [])
