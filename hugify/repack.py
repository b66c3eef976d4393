"""``hugify repack``: rewrites the ELF files of already built .deb and .rpm packages.

For software nobody can rebuild (vendors' packages, a distribution's archive) the
package itself is the input. Each package is unpacked into a work directory,
`hugify tree` transforms its files under the policy (stripped files allowed:
archive binaries are stripped), the runtime manifest and, when the policy signs,
the signed statement are added, and the package is rebuilt by its own format's
tool with everything else kept: name, architecture, relationships, maintainer
scripts, triggers, conffiles, modes and owners. The version gets a suffix so the
package manager sees an upgrade, and a field names the original version.

A debug package given with its main package (-dbgsym, -debuginfo) is repacked
too: each separate debug file is joined with the original stripped file
(eu-unstrip), that whole file is transformed with the same mode as the shipped
one by the same core (so its DWARF, symbols and headers move by the same plan,
which is checked), and the debug part is split off again (objcopy
--only-keep-debug) under the flipped build-id.

Everything is written into a temporary directory inside the output directory and
renamed into place at the end: on any failure nothing is left in the output.
The format handlers are hugify.repack_deb and hugify.repack_rpm; what they share
with this module is in hugify.repack_package.
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from hugify import debugfiles, files, manifest, reasons, repack_deb, repack_rpm, signing, tree
from hugify.exitcodes import Exit
from hugify.files import source_date_epoch
from hugify.policy import Layers, Policy, PolicyError, Setting, load, resolve
from hugify.repack_package import Context, Package, RepackError, add_file
from hugify.sizes import human


class Format(Protocol):
    """What a package format provides (hugify.repack_deb, hugify.repack_rpm)."""

    name: str
    default_suffix: str

    def unpack(self, src: Path, work: Path) -> Package: ...

    def new_version(self, pkg: Package, suffix: str) -> str: ...

    def sorts_above(self, old: str, new: str) -> bool:
        """Whether the format's package manager takes `new` as newer than `old`."""
        ...

    def build(self, pkg: Package, ctx: Context, outdir: Path) -> Path:
        """Writes the rebuilt package into outdir; its path."""
        ...


def format_of(path: Path) -> Format:
    """The format handler for a file, by its magic bytes."""
    try:
        with path.open("rb") as f:
            magic = f.read(8)
    except OSError as e:
        raise RepackError("not-a-package", f"cannot read it: {reasons.io_detail(e, with_file=False)}") from e
    if magic == b"!<arch>\n":
        return repack_deb.Deb()
    if magic[:4] == b"\xed\xab\xee\xdb":
        return repack_rpm.Rpm()
    raise RepackError("not-a-package", "neither a .deb (ar archive) nor an .rpm (lead magic)")


# --- the run -------------------------------------------------------------------------


@dataclass
class Options:
    packages: list[Path]
    outdir: Path
    #: A policy file layered over the system ones; each package gets its own
    #: effective policy ([packages.NAME]).
    policy: Path | None = None
    suffix: str | None = None
    dry_run: bool = False
    jobs: int = 1
    out: TextIO | None = None


def _unusable(e: PolicyError, package: str | None = None) -> RepackError:
    """A policy's problems in one line."""
    problems = "; ".join(
        f"{p.file}{f':{p.line}' if p.line else ''}: {p.message}{f' (hint: {p.hint})' if p.hint else ''}"
        for p in e.problems
    )
    return RepackError("bad-policy", f"the policy is not usable{f' for {package}' if package else ''}: {problems}")


def _resolve(layers: Layers, package: str | None) -> Policy:
    try:
        return resolve(layers, package)
    except PolicyError as e:
        raise _unusable(e, package) from None


def load_policy(extra: Path | None) -> Layers:
    """The policy layers, checked as a whole before any package is looked at."""
    try:
        layers = load(extra)
    except PolicyError as e:
        raise _unusable(e) from None
    _resolve(layers, None)
    return layers


def repack_policy(layers: Layers, package: str) -> Policy:
    """The package's policy with stripped files allowed: an archive's binaries are
    stripped (a package build runs hugify before strip; here strip has long run)."""
    pol = _resolve(layers, package)
    settings = dict(pol.settings)
    settings[("refuse_stripped",)] = Setting(False, "hugify repack (archive binaries are stripped)")
    return Policy(settings, package)


def run(opts: Options) -> Exit:
    out = opts.out or sys.stdout
    try:
        layers = load_policy(opts.policy)
        opts.outdir.mkdir(exist_ok=True)  # DIR itself, never its parents (a mistyped path is an error)
        with tempfile.TemporaryDirectory(prefix=".hugify-repack-", dir=opts.outdir) as tmp:
            work = Path(tmp).absolute()  # rpmbuild runs its steps elsewhere
            built = _repack_all(opts, layers, work, out)
            if opts.dry_run:
                print("hugify: dry run: nothing written", file=out)
                return Exit.OK
            names = [f.name for f in built]
            if len(set(names)) != len(names):
                twice = sorted({n for n in names if names.count(n) > 1})
                raise RepackError("not-a-package", f"the same package given twice: {', '.join(twice)}")
            with files.Directory.open(opts.outdir, follow=True) as dest:
                for f in built:
                    with files.Directory.open(f.parent, follow=False) as made:
                        os.replace(f.name, f.name, src_dir_fd=made.fd, dst_dir_fd=dest.fd)
                    print(f"hugify: wrote {opts.outdir / f.name}", file=out)
    except (RepackError, OSError) as e:
        return reasons.report(e)
    return Exit.OK


def _in(src: Path, e: RepackError) -> RepackError:
    return RepackError(e.reason, f"{src}: {e.detail}")


def _repack_all(opts: Options, layers: Layers, work: Path, out: TextIO) -> list[Path]:
    pkgs: list[tuple[Format, Package]] = []
    for i, src in enumerate(opts.packages):
        try:
            fmt = format_of(src)
            pkgs.append((fmt, fmt.unpack(src, work / f"p{i}")))
        except RepackError as e:
            raise _in(src, e) from None
    # By name and architecture: one call may hold a package for two architectures.
    mains = {(p.name, p.arch): p for _, p in pkgs if p.debug_of is None}
    for _, p in pkgs:
        if p.debug_of is not None and (p.debug_of, p.arch) not in mains:
            raise RepackError("debug-without-main", f"{p.src}: {p.name} describes {p.debug_of}, which is not given")
    epoch = source_epoch([p for _, p in pkgs])
    suffix_of = {fmt.name: opts.suffix or fmt.default_suffix for fmt, _ in pkgs}
    versions = {p.name: (p.version, fmt.new_version(p, suffix_of[fmt.name])) for fmt, p in pkgs}
    for fmt, p in pkgs:
        old, new = versions[p.name]
        if not fmt.sorts_above(old, new):
            raise RepackError(
                "suffix-not-higher",
                f"{p.src}: {p.name} {new} does not sort above {old}: the suffix {suffix_of[fmt.name]!r} lowers it",
            )
    for fmt, p in pkgs:
        if p.debug_of is None:
            try:
                _transform(p, repack_policy(layers, p.name), opts, epoch, discovered=fmt.name == "rpm")
            except RepackError as e:
                raise _in(p.src, e) from None
    for _, p in pkgs:
        if p.debug_of is not None:
            try:
                with _dir_times(p.root, epoch):
                    debugfiles.repack(p, mains[(p.debug_of, p.arch)])
            except RepackError as e:
                raise _in(p.src, e) from None
    for _, p in pkgs:
        for line in p.log:
            print(line, file=out)
    print(summary_table([p for _, p in pkgs]), file=out)
    if opts.dry_run:
        return []
    built = []
    for fmt, p in pkgs:
        ctx = Context(suffix_of[fmt.name], versions, epoch)
        try:
            built.append(fmt.build(p, ctx, work / "out"))
        except RepackError as e:
            raise _in(p.src, e) from None
    return built


def source_epoch(pkgs: list[Package]) -> int:
    """The time stamp of everything hugify adds: $SOURCE_DATE_EPOCH, else the
    newest time stamp of the input packages' files (so the output depends on the
    inputs alone)."""
    given = source_date_epoch()
    if given is not None:
        return given
    newest = 0
    for p in pkgs:
        for _, st in tree.walk(p.root):
            newest = max(newest, int(st.st_mtime))
    return newest


def _transform(pkg: Package, pol: Policy, opts: Options, epoch: int, discovered: bool) -> None:
    """Runs `hugify tree` on the package's files, keeping a hard link to each ELF
    file's original (debug files are matched with those), then adds the manifest
    and, when the policy signs, the signed statement. `discovered`: the format's
    hugified files are found at installation without a manifest (rpm)."""
    found = tree.candidates(pkg.root)
    # A FIFO or device node the package ships is a candidate only to be reported.
    if all(c.refusal and c.refusal[0] == "not-regular" for c in found):
        raise RepackError("no-elf-file", f"{pkg.name} holds no ELF executable or shared object")
    # Beside the package's own root: two packages may share a name (two architectures).
    scratch = pkg.root.parent
    keep = scratch / "originals"
    keep.mkdir()
    for n, c in enumerate(found):
        if c.refusal and c.refusal[0] == "not-regular":
            continue
        os.link(c.files[0], keep / str(n), follow_symlinks=False)
        for path in c.paths:
            pkg.originals[path] = keep / str(n)
    listing, report = scratch / "manifest.list", scratch / "report.json"
    log = io.StringIO()
    topts = tree.Options(
        root=pkg.root,
        policy=pol,
        jobs=opts.jobs,
        arch=pkg.arch,
        manifest=listing,
        report=report,
        out=log,
        found=found,
    )
    with _dir_times(pkg.root, epoch):
        code = tree.run(topts)
        pkg.log = log.getvalue().splitlines()
        pkg.report = tree.read_report(report)
        if code != Exit.OK:
            failed = [f for f in pkg.report["files"] if f["status"] == "failed"]
            raise RepackError("files-failed", f"{len(failed)} file(s) failed and the policy says on_error = fail")
        if not any(f["status"] in ("transformed", "as-is") for f in pkg.report["files"]):
            why = "; ".join(sorted({f"{f['reason']}" for f in pkg.report["files"]}))
            raise RepackError("all-refused", f"no ELF file of {pkg.name} was transformed ({why})")
        _refuse_no_op(pkg, discovered)
        if manifest.parse(listing.read_text(encoding="utf-8"), str(listing)):
            dest = pkg.root / manifest.MANIFEST_DIR.relative_to("/") / pkg.manifest_name
            add_file(pkg.root, dest, listing.read_bytes(), epoch)
        _sign(pkg, pol, report, epoch)


def _refuse_no_op(pkg: Package, discovered: bool) -> None:
    """Refuses a package the repack would not change (already-hugified): no file was
    transformed, only listed as it is, and the manifest is there already (the package
    ships one) or is not needed (`discovered`: an rpm, whose hugified files hugify's
    file triggers list at installation, docs/manifest.md)."""
    assert pkg.report is not None
    if any(f["status"] == "transformed" for f in pkg.report["files"]):
        return
    shipped = sorted((pkg.root / manifest.MANIFEST_DIR.relative_to("/")).glob("*.list"))
    if not (shipped or discovered):
        return  # the repack adds the manifest the runtime needs
    as_is = sum(f["status"] == "as-is" for f in pkg.report["files"])
    has = (
        f"ships {'/' + shipped[0].relative_to(pkg.root).as_posix()}"
        if shipped
        else "is an rpm (hugify's file triggers list its hugified files at installation)"
    )
    raise RepackError(
        "already-hugified",
        f"{pkg.name} {pkg.version}: no ELF file would change ({as_is} already on whole huge-page windows: "
        f"built with hugify) and it {has}; a repack would be a no-op upgrade",
    )


def _sign(pkg: Package, pol: Policy, report: Path, epoch: int) -> None:
    """The signed statement (docs/signing.md) when the policy signs at all."""
    if pol.signing("mode") == "off":
        return
    assert pkg.report is not None
    req = signing.SignRequest(
        root=pkg.root,
        report=pkg.report,
        name=pkg.name,
        mode=pol.signing("mode"),
        mode_where=pol.where("signing", "mode"),
        key=pol.signing("key"),
        key_where=pol.where("signing", "key"),
        tlog_upload=pol.signing("tlog_upload"),
        install=True,
        output=None,
        file_list=None,
        stem=pkg.stem,
    )
    if not signing.sign(req, pkg.log.append):
        raise RepackError("tool-failed", f"signing the statement of {pkg.name} failed (signing.mode = required)")
    for f in (pkg.root / "usr/share/hugify/attestations").glob(f"{glob.escape(pkg.stem)}.*"):
        os.utime(f, (epoch, epoch), follow_symlinks=False)


@contextlib.contextmanager
def _dir_times(root: Path, epoch: int) -> Iterator[None]:
    """Puts back the time stamps of the directories of root after changes in them;
    directories made meanwhile get `epoch`."""
    before = {Path(d): os.stat(d).st_mtime_ns for d, _, _ in os.walk(root)}
    yield
    for d, _, _ in os.walk(root):
        ns = before.get(Path(d), epoch * 1_000_000_000)
        os.utime(d, ns=(ns, ns), follow_symlinks=False)


# --- the summary -----------------------------------------------------------------------


def summary_table(pkgs: list[Package]) -> str:
    """Per package: files transformed / listed as is / skipped (by reason), the
    size growth and the code on huge pages predicted."""
    rows = [("package", "transformed", "as is", "skipped", "growth", "code on huge pages")]
    reasons: list[str] = []
    names = [p.name for p in pkgs]
    for p in pkgs:
        label = f"{p.name}:{p.arch}" if names.count(p.name) > 1 else p.name
        if p.report is None:
            ids = f"{len(p.renamed_ids)} debug file(s) moved"
            rows.append((label, ids, "", "", "", ""))
            continue
        files = p.report["files"]
        done = [f for f in files if f["status"] == "transformed"]
        skipped = [f for f in files if f["status"] in ("skipped", "failed")]
        code = sum(f.get("code_bytes", 0) for f in done)
        covered = sum(f.get("covered_code", 0) for f in done)
        rows.append(
            (
                label,
                str(len(done)),
                str(sum(f["status"] == "as-is" for f in files)),
                str(len(skipped)),
                human(sum(f.get("growth", 0) for f in done)),
                f"{100 * covered / code:.1f}% of {human(code)}" if code else "-",
            )
        )
        for f in skipped:
            reasons.append(f"  {label}: {f['path']}: {f['status']} ({f['reason']}): {f['detail']}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(["hugify: repack summary", *lines, *(["not transformed:", *reasons] if reasons else [])])
