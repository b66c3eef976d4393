"""The typed seam between the Rust core and Python: hugify/_core.pyi is what mypy
checks every layer against, so it must be what the binding really has. mypy's
stubtest compares names and signatures; the keys of every dictionary the binding
returns are compared with the stub's TypedDicts, recursively, on real files. The
tree report (hugify.tree.Report) is held to what `hugify tree --report` writes."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest

from hugify import _core, tree
from testkit import HP, REPO
from testkit.cli import hugify
from testkit.recipes import BY_NAME, build

STUB = REPO / "hugify" / "_core.pyi"
#: The stub's TypedDicts exist for mypy only: the binding returns plain dicts.
TYPES_ONLY = (
    "Segment",
    "WindowRun",
    "Refusal",
    "PlanRefused",
    "Plan",
    "Plans",
    "Report",
    "Transformed",
    "GlibcThp",
    "Probe",
    "Windows",
)


def test_stubtest_finds_the_stub_and_the_binding_alike(tmp_path: Path) -> None:
    allow = tmp_path / "allowlist"
    allow.write_text("".join(f"hugify._core.{name}\n" for name in (*TYPES_ONLY, "__all__")))
    res = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "hugify._core", "--allowlist", str(allow)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def stub_typeddicts() -> dict[str, dict[str, str]]:
    """TypedDict name -> {key: annotation source}, bases' keys included."""
    module = ast.parse(STUB.read_text())
    out: dict[str, dict[str, str]] = {}
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.bases:
            bases = [ast.unparse(b) for b in node.bases]
            if bases == ["Exception"]:
                continue
            fields = {}
            for base in bases:
                fields |= out.get(base, {})
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    fields[item.target.id] = ast.unparse(item.annotation)
            out[node.name] = fields
    assert set(out) == set(TYPES_ONLY)
    return out


def check_keys(value: Any, annotation: str, types: dict[str, dict[str, str]], where: str) -> None:
    """The dict `value` (or the dicts in it) has exactly the keys of the TypedDict its
    annotation names; a union of TypedDicts takes the one whose keys match."""
    named = [t for t in re.findall(r"\w+", annotation) if t in types]
    if isinstance(value, list):
        for i, item in enumerate(value):
            check_keys(item, annotation, types, f"{where}[{i}]")
        return
    if not isinstance(value, dict) or not named:
        return
    matching = [t for t in named if set(types[t]) == set(value)]
    assert matching, f"{where}: keys {sorted(value)} are none of {named}: {[sorted(types[t]) for t in named]}"
    for key, annotation_of_key in types[matching[0]].items():
        check_keys(value[key], annotation_of_key, types, f"{where}.{key}")


@pytest.fixture(scope="module")
def program() -> Path:
    return build(BY_NAME["gcc-bfd"]) / "prog"


def test_every_dict_the_binding_returns_has_the_stubs_keys(program: Path, tmp_path: Path) -> None:
    types = stub_typeddicts()
    check_keys(_core.inspect(program, HP, 0), "Report", types, "inspect")
    src = os.open(program, os.O_RDONLY)
    out = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        check_keys(_core.transform(src, out, HP, 0), "Transformed", types, "transform")
        check_keys(_core.probe(src), "Probe", types, "probe of a descriptor")
    finally:
        os.close(src)
        os.close(out)
    for where, path in (("probe", program), ("probe of the output", tmp_path / "out")):
        probed = _core.probe(path)
        check_keys(probed, "Probe", types, where)
        assert probed is not None
        check_keys(_core.windows(probed, HP), "Windows", types, f"windows of the {where}")
    broken = tmp_path / "broken"
    broken.write_bytes(program.read_bytes()[:200])
    probed = _core.probe(broken)
    assert probed is not None and probed["problem"]
    check_keys(probed, "Probe", types, "probe of a truncated file")
    check_keys(_core.windows(probed, HP), "Windows", types, "windows of a truncated file")
    small = build(BY_NAME["gcc-bfd-small"]) / "prog"
    refused = _core.inspect(small, HP, 1 << 30)
    assert refused["refusal"] is not None
    check_keys(refused, "Report", types, "inspect with a refusal")


def test_the_tree_report_has_the_keys_of_its_typed_dicts(program: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/prog").write_bytes(program.read_bytes())
    (root / "usr/bin/prog").chmod(0o755)
    (root / "usr/bin/libbroken.so").write_bytes(program.read_bytes()[:200])  # truncated: fails
    report = tmp_path / "report.json"
    hugify("tree", root, "--no-progress", "--report", report, check=False, env={**os.environ, "HUGIFY_POLICY_PATH": ""})
    doc = json.loads(report.read_text())
    hints = typing.get_type_hints(tree.Report)
    assert set(doc) == set(hints)
    assert set(doc["summary"]) == set(typing.get_type_hints(tree.Summary))
    file_keys = typing.get_type_hints(tree.FileReport, include_extras=True)
    required = {k for k, hint in file_keys.items() if typing.get_origin(hint) is not typing.NotRequired}
    assert {f["status"] for f in doc["files"]} == {"transformed", "failed"}
    for f in doc["files"]:
        assert required <= set(f) <= set(file_keys), f
    assert set(next(f for f in doc["files"] if f["status"] == "transformed")) == set(file_keys) - {"dropped_signatures"}
