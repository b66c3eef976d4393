"""hugify derive-source: the +hugifyN source a distribution derives from a Debian source
package to build it with hugify on, the recorded way (docs/packaging-debian.md,
"Turning it on, recorded" and "On debusine"), from GNU hello as the archive has it
(fetched with apt-get source through a private apt state and cached:
testkit.debian_roots) and from small sources of the other formats made here.

The oracles are Debian's own tools, not derive-source's code: dpkg-source unpacks the
original and the derived source and `diff -r` compares the trees; dpkg-parsechangelog
reads the new entry; sbuild builds the derived source in a clean chroot (the build
tests/test_sbuild.py and tests/test_repro_switch.py use too: testkit.debian_repro makes
its source with derive-source) and its .buildinfo says what was installed; `hugify
check` judges the built packages. On main there is no derive-source: every test fails
there (its command line is refused as unknown, and the repro tests derived hello with
testkit code of their own).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from testkit.cli import hugify
from testkit.debian import VERSION, clean_env, hugify_sources, snapshot_digest
from testkit.debian_repro import MAINTAINER as REPRO_MAINTAINER
from testkit.debian_repro import hugified_build, hugified_source, parse_buildinfo
from testkit.debian_roots import source_package
from testkit.elf import hugified

MAINTAINER = "hugify tests <tests@hugify.invalid>"


def derive(
    dsc: Path, out: Path, *extra: str | Path, env: dict[str, str] | None = None, runner: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return hugify(
        "derive-source", dsc, "-o", out, "--maintainer", MAINTAINER, *extra,
        check=False, env=env or clean_env(), runner=runner,
    )  # fmt: skip


def unpack(dsc: Path, dest: Path) -> Path:
    subprocess.run(["dpkg-source", "-x", dsc, dest], capture_output=True, check=True)
    return dest


def changelog(tree: Path, *fields: str) -> list[str]:
    """The last changelog entry's fields, as dpkg-parsechangelog reads them."""
    return [
        subprocess.run(
            ["dpkg-parsechangelog", "-l", tree / "debian/changelog", "-S", f],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.rstrip("\n")
        for f in fields
    ]


def digests(d: Path) -> dict[str, str]:
    """Every entry of a directory (hidden ones too), files by their SHA-256."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "-" for p in sorted(d.iterdir())}


def check_derived(original: Path, out: Path, work: Path) -> Path:
    """The derived source in `out` is the original with dh-sequence-hugify first in its
    Build-Depends and one changelog entry on top, dated a second after the last, and
    nothing else; its upstream tarballs are the original's. Its .dsc."""
    (new,) = out.glob("*.dsc")
    old_tree, new_tree = unpack(original, work / "old"), unpack(new, work / "new")
    res = subprocess.run(["diff", "-rq", old_tree, new_tree], capture_output=True, text=True, check=False)
    changed = sorted(line.split()[1].removeprefix(f"{old_tree}/") for line in res.stdout.splitlines())
    assert changed == ["debian/changelog", "debian/control"], res.stdout + res.stderr
    old_control, new_control = ((t / "debian/control").read_text() for t in (old_tree, new_tree))
    undone = (new_control.replace("dh-sequence-hugify, ", "", 1), new_control.replace(" dh-sequence-hugify,\n", "", 1))
    assert old_control in undone, new_control
    old_log, new_log = ((t / "debian/changelog").read_text() for t in (old_tree, new_tree))
    assert new_log.endswith("\n\n" + old_log)
    version, stamp, dist = changelog(old_tree, "Version", "Timestamp", "Distribution")
    assert changelog(new_tree, "Version", "Timestamp", "Distribution", "Maintainer") == [
        f"{version}+hugify1",
        str(int(stamp) + 1),
        dist,
        MAINTAINER,
    ]
    assert "Build-Depends on dh-sequence-hugify" in changelog(new_tree, "Changes")[0]
    # What dpkg-source wrote into the new .dsc: the build dependency, and the original's
    # upstream files (tarballs, their signatures) byte for byte.
    assert re.search(r"^Build-Depends: dh-sequence-hugify, ", new.read_text(), re.M), new.read_text()
    upstream = {n: d for n, d in digests(original.parent).items() if ".orig" in n}
    assert {n: d for n, d in digests(out).items() if ".orig" in n} == upstream
    return new


def test_hello_gets_one_build_dependency_and_one_changelog_entry(tmp_path: Path) -> None:
    dsc = source_package("hello")
    before = digests(dsc.parent)
    out = tmp_path / "out"
    out.mkdir()
    res = derive(dsc, out)
    assert res.returncode == 0, res.stderr
    said = "hugify: derive-source: hello 2.10-3+hugify1, Build-Depends: dh-sequence-hugify"
    assert res.stdout == f"{said}: {out}/hello_2.10-3+hugify1.dsc\n", res.stdout
    check_derived(dsc, out, tmp_path)
    assert sorted(digests(out)) == [
        "hello_2.10-3+hugify1.debian.tar.xz",
        "hello_2.10-3+hugify1.dsc",
        "hello_2.10.orig.tar.gz",
        "hello_2.10.orig.tar.gz.asc",
    ], "nothing else is left in DIR"
    assert digests(dsc.parent) == before, "the original source is left as it was"
    # --distribution names the derivative's suite; SOURCE_DATE_EPOCH dates the entry.
    again = tmp_path / "again"
    again.mkdir()
    res = derive(dsc, again, "--distribution", "trixie-hugify", env=clean_env(SOURCE_DATE_EPOCH="1800000000"))
    assert res.returncode == 0, res.stderr
    tree = unpack(next(again.glob("*.dsc")), tmp_path / "tree")
    assert changelog(tree, "Distribution", "Timestamp") == ["trixie-hugify", "1800000000"]


def test_the_same_source_gives_the_same_bytes(tmp_path: Path) -> None:
    dsc = source_package("hello")
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert derive(dsc, a).returncode == 0
    # Another umask, time zone and locale, a second or more later.
    odd = clean_env(TZ="Pacific/Kiritimati", LC_ALL="C")
    res = derive(dsc, b, env=odd, runner=("sh", "-c", 'sleep 1.1 && umask 077 && exec "$@"', "sh"))
    assert res.returncode == 0, res.stderr
    assert digests(a) == digests(b)
    assert len(digests(a)) == 4


def make_source(parent: Path, fmt: str, version: str) -> Path:
    """A small source of format `fmt` (its upstream tarball too when the version has a
    revision and the format is 1.0), built by dpkg-source: its .dsc."""
    parent.mkdir()
    tree = parent / f"tiny-{version}"
    (tree / "debian" / "source").mkdir(parents=True)
    (tree / "tiny.c").write_text("int main(void) { return 0; }\n")
    (tree / "debian" / "control").write_text(
        "Source: tiny\nMaintainer: A B <ab@example.org>\nBuild-Depends:\n debhelper-compat (= 13),\n\n"
        "Package: tiny\nArchitecture: any\nDescription: a test\n a test\n"
    )
    (tree / "debian" / "changelog").write_text(
        f"tiny ({version}) unstable; urgency=medium\n\n  * A test.\n\n -- A B <ab@example.org>  "
        "Mon, 26 Dec 2022 16:30:00 +0100\n"
    )
    (tree / "debian" / "rules").write_text("#!/usr/bin/make -f\n%:\n\tdh $@\n")
    (tree / "debian" / "rules").chmod(0o755)
    (tree / "debian" / "source" / "format").write_text(f"{fmt}\n")
    if "-" in version:
        upstream = version.rsplit("-", 1)[0]
        orig = parent / f"tiny_{upstream}.orig.tar.gz"
        subprocess.run(["tar", "-czf", orig, f"--transform=s,^{tree.name},tiny-{upstream},", tree.name + "/tiny.c"],
                       cwd=parent, check=True)  # fmt: skip
    subprocess.run(["dpkg-source", "-b", tree.name], cwd=parent, capture_output=True, check=True)
    shutil.rmtree(tree)
    return next(parent.glob("*.dsc"))


@pytest.mark.parametrize(
    ("fmt", "version"), [("1.0", "1.0"), ("1.0", "1.0-1"), ("3.0 (native)", "1.0"), ("3.0 (quilt)", "1.0-1")]
)
def test_every_format_dpkg_source_rebuilds(tmp_path: Path, fmt: str, version: str) -> None:
    dsc = make_source(tmp_path / "src", fmt, version)
    outs = [tmp_path / "a", tmp_path / "b"]
    for out in outs:
        out.mkdir()
        res = derive(dsc, out, runner=("sh", "-c", f'umask {"077" if out.name == "b" else "022"} && exec "$@"', "sh"))
        assert res.returncode == 0, res.stderr
    check_derived(dsc, outs[0], tmp_path)
    assert digests(outs[0]) == digests(outs[1])
    if fmt == "3.0 (quilt)":
        return  # its debian tarball holds debian/ alone
    # A native tarball and a 1.0 diff name the tree: as dpkg-source -x names it.
    (made,) = (
        p for p in outs[0].iterdir() if p.name.endswith((".tar.xz", ".tar.gz", ".diff.gz")) and ".orig" not in p.name
    )
    listing = subprocess.run(
        ["zcat", "-f", made] if made.name.endswith(".gz") else ["xz", "-dc", made], capture_output=True, check=True
    ).stdout
    assert b"tiny-1.0" in listing and b"tree/" not in listing


def with_rules(dsc: Path, work: Path, old: str, new: str) -> Path:
    """The source with a piece of its debian/rules changed, built again by dpkg-source."""
    work.mkdir()
    tree = unpack(dsc, work / "tree")
    rules = tree / "debian/rules"
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, new))
    subprocess.run(["dpkg-source", "-b", "tree"], cwd=work, capture_output=True, check=True)
    shutil.rmtree(tree)
    return next(work.glob("*.dsc"))


def copy_source(dsc: Path, dest: Path) -> Path:
    dest.mkdir()
    for p in dsc.parent.iterdir():
        shutil.copy(p, dest / p.name)
    return dest / dsc.name


def test_bad_input_is_refused_in_one_line_and_nothing_is_written(tmp_path: Path) -> None:
    hello = source_package("hello")
    derived = tmp_path / "derived"
    derived.mkdir()
    assert derive(hello, derived).returncode == 0
    derived_dsc = next(derived.glob("*.dsc"))
    text = tmp_path / "text" / "notes.dsc"
    text.parent.mkdir()
    text.write_text("not a source\n")
    binary = tmp_path / "binary" / "true.dsc"
    binary.parent.mkdir()
    shutil.copy("/bin/true", binary)
    fifo = tmp_path / "fifo" / "pipe.dsc"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    no_checksums = copy_source(hello, tmp_path / "no-checksums")
    no_checksums.write_text(no_checksums.read_text().replace("Checksums-Sha256:", "X-Checksums:"))
    git_format = copy_source(hello, tmp_path / "git-format")
    git_format.write_text(git_format.read_text().replace("Format: 3.0 (quilt)", "Format: 3.0 (git)"))
    damaged = copy_source(hello, tmp_path / "damaged")
    (tarball,) = damaged.parent.glob("*.debian.tar.xz")
    data = bytearray(tarball.read_bytes())
    data[100] ^= 0xFF
    tarball.write_bytes(bytes(data))
    incomplete = copy_source(hello, tmp_path / "incomplete")
    (incomplete.parent / "hello_2.10.orig.tar.gz").unlink()
    with_hugify = with_rules(hello, tmp_path / "with", "dh $@", "dh $@ --with autoreconf,hugify")
    without_dh = with_rules(hello, tmp_path / "without-dh", "%:\n\tdh $@", "build binary clean:\n\tdh_testdir")
    out = tmp_path / "out"
    out.mkdir()
    cases = [
        (tmp_path / "absent.dsc", (), 5, "io-error"),
        (tmp_path / "text", (), 3, "wrong-file-type"),
        (fifo, (), 3, "wrong-file-type"),
        (text, (), 3, "not-a-source"),
        (binary, (), 3, "not-a-source"),
        (no_checksums, (), 3, "not-a-source"),
        (git_format, (), 4, "unsupported-source-format"),
        (damaged, (), 3, "source-corrupt"),
        (incomplete, (), 3, "source-corrupt"),
        (derived_dsc, (), 4, "already-hugified"),
        (with_hugify, (), 4, "already-hugified"),
        (without_dh, (), 4, "no-dh-sequence"),
        (hello, ("--suffix", "~hugify1"), 3, "suffix-not-higher"),
    ]
    wrong = []
    for dsc, extra, status, reason in cases:
        before = digests(dsc.parent)
        res = derive(dsc, out, *extra)
        err = res.stderr.strip()
        if res.returncode != status or len(err.splitlines()) != 1 or not err.endswith(f"({reason})"):
            wrong.append(f"{dsc.name} {extra}: exit {res.returncode}, {err!r}; expected {status} ({reason})")
        if str(dsc) not in err:
            wrong.append(f"{dsc.name}: the line does not name it: {err!r}")
        if digests(out):
            wrong.append(f"{dsc.name} {extra}: left in DIR: {sorted(digests(out))}")
        if digests(dsc.parent) != before:
            wrong.append(f"{dsc.name}: its directory changed")
    assert not wrong, "\n".join(wrong)
    res = derive(without_dh, out)
    assert "call dh_hugify, dh_hugify_check and dh_hugify_sign from its rules" in res.stderr
    # DIR is the caller's to make; a directory at an output's name is not written over.
    res = derive(hello, tmp_path / "missing")
    assert res.returncode == 5 and res.stderr.strip().endswith("(io-error)"), res.stderr
    assert not (tmp_path / "missing").exists()
    (out / "hello_2.10-3+hugify1.dsc").mkdir()
    res = derive(hello, out)
    assert res.returncode == 6 and res.stderr.strip().endswith("(not-regular)"), res.stderr
    assert sorted(digests(out)) == ["hello_2.10-3+hugify1.dsc"] and not any(
        (out / "hello_2.10-3+hugify1.dsc").iterdir()
    )
    # Usage: who signs the entry (--maintainer, else DEBFULLNAME and DEBEMAIL), a suffix.
    nobody = {k: v for k, v in clean_env().items() if k not in ("DEBEMAIL", "EMAIL", "DEBFULLNAME", "NAME")}
    res = hugify("derive-source", hello, "-o", out, check=False, env=nobody)
    assert res.returncode == 2 and "--maintainer" in res.stderr, res
    res = derive(hello, out, "--suffix", "-1")
    assert res.returncode == 2 and "version suffix" in res.stderr, res
    named = tmp_path / "named"
    named.mkdir()
    res = hugify(
        "derive-source",
        hello,
        "-o",
        named,
        check=False,
        env={**nobody, "DEBFULLNAME": "A B", "DEBEMAIL": "a@b.example"},
    )
    assert res.returncode == 0, res.stderr
    assert changelog(unpack(next(named.glob("*.dsc")), tmp_path / "t3"), "Maintainer") == ["A B <a@b.example>"]


@pytest.mark.slow
def test_the_derived_source_builds_hugified_and_its_buildinfo_records_the_switch(tmp_path: Path) -> None:
    """sbuild in a clean chroot (testkit.debian_repro: hugify's packages offered as an
    archive would, the test distribution's policy package among them) builds hello's
    source as derive-source made it."""
    dsc = hugified_source("hello")
    # The source built is derive-source's: made again here, the same bytes.
    again = tmp_path / "again"
    again.mkdir()
    res = hugify("derive-source", source_package("hello"), "-o", again, "--maintainer", REPRO_MAINTAINER,
                 env=clean_env(), check=False)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert digests(again) == digests(dsc.parent)
    build = hugified_build("hello").ok()
    (buildinfo,) = (build.dir / "debs").glob("*.buildinfo")
    info = parse_buildinfo(buildinfo)
    assert (info["Source"], info["Version"]) == ("hello", "2.10-3+hugify1")
    installed = info["Installed-Build-Depends"]
    snapshot = f"{VERSION}+src.{snapshot_digest(hugify_sources())}"
    assert f"hugify (= {snapshot})" in installed and "hugify-policy-test (= 1.0)" in installed, installed
    assert re.search(r"^hugify: /usr/bin/hello: transformed \(", build.log, re.M), build.log[-4000:]
    assert hugified(build.pkg("hello") / "usr/bin/hello")
    # hugify check, as an archive's QA runs it on the upload: hugified, manifest,
    # statement and the -dbgsym's build-id consistent.
    (changes,) = (build.dir / "debs").glob("*.changes")
    res = hugify("check", changes, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "hello_2.10-3+hugify1_amd64.deb: 1 hugified file(s) as hugify left them\n" in res.stdout, res.stdout
