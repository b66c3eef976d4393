"""`hugify repack` against an oracle over every field: each header tag rpm knows
(`rpm --querytags`, queried with `rpm -qp --qf`, arrays whole) and each control
field and member of a .deb (`dpkg-deb -f`, `-I`, `-c`, every control file, the data
members) of the original and the repacked package are compared, and any difference
fails unless the documented list of intended changes allows it. That list is read
from the docs (docs/packaging-rpm.md, docs/packaging-debian.md), never from the
code under test.

rpm: tests/rpm/hugify-repack-test.spec (subpackages requiring each other by exact
version, scriptlets with -e/-q, triggers, %config(noreplace), %ghost, %dir, %caps,
OrderWithRequires, BugURL, DistTag, DistURL, ModularityLabel; %preuntrans and
%postuntrans where rpm has them), repacked alone and together. rpm here cannot sign
files (rpmsign has no --signfiles without IMA support): a package carrying per-file
signatures is refused, shown with fs-verity file signatures (rpmsign --signverity)
where rpm can make those, and with a header whose IMA tag is present.
Debian: archive packages fetched with apt-get download (cached): a library with
symbols and triggers (libzstd1), a package with conffiles and maintainer scripts
(cron), an Essential one (dash), a Multi-Arch: same library for amd64 and arm64 in
one call (liblz4-1), and a -dbgsym built here (the debug archive is not reachable).
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import subprocess
from pathlib import Path

import pytest

from testkit import REPO
from testkit.cache import cache_root, locked
from testkit.cli import hugify
from testkit.debian import build_id, build_variant
from testkit.elf import hugified

slow = pytest.mark.slow
DOCS = REPO / "docs"
SPEC = REPO / "tests" / "rpm" / "hugify-repack-test.spec"
POLICY = 'threshold = "0"\n'
#: Flags of rpm's dependency generator (rpmds.h): auto (found), config.
AUTO_MARKS = 0x4000 | 0x8000 | 0x10000000
#: rpmds.h's sense bits, and the operator a spec writes for each combination.
LESS, GREATER, EQUAL = 2, 4, 8
OPERATORS = {EQUAL: "=", GREATER | EQUAL: ">=", LESS | EQUAL: "<=", GREATER: ">", LESS: "<"}
GHOST = 64  # rpmfiles.h
FILESIGNATURES = 5090  # rpmtag.h
BUILD_ID_DIR = "/usr/lib/.build-id"


def transformed(path: Path) -> bool:
    """An ELF file whose code is on whole huge-page windows."""
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF" and hugified(path)


def documented(doc: Path, heading: str) -> dict[str, str]:
    """name -> rule, from the two-column table that follows `heading` in a doc."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(heading)
    rules: dict[str, str] = {}
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            in_table = True
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) >= 2 and not set(cells[1]) <= {"-"} and cells[1] != "rule":
                for name in re.findall(r"`([^`]+)`", cells[0]):
                    rules[name] = cells[1]
        elif in_table:
            break
    assert rules, f"no table after {heading!r} in {doc}"
    return rules


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    p = tmp_path / "policy.toml"
    p.write_text(POLICY)
    return p


# --- rpm ------------------------------------------------------------------------------

RPM_RULES_HEADING = "#### What repack changes in an rpm header"
RPM_VERSIONS_HEADING = "#### Versions in relationships"


def rpm_tags() -> list[str]:
    return subprocess.run(["rpm", "--querytags"], capture_output=True, text=True, check=True).stdout.split()


def rpm_header(pkg: Path, tags: list[str]) -> dict[str, list[str]]:
    """Every tag's values ([] when absent), in one rpm call."""
    qf = "".join(f"\x01{t}\x02[%{{{t}}}\x03]" for t in tags)
    res = subprocess.run(
        ["rpm", "-qp", "--nosignature", "--nodigest", "--qf", qf, str(pkg)], capture_output=True, text=True, check=True
    )
    out: dict[str, list[str]] = {}
    for chunk in res.stdout.split("\x01")[1:]:
        tag, _, values = chunk.partition("\x02")
        out[tag] = values.split("\x03")[:-1]
    assert sorted(out) == sorted(tags), res.stderr
    return out


def rpm_untrans() -> bool:
    return "PREUNTRANS" in rpm_tags()


def build_test_rpms(top: Path) -> dict[str, Path]:
    """The test spec built with the optional header tags defined; name -> package."""
    defines = {
        "_topdir": str(top),
        "disttag": "hugify.t1",
        "disturl": "https://dist.example.org/hugify/t1",
        "modularitylabel": "hugify:test:1:c0ffee",
    }
    if rpm_untrans():
        defines["with_untrans"] = "1"
    cmd = ["rpmbuild", "-bb"]
    for k, v in defines.items():
        cmd += ["--define", f"{k} {v}"]
    res = subprocess.run([*cmd, str(SPEC)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    pkgs = {}
    for p in (top / "RPMS").rglob("*.rpm"):
        name = subprocess.run(
            ["rpm", "-qp", "--qf", "%{NAME}", str(p)], capture_output=True, text=True, check=True
        ).stdout
        pkgs[name] = p
    return pkgs


def subject(dep: str) -> str:
    for pattern in (r"config\((.+)\)", r"(.+)\([a-z0-9_-]+\)"):
        m = re.fullmatch(pattern, dep)
        if m:
            return m.group(1)
    return dep


def rows(h: dict[str, list[str]], stem: str) -> list[tuple[str, int, str]]:
    names, flags, versions = (h[f"{stem}{x}"] for x in ("NAME", "FLAGS", "VERSION"))
    return list(zip(names, map(int, flags), versions, strict=True))


FOLLOWS_HEADING = "`follows` writes the new version"


def follows(doc: Path, symbols: dict[str, str]) -> dict[str, str]:
    """The doc's table of what `follows` writes, each row's forms spelled out with
    `symbols` (the table's letters and their values for one repacked package): the
    original version, written each way the table lists, -> what it becomes."""

    def spelled(form: str) -> str:
        letters = "|".join(map(re.escape, sorted(symbols, key=len, reverse=True)))
        return re.sub(letters, lambda m: symbols[m.group(0)], form.strip("`"))

    return {spelled(written): spelled(becomes) for written, becomes in documented(doc, FOLLOWS_HEADING).items()}


def followed(version: str, rule: str | None, forms: dict[str, str]) -> str:
    """A relation's version as the documented tables say it becomes: by its operator's
    rule, `follows` per the forms of the package it names (`follows`), every other
    rule leaves it."""
    return forms.get(version, version) if rule == "follows" else version


def rpm_forms(old_new: tuple[str, str] | None) -> dict[str, str]:
    """docs/packaging-rpm.md's `follows` forms for a package repacked together, from
    its original and new E:V-R."""
    if old_new is None:
        return {}
    parts = [re.fullmatch(r"(?:(\d+):)?([^-]+)-([^-]+)", v) for v in old_new]
    assert parts[0] and parts[1], old_new
    (epoch, version, release), (new_epoch, new_version, new_release) = parts[0].groups(), parts[1].groups()
    assert (new_epoch, new_version) == (epoch, version), old_new  # repack changes the release only
    symbols = {"E:": f"{epoch}:" if epoch else "", "V": version, "R": release, "R'": new_release}
    return follows(DOCS / "packaging-rpm.md", symbols)


def expected_rows(
    before: list[tuple[str, int, str]], together: dict[str, tuple[str, str]]
) -> list[tuple[str, int, str]]:
    """The original's relationship rows as the docs say they become."""
    operators = documented(DOCS / "packaging-rpm.md", RPM_VERSIONS_HEADING)
    out = []
    for name, flags, version in before:
        op = OPERATORS.get(flags & (LESS | GREATER | EQUAL))
        rule = operators[op] if op else None
        out.append((name, flags & ~AUTO_MARKS, followed(version, rule, rpm_forms(together.get(subject(name))))))
    return sorted(out)


def per_file(h: dict[str, list[str]], tags: list[str]) -> dict[str, dict[str, str]]:
    """path -> {tag: value} of the per-file tags that have one value per file."""
    names = h["FILENAMES"]
    files: dict[str, dict[str, str]] = {n: {} for n in names}
    for tag in tags:
        values = h[tag]
        if len(values) == len(names):
            for n, v in zip(names, values, strict=True):
                files[n][tag] = v
    return files


def rpm_oracle(orig: Path, new: Path, suffix: str, together: dict[str, tuple[str, str]], tmp: Path) -> None:
    """Fails on any difference between the two headers the docs do not allow."""
    tags = rpm_tags()
    rules = documented(DOCS / "packaging-rpm.md", RPM_RULES_HEADING)
    a, b = rpm_header(orig, tags), rpm_header(new, tags)
    name = a["NAME"][0]
    unexplained = [t for t in tags if a[t] != b[t] and t not in rules]
    assert not unexplained, {t: (a[t][:8], b[t][:8]) for t in unexplained}
    release, version = a["RELEASE"][0], a["VERSION"][0]
    for tag in (t for t, r in rules.items() if r == "suffix"):
        want = [
            v + suffix if tag in ("RELEASE", "R") else v.replace(f"{version}-{release}", f"{version}-{release}{suffix}")
            for v in a[tag]
        ]
        assert b[tag] == want, tag
    # Relationships, kind by kind (the derived tags PROVIDES, REQUIRENEVRS… follow).
    for stem in ("REQUIRE", "CONFLICT", "OBSOLETE", "RECOMMEND", "SUGGEST", "SUPPLEMENT", "ENHANCE", "ORDER"):
        have = sorted(rows(b, stem))
        if stem == "REQUIRE":  # rpmlib() features follow what the rebuild uses
            have = [r for r in have if not r[0].startswith("rpmlib(")]
        want = [r for r in expected_rows(rows(a, stem), together) if not r[0].startswith("rpmlib(")]
        assert have == want, stem
    note = {r for r in rows(b, "PROVIDE") if r[0].startswith("hugify-repack(")}
    hugify_version = hugify("--version").stdout.split()[1]
    evr = (f"{a['EPOCH'][0]}:" if a["EPOCH"] else "") + f"{version}-{release}"
    assert note == {("hugify-repack(original-version)", EQUAL, evr), ("hugify-repack(hugify)", EQUAL, hugify_version)}
    assert sorted(set(rows(b, "PROVIDE")) - note) == expected_rows(rows(a, "PROVIDE"), together)
    # Files, path by path.
    file_tags = [t for t, r in rules.items() if r in ("by-path", "file-content", "auto-dependencies")]
    fa, fb = per_file(a, file_tags), per_file(b, file_tags)
    added = {p for p in fb if p not in fa and not p.startswith(BUILD_ID_DIR)}
    manifest = f"/usr/lib/hugify/manifest.d/{name}.list"
    assert added <= {"/usr/lib/hugify", "/usr/lib/hugify/manifest.d", manifest}, added
    assert not {p for p in fa if p not in fb and not p.startswith(BUILD_ID_DIR)}
    if manifest in added:
        assert fb["/usr/lib/hugify/manifest.d"]["FILEMODES"] == str(0o40755)  # an owned directory
    root = tmp / "payload"
    root.mkdir(parents=True)
    subprocess.run(f"rpm2cpio {new} | cpio -idm --quiet", shell=True, cwd=root, check=True)
    for path, before in fa.items():
        if path.startswith(BUILD_ID_DIR):
            continue
        after = fb[path]
        changed = {t for t in before if before[t] != after.get(t)}
        allowed = {t for t in changed if rules.get(t) == "auto-dependencies" and after.get(t, "") in ("", "0")}
        if int(before["FILEFLAGS"]) & GHOST and before["FILECLASS"] == "":
            # Not in the original payload: given to rpmbuild as an empty file (the docs).
            allowed |= {t for t in changed if (t, after.get(t)) in (("FILECLASS", "empty"), ("FILEDEVICES", "1"))}
        if (root / path.lstrip("/")).is_file() and transformed(root / path.lstrip("/")):
            allowed |= {t for t in changed if rules.get(t) == "file-content"}
        assert changed == allowed, (path, {t: (before[t], after.get(t)) for t in changed - allowed})
    # The build-id links name the new build-ids of the transformed files.
    links = {p for p in fb if p.startswith(BUILD_ID_DIR) and fb[p]["FILELINKTOS"]}
    for link in links:
        target = (Path(link).parent / fb[link]["FILELINKTOS"]).resolve()
        assert Path(link).parent.name + Path(link).name == build_id(root / str(target).lstrip("/")), link
    source = a["SOURCERPM"][0]
    if source.startswith(f"{name}-{version}-{release}."):
        assert b["SOURCERPM"] == [source.replace(f"-{release}.", f"-{release}{suffix}.")]
    else:
        assert b["SOURCERPM"] == [source]


@pytest.fixture(scope="module")
def test_rpms(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_test_rpms(tmp_path_factory.mktemp("rpmbuild"))


def rpm_of(out: Path, name: str) -> Path:
    (pkg,) = (p for p in out.iterdir() if p.name.startswith(f"{name}-2.1-"))
    return pkg


@slow
def test_rpm_repacked_alone_keeps_every_tag_and_the_other_packages_version(
    test_rpms: dict[str, Path], policy: Path, tmp_path: Path
) -> None:
    main, tools = test_rpms["hugify-repack-test"], test_rpms["hugify-repack-test-tools"]
    header = rpm_header(main, rpm_tags())
    # What the oracle is run on: the spec made them.
    assert header["POSTTRANSFLAGS"] == ["1"]  # -e
    assert header["TRIGGERSCRIPTFLAGS"] == ["0", "2"] and header["ORDERNAME"] == ["coreutils"]
    assert header["DISTTAG"] == ["hugify.t1"] and header["MODULARITYLABEL"] and header["BUGURL"]
    if rpm_untrans():
        assert header["PREUNTRANS"] and header["POSTUNTRANSFLAGS"] == ["1"]
    out = tmp_path / "out"
    hugify("repack", main, "--policy", policy, "-o", out)
    new = rpm_of(out, "hugify-repack-test")
    assert new.name == "hugify-repack-test-2.1-3.hugify1.x86_64.rpm"
    # The -tools package was not repacked: the exact requirement keeps its version.
    requires = subprocess.run(["rpm", "-qp", "--requires", str(new)], capture_output=True, text=True, check=True).stdout
    assert "hugify-repack-test-tools = 1:2.1-3\n" in requires, requires
    rpm_oracle(main, new, ".hugify1", {"hugify-repack-test": ("1:2.1-3", "1:2.1-3.hugify1")}, tmp_path)
    out_tools = tmp_path / "out-tools"
    hugify("repack", tools, "--policy", policy, "-o", out_tools)
    new_tools = rpm_of(out_tools, "hugify-repack-test-tools")
    rpm_oracle(
        tools, new_tools, ".hugify1", {"hugify-repack-test-tools": ("1:2.1-3", "1:2.1-3.hugify1")}, tmp_path / "t"
    )


@slow
def test_rpm_repacked_together_follow_each_other(test_rpms: dict[str, Path], policy: Path, tmp_path: Path) -> None:
    # rpm >= 4.20 makes no -debuginfo where the platform does not enable debug packages (Debian).
    names = [
        n for n in ("hugify-repack-test", "hugify-repack-test-tools", "hugify-repack-test-debuginfo") if n in test_rpms
    ]
    out = tmp_path / "out"
    hugify("repack", *(test_rpms[n] for n in names), "--policy", policy, "-o", out)
    again = tmp_path / "again"
    hugify("repack", *(test_rpms[n] for n in names), "--policy", policy, "-o", again)
    assert {p.name: p.read_bytes() for p in again.iterdir()} == {p.name: p.read_bytes() for p in out.iterdir()}
    together = {n: ("1:2.1-3", "1:2.1-3.hugify1") for n in names}
    for n in names[:2]:
        new = rpm_of(out, n)
        requires = subprocess.run(
            ["rpm", "-qp", "--requires", str(new)], capture_output=True, text=True, check=True
        ).stdout
        other = names[1 - names.index(n)]
        assert f"{other} = 1:2.1-3.hugify1\n" in requires, requires
        work = tmp_path / n
        work.mkdir()
        rpm_oracle(test_rpms[n], new, ".hugify1", together, work)


@slow
def test_rpm_output_is_named_by_the_systems_build_name_fmt(
    test_rpms: dict[str, Path], policy: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".rpmmacros").write_text("%_build_name_fmt %%{NAME}/%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm\n")
    out = tmp_path / "out"
    env = {**os.environ, "HOME": str(home)}
    res = hugify("repack", test_rpms["hugify-repack-test-tools"], "--policy", policy, "-o", out, env=env)
    (written,) = out.iterdir()
    assert written.name == "2.1-3.hugify1.x86_64.rpm", res.stdout
    assert f"hugify: wrote {written}" in res.stdout


@slow
def test_rpm_suffix_that_sorts_lower_is_refused(test_rpms: dict[str, Path], policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = hugify(
        "repack", test_rpms["hugify-repack-test"], "--policy", policy, "--suffix", "~x1", "-o", out, check=False
    )
    assert res.returncode == 3 and "(suffix-not-higher)" in res.stderr and len(res.stderr.splitlines()) == 1, res
    assert list(out.iterdir()) == []
    # rpm's own rule agrees: 3~x1 sorts before 3.
    script = '%{lua: print(rpm.vercmp("3~x1", "3"))}'
    vercmp = subprocess.run(["rpm", "--eval", script], capture_output=True, text=True, check=True)
    assert vercmp.stdout.strip() == "-1"
    assert "suffix-not-higher" in hugify("explain", "suffix-not-higher").stdout


def with_tag(pkg: Path, dest: Path, tag: int = FILESIGNATURES) -> None:
    """A copy of the package whose header carries a string array tag with one value
    per file: per-file IMA signatures (FILESIGNATURES) as `rpmsign --signfiles` leaves
    them, by default. rpm here is built without IMA support (rpmsign has no
    --signfiles), so the tag is written into the header's immutable region directly:
    placeholder values before the region's trailer, whose offset and count follow.
    rpm reads the result (checked by the callers); only its digests no longer match."""
    data = pkg.read_bytes()

    def header_end(at: int) -> tuple[int, int, int]:
        assert data[at : at + 3] == b"\x8e\xad\xe8"
        count, size = struct.unpack(">II", data[at + 8 : at + 16])
        return count, size, at + 16 + 16 * count + size

    _, _, end = header_end(96)  # the signature header, after the lead
    at = end + (-end % 8)
    count, size, end = header_end(at)
    index = [list(struct.unpack(">iiii", data[at + 16 + 16 * i : at + 32 + 16 * i])) for i in range(count)]
    store = at + 16 + 16 * count
    trailer = next(e for e in index if e[0] == 63)[2]  # HEADERIMMUTABLE
    files = subprocess.run(
        ["rpm", "-qp", "--qf", "[%{FILENAMES}\n]", str(pkg)], capture_output=True, text=True, check=True
    )
    signatures = b"ab\0" * len(files.stdout.splitlines())
    for e in index:
        if e[2] >= trailer:
            e[2] += len(signatures)
    index.append([tag, 8, trailer, len(files.stdout.splitlines())])  # RPM_STRING_ARRAY_TYPE
    region = struct.pack(">iiii", 63, 7, -(count + 1) * 16, 16)
    body = data[store : store + trailer] + signatures + region + data[store + trailer + 16 : store + size]
    dest.write_bytes(
        data[: at + 8]
        + struct.pack(">II", count + 1, len(body))
        + b"".join(struct.pack(">iiii", *e) for e in index)
        + body
        + data[end:]
    )


@slow
def test_rpm_with_file_signatures_is_refused_by_tag_name(
    test_rpms: dict[str, Path], policy: Path, tmp_path: Path
) -> None:
    signed = tmp_path / "signed.rpm"
    with_tag(test_rpms["hugify-repack-test-tools"], signed)
    query = ["rpm", "-qp", "--nosignature", "--nodigest", "--qf", "[%{FILESIGNATURES}\n]", str(signed)]
    assert set(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()) == {"ab"}
    before = hashlib.sha256(signed.read_bytes()).hexdigest()
    out = tmp_path / "out"
    res = hugify("repack", signed, "--policy", policy, "-o", out, check=False)
    assert res.returncode == 4 and len(res.stderr.splitlines()) == 1, res
    assert "the header has Filesignatures (per-file IMA signatures)" in res.stderr, res.stderr
    assert "(unsupported-metadata)" in res.stderr and list(out.iterdir()) == []
    assert hashlib.sha256(signed.read_bytes()).hexdigest() == before
    # A tag this rpm has no name for (a newer rpm's) is refused too, not dropped.
    newer = tmp_path / "newer.rpm"
    with_tag(test_rpms["hugify-repack-test-tools"], newer, 20000)
    res = hugify("repack", newer, "--policy", policy, "-o", out, check=False)
    assert res.returncode == 4 and "a tag this rpm does not know" in res.stderr, res.stderr
    assert len(res.stderr.splitlines()) == 1 and list(out.iterdir()) == []


# --- Debian ---------------------------------------------------------------------------

DEB_RULES_HEADING = "#### What repack changes in a .deb"
ARCHIVE = ["libzstd1", "cron", "dash", "liblz4-1", "liblz4-1:arm64"]
MIRROR = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def archive_debs(packages: list[str]) -> list[Path]:
    """The running system's suite's current .debs of `packages` (NAME:ARCH for
    another architecture), fetched with apt-get download through a private apt
    state (its own sources list, architectures amd64 and arm64, lists and cache) and
    kept under the test cache by file name, the archive's newer versions replacing
    older ones."""
    release = dict(line.split("=", 1) for line in Path("/etc/os-release").read_text().splitlines() if "=" in line)
    suite = release["VERSION_CODENAME"].strip('"')
    group = cache_root() / f"repack-oracle-{suite}"
    state = group / "apt"
    with locked(group / "apt.lock"):
        for d in ("lists/partial", "cache/archives/partial", "sources.list.d"):
            (state / d).mkdir(parents=True, exist_ok=True)
        (state / "sources.list").write_text(f"deb [signed-by={KEYRING}] {MIRROR} {suite} main\n")
        opts = [
            f"-oDir::Etc::SourceList={state / 'sources.list'}",
            f"-oDir::Etc::SourceParts={state / 'sources.list.d'}",
            f"-oDir::State::Lists={state / 'lists'}",
            f"-oDir::Cache={state / 'cache'}",
            "-oAPT::Architecture=amd64",
            "-oAPT::Architectures::=amd64",
            "-oAPT::Architectures::=arm64",
        ]

        def names() -> list[str] | None:
            res = subprocess.run(
                ["apt-get", *opts, "download", "--print-uris", *packages], capture_output=True, text=True, check=False
            )
            return sorted(line.split()[1] for line in res.stdout.splitlines()) if res.returncode == 0 else None

        debs = names()
        # One directory per package list, so that lists do not evict each other's files.
        here = group / hashlib.sha256(" ".join(sorted(packages)).encode()).hexdigest()[:16]
        here.mkdir(exist_ok=True)
        if debs is None or not all((here / d).exists() for d in debs):
            subprocess.run(["apt-get", "-q", *opts, "update"], capture_output=True, text=True, check=True)
            debs = names()
            assert debs is not None, packages
            res = subprocess.run(
                ["apt-get", *opts, "download", *packages], cwd=here, capture_output=True, text=True, check=False
            )
            assert res.returncode == 0, res.stderr
        for stale in here.glob("*.deb"):
            if stale.name not in debs:
                stale.unlink()
    return [here / d for d in debs]


@pytest.fixture(scope="module")
def archive() -> list[Path]:
    return archive_debs(ARCHIVE)


def deb_fields(deb: Path) -> dict[str, str]:
    text = subprocess.run(["dpkg-deb", "-f", str(deb)], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^(\S+): ?(.*(?:\n .*)*)", text, re.M))


def deb_info_members(deb: Path) -> list[str]:
    """The control members `dpkg-deb -I` lists: name, type, and for scripts their
    interpreter (sizes follow the contents, compared below)."""
    text = subprocess.run(["dpkg-deb", "-I", str(deb)], capture_output=True, text=True, check=True).stdout
    return sorted(
        re.sub(r"^\s*\d+ bytes,\s+\d+ lines\s+", "", ln).strip() for ln in text.splitlines() if " bytes," in ln
    )


def deb_members(deb: Path) -> dict[str, tuple[str, str, str, str]]:
    """path -> (mode, owner, size, link target) of every data member (`dpkg-deb -c`)."""
    text = subprocess.run(["dpkg-deb", "-c", str(deb)], capture_output=True, text=True, check=True).stdout
    out = {}
    for line in text.splitlines():
        mode, owner, size, _date, _time, name = line.split(None, 5)
        path, _, target = name.partition(" link to " if mode.startswith("h") else " -> ")
        out[path] = (mode, owner, size, target)
    return out


def ar_names(deb: Path) -> list[str]:
    return subprocess.run(["ar", "t", str(deb)], capture_output=True, text=True, check=True).stdout.split()


DEB_VERSIONS_HEADING = "#### Versions in relationships"


def deb_relations(value: str, together: dict[str, tuple[str, str]]) -> str:
    """A relationship field as the documented table of operators says it becomes."""
    operators = documented(DOCS / "packaging-debian.md", DEB_VERSIONS_HEADING)

    def one(m: re.Match[str]) -> str:
        name, op, version = m.group("name"), m.group("op"), m.group("version")
        old_new = together.get(name.split(":")[0])
        forms = follows(DOCS / "packaging-debian.md", {"V": old_new[0], "V'": old_new[1]}) if old_new else {}
        after = followed(version, operators[op], forms)
        start, end = m.start("version") - m.start(), m.end("version") - m.start()
        return m.group(0)[:start] + after + m.group(0)[end:]

    name = r"(?P<name>[a-z0-9][a-z0-9+.\-]*(?::[a-z0-9-]+)?)"
    return re.sub(name + r"\s*\(\s*(?P<op>>=|<=|>>|<<|=)\s*(?P<version>[^)\s]+)\s*\)", one, value)


def deb_oracle(orig: Path, new: Path, suffix: str, together: dict[str, tuple[str, str]], tmp: Path) -> None:
    rules = documented(DOCS / "packaging-debian.md", DEB_RULES_HEADING)
    fa, fb = deb_fields(orig), deb_fields(new)
    name, version, arch = fa["Package"], fa["Version"], fa["Architecture"]
    unexplained = {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k) and k not in rules}
    assert not unexplained, {k: (fa.get(k), fb.get(k)) for k in unexplained}
    assert [k for k in fb if k in fa] == list(fa)  # the fields keep their order
    for field, rule in rules.items():
        before, after = fa.get(field), fb.get(field)
        if rule == "suffix":
            assert after == f"{version}{suffix}", field
        elif rule == "source-version":
            assert after == f"{(before or name).split()[0]} ({version})", field
        elif rule == "added":
            hugify_version = hugify("--version").stdout.split()[1]
            assert before is None and after == f"original-version={version}; hugify={hugify_version}", field
        elif rule == "relations" and before is not None:
            assert after == deb_relations(before, together), field
        elif rule == "build-ids" and before is not None:
            assert len(after.split()) == len(before.split()), field
    # Members of the ar archive, and of control.tar.
    assert ar_names(new) == ar_names(orig)
    control = {}
    for side, deb in (("a", orig), ("b", new)):
        d = tmp / f"control-{side}"
        subprocess.run(["dpkg-deb", "--control", str(deb), str(d)], check=True)
        control[side] = {p.name: p.read_bytes() for p in d.iterdir()}
    assert control["a"].keys() == control["b"].keys()
    for member in control["a"]:
        if member not in ("control", "md5sums"):  # the fields above; the files below
            assert control["a"][member] == control["b"][member], member
    assert deb_info_members(new) == deb_info_members(orig)
    # Data members: mode, owner and link target of each kept; size only of transformed files.
    ma, mb = deb_members(orig), deb_members(new)
    root = tmp / "data"
    subprocess.run(["dpkg-deb", "-x", str(new), str(root)], check=True)
    listing = f"{name}:{arch}.list" if fa.get("Multi-Arch") == "same" else f"{name}.list"
    manifest = f"./usr/lib/hugify/manifest.d/{listing}"
    new_paths = set(mb) - set(ma)
    debug_renamed = {p for p in new_paths if p.startswith("./usr/lib/debug/.build-id/")}
    assert new_paths - debug_renamed <= {"./usr/lib/", "./usr/lib/hugify/", "./usr/lib/hugify/manifest.d/", manifest}
    gone = set(ma) - set(mb)
    assert all(p.startswith("./usr/lib/debug/.build-id/") for p in gone) and len(gone) <= len(debug_renamed), gone
    for path, (mode, owner, size, target) in ma.items():
        if path in gone:
            continue
        m2, o2, s2, t2 = mb[path]
        assert (m2, o2, t2) == (mode, owner, target), path
        if s2 != size:
            assert transformed(root / path), path
    # md5sums: a line for every regular file but the conffiles, each right.
    conffiles = set(control["a"].get("conffiles", b"").decode().split())
    md5 = dict(ln.split("  ", 1)[::-1] for ln in control["b"]["md5sums"].decode().splitlines())
    files = {p[2:] for p, m in mb.items() if m[0][0] in "-h"}  # regular files, hard links too
    assert set(md5) == {f for f in files if "/" + f not in conffiles}
    for f, digest in md5.items():
        assert hashlib.md5((root / f).read_bytes()).hexdigest() == digest, f
    before_md5 = dict(ln.split("  ", 1)[::-1] for ln in control["a"].get("md5sums", b"").decode().splitlines())
    for f, digest in before_md5.items():
        if f in md5 and md5[f] != digest:
            assert transformed(root / f), f


@slow
def test_archive_debs_keep_every_field_and_member(archive: list[Path], policy: Path, tmp_path: Path) -> None:
    kinds = {deb.name: deb_fields(deb) for deb in archive}
    assert any(f.get("Essential") == "yes" for f in kinds.values())
    assert sum(f.get("Multi-Arch") == "same" and f["Package"] == "liblz4-1" for f in kinds.values()) == 2
    out = tmp_path / "out"
    res = hugify("repack", *archive, "--policy", policy, "-o", out)
    new = {(deb_fields(p)["Package"], deb_fields(p)["Architecture"]): p for p in out.iterdir()}
    assert len(new) == len(archive), res.stdout
    for arch in ("amd64", "arm64"):  # the summary tells the two apart
        assert re.search(rf"^liblz4-1:{arch}\s+1\s+0\s+0\s", res.stdout, re.M), res.stdout
    together = {f["Package"]: (f["Version"], f["Version"] + "+hugify1") for f in kinds.values()}
    for deb in archive:
        f = kinds[deb.name]
        work = tmp_path / deb.name
        work.mkdir()
        deb_oracle(deb, new[(f["Package"], f["Architecture"])], "+hugify1", together, work)
    # Both architectures of the Multi-Arch: same library install side by side.
    root = tmp_path / "root"
    for d in ("var/lib/dpkg/updates", "var/lib/dpkg/info"):
        (root / d).mkdir(parents=True)
    (root / "var/lib/dpkg/status").touch()
    (root / "var/lib/dpkg/arch").write_text("amd64\narm64\n")
    lz4 = [new[("liblz4-1", "amd64")], new[("liblz4-1", "arm64")]]
    cmd = ["dpkg", "--root", str(root), "--force-depends", "--force-not-root", "--force-script-chrootless", "-i"]
    res = subprocess.run([*cmd, *lz4], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@slow
def test_dbgsym_keeps_every_field_and_member(policy: Path, tmp_path: Path) -> None:
    plain = build_variant("plain").ok()
    names = ["hugify-deb-test", "hugify-deb-test-dbgsym", "libhugdebtest1", "libhugdebtest1-dbgsym"]
    debs = [plain.deb(n) for n in names]
    out = tmp_path / "out"
    hugify("repack", *debs, "-o", out)
    new = {deb_fields(p)["Package"]: p for p in out.iterdir()}
    together = {
        n: (deb_fields(d)["Version"], deb_fields(d)["Version"] + "+hugify1") for n, d in zip(names, debs, strict=True)
    }
    for n, deb in zip(names, debs, strict=True):
        work = tmp_path / n
        work.mkdir()
        deb_oracle(deb, new[n], "+hugify1", together, work)


@slow
def test_deb_suffix_that_sorts_lower_is_refused(archive: list[Path], policy: Path, tmp_path: Path) -> None:
    dash = next(d for d in archive if d.name.startswith("dash_"))
    out = tmp_path / "out"
    res = hugify("repack", dash, "--policy", policy, "--suffix", "~x1", "-o", out, check=False)
    assert res.returncode == 3 and "(suffix-not-higher)" in res.stderr and len(res.stderr.splitlines()) == 1, res
    assert list(out.iterdir()) == []
    lower = subprocess.run(["dpkg", "--compare-versions", "0.5.12-2~x1", "lt", "0.5.12-2"], check=False)
    assert lower.returncode == 0
