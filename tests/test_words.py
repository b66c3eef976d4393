"""Words that must stay true: the tests a comment names exist, test comments point at
nothing outside the repository, the manifest rule as `hugify manifest --help` and
docs/manifest.md state it is the core's (core/src/windows.rs), fixed address included,
and one module reads $SOURCE_DATE_EPOCH."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from testkit import REPO


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.splitlines()]


def test_every_test_file_named_exists() -> None:
    named = {
        (path.relative_to(REPO), m)
        for path in tracked("*.py", "*.c", "*.h", "*.rs", "*.md", "Makefile")
        if path.is_file()
        for m in re.findall(r"tests/(?:programs/)?[\w-]+\.(?:py|c)\b", path.read_text(errors="replace"))
    }
    assert named, "no file names a test"
    assert [(where, m) for where, m in sorted(named) if not (REPO / m).is_file()] == []


def test_test_comments_point_at_nothing_outside() -> None:
    outside = [
        f"{p.name}:{n}: {line.strip()}"
        for p in tracked("tests/*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if re.search(r"\bissue \d+, item \d+", line)
    ]
    assert outside == []


def test_manifest_rule_states_the_fixed_address_rule() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "hugify.cli", "manifest", "--help"], cwd=REPO, capture_output=True, text=True, check=True
    )
    help_text = " ".join(res.stdout.split())
    assert "ET_EXEC at its fixed address" in help_text and "p_align of at least" in help_text
    doc = " ".join((REPO / "docs/manifest.md").read_text().split())
    record_rule = doc.split("A file is recorded when")[1].split(".")[0]
    assert "`ET_EXEC` at its fixed link-time address" in record_rule


def test_one_place_reads_source_date_epoch() -> None:
    """hugify/files.py is the one reader of $SOURCE_DATE_EPOCH (others only pass it on
    to the tools they run)."""
    read = re.compile(r"""environ(?:\.get\(|\[)\s*["']SOURCE_DATE_EPOCH""")
    assert [p.name for p in tracked("hugify/*.py") if read.search(p.read_text())] == ["files.py"]
