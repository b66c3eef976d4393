"""Same bytes whatever the build host.

The test package (tests/deb/hugify-deb-test, hugified by this checkout's add-on) is
built three times at the same path: on ext4 (the test cache's file system; Linux
6.18 gives ext4 files large folios) under the machine's THP setting; on a tmpfs
mounted without huge pages (no large folios) with transparent huge pages disabled
for the whole build (prctl PR_SET_THP_DISABLE, what THP "never" is to a process)
and the setting's file reading "never"; and on a btrfs (folios of at most 256 KiB
on these kernels) with the setting's file reading "always". The machine's own THP
setting is shared with every other test and user, so it is not changed: what a
build can see of it (the sysfs file, its own THP state) is. Every .deb and .udeb,
-dbgsym included, must be byte-identical.

hugify's version is what changes its output: it is recorded with every hugified
file (the tree report, the statement) and, for builds that turn hugify on with
dh-sequence-hugify, in the .buildinfo (tests/test_repro_switch.py).
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from hugify import _core
from testkit.debian import DebBuild, build_variant

pytestmark = pytest.mark.slow


def digests(b: DebBuild) -> dict[str, str]:
    return {
        d.name: hashlib.sha256(d.read_bytes()).hexdigest()
        for d in sorted((b.dir / "debs").iterdir())
        if d.suffix in (".deb", ".udeb")
    }


@pytest.mark.parametrize(
    ("variant", "fs", "thp"),
    [
        ("with-tmpfs-thp-never", "tmpfs", r"always madvise \[never\]; THP_enabled: 0"),
        ("with-btrfs-thp-always", "btrfs", r"\[always\] madvise never; THP_enabled: 1"),
    ],
)
def test_the_same_debs_on_another_filesystem_and_thp_setting(variant: str, fs: str, thp: str) -> None:
    ext4, other = build_variant("with").ok(), build_variant(variant).ok()
    assert re.search(rf"^build directory: {fs}; THP: {thp}$", other.log, re.M), other.log[:3000]
    assert re.search(r"^hugify: /usr/bin/hugify-deb-test: transformed \(shift\)", other.log, re.M)
    want = digests(ext4)
    assert len(want) >= 10, want
    assert digests(other) == want


def test_hugifys_version_is_recorded_with_what_it_changed() -> None:
    b = build_variant("with").ok()
    report = json.loads((b.dir / "reports" / "hugify-deb-test.json").read_text())
    assert report["hugify_version"] == _core.VERSION
    statement = json.loads(
        (b.pkg("hugify-deb-test") / "usr/share/hugify/attestations/hugify-deb-test.intoto.json").read_text()
    )
    assert statement["predicate"]["hugify"]["version"] == _core.VERSION
    assert statement["predicate"]["policy"]["sha256"] == report["policy_digest"]
