"""The .rpm side of ``hugify repack`` (hugify.repack): the approach of rpmrebuild.

The header is read with `rpm -qp --xml`, the payload unpacked with rpm2cpio and
cpio, and a spec is written that says again what the header says: name, epoch,
version, the release with the suffix, the preamble's tags, relationships (with
their scriptlet qualifiers), scriptlets and triggers with their interpreters and
flags, the changelog, and every file with its mode, owner, group, capabilities,
verify flags and %config/%doc/%ghost flags. rpmbuild packs the unpacked tree as
it is (no %install step, no brp scripts, no dependency generator). What rpmbuild
regenerates itself is left out of the spec: rpmlib() and interpreter
requirements and the /usr/lib/.build-id links, which it makes for the new
build-ids.

Every tag of the header is either carried (CARRIED) or regenerated
(REGENERATED); a package with any other tag is refused before anything is
written, naming the tag (check_carried). docs/packaging-rpm.md lists what
differs between the original and the repacked header, which
tests/test_repack_oracle.py checks tag by tag.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from hugify.repack_package import Context, Package, RepackError, tool

# rpmds sense flags (rpm's rpmds.h)
LESS, GREATER, EQUAL = 2, 4, 8
POSTTRANS, PRETRANS, INTERP = 1 << 5, 1 << 7, 1 << 8
SCRIPT_PRE, SCRIPT_POST, SCRIPT_PREUN, SCRIPT_POSTUN, SCRIPT_VERIFY = (1 << n for n in range(9, 14))
FIND_REQUIRES, FIND_PROVIDES = 1 << 14, 1 << 15
TRIGGERIN, TRIGGERUN, TRIGGERPOSTUN, TRIGGERPREIN = 1 << 16, 1 << 17, 1 << 18, 1 << 25
PREUNTRANS, POSTUNTRANS = 1 << 20, 1 << 21
RPMLIB, CONFIG, META = 1 << 24, 1 << 28, 1 << 29
QUALIFIERS = (
    (SCRIPT_PRE, "pre"),
    (SCRIPT_POST, "post"),
    (SCRIPT_PREUN, "preun"),
    (SCRIPT_POSTUN, "postun"),
    (PRETRANS, "pretrans"),
    (POSTTRANS, "posttrans"),
    (PREUNTRANS, "preuntrans"),
    (POSTUNTRANS, "postuntrans"),
    (SCRIPT_VERIFY, "verify"),
    (META, "meta"),
)
TRIGGERS = (
    (TRIGGERPREIN, "triggerprein"),
    (TRIGGERIN, "triggerin"),
    (TRIGGERUN, "triggerun"),
    (TRIGGERPOSTUN, "triggerpostun"),
)
#: The bits of a relationship a spec line says again, and those of rpmbuild's
#: dependency generator (FIND_REQUIRES/FIND_PROVIDES on what it found, CONFIG on
#: config() relations), which the rebuilt spec states by hand instead
#: (docs/packaging-rpm.md, what repack changes). Any other bit (the legacy PREREQ,
#: MISSINGOK, KEYRING…) no spec line sets: the package is refused.
CARRIED_SENSE = LESS | GREATER | EQUAL | FIND_REQUIRES | FIND_PROVIDES | CONFIG
CARRIED_SENSE |= sum(bit for bit, _ in QUALIFIERS) | sum(bit for bit, _ in TRIGGERS)
# rpmfiles.h file flags
F_CONFIG, F_DOC, F_MISSINGOK, F_NOREPLACE, F_GHOST, F_LICENSE, F_README, F_ARTIFACT = (
    1,
    2,
    8,
    16,
    64,
    128,
    256,
    4096,
)
VERIFY_BITS = ("md5", "size", "link", "user", "group", "mtime", "mode", "rdev", "caps")
#: Spec keyword -> the stem of its header tags (Requirename, Requireflags, Requireversion).
DEPENDENCIES = {
    "Requires": "Require",
    "Provides": "Provide",
    "Conflicts": "Conflict",
    "Obsoletes": "Obsolete",
    "Recommends": "Recommend",
    "Suggests": "Suggest",
    "Supplements": "Supplement",
    "Enhances": "Enhance",
    "OrderWithRequires": "Order",
}
SCRIPTS = (
    ("Pretrans", "pretrans"),
    ("Prein", "pre"),
    ("Postin", "post"),
    ("Preun", "preun"),
    ("Postun", "postun"),
    ("Posttrans", "posttrans"),
    ("Preuntrans", "preuntrans"),
    ("Postuntrans", "postuntrans"),
    ("Verifyscript", "verifyscript"),
)
#: rpmscript.h flags of a scriptlet and the spec option that sets each: -e expands
#: macros when the scriptlet runs, -q expands query formats.
SCRIPT_FLAGS = ((1, "-e"), (2, "-q"))
#: Preamble tags the spec says again, by their spec keyword (rpmbuild takes DistTag,
#: DistURL and ModularityLabel from macros, see Rpm.build).
PREAMBLE = {
    "Summary": "Summary",
    "License": "License",
    "Group": "Group",
    "Url": "URL",
    "Bugurl": "BugURL",
    "Vendor": "Vendor",
    "Packager": "Packager",
    "Distribution": "Distribution",
    "Vcs": "VCS",
    "Translationurl": "TranslationURL",
    "Upstreamreleases": "UpstreamReleases",
}
MACRO_TAGS = {"Disttag": "disttag", "Disturl": "disturl", "Modularitylabel": "modularitylabel"}
#: Every header tag the rebuild carries: said again in the spec, or given to
#: rpmbuild as a definition.
CARRIED = frozenset(
    {"Name", "Version", "Release", "Epoch", "Description", "Os", "Arch", "Buildhost", "Sourcerpm"}
    | set(PREAMBLE)
    | set(MACRO_TAGS)
    | {f"{stem}{x}" for stem in DEPENDENCIES.values() for x in ("name", "flags", "version")}
    | {f"{tag}{x}" for tag, _ in SCRIPTS for x in ("", "prog", "flags")}
    | {f"Trigger{x}" for x in ("scripts", "name", "version", "flags", "index", "scriptprog", "scriptflags")}
    | {"Changelogtime", "Changelogname", "Changelogtext"}
    | {"Basenames", "Dirnames", "Dirindexes", "Filemodes", "Fileusername", "Filegroupname", "Fileflags"}
    | {"Fileverifyflags", "Filecaps", "Filelangs", "Filelinktos", "Filerdevs", "Filemtimes"}
    | {"Payloadformat", "Payloadcompressor", "Payloadflags", "Headeri18ntable"}
)
#: Every header tag rpmbuild computes itself, from the files and the build: digests
#: and sizes (of transformed files they change), the build's time, its rpm and
#: its flags, file classes and colors, and the package's signatures (a repacked
#: package is unsigned; re-sign it with rpmsign).
REGENERATED = frozenset(
    {"Sigsize", "Sigmd5", "Sha1header", "Sha256header", "Rsaheader", "Dsaheader", "Siggpg", "Sigpgp", "Pubkeys"}
    | {"Longsigsize", "Longarchivesize", "Longsize", "Longfilesizes", "Openpgp", "Reservedspace"}
    | {"Buildtime", "Cookie", "Size", "Archivesize", "Rpmversion", "Optflags", "Platform", "Encoding"}
    | {"Filesizes", "Filedigests", "Filedigestalgo", "Filedevices", "Fileinodes", "Filecolors", "Fileclass"}
    | {"Classdict", "Filedependsx", "Filedependsn", "Dependsdict"}
    | {"Payloaddigest", "Payloaddigestalgo", "Payloaddigestalt", "Payloadsize", "Payloadsizealt"}
)
#: What some tags hold, for the line that refuses a package carrying them.
MEANING = {
    "Filesignatures": "per-file IMA signatures",
    "Filesignaturelength": "per-file IMA signatures",
    "Veritysignatures": "per-file fs-verity signatures",
    "Veritysignaturealgo": "per-file fs-verity signatures",
    "Filetriggername": "file triggers",
    "Transfiletriggername": "transaction file triggers",
    "Prefixes": "a relocatable package",
    "Policies": "SELinux policies",
}
#: What names the original version and hugify's (rpm has no free-form header field).
NOTE_PROVIDE = "hugify-repack"
COMPRESSORS = {"gzip": "gzdio", "xz": "xzdio", "zstd": "zstdio", "bzip2": "bzdio", "lzma": "lzdio"}


def read_header(src: Path) -> dict[str, list[Any]]:
    """Every tag of the package header: name -> list of values (ints or strings)."""
    try:
        xml = tool(["rpm", "-qp", "--nosignature", "--nodigest", "--xml", str(src)])
        doc = ET.fromstring(xml)
    except (RepackError, ET.ParseError) as e:
        raise RepackError("not-a-package", f"rpm cannot read its header: {getattr(e, 'detail', e)}") from None
    tags: dict[str, list[Any]] = {}
    for tag in doc:
        tags[str(tag.get("name"))] = [int(v.text or 0) if v.tag == "integer" else (v.text or "") for v in tag]
    return tags


def one(h: dict[str, list[Any]], name: str, default: Any = None) -> Any:
    values = h.get(name)
    return values[0] if values else default


def pct(text: str) -> str:
    """Text as a spec says it literally."""
    return text.replace("%", "%%")


def evr(h: dict[str, list[Any]], release: str | None = None) -> str:
    epoch = one(h, "Epoch")
    return f"{f'{epoch}:' if epoch is not None else ''}{one(h, 'Version')}-{release or one(h, 'Release')}"


def _sense(flags: int) -> str:
    return {LESS: "<", GREATER: ">", EQUAL: "=", LESS | EQUAL: "<=", GREATER | EQUAL: ">="}.get(
        flags & (LESS | GREATER | EQUAL), ""
    )


def dependency_lines(h: dict[str, list[Any]], name: str, versions: dict[str, tuple[str, str]]) -> list[str]:
    """The spec's relationship lines. What rpmbuild adds itself is left out. An
    exact (=) relation to a package repacked in the same run, at its old version,
    names its new one; any other relation stays as it is."""
    lines = []
    for kind, stem in DEPENDENCIES.items():
        names, flags, values = (h.get(f"{stem}{x}", []) for x in ("name", "flags", "version"))
        for dep, fl, ver in zip(names, flags, values, strict=False):
            if fl & (RPMLIB | INTERP):
                continue
            if kind == "Provides" and dep == name and ver == versions[name][0]:
                continue  # rpmbuild provides the package's name at its new version
            exact = fl & (LESS | GREATER | EQUAL) == EQUAL  # not >= or <= (docs/packaging-rpm.md)
            version = _followed(ver, versions.get(subject(dep))) if exact else ver
            quals = ",".join(q for bit, q in QUALIFIERS if fl & bit)
            op = _sense(fl)
            lines.append(f"{kind}{f'({quals})' if quals else ''}: {pct(dep)}{f' {op} {pct(version)}' if op else ''}")
    return lines


def subject(dep: str) -> str:
    """The package a relationship names: `foo` for foo, foo(x86-64) and config(foo)
    (the provides rpm makes of a package's name, architecture and %config files)."""
    inner = re.fullmatch(r"config\((.+)\)", dep)
    if inner:
        return inner.group(1)
    arch = re.fullmatch(r"(.+)\([a-z0-9_-]+\)", dep)
    return arch.group(1) if arch else dep


def _followed(version: str, old_new: tuple[str, str] | None) -> str:
    """An exact relation's version, moved to a repacked package's new one when it
    names its old one (with or without the epoch)."""
    if old_new is None:
        return version
    old, new = old_new
    if version == old:
        return new
    if version == old.split(":", 1)[-1]:
        return new.split(":", 1)[-1]
    return version


def _script_options(flags: int) -> str:
    return "".join(f" {opt}" for bit, opt in SCRIPT_FLAGS if flags & bit)


def script_sections(h: dict[str, list[Any]], name: str) -> list[str]:
    """The scriptlets and triggers of the package `name` (a subpackage of the spec)."""
    out = []
    for tag, section in SCRIPTS:
        body, interpreter = one(h, tag), h.get(f"{tag}prog")
        if body is None and not interpreter:
            continue
        head = f"%{section} -n {name}{_script_options(one(h, f'{tag}flags', 0))}"
        head += f" -p {' '.join(interpreter)}" if interpreter else ""
        out.append(head + "\n" + (pct(body) + "\n" if body else ""))
    # Triggers: one section per script index, naming every condition of that index.
    conditions: dict[int, list[str]] = {}
    kinds: dict[int, str] = {}
    for tname, fl, ver, idx in zip(
        h.get("Triggername", []),
        h.get("Triggerflags", []),
        h.get("Triggerversion", []),
        h.get("Triggerindex", []),
        strict=False,
    ):
        op = _sense(fl)
        conditions.setdefault(idx, []).append(f"{tname}{f' {op} {ver}' if op else ''}")
        kinds[idx] = next(k for bit, k in TRIGGERS if fl & bit)
    progs, bodies = h.get("Triggerscriptprog", []), h.get("Triggerscripts", [])
    script_flags = h.get("Triggerscriptflags", [])
    for idx in sorted(conditions):
        prog = progs[idx] if idx < len(progs) else "/bin/sh"
        body = bodies[idx] if idx < len(bodies) else ""
        opts = _script_options(script_flags[idx] if idx < len(script_flags) else 0)
        out.append(f"%{kinds[idx]} -n {name}{opts} -p {prog} -- {', '.join(conditions[idx])}\n{pct(body)}\n")
    return out


def changelog(h: dict[str, list[Any]]) -> str:
    entries = zip(h.get("Changelogtime", []), h.get("Changelogname", []), h.get("Changelogtext", []), strict=False)
    return "".join(
        f"* {time.strftime('%a %b %d %Y', time.gmtime(t))} {pct(n)}\n{pct(text)}\n\n" for t, n, text in entries
    )


def file_paths(h: dict[str, list[Any]]) -> list[str]:
    dirs = h.get("Dirnames", [])
    return [dirs[i] + b for b, i in zip(h.get("Basenames", []), h.get("Dirindexes", []), strict=True)]


def file_lines(h: dict[str, list[Any]], root: Path) -> list[str]:
    """The %files lines of every file of the header but rpmbuild's own artifacts."""
    lines = []
    columns = [h.get(t, []) for t in ("Filemodes", "Fileusername", "Filegroupname", "Fileflags", "Fileverifyflags")]
    caps, langs, mtimes = h.get("Filecaps", []), h.get("Filelangs", []), h.get("Filemtimes", [])
    for i, (path, mode, user, group, flags, verify) in enumerate(zip(file_paths(h), *columns, strict=True)):
        if flags & F_ARTIFACT:
            continue
        attrs = []
        kind = mode & 0o170000
        perm = "-" if kind == 0o120000 else f"{mode & 0o7777:04o}"
        attrs.append(f"%attr({perm},{user},{group})")
        if kind == 0o040000:
            attrs.append("%dir")
        if i < len(caps) and caps[i]:
            attrs.append(f"%caps({caps[i]})")
        if flags & F_CONFIG:
            opts = [o for bit, o in ((F_NOREPLACE, "noreplace"), (F_MISSINGOK, "missingok")) if flags & bit]
            attrs.append(f"%config({','.join(opts)})" if opts else "%config")
        elif flags & F_MISSINGOK:
            attrs.append("%config(missingok)")
        if flags & F_LICENSE:
            attrs.append("%license")
        elif flags & (F_DOC | F_README):
            attrs.append("%doc")
        if flags & F_GHOST:
            attrs.append("%ghost")
            ghost = root / path.lstrip("/")
            if not ghost.exists() and not ghost.is_symlink():
                # Absent, rpmbuild would date it by the clock: an empty file dated as
                # in the header keeps the output deterministic (docs/packaging-rpm.md).
                ghost.parent.mkdir(parents=True, exist_ok=True)
                ghost.touch()
                os.utime(ghost, (mtimes[i], mtimes[i]))
        if i < len(langs) and langs[i]:
            attrs.append(f"%lang({langs[i]})")
        if verify & 0xFFFFFFFF != 0xFFFFFFFF:
            nots = [b for n, b in enumerate(VERIFY_BITS) if not verify & (1 << n)]
            attrs.append(f"%verify(not {' '.join(nots)})")
        lines.append(f'{" ".join(attrs)} "{pct(path)}"')
    return lines


def check_carried(h: dict[str, list[Any]]) -> None:
    """RepackError naming the first thing of the header the rebuild would not
    carry: a tag neither said again nor regenerated, a relationship's or a
    scriptlet's flag no spec line sets, a translated header, a payload rpmbuild
    does not write."""

    def refuse(what: str) -> RepackError:
        return RepackError("unsupported-metadata", f"the header has {what}, which repack cannot carry")

    for tag in sorted(h):
        if tag == "(unknown)" or re.fullmatch(r"\[\d+\]", tag):  # how rpm < 4.20 and >= 4.20 name them
            raise refuse(f"a tag this rpm does not know{'' if tag == '(unknown)' else f' (number {tag[1:-1]})'}")
        if tag not in CARRIED and tag not in REGENERATED:
            raise refuse(f"{tag}{f' ({MEANING[tag]})' if tag in MEANING else ''}")
    for stem in [*DEPENDENCIES.values(), "Trigger"]:
        for dep, fl in zip(h.get(f"{stem}name", []), h.get(f"{stem}flags", []), strict=False):
            if fl & ~(CARRIED_SENSE | RPMLIB | INTERP):
                raise refuse(f"{stem}flags {fl:#x} on {dep}")
    known = sum(bit for bit, _ in SCRIPT_FLAGS)
    for tag in [f"{t}flags" for t, _ in SCRIPTS] + ["Triggerscriptflags"]:
        for fl in h.get(tag, []):
            if fl & ~known:
                raise refuse(f"{tag} {fl:#x}")
    if len(h.get("Headeri18ntable", ["C"])) > 1:
        raise refuse(f"Headeri18ntable {' '.join(h['Headeri18ntable'])} (translated summaries)")
    if one(h, "Payloadformat", "cpio") != "cpio":
        raise refuse(f"Payloadformat {one(h, 'Payloadformat')}")
    source = one(h, "Sourcerpm")
    if not source or not source.endswith(".src.rpm") or source.count("-") < 2:
        raise refuse(f"Sourcerpm {source or '(none: a source package)'}")


def source_nvr(h: dict[str, list[Any]]) -> tuple[str, str, str]:
    """Name, version and release of the source rpm the package was built from."""
    name, version, release = str(one(h, "Sourcerpm")).removesuffix(".src.rpm").rsplit("-", 2)
    return name, version, release


class Rpm:
    name = "rpm"
    default_suffix = ".hugify1"

    def unpack(self, src: Path, work: Path) -> Package:
        h = read_header(src)
        check_carried(h)
        root = work / "root"
        root.mkdir(parents=True)
        with subprocess.Popen(["rpm2cpio", str(src)], stdout=subprocess.PIPE, stderr=subprocess.PIPE) as rpm2cpio:
            cpio = subprocess.run(
                ["cpio", "-idm", "--quiet", "--no-absolute-filenames"],
                stdin=rpm2cpio.stdout,
                cwd=root,
                capture_output=True,
                text=True,
                check=False,
            )
            _, err = rpm2cpio.communicate()
        if rpm2cpio.returncode != 0 or cpio.returncode != 0:
            why = (err.decode(errors="replace") + cpio.stderr).strip().splitlines()
            raise RepackError("not-a-package", f"the payload does not unpack: {why[-1] if why else 'rpm2cpio failed'}")
        # cpio -m dates regular files only: symbolic links and directories get the header's too.
        for path, mtime in zip(file_paths(h), h.get("Filemtimes", []), strict=False):
            installed = root / path.lstrip("/")
            if installed.is_symlink() or installed.is_dir():
                os.utime(installed, (mtime, mtime), follow_symlinks=False)
        name = one(h, "Name")
        if any(p.startswith(f"{NOTE_PROVIDE}(") for p in h.get("Providename", [])):
            raise RepackError("already-repacked", f"{name} {evr(h)} is a repack (it provides {NOTE_PROVIDE}(…))")
        debug_of = name.removesuffix("-debuginfo") if name.endswith("-debuginfo") else None
        pkg = Package(src, name, evr(h), one(h, "Arch"), root, debug_of)
        pkg.extra = h
        return pkg

    def new_version(self, pkg: Package, suffix: str) -> str:
        return evr(pkg.extra, one(pkg.extra, "Release") + suffix)

    def sorts_above(self, old: str, new: str) -> bool:
        """rpm's own comparison (rpm.vercmp, rpmvercmp of each part)."""
        script = f"%{{lua: print(rpm.vercmp({new!r}, {old!r}))}}"
        return tool(["rpm", "--eval", script]).strip() == "1"

    def build(self, pkg: Package, ctx: Context, outdir: Path) -> Path:
        h: dict[str, list[Any]] = pkg.extra
        release = one(h, "Release") + ctx.suffix
        # rpmbuild makes the build-id links of the new build-ids itself.
        for path, flags in zip(file_paths(h), h.get("Fileflags", []), strict=True):
            p = pkg.root / path.lstrip("/")
            if flags & F_ARTIFACT and (p.is_symlink() or p.is_file()):
                p.unlink()
        for path, flags in sorted(zip(file_paths(h), h.get("Fileflags", []), strict=True), reverse=True):
            p = pkg.root / path.lstrip("/")
            if flags & F_ARTIFACT and p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        spec = self._spec(pkg, release, ctx)
        top = pkg.root.parent / "rpmbuild"
        (top / "SPECS").mkdir(parents=True, exist_ok=True)
        spec_file = top / "SPECS" / f"{pkg.name}.spec"
        spec_file.write_text(spec, encoding="utf-8")
        outdir.mkdir(exist_ok=True)
        compressor = COMPRESSORS.get(one(h, "Payloadcompressor", "gzip"), "gzdio")
        level = one(h, "Payloadflags", "9") or "9"
        defines = {
            "_topdir": str(top),
            "_rpmdir": str(outdir),
            "__spec_install_pre": "%{___build_pre}",
            "__spec_install_post": "%{nil}",
            "__os_install_post": "%{nil}",
            "__spec_clean_body": "%{nil}",
            "debug_package": "%{nil}",
            "_binary_payload": f"w{level}.{compressor}",
            "_buildhost": one(h, "Buildhost", "localhost"),
            # The flags the files were compiled with, and the platform they were built for.
            "optflags": pct(one(h, "Optflags", "")) or "%{nil}",
            "_target_platform": one(h, "Platform", "%{_target_cpu}-%{_vendor}-%{_target_os}"),
            "use_source_date_epoch_as_buildtime": "1",
            # The /usr/lib/.build-id links rpmbuild makes would be dated by the clock:
            # clamped to the epoch, which no file of the package is newer than (below).
            "clamp_mtime_to_source_date_epoch": "1",
            **{macro: pct(one(h, tag)) for tag, macro in MACRO_TAGS.items() if one(h, tag)},
        }
        # Only what the header has: none of the building system's defaults.
        undefined = [m for t, m in MACRO_TAGS.items() if not one(h, t)]
        undefined += ["vendor", "packager", "distribution", "bugurl"]
        # --buildroot, not a definition: rpm >= 4.20 derives %buildroot from its build directory.
        cmd = ["rpmbuild", "-bb", "--nodeps", "--target", pkg.arch, "--buildroot", str(pkg.root)]
        for k, v in defines.items():
            cmd += ["--define", f"{k} {v}"]
        for macro in undefined:
            cmd += ["--undefine", macro]
        # Nothing the package owns is newer than the epoch, so the clamp leaves their times.
        newest = max(h.get("Filemtimes", []), default=0)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(max(ctx.epoch, newest)), "LC_ALL": "C"}
        said = tool([*cmd, str(spec_file)], env=env)
        # Where rpmbuild wrote it, by the building system's own _build_name_fmt.
        wrote = [Path(ln.split(":", 1)[1].strip()) for ln in said.splitlines() if ln.startswith("Wrote:")]
        if len(wrote) != 1 or not wrote[0].is_file():
            raise RepackError("tool-failed", f"rpmbuild wrote {len(wrote)} packages for {pkg.name}, not one")
        return wrote[0]

    def _spec(self, pkg: Package, release: str, ctx: Context) -> str:
        """A spec that says the header again. Its first package is named after the
        source rpm and not built, so that rpmbuild names the original source rpm
        (SOURCERPM) — unless the package has its source's name (docs/packaging-rpm.md)."""
        h: dict[str, list[Any]] = pkg.extra
        name = pkg.name
        source = source_nvr(h)
        summary = pct(one(h, "Summary", "") or name)
        head = []
        if source[0] != name:
            head += [f"Name: {source[0]}", f"Version: {source[1]}", f"Release: {source[2]}", f"Summary: {summary}"]
            head += [f"License: {pct(one(h, 'License', '') or 'unknown')}", "", f"%description\n{summary}", ""]
            head.append(f"%package -n {name}")
        else:
            head.append(f"Name: {name}")
        head += [f"Version: {one(h, 'Version')}", f"Release: {pct(release)}"]
        if one(h, "Epoch") is not None:
            head.append(f"Epoch: {one(h, 'Epoch')}")
        for tag, keyword in PREAMBLE.items():
            value = one(h, tag)
            if value:
                head.append(f"{keyword}: {pct(value)}")
        if pkg.arch == "noarch":
            head.append("BuildArch: noarch")
        head += ["AutoReqProv: no", *dependency_lines(h, name, ctx.versions)]
        note = ctx.note(pkg).split("; ")
        head += [f"Provides: {NOTE_PROVIDE}({k}) = {v}" for k, v in (n.split("=", 1) for n in note)]
        paths = set(file_paths(h))
        files = file_lines(h, pkg.root)
        for added in added_paths(pkg.root, paths):
            kind = "%dir %attr(0755,root,root)" if (pkg.root / added.lstrip("/")).is_dir() else "%attr(0644,root,root)"
            files.append(f'{kind} "{pct(added)}"')
        parts = [
            "\n".join(head),
            f"%description -n {name}\n{pct(one(h, 'Description', ''))}",
            "%install",
            *script_sections(h, name),
            f"%files -n {name}\n" + "\n".join(sorted(files, key=lambda ln: ln.rsplit(' "', 1)[1])),
            "%changelog\n" + changelog(h),
        ]
        return "\n\n".join(parts) + "\n"


def added_paths(root: Path, packaged: set[str]) -> list[str]:
    """What hugify added to the package (the manifest, the statement), and the new
    directories of its own (named hugify, and those under them) holding them: the
    system's directories above (/usr/lib, /usr/share) stay the base system's."""
    out = set()
    for d, _, names in os.walk(root):
        for n in names:
            installed = "/" + (Path(d) / n).relative_to(root).as_posix()
            if installed in packaged:
                continue
            out.add(installed)
            parents = list(Path(installed).parents)
            for i, parent in enumerate(parents):
                if parent.name == "hugify" and parent.as_posix() not in packaged:
                    out.update(q.as_posix() for q in parents[: i + 1] if q.as_posix() not in packaged)
                    break
    return sorted(out)
