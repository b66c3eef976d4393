"""A hugify whose code changed carries another package version: a change of the tool
that changes output bytes is visible in the versions a .buildinfo records.

The version is all a .buildinfo records of hugify (`Installed-Build-Depends: hugify
(= VERSION)`). `make deb` (and the test suite's build of hugify's .deb) runs
tools/stamp-snapshot on the copy of the sources it builds: a changelog entry whose
version is the release's with `+src.DIGEST`, DIGEST the first 12 hex digits of the
sha256 of the sources, each file's path and content in path order
(docs/packaging-debian.md, "Which hugify a build used"). Here the digest is computed
again from that rule, one byte of the core is changed, and the same sources are
stamped twice (testkit.debian.snapshot_digest is the rule written again, apart
from the tool). On main there is no stamp: every build of any code is 0.1.0.
The built package carrying it is checked in tests/test_repro_switch.py.
"""

from __future__ import annotations

import datetime
import email.utils
import re
import subprocess
from pathlib import Path

from testkit import REPO
from testkit.debian import VERSION, copy_sources, hugify_sources, snapshot_digest

STAMP = REPO / "tools" / "stamp-snapshot"


def stamped(tree: Path) -> tuple[str, str]:
    """tools/stamp-snapshot's answer and the version dpkg reads from the changelog after it."""
    out = subprocess.run([str(STAMP), str(tree)], capture_output=True, text=True, check=True).stdout.strip()
    parsed = subprocess.run(
        ["dpkg-parsechangelog", "-S", "Version"], cwd=tree, capture_output=True, text=True, check=True
    ).stdout.strip()
    return out, parsed


def test_the_version_names_the_sources_and_changes_with_them(tmp_path: Path) -> None:
    sources = hugify_sources()
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for tree in (a, b, c):
        copy_sources(sources, tree)
    expected = f"{VERSION}+src.{snapshot_digest(sources)}"
    assert stamped(a) == (expected, expected)
    # The same sources again: the same version and the same changelog bytes.
    assert stamped(b) == (expected, expected)
    assert (a / "debian/changelog").read_bytes() == (b / "debian/changelog").read_bytes()
    # The release's entry is kept below the snapshot's, and the snapshot's date is the
    # release's and a second (nothing of the moment of the build; a new entry is newer).
    log = (a / "debian/changelog").read_text()
    assert log.endswith((REPO / "debian/changelog").read_text())
    dates = [email.utils.parsedate_to_datetime(d) for d in re.findall(r"^ -- .*?  (.*)$", log, re.M)]
    assert dates[0] - dates[1] == datetime.timedelta(seconds=1), dates
    # One byte of the rewriter changed: another version.
    plan = c / "core/src/plan.rs"
    plan.write_bytes(plan.read_bytes().replace(b"fn ", b"fn  ", 1))
    changed, parsed = stamped(c)
    assert changed == parsed and re.fullmatch(rf"{re.escape(VERSION)}\+src\.[0-9a-f]{{12}}", changed)
    assert changed != expected


def test_a_tree_without_a_changelog_is_refused(tmp_path: Path) -> None:
    res = subprocess.run([str(STAMP), str(tmp_path)], capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "usage: tools/stamp-snapshot DIR" in res.stderr
    assert list(tmp_path.iterdir()) == []
