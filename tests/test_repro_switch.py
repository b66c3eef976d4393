"""A distribution's switch that the build records: a hugified package rebuilds bit
for bit from its .buildinfo alone.

The package is GNU hello from the archive, turned on the documented way: one
Build-Depends, `dh-sequence-hugify` (the `+hugify1` source; testkit/debian_repro.py),
built by sbuild in a clean chroot with hugify's packages in the archive. hugify
depends on the distribution's policy package (here tests/deb/hugify-policy-test), so
the .buildinfo records both exact versions in Installed-Build-Depends. The rebuild is
debrebuild's recipe: a fresh chroot holding exactly the recorded packages, the
source at the recorded Build-Path, dpkg-buildpackage with the recorded Environment,
nothing of the first build's configuration; its .debs are compared with the
checksums the .buildinfo lists, as reproduce.debian.net does.

The .buildinfo names the hugify that ran by a version that names its code: the
test suite's hugify is a snapshot (`make deb`: VERSION+src.DIGEST of its sources,
tools/stamp-snapshot), and the digest of this checkout's sources is found in hello's
Installed-Build-Depends. On main it read `hugify (= 0.1.0)` whatever the code.

The same sbuild build is test_sbuild.py's, and the same rebuild is the one
test_repro_reprotest.py's hello relies on: each is built once.

The second test is the switch docs/packaging-debian.md documented before (and keeps
as local-only): DH_EXTRA_ADDONS and a build dependency added by sbuild's
configuration. Its .buildinfo records neither: it is the .buildinfo of the archive's
hello built in the same chroot without hugify (test_sbuild.py's build), field for
field of what a rebuild follows, while the packages differ, so a rebuild from it
cannot give the hugified bytes (it would build without hugify, as a rebuild of that
record did when this test ran one: tests then built hello twice more for no more
proof). The reason the recorded switch exists. On main this
was the only distribution-wide switch; the first test fails there (no policy
package exists: hugify is not in the rebuild, or hello, below the vendor threshold,
is not transformed).
"""

from __future__ import annotations

import re
import time

import pytest

from testkit.debian import VERSION, hugify_sources, snapshot_digest
from testkit.debian_repro import (
    archive_build,
    deb_digests,
    hugified_build,
    hugified_source,
    hugify_debs,
    listed_debs,
    local_switch_build,
    parse_buildinfo,
    rebuild,
)
from testkit.elf import hugified

pytestmark = pytest.mark.slow

PROGRAM = "usr/bin/hello"
#: The fields of a .buildinfo a rebuild from it follows (debrebuild, testkit.debian_repro.rebuild).
RECORD = (
    "Source",
    "Version",
    "Architecture",
    "Build-Architecture",
    "Build-Path",
    "Installed-Build-Depends",
    "Environment",
)


def test_a_rebuild_from_the_buildinfo_alone_gives_the_same_debs() -> None:
    start = time.monotonic()
    first = hugified_build().ok()
    (buildinfo,) = (first.dir / "debs").glob("*.buildinfo")
    info = parse_buildinfo(buildinfo)
    again = rebuild(first, hugified_source("hello"), hugify_debs()).ok()
    print(f"build and rebuild: {time.monotonic() - start:.0f} s")
    # hugify ran in both, with the same policy, from the recorded packages only.
    for b in (first, again):
        assert re.search(rf"^hugify: /{PROGRAM}: transformed \(", b.log, re.M), b.log[-5000:]
        assert hugified(b.pkg("hello") / PROGRAM)
    assert "/etc/hugify/policy.toml" not in again.log
    assert "hugify-policy-test (= 1.0)" in info["Installed-Build-Depends"]
    # Which hugify: the version of a snapshot of exactly these sources.
    snapshot = f"{VERSION}+src.{snapshot_digest(hugify_sources())}"
    assert f"hugify (= {snapshot})" in info["Installed-Build-Depends"], info["Installed-Build-Depends"]
    # Every .deb the .buildinfo lists, dbgsym included, byte for byte.
    listed = listed_debs(info)
    assert sorted(listed) == ["hello-dbgsym_2.10-3+hugify1_amd64.deb", "hello_2.10-3+hugify1_amd64.deb"], listed
    assert deb_digests(again) == listed


def test_the_local_switch_is_not_reproduced_from_the_buildinfo() -> None:
    local = local_switch_build().ok()
    assert hugified(local.pkg("hello") / PROGRAM)
    assert "hugify is on only through DH_EXTRA_ADDONS, which the .buildinfo does not record" in local.log
    # The archive's hello built in the same chroot without hugify (test_sbuild.py's build).
    plain = archive_build().ok()
    assert not hugified(plain.pkg("hello") / PROGRAM)
    (local_info,) = (parse_buildinfo(p) for p in (local.dir / "debs").glob("*.buildinfo"))
    (plain_info,) = (parse_buildinfo(p) for p in (plain.dir / "debs").glob("*.buildinfo"))
    assert not re.search(r"\bhugify", local_info["Installed-Build-Depends"]), "nothing records hugify"
    assert "DH_EXTRA_ADDONS" not in local_info.get("Environment", "")
    # All that a rebuilder goes by is the same for both builds...
    for f in RECORD:
        assert local_info.get(f) == plain_info.get(f), f
    # ...and their packages differ: a rebuild from that record gives at most one of
    # them, and without hugify among the recorded packages, the plain one.
    local_debs, plain_debs = listed_debs(local_info), listed_debs(plain_info)
    assert sorted(local_debs) == sorted(plain_debs) == ["hello-dbgsym_2.10-3_amd64.deb", "hello_2.10-3_amd64.deb"]
    assert all(local_debs[n] != plain_debs[n] for n in local_debs), "other bytes"
