"""Reproducible under variation, on real Debian packages.

Three source packages of the archive, of three kinds, each turned on the
documented way (one Build-Depends, dh-sequence-hugify; the test distribution's
policy package, threshold 4 KiB) and each with a file hugify transforms:

* hello (C, autotools): /usr/bin/hello, 11.6 KiB of code;
* tinyxml2 (C++, CMake): the shared library libtinyxml2.so.9;
* rust-exa (Rust, dh-cargo; libgit2 through git2): /usr/bin/exa.

They are small sources of their kind in bookworm whose build dependencies are all in
the archive (exa's eighteen crates; smaller Rust programs such as hexyl or sd were
not to be had from the mirror here), so the suite stays in time; their files are
small, which is why the distribution's policy sets a 4 KiB threshold, recorded in
the policy package the .buildinfo names.

reprotest (Debian's) builds each twice in a clean chroot with every variation it
has (build path, time, umask, locales, timezone, user and group, home, file
ordering, number of CPUs, kernel, ASLR, domain and host names, exec path,
environment) and the experiment under THP "never" (prctl PR_SET_THP_DISABLE, the
setting as a build process sees it: the machine-wide one is shared; see
testkit/debian_repro.py), and every .deb, dbgsym included, must be byte-identical.
Then each package's sbuild build is rebuilt from its .buildinfo alone, as debrebuild
does, and must give the .debs the .buildinfo lists.
"""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path

import pytest

from testkit.debian_repro import (
    deb_digests,
    faked_time,
    hugified_build,
    hugified_source,
    hugify_debs,
    listed_debs,
    parse_buildinfo,
    rebuild,
    reprotest,
)

pytestmark = pytest.mark.slow

#: Source package -> a file of it hugify transforms.
SOURCES = {
    "hello": "/usr/bin/hello",
    "tinyxml2": "/usr/lib/x86_64-linux-gnu/libtinyxml2.so.9",
    "rust-exa": "/usr/bin/exa",
}


def artifacts(store_dir: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(store_dir.iterdir())
        if p.suffix in (".deb", ".udeb")
    }


@pytest.mark.parametrize("source", SOURCES)
def test_reprotest_with_every_variation_gives_identical_debs(source: str) -> None:
    start = time.monotonic()
    r = reprotest(source, hugified_source(source), hugify_debs())
    print(f"reprotest {source}: {time.monotonic() - start:.0f} s")
    assert r.rc == 0, r.log[-8000:]
    assert "Reproduction successful" in r.log and "No differences in ./*.*deb" in r.log, r.log[-8000:]
    # reprotest keeps the control build's artifacts and the digests both builds shared.
    control = artifacts(r.dir / "store" / "control" / "source-root")
    sums = dict(reversed(line.split()) for line in (r.dir / "store" / "SHA256SUMS").read_text().splitlines())
    assert {name.removeprefix("./"): digest for name, digest in sums.items()} == control
    assert any("-dbgsym_" in n for n in control), control
    # hugify transformed the file in both builds, the second one with THP off, and the
    # experiment varied what it says it did.
    path = SOURCES[source]
    assert len(re.findall(rf"^hugify: {re.escape(path)}[^:]*: transformed \(", r.log, re.M)) >= 2, r.log[-8000:]
    builds = re.findall(r"^reprotest build: (.*)$", r.log, re.M)
    assert len(builds) == 2 and "THP_enabled: 1," in builds[0] and "THP_enabled: 0," in builds[1], builds
    for variation in ("BUILD_PATH", "FAKETIME", "UMASK", "LOCALE", "TIMEZONE", "HOME", "DISORDERFS", "NUM_CPUS"):
        assert f"{variation} variation: " in r.log, variation
    assert f"FAKETIME variation: faketime = {faked_time()}" in r.log
    assert "as root:root," in builds[0] and "as builduser:builduser," in builds[1], builds


@pytest.mark.parametrize("source", SOURCES)
def test_a_rebuild_from_the_buildinfo_gives_the_listed_debs(source: str) -> None:
    start = time.monotonic()
    first = hugified_build(source).ok()
    (buildinfo,) = (first.dir / "debs").glob("*.buildinfo")
    info = parse_buildinfo(buildinfo)
    again = rebuild(source, first, hugified_source(source), hugify_debs()).ok()
    print(f"sbuild and rebuild {source}: {time.monotonic() - start:.0f} s")
    assert re.search(rf"^hugify: {re.escape(SOURCES[source])}[^:]*: transformed \(", again.log, re.M)
    listed = listed_debs(info)
    assert any("-dbgsym_" in n for n in listed), listed
    assert deb_digests(again) == listed
