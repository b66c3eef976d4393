"""The .rpm side of ``hugify repack`` (hugify.repack): the approach of rpmrebuild.

The header is read with `rpm -qp --xml`, the payload unpacked with rpm2cpio and
cpio, and a spec is written that says again what the header says: name, epoch,
version, the release with the suffix, summary, description, relationships
(with their scriptlet qualifiers), scriptlets with their interpreters, triggers,
the changelog, and every file with its mode, owner, group, capabilities, verify
flags and %config/%doc/%ghost flags. rpmbuild packs the unpacked tree as it is
(no %install step, no brp scripts, no dependency generator). What rpmbuild
regenerates itself is left out of the spec: rpmlib() and interpreter
requirements, config() provides and the /usr/lib/.build-id links, which it
makes for the new build-ids.
"""

from __future__ import annotations

import os
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
TRIGGERIN, TRIGGERUN, TRIGGERPOSTUN, TRIGGERPREIN = 1 << 16, 1 << 17, 1 << 18, 1 << 25
RPMLIB, META = 1 << 24, 1 << 29
QUALIFIERS = (
    (SCRIPT_PRE, "pre"),
    (SCRIPT_POST, "post"),
    (SCRIPT_PREUN, "preun"),
    (SCRIPT_POSTUN, "postun"),
    (PRETRANS, "pretrans"),
    (POSTTRANS, "posttrans"),
    (SCRIPT_VERIFY, "verify"),
    (META, "meta"),
)
TRIGGERS = (
    (TRIGGERPREIN, "triggerprein"),
    (TRIGGERIN, "triggerin"),
    (TRIGGERUN, "triggerun"),
    (TRIGGERPOSTUN, "triggerpostun"),
)
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
DEPENDENCIES = ("Requires", "Provides", "Conflicts", "Obsoletes", "Recommends", "Suggests", "Supplements", "Enhances")
SCRIPTS = (
    ("Pretrans", "pretrans"),
    ("Prein", "pre"),
    ("Postin", "post"),
    ("Preun", "preun"),
    ("Postun", "postun"),
    ("Posttrans", "posttrans"),
    ("Verifyscript", "verifyscript"),
)
#: Header tags this rebuild cannot carry; a package using them is refused.
UNSUPPORTED = ("Filetriggername", "Transfiletriggername", "Prefixes", "Policies")
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


def dependency_lines(h: dict[str, list[Any]], name: str, old: str, new: str) -> list[str]:
    """The spec's relationship lines. What rpmbuild adds itself is left out; the
    package's provides of its own old version name the new one."""
    lines = []
    for kind in DEPENDENCIES:
        stem = kind[:-1]  # Requires: the tags Requirename, Requireflags, Requireversion
        names, flags, versions = (h.get(f"{stem}{x}", []) for x in ("name", "flags", "version"))
        for dep, fl, ver in zip(names, flags, versions, strict=False):
            if fl & (RPMLIB | INTERP):
                continue
            if kind == "Provides" and dep == name and ver == old:
                continue  # rpmbuild provides the package's name at its new version
            version = new if ver == old and fl & EQUAL else ver
            quals = ",".join(q for bit, q in QUALIFIERS if fl & bit)
            op = _sense(fl)
            lines.append(f"{kind}{f'({quals})' if quals else ''}: {pct(dep)}{f' {op} {pct(version)}' if op else ''}")
    return lines


def script_sections(h: dict[str, list[Any]]) -> list[str]:
    out = []
    for tag, section in SCRIPTS:
        body, interpreter = one(h, tag), h.get(f"{tag}prog")
        if body is None and not interpreter:
            continue
        head = f"%{section}" + (f" -p {' '.join(interpreter)}" if interpreter else "")
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
    for idx in sorted(conditions):
        prog = progs[idx] if idx < len(progs) else "/bin/sh"
        body = bodies[idx] if idx < len(bodies) else ""
        out.append(f"%{kinds[idx]} -p {prog} -- {', '.join(conditions[idx])}\n{pct(body)}\n")
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
    caps, langs = h.get("Filecaps", []), h.get("Filelangs", [])
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
                ghost.parent.mkdir(parents=True, exist_ok=True)
                ghost.touch()
        if i < len(langs) and langs[i]:
            attrs.append(f"%lang({langs[i]})")
        if verify & 0xFFFFFFFF != 0xFFFFFFFF:
            nots = [b for n, b in enumerate(VERIFY_BITS) if not verify & (1 << n)]
            attrs.append(f"%verify(not {' '.join(nots)})")
        lines.append(f'{" ".join(attrs)} "{pct(path)}"')
    return lines


class Rpm:
    name = "rpm"
    default_suffix = ".hugify1"

    def unpack(self, src: Path, work: Path) -> Package:
        h = read_header(src)
        for tag in UNSUPPORTED:
            if h.get(tag):
                raise RepackError("unsupported-metadata", f"the header has {tag}, which a rebuilt spec cannot carry")
        if one(h, "Payloadformat", "cpio") != "cpio":
            raise RepackError("unsupported-metadata", f"payload format {one(h, 'Payloadformat')}")
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
        name = one(h, "Name")
        if any(p.startswith(f"{NOTE_PROVIDE}(") for p in h.get("Providename", [])):
            raise RepackError("already-repacked", f"{name} {evr(h)} is a repack (it provides {NOTE_PROVIDE}(…))")
        debug_of = name.removesuffix("-debuginfo") if name.endswith("-debuginfo") else None
        pkg = Package(src, name, evr(h), one(h, "Arch"), root, debug_of)
        pkg.extra = h
        return pkg

    def new_version(self, pkg: Package, suffix: str) -> str:
        return evr(pkg.extra, one(pkg.extra, "Release") + suffix)

    def build(self, pkg: Package, ctx: Context, outdir: Path) -> Path:
        h: dict[str, list[Any]] = pkg.extra
        release = one(h, "Release") + ctx.suffix
        old, new = ctx.versions[pkg.name]
        # rpmbuild makes the build-id links of the new build-ids itself.
        for path, flags in zip(file_paths(h), h.get("Fileflags", []), strict=True):
            p = pkg.root / path.lstrip("/")
            if flags & F_ARTIFACT and (p.is_symlink() or p.is_file()):
                p.unlink()
        for path, flags in sorted(zip(file_paths(h), h.get("Fileflags", []), strict=True), reverse=True):
            p = pkg.root / path.lstrip("/")
            if flags & F_ARTIFACT and p.is_dir() and not any(p.iterdir()):
                p.rmdir()
        spec = self._spec(pkg, release, (old, new), ctx)
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
            "buildroot": str(pkg.root),
            "__spec_install_pre": "%{___build_pre}",
            "__spec_install_post": "%{nil}",
            "__os_install_post": "%{nil}",
            "__spec_clean_body": "%{nil}",
            "debug_package": "%{nil}",
            "_binary_payload": f"w{level}.{compressor}",
            "_buildhost": one(h, "Buildhost", "localhost"),
            "use_source_date_epoch_as_buildtime": "1",
            "clamp_mtime_to_source_date_epoch": "0",
        }
        cmd = ["rpmbuild", "-bb", "--nodeps", "--target", pkg.arch]
        for k, v in defines.items():
            cmd += ["--define", f"{k} {v}"]
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(ctx.epoch), "LC_ALL": "C"}
        tool([*cmd, str(spec_file)], env=env)
        want = outdir / pkg.arch / f"{pkg.name}-{one(h, 'Version')}-{release}.{pkg.arch}.rpm"
        if not want.is_file():
            raise RepackError("tool-failed", f"rpmbuild did not write {want.name}")
        return want

    def _spec(self, pkg: Package, release: str, versions: tuple[str, str], ctx: Context) -> str:
        h: dict[str, list[Any]] = pkg.extra
        old, new = versions
        head = [f"Name: {pkg.name}", f"Version: {one(h, 'Version')}", f"Release: {pct(release)}"]
        if one(h, "Epoch") is not None:
            head.append(f"Epoch: {one(h, 'Epoch')}")
        for tag in ("Summary", "License", "Group", "Url", "Vendor", "Packager", "Distribution"):
            value = one(h, tag)
            if value:
                head.append(f"{'URL' if tag == 'Url' else tag}: {pct(value)}")
        if pkg.arch == "noarch":
            head.append("BuildArch: noarch")
        head += ["AutoReqProv: no", *dependency_lines(h, pkg.name, old, new)]
        note = ctx.note(pkg).split("; ")
        head += [f"Provides: {NOTE_PROVIDE}({k}) = {v}" for k, v in (n.split("=", 1) for n in note)]
        paths = set(file_paths(h))
        files = file_lines(h, pkg.root)
        for d, _, names in os.walk(pkg.root):
            for n in names:
                installed = "/" + (Path(d) / n).relative_to(pkg.root).as_posix()
                if installed not in paths:  # what hugify added: the manifest, the statement
                    files.append(f'%attr(0644,root,root) "{pct(installed)}"')
        parts = [
            "\n".join(head),
            f"%description\n{pct(one(h, 'Description', ''))}",
            "%install",
            *script_sections(h),
            "%files\n" + "\n".join(sorted(files, key=lambda ln: ln.rsplit(' "', 1)[1])),
            "%changelog\n" + changelog(h),
        ]
        return "\n\n".join(parts) + "\n"
