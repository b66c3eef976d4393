"""Built packages as a signer outside the build reads them (``hugify sign-packages``,
hugify.postbuild): a Debian upload's .changes file with the checksums of the files it
names, and each .deb or .rpm with its name, version, architecture and payload.

A package is read without unpacking it into the file system: its payload is a tar
stream (``dpkg-deb --fsys-tarfile``; ``rpm2archive`` for an rpm, after ``rpmkeys
--checksig`` has checked the digests rpm keeps of header and payload), each regular
file hashed as it streams past. Paths in the payload are names only: nothing is
created at them. What the signer needs beyond the digests is kept: hugify's own
files (statements, manifests) and, in a private directory of the signer, a copy of
each ELF file, which the core probes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import posixpath
import re
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from hugify import manifest, reasons, repack_deb, repack_rpm, signing
from hugify.reasons import ReasonError
from hugify.repack_package import RepackError, tool

#: hugify's own files kept whole, and how large they may be.
KEPT_DIRS = (signing.ATTESTATION_DIR, str(manifest.MANIFEST_DIR))
KEPT_LIMIT = 16 << 20
#: Debug files are never hugified, and never probed.
DEBUG_DIR = "/usr/lib/debug/"
ELF_MAGIC = b"\x7fELF"
CHUNK = 1 << 20


# --- .changes ---------------------------------------------------------------------------


def unsigned_text(text: str) -> str:
    """A .changes file's fields without an OpenPGP clear signature around them (the
    signature is not checked here: the archive's upload queue checks it)."""
    lines = text.splitlines()
    if not lines or lines[0] != "-----BEGIN PGP SIGNED MESSAGE-----":
        return text
    body = lines[lines.index("") + 1 :] if "" in lines else []
    end = body.index("-----BEGIN PGP SIGNATURE-----") if "-----BEGIN PGP SIGNATURE-----" in body else len(body)
    return "\n".join(line[2:] if line.startswith("- ") else line for line in body[:end])


def changes_files(changes: Path) -> list[Path]:
    """The files a .changes file names (Checksums-Sha256), each checked against its size
    and SHA-256 there; the packages among them, in the order listed. ReasonError:
    bad-changes, changes-mismatch."""
    try:
        text = changes.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ReasonError("bad-changes", f"{changes}: not UTF-8 text") from None
    try:
        fields = repack_deb.parse_control(unsigned_text(text))
    except RepackError as e:
        raise ReasonError("bad-changes", f"{changes}: {e.detail}") from None
    listing = repack_deb.get(fields, "Checksums-Sha256")
    if not listing or not repack_deb.get(fields, "Format"):
        raise ReasonError("bad-changes", f"{changes}: no Format or Checksums-Sha256 field")
    packages = []
    for line in listing.splitlines():
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 3 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]) or not parts[1].isdigit():
            raise ReasonError(
                "bad-changes", f"{changes}: a Checksums-Sha256 line is not SHA256 SIZE NAME: {line.strip()}"
            )
        digest, size, name = parts[0], int(parts[1]), parts[2]
        if "/" in name or name in (".", ".."):
            raise ReasonError("bad-changes", f"{changes}: {name!r} is not a file name beside the .changes")
        path = changes.parent / name
        try:
            with path.open("rb") as f:
                st = os.fstat(f.fileno())
                got = hashlib.file_digest(f, "sha256").hexdigest() if st.st_size == size else None
        except FileNotFoundError:
            raise ReasonError("changes-mismatch", f"{changes}: {name} is missing") from None
        if st.st_size != size:
            raise ReasonError("changes-mismatch", f"{changes}: {name} has {st.st_size} bytes, the .changes says {size}")
        if got != digest:
            raise ReasonError("changes-mismatch", f"{changes}: {name} has SHA-256 {got}, the .changes says {digest}")
        if name.endswith((".deb", ".udeb")):
            packages.append(path)
    return packages


# --- packages ----------------------------------------------------------------------------


@dataclass
class Member:
    """A regular file of a package's payload."""

    sha256: str
    size: int
    #: hugify's own files (statements, manifests): the bytes.
    data: bytes | None = None
    #: An ELF file: its copy in the signer's private directory, for the core to probe.
    copy: Path | None = None


@dataclass
class Artefact:
    """A built package, read: what it says it is and the regular files it installs."""

    path: Path
    format: str  # deb | rpm
    name: str
    version: str
    arch: str
    #: The source package it was built from (rpm: the source rpm's name; Debian: Source or the name).
    source: str
    multi_arch_same: bool
    #: rpm: the source rpm (SOURCERPM); its packages share one statement.
    built_from: str = ""
    files: dict[str, Member] = field(default_factory=dict)
    #: Symbolic links of the payload: installed path -> target (as written).
    links: dict[str, str] = field(default_factory=dict)

    @property
    def stem(self) -> str:
        """Its file name without the package suffix: what is published beside it."""
        return re.sub(r"\.(deb|udeb|rpm)$", "", self.path.name)

    def kept(self, directory: str, suffix: str) -> dict[str, bytes]:
        """name (without suffix) -> content, of hugify's own files in a directory."""
        prefix = directory.rstrip("/") + "/"
        return {
            p[len(prefix) : -len(suffix)]: m.data
            for p, m in sorted(self.files.items())
            if p.startswith(prefix) and "/" not in p[len(prefix) :] and p.endswith(suffix) and m.data is not None
        }


def read_artefact(path: Path, spool: Path) -> Artefact:
    """A .deb or an .rpm, read; ELF files are copied into `spool` (a directory only
    the signer writes). ReasonError not-a-package for anything else or anything damaged."""
    try:
        with path.open("rb") as f:
            magic = f.read(8)
    except OSError as e:
        raise ReasonError("not-a-package", f"{path}: cannot read it: {reasons.io_detail(e, with_file=False)}") from None
    try:
        if magic == b"!<arch>\n":
            art = _deb(path)
            command = ["dpkg-deb", "--fsys-tarfile", str(path)]
        elif magic[:4] == b"\xed\xab\xee\xdb":
            art = _rpm(path)
            command = ["rpm2archive", "-n", "-"]
        else:
            raise ReasonError("not-a-package", "neither a .deb (ar archive) nor an .rpm (lead magic)")
        with path.open("rb") as stdin:
            _read_payload(art, command, stdin, spool)
    except RepackError as e:
        raise ReasonError("not-a-package", f"{path}: {e.detail}") from None
    except ReasonError as e:
        raise ReasonError(e.reason, f"{path}: {e.detail}") from None
    return art


def _deb(path: Path) -> Artefact:
    repack_deb.check_deb(path)
    fields = repack_deb.parse_control(tool(["dpkg-deb", "--field", str(path)]))
    name, version, arch = (repack_deb.get(fields, k) for k in ("Package", "Version", "Architecture"))
    if not (name and version and arch):
        raise ReasonError("not-a-package", "the control file lacks Package, Version or Architecture")
    source = (repack_deb.get(fields, "Source") or name).split()[0]
    same = (repack_deb.get(fields, "Multi-Arch") or "").strip() == "same"
    return Artefact(path, "deb", name, version, arch, source, same)


def _rpm(path: Path) -> Artefact:
    # The digests rpm keeps of the header and the payload (no key is needed for them).
    tool(["rpmkeys", "--checksig", "--nosignature", str(path)])
    h = repack_rpm.read_header(path)
    source = repack_rpm.one(h, "Sourcerpm")
    if not source:
        raise ReasonError("not-a-package", "a source rpm: it installs no files")
    name = repack_rpm.one(h, "Name")
    arch = repack_rpm.one(h, "Arch")
    return Artefact(path, "rpm", name, repack_rpm.evr(h), arch, repack_rpm.source_nvr(h)[0], False, source)


def _read_payload(art: Artefact, command: list[str], stdin: IO[bytes], spool: Path) -> None:
    # stderr to a file: a pipe nobody reads while the payload streams could fill and stall the tool.
    with tempfile.TemporaryFile() as err:
        with subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=err) as proc:
            assert proc.stdout is not None
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                    for member in tar:
                        _member(art, tar, member, spool)
            except tarfile.TarError as e:
                proc.kill()
                raise ReasonError("not-a-package", f"its payload is not a readable archive: {e}") from None
            finally:
                proc.stdout.read()  # what follows the archive's end, so that the tool can finish
        if proc.returncode != 0:
            err.seek(0)
            said = err.read().decode(errors="replace").strip().splitlines()
            raise ReasonError("not-a-package", f"{command[0]}: {said[-1] if said else f'exit {proc.returncode}'}")


def _installed(name: str) -> str:
    return posixpath.normpath("/" + name.removeprefix("./").lstrip("/"))


def _member(art: Artefact, tar: tarfile.TarFile, member: tarfile.TarInfo, spool: Path) -> None:
    path = _installed(member.name)
    if member.islnk():  # a hard link to a file earlier in the stream
        target = art.files.get(_installed(member.linkname))
        if target is not None:
            art.files[path] = target
        return
    if not member.isreg():
        art.files.pop(path, None)  # a later member of the same name replaces it
        if member.issym():
            art.links[path] = member.linkname
        return
    stream = tar.extractfile(member)
    assert stream is not None
    keep = any(path.startswith(d.rstrip("/") + "/") for d in KEPT_DIRS) and member.size <= KEPT_LIMIT
    art.files[path] = _read_member(stream, keep, spool, path.startswith(DEBUG_DIR))


def _read_member(stream: IO[bytes], keep: bool, spool: Path, debug: bool) -> Member:
    h = hashlib.sha256()
    kept: list[bytes] = []
    first = stream.read(CHUNK)
    copy = _spool_file(spool) if first.startswith(ELF_MAGIC) and not debug else None
    size = 0
    with open(copy, "wb", opener=_private) if copy is not None else _no_copy() as out:
        chunk = first
        while chunk:
            h.update(chunk)
            size += len(chunk)
            if keep:
                kept.append(chunk)
            if out is not None:
                out.write(chunk)
            chunk = stream.read(CHUNK)
    return Member(h.hexdigest(), size, b"".join(kept) if keep else None, copy)


_spooled = itertools.count(1)


def _spool_file(spool: Path) -> Path:
    """A new file in the signer's own directory, named by a counter (never by a path
    of the package)."""
    return spool / f"{next(_spooled)}.elf"


def _private(name: str, flags: int) -> int:
    return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


@contextlib.contextmanager
def _no_copy() -> Iterator[None]:
    yield None
