"""The .deb side of ``hugify repack`` (hugify.repack): unpacks with dpkg-deb,
rewrites the control file, regenerates md5sums, rebuilds with dpkg-deb --build.

Owners, modes (setuid too) and hard links survive because dpkg-deb -x, run as
root, extracts the data tarball with them and dpkg-deb --build packs what is on
disk. A .deb carries no extended attributes, so there are no capabilities to keep.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path

from hugify import reasons
from hugify.files import write_text_atomic
from hugify.repack_package import Context, Package, RepackError, tool

#: data.tar member suffix -> dpkg-deb -Z value.
COMPRESSORS = {".xz": "xz", ".zst": "zstd", ".gz": "gzip", "": "none"}
#: Fields whose exact-version relations to a repacked package follow its new version.
RELATIONS = ("Depends", "Pre-Depends", "Recommends", "Suggests", "Enhances")
#: The field naming the original version and hugify's (dpkg keeps fields it does
#: not know, in the package and in its status database).
NOTE_FIELD = "X-Hugify"
DEBUG_FILES = "usr/lib/debug/.build-id"


def ar_members(path: Path) -> list[tuple[str, int, int]]:
    """(name, offset, size) of each member of an ar archive, checked against the
    file's length; RepackError for anything that is not a whole ar archive."""
    size = path.stat().st_size
    out = []
    with path.open("rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise RepackError("not-a-package", "not an ar archive")
        pos = 8
        while pos < size:
            head = f.read(60)
            if len(head) < 60 or head[58:60] != b"`\n":
                raise RepackError("not-a-package", f"truncated or damaged ar member header at byte {pos}")
            name = head[:16].decode("ascii", "replace").rstrip().rstrip("/")
            try:
                length = int(head[48:58].decode("ascii"))
            except ValueError:
                raise RepackError("not-a-package", f"ar member {name!r} has no valid size") from None
            if pos + 60 + length > size:
                raise RepackError("not-a-package", f"truncated: ar member {name!r} needs {length} bytes")
            out.append((name, pos + 60, length))
            pos += 60 + length + (length & 1)
            f.seek(pos)
    return out


def check_deb(path: Path) -> str:
    """The compression of the data member (a dpkg-deb -Z value) of a well-formed .deb."""
    members = ar_members(path)
    names = [m[0] for m in members]
    if len(names) < 3 or names[0] != "debian-binary" or not names[1].startswith("control.tar"):
        raise RepackError("not-a-package", f"an ar archive but not a .deb (members: {', '.join(names) or 'none'})")
    with path.open("rb") as f:
        f.seek(members[0][1])
        if not f.read(members[0][2]).startswith(b"2."):
            raise RepackError("not-a-package", "not a version 2 .deb")
    data = next((n for n in names if n.startswith("data.tar")), None)
    if data is None or data[len("data.tar") :] not in COMPRESSORS:
        raise RepackError("not-a-package", f"no data.tar member dpkg-deb can rebuild ({data or 'none'})")
    return COMPRESSORS[data[len("data.tar") :]]


# --- control files ----------------------------------------------------------------------


def parse_control(text: str) -> list[tuple[str, str]]:
    """The fields of a binary control file, in order (continuation lines kept)."""
    fields: list[tuple[str, str]] = []
    for line in text.splitlines():
        if line[:1] in (" ", "\t") and fields:
            name, value = fields[-1]
            fields[-1] = (name, f"{value}\n{line}")
        elif ":" in line:
            name, value = line.split(":", 1)
            fields.append((name.strip(), value.strip()))
        elif line.strip():
            raise RepackError("not-a-package", f"control file line is not a field: {line[:60]!r}")
    return fields


def render_control(fields: list[tuple[str, str]]) -> str:
    return "".join(f"{n}: {v}\n" for n, v in fields)


def get(fields: list[tuple[str, str]], name: str) -> str | None:
    return next((v for n, v in fields if n.lower() == name.lower()), None)


def put(fields: list[tuple[str, str]], name: str, value: str, after: str | None = None) -> None:
    """Sets a field in place, or adds it after the field `after` (else at the end)."""
    for i, (n, _) in enumerate(fields):
        if n.lower() == name.lower():
            fields[i] = (n, value)
            return
    at = next((i + 1 for i, (n, _) in enumerate(fields) if after and n.lower() == after.lower()), len(fields))
    fields.insert(at, (name, value))


def follow_versions(value: str, versions: dict[str, tuple[str, str]]) -> str:
    """A relationship field with `pkg (= OLD)` of repacked packages made `(= NEW)`."""

    def sub(m: re.Match[str]) -> str:
        name, ver = m.group(1), m.group(3).strip()
        old, new = versions.get(name.split(":")[0], (None, None))
        return f"{m.group(1)}{m.group(2)}{new}{m.group(4)}" if ver == old and new else m.group(0)

    return re.sub(r"([a-z0-9][a-z0-9+.\-]*(?::[a-z0-9-]+)?)(\s*\(\s*=\s*)([^)\s]+)(\s*\))", sub, value)


def installed_kib(root: Path) -> int:
    """dpkg-gencontrol's measure: each regular file's size in KiB rounded up (hard
    links once), 1 for anything else."""
    total, seen = 0, set()
    for d, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(d, name))
            if os.path.isfile(os.path.join(d, name)) and not os.path.islink(os.path.join(d, name)):
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
                total += (st.st_size + 1023) // 1024
            else:
                total += 1
    return total


# --- the format ------------------------------------------------------------------------


class Deb:
    name = "deb"
    default_suffix = "+hugify1"

    def unpack(self, src: Path, work: Path) -> Package:
        compressor = check_deb(src)
        root, control = work / "root", work / "DEBIAN"
        work.mkdir(parents=True)
        try:
            tool(["dpkg-deb", "--extract", str(src), str(root)])
            tool(["dpkg-deb", "--control", str(src), str(control)])
        except RepackError as e:  # a whole ar archive whose members do not unpack
            raise RepackError("not-a-package", e.detail) from None
        fields = parse_control((control / "control").read_text(encoding="utf-8"))
        name, version, arch = (get(fields, k) for k in ("Package", "Version", "Architecture"))
        if not (name and version and arch):
            raise RepackError("not-a-package", "the control file lacks Package, Version or Architecture")
        if get(fields, NOTE_FIELD) is not None:
            raise RepackError(
                "already-repacked", f"{name} {version} is a repack ({NOTE_FIELD}: {get(fields, NOTE_FIELD)})"
            )
        debug_of = None
        if name.endswith("-dbgsym") or get(fields, "Auto-Built-Package") == "debug-symbols":
            debug_of = name.removesuffix("-dbgsym")
        pkg = Package(src, name, version, arch, root, debug_of)
        pkg.extra = DebExtra(control, fields, compressor, installed_kib(root))
        pkg.coinstallable = (get(fields, "Multi-Arch") or "").strip() == "same"
        return pkg

    def new_version(self, pkg: Package, suffix: str) -> str:
        return pkg.version + suffix

    def sorts_above(self, old: str, new: str) -> bool:
        """dpkg's own comparison (dpkg --compare-versions)."""
        try:
            res = subprocess.run(["dpkg", "--compare-versions", new, "gt", old], capture_output=True, check=False)
        except OSError as e:
            raise RepackError("tool-failed", f"cannot run dpkg: {reasons.io_detail(e, with_file=False)}") from e
        if res.returncode not in (0, 1):
            raise RepackError("tool-failed", f"dpkg --compare-versions: {res.stderr.decode(errors='replace').strip()}")
        return res.returncode == 0

    def build(self, pkg: Package, ctx: Context, outdir: Path) -> Path:
        x: DebExtra = pkg.extra
        fields = list(x.fields)
        new = ctx.versions[pkg.name][1]
        # The source keeps its version (as for a binNMU): name it when the binary's differs.
        source = get(fields, "Source") or pkg.name
        if "(" not in source:
            put(fields, "Source", f"{source} ({pkg.version})", after="Package")
        put(fields, "Version", new)
        for rel in RELATIONS:
            value = get(fields, rel)
            if value:
                put(fields, rel, follow_versions(value, ctx.versions))
        old_size = int(get(fields, "Installed-Size") or x.installed)
        put(fields, "Installed-Size", str(max(0, old_size + installed_kib(pkg.root) - x.installed)))
        if pkg.renamed_ids:
            ids = dict(pkg.renamed_ids)
            value = get(fields, "Build-Ids")
            if value:
                put(fields, "Build-Ids", " ".join(ids.get(i, i) for i in value.split()))
        put(fields, NOTE_FIELD, ctx.note(pkg))
        # Through the shared writer: a member of the package's control area that is a
        # symlink is replaced, never written through.
        write_text_atomic(x.control / "control", render_control(fields))
        _md5sums(pkg.root, x.control)
        debian = pkg.root / "DEBIAN"
        os.rename(x.control, debian)
        outdir.mkdir(exist_ok=True)
        out = outdir / f"{pkg.name}_{new.split(':', 1)[-1]}_{pkg.arch}.deb"
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(ctx.epoch)}
        try:
            tool(["dpkg-deb", "--build", f"-Z{x.compressor}", str(pkg.root), str(out)], env=env)
        finally:
            os.rename(debian, x.control)
        return out


class DebExtra:
    """The .deb-specific state of an unpacked package."""

    def __init__(self, control: Path, fields: list[tuple[str, str]], compressor: str, installed: int) -> None:
        self.control, self.fields, self.compressor, self.installed = control, fields, compressor, installed


def _md5sums(root: Path, control: Path) -> None:
    """DEBIAN/md5sums for every regular file but the conffiles (as dh_md5sums),
    sorted by path."""
    conffiles_file = control / "conffiles"
    conffiles = set()
    if conffiles_file.exists():
        conffiles = {ln.split()[-1] for ln in conffiles_file.read_text().splitlines() if ln.strip()}
    lines = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            p = Path(d) / name
            installed = "/" + p.relative_to(root).as_posix()
            if p.is_symlink() or not p.is_file() or installed in conffiles:
                continue
            with p.open("rb") as f:
                lines.append(f"{hashlib.file_digest(f, 'md5').hexdigest()}  {installed[1:]}\n")
    write_text_atomic(control / "md5sums", "".join(sorted(lines, key=lambda ln: ln[34:])))
