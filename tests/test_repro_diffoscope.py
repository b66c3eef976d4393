"""diffoscope (Debian's) between the hugified and the plain build of the same source
shows only the kinds of difference docs/manifest.md lists ("What a hugified package
differs in from a plain build"); the table is read from there, so the documentation
and the test cannot part.

The builds are the test package's (testkit/debian.py: tests/deb/hugify-deb-test,
variants "with" and "plain", built at the same path with the same tools): its
program, its library and their -dbgsym packages. Besides the labels, what the
package-level differences contain is checked: only the documented control fields
change, files are only added under hugify's directories (or renamed after a new
build-id in a -dbgsym), the build-ids differ by one bit, and the section names
gain only `.hugify.pad`. diffoscope's JSON report of each pair is cached with the
builds it compares.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.cache import cached
from testkit.debian import build_variant, files_key, tool_versions
from testkit.elf import bits_differing

pytestmark = pytest.mark.slow

PACKAGES = ["hugify-deb-test", "hugify-deb-test-dbgsym", "libhugdebtest1", "libhugdebtest1-dbgsym"]
DOC = REPO / "docs" / "manifest.md"


def documented_labels() -> list[re.Pattern[str]]:
    """The first column of docs/manifest.md's table: each `label` as a pattern
    (SECTION: any section name; a cell may name several, comma-separated, the later
    ones options of the first's command)."""
    text = DOC.read_text()
    table = text.split("## What a hugified package differs in from a plain build", 1)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    patterns = []
    for row in rows:
        cell = row.split("|")[1]
        labels = re.findall(r"`([^`]+)`", cell)
        command = labels[0].rsplit(" --", 1)[0] if labels[0].startswith("readelf") else ""
        for i, written in enumerate(labels):
            label = f"{command} {written}" if i and written.startswith("--") else written
            rx = re.escape(label).replace("SECTION", r"\S+")
            patterns.append(re.compile(rf"(^|.* / ){rx}( / .*)?$"))
    assert len(patterns) > 10, rows
    return patterns


def diffoscope(package: str) -> dict:
    """diffoscope's JSON report of the package's plain and hugified .deb."""
    plain, hugified = build_variant("plain").ok(), build_variant("with").ok()
    a, b = plain.deb(package), hugified.deb(package)
    key = files_key([("a", a), ("b", b)], tool_versions("diffoscope-minimal", "binutils"))

    def make(work: Path) -> None:
        res = subprocess.run(
            ["diffoscope", "--json", str(work / "report.json"), "--exclude-directory-metadata=yes", str(a), str(b)],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]  # 1: they differ

    return json.loads((cached(f"diffoscope-{package}", key, make) / "report.json").read_text())


def leaves(node: dict, path: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """(label path below the .deb, unified diff) of every difference diffoscope shows."""
    label = re.sub(r"\s*\{\}\s*", "", node.get("source1") or "").strip()
    here = (*path, label)
    out = []
    if node.get("unified_diff"):
        out.append((" / ".join(here[1:]), node["unified_diff"]))
    for kid in node.get("details", []):
        out += leaves(kid, here)
    return out


def changed(diff: str) -> tuple[list[str], list[str]]:
    """The removed and the added lines of a unified diff."""
    lines = diff.splitlines()
    removed = [x[1:] for x in lines if x.startswith("-") and not x.startswith("---")]
    added = [x[1:] for x in lines if x.startswith("+") and not x.startswith("+++")]
    return removed, added


@pytest.mark.parametrize("package", PACKAGES)
def test_only_the_documented_kinds_of_difference(package: str) -> None:
    documented = documented_labels()
    found = leaves(diffoscope(package))
    assert found, "the builds differ"
    undocumented = sorted({p for p, _ in found if not any(rx.match(p) for rx in documented)})
    assert undocumented == [], undocumented
    for path, diff in found:
        removed, added = changed(diff)
        if path.endswith("./control"):
            fields = {line.split(":", 1)[0] for line in removed + added}
            assert fields <= {"Installed-Size", "Build-Ids"}, (path, fields)
        elif path.endswith("data.tar / file list"):
            gone = {line.split()[-1] for line in removed}
            new = {line.split()[-1] for line in added}
            hugifys = ("./usr/lib/hugify/", "./usr/share/hugify/", "./usr/lib/debug/.build-id/")
            for p in new - gone:
                # hugify's files, or a directory on the way to them
                assert p.startswith(hugifys) or any(h.startswith(p) for h in hugifys), p
            assert all(p.startswith("./usr/lib/debug/.build-id/") for p in gone - new), gone - new
        elif path.endswith("readelf --wide --notes"):
            ids = [re.search(r"Build ID: ([0-9a-f]+)", line) for line in removed + added]
            assert len(ids) == 2 and all(ids), diff
            before, after = (bytes.fromhex(m[1]) for m in ids if m)
            assert bits_differing(before, after) == 1
        elif path.endswith("strings --all --bytes=8"):
            assert (removed, added) == ([], [".hugify.pad"]), diff
