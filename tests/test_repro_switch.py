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

The second test is the switch docs/packaging-debian.md documented before (and keeps
as local-only): DH_EXTRA_ADDONS and a build dependency added by sbuild's
configuration. Its .buildinfo records neither, so the same rebuild runs without
hugify and gets other bytes: the reason the recorded switch exists. On main this
was the only distribution-wide switch; the first test fails there (no policy
package exists: hugify is not in the rebuild, or hello, below the vendor threshold,
is not transformed).
"""

from __future__ import annotations

import re
import time

import pytest

from testkit.debian_repro import (
    deb_digests,
    hugified_build,
    hugified_source,
    hugify_debs,
    listed_debs,
    local_switch_build,
    parse_buildinfo,
    rebuild,
)
from testkit.debian_roots import source_package
from testkit.elf import hugified

pytestmark = pytest.mark.slow

PROGRAM = "usr/bin/hello"


def test_a_rebuild_from_the_buildinfo_alone_gives_the_same_debs() -> None:
    start = time.monotonic()
    first = hugified_build().ok()
    (buildinfo,) = (first.dir / "debs").glob("*.buildinfo")
    info = parse_buildinfo(buildinfo)
    again = rebuild("hello-hugified", first, hugified_source("hello"), hugify_debs()).ok()
    print(f"build and rebuild: {time.monotonic() - start:.0f} s")
    # hugify ran in both, with the same policy, from the recorded packages only.
    for b in (first, again):
        assert re.search(rf"^hugify: /{PROGRAM}: transformed \(", b.log, re.M), b.log[-5000:]
        assert hugified(b.pkg("hello") / PROGRAM)
    assert "/etc/hugify/policy.toml" not in again.log
    assert "hugify-policy-test (= 1.0)" in info["Installed-Build-Depends"]
    # Every .deb the .buildinfo lists, dbgsym included, byte for byte.
    listed = listed_debs(info)
    assert sorted(listed) == ["hello-dbgsym_2.10-3+hugify1_amd64.deb", "hello_2.10-3+hugify1_amd64.deb"], listed
    assert deb_digests(again) == listed


def test_the_local_switch_is_not_reproduced_from_the_buildinfo() -> None:
    local = local_switch_build().ok()
    assert hugified(local.pkg("hello") / PROGRAM)
    assert "hugify is on only through DH_EXTRA_ADDONS, which the .buildinfo does not record" in local.log
    (buildinfo,) = (local.dir / "debs").glob("*.buildinfo")
    info = parse_buildinfo(buildinfo)
    assert not re.search(r"\bhugify", info["Installed-Build-Depends"]), "nothing records hugify"
    assert "DH_EXTRA_ADDONS" not in info.get("Environment", "")
    again = rebuild("hello-local-switch", local, source_package("hello"), hugify_debs()).ok()
    assert "dh_hugify" not in again.log
    assert not hugified(again.pkg("hello") / PROGRAM)
    listed = listed_debs(info)
    assert set(deb_digests(again)) == set(listed)
    assert all(deb_digests(again)[n] != d for n, d in listed.items()), "other bytes"
