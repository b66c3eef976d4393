"""hugify derive-source: the `+hugifyN` source a distribution derives from a Debian
source package to build it with hugify on, the recorded way (docs/packaging-debian.md,
"Turning it on, recorded"): `dh-sequence-hugify` added to the source's Build-Depends,
which the .buildinfo of every build of it records with hugify and the distribution's
policy package, and a changelog entry saying so. Nothing else of the package changes.

Debian's own tools do the work: `dpkg-source -x` unpacks the source (and checks every
file the .dsc lists against its checksums), `dpkg-parsechangelog` reads the last entry,
`dpkg-source -b` builds the new source. Same input and options, same bytes: the entry
is dated SOURCE_DATE_EPOCH, else one second after the last entry (never the clock);
dpkg-source runs with that date as its SOURCE_DATE_EPOCH (the new tarball's times
clamped to it, names sorted, owner 0), umask 022, one compressor thread, the C locale
and UTC.

Refused before anything is written to the output directory, which must exist: a .dsc
that is not one (not-a-source), a source format dpkg-source does not rebuild as it was
(unsupported-source-format), a listed file missing or with other bytes
(source-corrupt), a source that turns hugify on already (already-hugified), one whose
rules run no dh sequence, where the Build-Depends would load nothing (no-dh-sequence),
a suffix that does not make a higher version (suffix-not-higher).
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import errno
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hugify import files
from hugify.artefacts import unsigned_text
from hugify.reasons import ReasonError
from hugify.repack_deb import Deb, get, parse_control
from hugify.repack_package import RepackError, tool

#: The build dependency that turns hugify on (dh(1): it implies `dh --with hugify`).
SEQUENCE = "dh-sequence-hugify"
#: The source formats dpkg-source unpacks and builds again as they were.
FORMATS = ("1.0", "3.0 (quilt)", "3.0 (native)")
DEFAULT_SUFFIX = Deb.default_suffix
#: What the changelog entry says (docs/packaging-debian.md quotes it).
ENTRY_TEXT = (
    "  * Build with hugify: Build-Depends on dh-sequence-hugify, which runs\n"
    "    dh_hugify, dh_hugify_check and dh_hugify_sign with the distribution's\n"
    "    hugify policy package (both recorded in the .buildinfo).\n"
)
#: dh's sequencer run from a rules file: `dh $@`, `dh $(@)`, or `dh binary` and the
#: like, after make's recipe prefixes and variable assignments.
_DH_RUN = re.compile(
    r"^\t[@+-]*\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*dh\s+"
    r"(?:\$@|\$\(@\)|\$\{@\}|(?:binary|build|clean|install)(?:-arch|-indep)?(?:\s|;|$))",
    re.M,
)
#: hugify turned on in the rules already: `--with hugify` (among other add-ons) or
#: dh_hugify run by hand.
_HUGIFY_IN_RULES = re.compile(r"--with[= ]\s*(?:[\w.+-]+,)*hugify\b|\bdh_hugify\b")
MAINTAINER = re.compile(r"[^<>\n]*[^<>\s] <[^<>@\s]+@[^<>\s]+>")
#: What a suffix may hold: characters of a Debian revision, never a hyphen (which
#: would move the split between upstream version and revision).
SUFFIX = re.compile(r"[A-Za-z0-9.+~]+")
#: A changelog distribution: one suite name.
DISTRIBUTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+-]*")


@dataclass(frozen=True)
class Options:
    dsc: Path
    outdir: Path
    #: "Full Name <address>" of the entry's author.
    maintainer: str
    suffix: str = DEFAULT_SUFFIX
    #: The entry's distribution; None: the last entry's.
    distribution: str | None = None


@dataclass(frozen=True)
class Derived:
    dsc: Path
    source: str
    version: str
    #: Every file written into the output directory, the .dsc last.
    written: tuple[Path, ...]


def maintainer_from_env(env: dict[str, str]) -> str | None:
    """The entry's author as dch takes it: DEBFULLNAME (or NAME) with DEBEMAIL (or
    EMAIL), or DEBEMAIL holding both ("Full Name <address>")."""
    mail = (env.get("DEBEMAIL") or env.get("EMAIL") or "").strip()
    if MAINTAINER.fullmatch(mail):
        return mail
    name = (env.get("DEBFULLNAME") or env.get("NAME") or "").strip()
    return f"{name} <{mail}>" if name and mail else None


# --- the .dsc ----------------------------------------------------------------------------


def read_dsc(dsc: Path) -> list[tuple[str, str]]:
    """The fields of a source package's .dsc (its clear signature taken off, not
    checked: the archive's Release signature vouches for what apt-get source fetched).
    Refused: not a regular file (not opened), not a .dsc, a format not in FORMATS."""
    mode = dsc.stat().st_mode  # a missing file: io-error
    if not stat.S_ISREG(mode):  # a directory, a FIFO: not opened
        raise ReasonError("wrong-file-type", f"{dsc}: {files.describe(mode)}, not a .dsc file")
    try:
        fields = parse_control(unsigned_text(dsc.read_bytes().decode("utf-8")))
    except UnicodeDecodeError:
        raise ReasonError("not-a-source", f"{dsc}: not UTF-8 text, not a .dsc") from None
    except RepackError as e:
        raise ReasonError("not-a-source", f"{dsc}: {e.detail}") from None
    missing = [f for f in ("Format", "Source", "Version", "Checksums-Sha256") if not get(fields, f)]
    if missing:
        raise ReasonError("not-a-source", f"{dsc}: no {', '.join(missing)} field: not a source package's .dsc")
    fmt = (get(fields, "Format") or "").strip()
    if fmt not in FORMATS:
        raise ReasonError(
            "unsupported-source-format",
            f"{dsc}: source format {fmt!r}; derive-source rebuilds {', '.join(FORMATS)}",
        )
    return fields


def listed_names(fields: list[tuple[str, str]]) -> list[str]:
    """The file names of a .dsc's Checksums-Sha256 field, in order."""
    return [line.split()[-1] for line in (get(fields, "Checksums-Sha256") or "").splitlines() if line.strip()]


# --- the unpacked tree ---------------------------------------------------------------------


def _without_comments(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("#"))


def _source_fields(control: str) -> dict[str, str]:
    """debian/control's first stanza (the source's), by lower-case field name,
    continuation lines joined; comments dropped."""
    fields: dict[str, str] = {}
    name = ""
    for line in _without_comments(control).splitlines():
        if not line.strip():
            if fields:
                break
        elif line[:1] in (" ", "\t") and name:
            fields[name] += "\n" + line
        elif ":" in line:
            field, _, value = line.partition(":")
            name = field.strip().lower()
            fields[name] = value
    return fields


def build_dependencies(control: str) -> set[str]:
    """The package names of the source stanza's Build-Depends, -Arch and -Indep (every
    alternative, without versions, architectures, profiles or :any)."""
    fields = _source_fields(control)
    names = set()
    for field in ("build-depends", "build-depends-arch", "build-depends-indep"):
        for alternative in re.split(r"[,|]", fields.get(field, "")):
            m = re.match(r"\s*([a-z0-9][a-z0-9+.-]*)", alternative)
            if m:
                names.add(m.group(1))
    return names


def with_sequence(control: str) -> str:
    """debian/control with dh-sequence-hugify first in the source stanza's
    Build-Depends, in the field's own layout (on its first line, or on a line of its
    own with the next line's indentation); the rest byte for byte as it was. A source
    without Build-Depends gets the field after its Source field."""
    lines = control.splitlines(keepends=True)
    seen_field = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("#"):
            continue
        if not line.strip():
            if seen_field:
                break
            continue
        seen_field = True
        m = re.match(r"Build-Depends[ \t]*:", line, re.I)
        if not m:
            continue
        rest = line[m.end() :]
        if rest.strip():
            value = rest.lstrip(" \t")
            lead = rest[: len(rest) - len(value)] or " "
            lines[i] = f"{line[: m.end()]}{lead}{SEQUENCE}, {value}"
        else:
            following = lines[i + 1] if i + 1 < len(lines) else " "
            indent = following[: len(following) - len(following.lstrip(" \t"))] or " "
            lines.insert(i + 1, f"{indent}{SEQUENCE},\n")
        return "".join(lines)
    for i, line in enumerate(lines):
        if re.match(r"Source[ \t]*:", line, re.I):
            lines.insert(i + 1, f"Build-Depends: {SEQUENCE}\n")
            return "".join(lines)
    raise ReasonError("not-a-source", "debian/control has no source stanza (no Source field)")


def _rules_text(tree: Path) -> str:
    """debian/rules and the makefiles of debian/ it may include, comments dropped."""
    parts = [tree / "debian" / "rules", *sorted((tree / "debian").glob("*.mk"))]
    return "".join(_without_comments(p.read_text(errors="replace")) for p in parts if p.is_file())


def checked_control(tree: Path, dsc: Path) -> str:
    """debian/control of a source that hugify can be turned on in; refused otherwise."""
    control_path = tree / "debian" / "control"
    if not control_path.is_file() or not (tree / "debian" / "changelog").is_file():
        raise ReasonError("not-a-source", f"{dsc}: the source has no debian/control or debian/changelog")
    control = control_path.read_text()
    if SEQUENCE in build_dependencies(control):
        raise ReasonError("already-hugified", f"{dsc}: its Build-Depends name {SEQUENCE} already")
    rules = _rules_text(tree)
    on = _HUGIFY_IN_RULES.search(rules)
    if on:
        raise ReasonError("already-hugified", f"{dsc}: its debian/rules turns hugify on already ({on.group(0)})")
    if not _DH_RUN.search(rules):
        raise ReasonError(
            "no-dh-sequence",
            f"{dsc}: its debian/rules runs no dh sequence (its targets call dh_* commands themselves, or CDBS), "
            f"so {SEQUENCE} in Build-Depends would load no add-on: call dh_hugify, dh_hugify_check and "
            "dh_hugify_sign from its rules instead",
        )
    return control


def last_entry(tree: Path, dsc: Path) -> list[tuple[str, str]]:
    """The fields of the changelog's last entry, as dpkg-parsechangelog reads them."""
    try:
        return parse_control(tool(["dpkg-parsechangelog", "-l", str(tree / "debian" / "changelog")]))
    except RepackError as e:
        raise ReasonError("not-a-source", f"{dsc}: its debian/changelog: {e.detail}") from None


def entry_date(last: list[tuple[str, str]], dsc: Path) -> tuple[str, int]:
    """The new entry's date line and its epoch: SOURCE_DATE_EPOCH, else one second
    after the last entry (in its time zone), so that the entries stay in order."""
    epoch = files.source_date_epoch()
    if epoch is not None:
        return email.utils.format_datetime(datetime.datetime.fromtimestamp(epoch, datetime.UTC)), epoch
    try:
        when = email.utils.parsedate_to_datetime(get(last, "Date") or "") + datetime.timedelta(seconds=1)
    except (TypeError, ValueError):
        raise ReasonError("not-a-source", f"{dsc}: the last changelog entry has no date") from None
    return email.utils.format_datetime(when), int(when.timestamp())


def entry(source: str, version: str, distribution: str, maintainer: str, date: str) -> str:
    return f"{source} ({version}) {distribution}; urgency=medium\n\n{ENTRY_TEXT}\n -- {maintainer}  {date}\n\n"


# --- the derived source ----------------------------------------------------------------------


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """The modes dpkg-source unpacks with, hence those the new tarball records."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _place(src: Path, work: Path) -> None:
    """A file the .dsc lists beside the tree, where dpkg-source -b looks for the
    upstream tarballs; the others, named after the old version, are left behind with
    the work directory. A copy: the output's upstream tarballs are no other names of
    the input's."""
    shutil.copyfile(src, work / src.name)


def _check_outputs(outdir: Path, names: list[str]) -> None:
    """hugify writes over a regular file or a new name only."""
    for name in names:
        try:
            st = os.stat(outdir / name, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise files.UnsafeFile("not-regular", str(outdir / name), f"{files.describe(st.st_mode)}, not a file")


def _move_all(work: Path, outdir: Path, names: list[str]) -> list[Path]:
    """The files renamed from `work` into `outdir`, in order; on failure, those of
    them that were new names are removed again."""
    placed: list[str] = []
    with files.Directory.open(outdir, follow=True) as dest, files.Directory.open(work, follow=False) as made:
        try:
            for name in names:
                new = dest.identity_of(name) is None
                os.replace(name, name, src_dir_fd=made.fd, dst_dir_fd=dest.fd)
                if new:
                    placed.append(name)
        except BaseException:
            for name in placed:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dest.fd)
            raise
    return [outdir / n for n in names]


def _dpkg_source(step: str, args: list[str], work: Path, env: dict[str, str], *, failure: str, dsc: Path) -> None:
    """dpkg-source STEP ARGS run quietly in `work` (its info lines off, so that its
    error is its last line); ReasonError `failure` with that error when it fails."""
    try:
        tool(["dpkg-source", "-q", step, *args], cwd=work, env=env)
    except RepackError as e:
        why = e.detail.removeprefix("dpkg-source -q: ").removeprefix("dpkg-source: error: ")
        raise ReasonError(failure, f"{dsc}: dpkg-source {step}: {why}") from None


def derive(opts: Options) -> Derived:
    """Writes the derived source into opts.outdir; ReasonError or OSError when refused
    or failed, with nothing written there."""
    fields = read_dsc(opts.dsc)
    if shutil.which("dpkg-source") is None:
        raise ReasonError("tool-failed", "dpkg-source is not installed (it is in dpkg-dev)")
    if not opts.outdir.is_dir():  # the caller's to make, as for every output of hugify
        raise FileNotFoundError(errno.ENOENT, "no such directory for the derived source", str(opts.outdir))
    with _umask(0o022), tempfile.TemporaryDirectory(prefix=".hugify-derive-", dir=opts.outdir) as tmp:
        work = Path(tmp).absolute()
        env = {**os.environ, "LC_ALL": "C.UTF-8", "TZ": "UTC"}
        unpack = ["--require-strong-checksums", str(opts.dsc.absolute()), "tree"]
        _dpkg_source("-x", unpack, work, env, failure="source-corrupt", dsc=opts.dsc)
        tree = work / "tree"
        control = checked_control(tree, opts.dsc)
        last = last_entry(tree, opts.dsc)
        source, version = get(last, "Source") or "", get(last, "Version") or ""
        new = version + opts.suffix
        if not Deb().sorts_above(version, new):
            raise ReasonError("suffix-not-higher", f"{opts.dsc}: {new} does not sort above {version}")
        date, epoch = entry_date(last, opts.dsc)
        distribution = opts.distribution or get(last, "Distribution") or "unstable"
        changelog = tree / "debian" / "changelog"
        (tree / "debian" / "control").write_text(with_sequence(control))
        changelog.write_text(entry(source, new, distribution, opts.maintainer, date) + changelog.read_text())
        # What hugify wrote is as old as the entry, whatever the clock says.
        for p in (tree / "debian" / "control", changelog, tree / "debian"):
            os.utime(p, (epoch, epoch))
        for name in listed_names(fields):
            _place(opts.dsc.parent / name, work)
        # Named as dpkg-source -x names it (a native tarball and a 1.0 diff carry the name).
        without_epoch = new.split(":", 1)[-1]
        tree = tree.rename(work / f"{source}-{without_epoch.rsplit('-', 1)[0]}")
        build_env = {**env, "SOURCE_DATE_EPOCH": str(epoch)}
        _dpkg_source("-b", ["--threads-max=1", tree.name], work, build_env, failure="tool-failed", dsc=opts.dsc)
        made = work / f"{source}_{without_epoch}.dsc"
        names = [*listed_names(parse_control(made.read_text())), made.name]
        _check_outputs(opts.outdir, names)
        written = _move_all(work, opts.outdir, names)
    return Derived(opts.outdir / made.name, source, new, tuple(written))
