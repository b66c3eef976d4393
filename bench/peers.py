"""The ways bench/speedup.py measures beside hugify's own (`--ways`): each a
hugify.trial.ways.Way, planned once the first run has found the objects under test
(bench/README.md, "The ways").

* ``hugifyr``: the Hugifier paper's artifact rewrites each object (where it refuses
  one, the original stays, and the column says so); its runtime tcollapse.so in
  LD_PRELOAD collapses the code with MADV_COLLAPSE at start-up. tcollapse skips every
  file on a filesystem outside its list (XFS, EROFS, NFS, ...; not ext4, not tmpfs), so
  where the comparison's own files are not on one, its rewrites go on an XFS image on a
  loop device, mounted in the comparison's own mount namespace (root only).
* ``iodlr``: Intel's liblppreload.so in LD_PRELOAD over the original files: it copies
  the code of the program and its libraries into anonymous memory advised with
  MADV_HUGEPAGE.
* ``glibc-hugified``, ``glibc-original``: glibc's own advice, GLIBC_TUNABLES=
  glibc.elf.thp=1 with Debian's glibc 2.44 (the first with the tunable) shown over
  the system's glibc in the side's namespace (the root that side sees is its own;
  nothing of the system changes), over copies of hugify's files and over copies of
  the originals. Copies of their own, so that their page cache holds what the tunable
  and their own runs made of it (glibc's advice works on a cold start: the first run
  after the copies are evicted), not what another way's runs left there.
* ``relink``, ``relink-glibc`` (the iTLB program only): the program relinked with
  `-z max-page-size=0x200000 -z common-page-size=0x200000` (the "just relink" answer),
  alone and with glibc's advice.

The peers are built from their sources into the test cache (testkit/peers.py). Every
prepared input of the benchmark (a workload's unpacked packages, a peer's build, the
iTLB program) goes through Fixtures, which writes down where it is, so that a bundle
(bench/speedup.py --bundle) finds it again where there is no archive, no compiler and
no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from hugify.trial.ways import AS_LEFT, HUGIFY, HUGIFY_SHARED, READAHEAD, Context, Plan, Way, WayUnavailable
from testkit import peers

HUGIFYR, IODLR = "hugifyr", "iodlr"
GLIBC_HUGIFIED, GLIBC_ORIGINAL = "glibc-hugified", "glibc-original"
RELINK, RELINK_GLIBC = "relink", "relink-glibc"
#: Every way, in the order of the table's columns.
ALL = (HUGIFY, HUGIFY_SHARED, HUGIFYR, IODLR, GLIBC_HUGIFIED, GLIBC_ORIGINAL, RELINK, RELINK_GLIBC)
TUNABLE = "glibc.elf.thp=1"
#: statfs f_type of the filesystems tcollapse.c collapses files on (its list).
TCOLLAPSE_FILESYSTEMS = {"xfs", "afs", "bcachefs", "erofs", "nfs", "smb2", "cifs", "zonefs"}
#: mkfs.xfs makes no smaller filesystem.
XFS_MIN = 300 << 20


class Fixtures:
    """Where the benchmark's prepared inputs are, by name: made here on first use and
    written down (`paths`), or, in a bundle, only read from what was written down."""

    def __init__(self, bundled: dict[str, str] | None = None) -> None:
        self.bundled = bundled is not None
        self.paths: dict[str, str] = dict(bundled or {})

    def get(self, name: str, make: Callable[[], Path]) -> Path:
        """The input `name`, made by `make` unless known. In a bundle, LookupError
        (its message says why) where the bundle has none."""
        if name in self.paths:
            return Path(self.paths[name])
        if self.bundled:
            raise LookupError(f"{name} is not in the bundle (prepare it with --bundle and the same --only, --ways)")
        path = make()
        self.paths[name] = str(path)
        return path


#: The benchmark's inputs (bench/speedup.py replaces it with a bundle's).
FIXTURES = Fixtures()


def _peer(get: Callable[[], Path]) -> Path:
    try:
        return get()
    except (peers.PeerUnavailable, LookupError) as e:
        raise WayUnavailable(str(e)) from None


def _built(name: str, build: Callable[[], peers.Built]) -> peers.Built:
    return peers.Built(_peer(lambda: FIXTURES.get(f"peer:{name}", lambda: build().dir)))


def _preload(ctx: Context, library: Path) -> dict[str, str]:
    have = ctx.env.get("LD_PRELOAD", "")
    return {"LD_PRELOAD": f"{library}:{have}" if have else str(library)}


def _filesystem(path: Path) -> str:
    res = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=False)
    return res.stdout.strip()


def _on_xfs(ctx: Context, files: dict[str, Path]) -> dict[str, Path]:
    """`files` (path -> file) on an XFS image mounted in the comparison's own mount
    namespace, the mount detached with the comparison's; path -> the file there."""
    if ctx.mounts is None:
        raise WayUnavailable(
            "its runtime collapses code only on XFS and a few other filesystems, not on "
            f"{_filesystem(ctx.scratch)}: an XFS image needs root to be mounted"
        )
    image, where = ctx.scratch / "xfs.img", ctx.scratch / "xfs"
    size = max(XFS_MIN, sum(os.stat(f).st_size for f in files.values()) * 5 // 4 + (64 << 20))
    with image.open("wb") as f:
        f.truncate(size)
    where.mkdir()
    for argv in (["mkfs.xfs", "-q", "-f", str(image)], ["mount", "-o", "loop", str(image), str(where)]):
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise WayUnavailable(f"`{' '.join(argv[:2])}` failed: {res.stderr.strip()[-200:]}")
    ctx.mounts.mounted.append(where)
    out = {}
    for n, (target, source) in enumerate(sorted(files.items())):
        (where / str(n)).mkdir()
        dst = where / str(n) / Path(target).name
        shutil.copyfile(source, dst)
        os.chmod(dst, os.stat(source).st_mode & 0o555)
        out[target] = dst
    os.sync()
    return out


def _hugifyr(ctx: Context) -> Plan:
    built = _built("hugifyr", peers.hugifyr)
    tool, runtime = _peer(lambda: built.file("hugifyr")), _peer(lambda: built.file("tcollapse.so"))
    rewritten: dict[str, Path] = {}
    objects: dict[str, str] = {}
    for o in ctx.objects:
        out = peers.hugifyr_output(tool, Path(o.original))
        if isinstance(out, Path):
            rewritten[o.original] = out
            objects[o.original] = "rewritten by hugifyr"
        else:
            objects[o.original] = f"refused by hugifyr ({out}): the original"
    if not rewritten:
        raise WayUnavailable(f"hugifyr refused every object: {'; '.join(sorted(set(objects.values())))}")
    notes = []
    fs = _filesystem(ctx.scratch)
    if fs in TCOLLAPSE_FILESYSTEMS:
        plan = Plan(copies=rewritten)
    else:
        plan = Plan(binds=_on_xfs(ctx, rewritten))
        notes.append(f"hugifyr's rewrites on an XFS image: tcollapse.so collapses no file on {fs}")
    plan.env = _preload(ctx, runtime)
    plan.page_cache = AS_LEFT  # tcollapse evicts and refaults the code itself
    plan.objects, plan.notes = objects, notes
    return plan


def _iodlr(ctx: Context) -> Plan:
    library = _peer(lambda: _built("iodlr", peers.iodlr).file("liblppreload.so"))
    objects = {o.original: "the original, its code copied to anonymous huge pages" for o in ctx.objects}
    return Plan(env=_preload(ctx, library), page_cache=READAHEAD, objects=objects)


def _glibc(ctx: Context) -> tuple[dict[str, Path], dict[str, str], list[str]]:
    """glibc 2.44's files over the system's (path -> file), the tunable, a note."""
    root = _peer(lambda: FIXTURES.get("peer:glibc", peers.glibc_files))
    binds: dict[str, Path] = {}
    missing = []
    for f in sorted((root / "usr" / "lib").rglob("*")):
        if f.is_symlink() or not f.is_file():
            continue
        target = Path("/") / f.relative_to(root)
        if target.exists():
            binds[os.path.realpath(target)] = f
        else:
            missing.append(str(target))
    if not any(Path(t).name.startswith("ld-linux") for t in binds):
        raise WayUnavailable(f"no ld.so in {root}")
    have = ctx.env.get("GLIBC_TUNABLES", "")
    env = {"GLIBC_TUNABLES": f"{have}:{TUNABLE}" if have else TUNABLE}
    note = f"glibc 2.44 ({root.name}) over the system's: {len(binds)} files"
    if missing:
        note += f"; {len(missing)} not on this system, left out ({', '.join(Path(m).name for m in missing[:3])}...)"
    return binds, env, [note]


def _glibc_over(which: str) -> Callable[[Context], Plan]:
    def plan(ctx: Context) -> Plan:
        binds, env, notes = _glibc(ctx)
        if which == "hugified":
            copies = {o.original: o.hugified for o in ctx.objects}
            objects = {o.original: "a copy of hugify's copy" for o in ctx.objects}
        else:
            copies = {o.original: Path(o.original) for o in ctx.objects}
            objects = {o.original: "a copy of the original" for o in ctx.objects}
        return Plan(binds=binds, copies=copies, env=env, page_cache=AS_LEFT, objects=objects, notes=notes)

    return plan


def _relink(relinked: Callable[[], dict[str, Path]], glibc: bool) -> Callable[[Context], Plan]:
    def plan(ctx: Context) -> Plan:
        programs = relinked()
        copies = {o.original: programs[o.original] for o in ctx.objects if o.original in programs}
        if not copies:
            raise WayUnavailable("the workload's programs come linked from Debian's packages: nothing to relink")
        objects = {o: "relinked with -z max-page-size=0x200000 -z common-page-size=0x200000" for o in copies}
        if not glibc:
            return Plan(copies=copies, page_cache=READAHEAD, objects=objects)
        binds, env, notes = _glibc(ctx)
        return Plan(binds=binds, copies=copies, env=env, page_cache=AS_LEFT, objects=objects, notes=notes)

    return plan


def ways(names: list[str], relinked: Callable[[], dict[str, Path]] = dict) -> list[str | Way]:
    """The ways of `names` (of ALL) for hugify.trial.ways; `relinked` gives, for the
    relink ways, original -> its relinked file."""
    made: dict[str, str | Way] = {
        HUGIFY: HUGIFY,
        HUGIFY_SHARED: HUGIFY_SHARED,
        HUGIFYR: Way(
            HUGIFYR, "hugifyr's rewrite (the Hugifier paper's artifact), tcollapse.so in LD_PRELOAD", _hugifyr
        ),
        IODLR: Way(IODLR, "iodlr's liblppreload.so in LD_PRELOAD over the originals", _iodlr),
        GLIBC_HUGIFIED: Way(
            GLIBC_HUGIFIED, f"glibc 2.44, GLIBC_TUNABLES={TUNABLE}, over hugify's files", _glibc_over("hugified")
        ),
        GLIBC_ORIGINAL: Way(
            GLIBC_ORIGINAL, f"glibc 2.44, GLIBC_TUNABLES={TUNABLE}, over the originals", _glibc_over("original")
        ),
        RELINK: Way(RELINK, "relinked with 2 MiB segment alignment", _relink(relinked, glibc=False)),
        RELINK_GLIBC: Way(
            RELINK_GLIBC, f"relinked, glibc 2.44 with GLIBC_TUNABLES={TUNABLE}", _relink(relinked, glibc=True)
        ),
    }
    return [made[n] for n in names]
