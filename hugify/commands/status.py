"""``hugify status [--json]``: the installed hugified files, how much of their code is
in huge-page folios right now, and the system settings that decide it. `gather` finds
it all in one pass; `as_json` and `print_text` only render what it found."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugify import reasons
from hugify.commands.common import add_json_option, epilog, print_json
from hugify.docs import doc
from hugify.exitcodes import Exit

if TYPE_CHECKING:
    from hugify.anoncopies import Copy
    from hugify.engine import Engine
    from hugify.glibc_thp import Advice
    from hugify.kernel import Mount
    from hugify.prefetch import Prefetcher, System, Target
    from hugify.shared import Held, Removed


def _yes(v: bool | None, unknown: str = "unknown") -> str:
    return unknown if v is None else "yes" if v else "no"


@dataclass
class Found:
    """What `hugify status` found: the system, the files' coverage, the copies."""

    hp: int  # the huge-page size measured (the PMD size)
    system: System
    features: dict[str, bool | None]
    cannot_measure: bool  # this process cannot see what is cached (coverage unknown)
    targets: list[Target]  # measured and closed
    problems: list[str]  # the manifests that could not be read
    copies: list[Copy]
    held: list[Held]
    removed: list[Removed]
    shared_dir: Path
    thp_advice: Advice
    no_large: list[dict[str, Any]]  # filesystems recorded as giving no large folios
    files_no_large: list[dict[str, Any]]  # files recorded so where their filesystem may
    ways: list[Way]  # what each filesystem holding programs gives hugified code
    may_record: bool  # this process is root's, who keeps records: what "unknown" means


# --- what this machine gets ------------------------------------------------------------

#: Where programs and libraries are installed: the filesystems `status` judges, with
#: those of the directories in PATH and of the files it reports.
PROGRAM_DIRS = (
    "/usr/bin",
    "/usr/sbin",
    "/usr/lib",
    "/usr/lib64",
    "/usr/libexec",
    "/usr/local/bin",
    "/usr/local/lib",
    "/opt",
)
#: The kernel release the verdicts are judged for, in place of this kernel's: the
#: tests' seam for kernels the machine cannot boot (ext4 before 6.16 on a 6.18 host).
RELEASE_ENV = "HUGIFY_FORCE_KERNEL_RELEASE"
#: The ways hugified code can get huge pages, best first (docs/runtime.md).
FILE_BACKED, SHARED, ANONYMOUS, NONE, UNKNOWN = (
    "file-backed huge pages",
    "shared copies",
    "anonymous only",
    "none",
    "unknown",
)


@dataclass(frozen=True)
class Way:
    """What hugified code on one mounted filesystem gets on this machine, and why."""

    mountpoint: str
    fstype: str
    device: str
    way: str  # FILE_BACKED, SHARED, ANONYMOUS, NONE or UNKNOWN
    why: str
    holds: tuple[str, ...]  # the program directories (or files) it holds

    def as_json(self) -> dict[str, Any]:
        return {
            "mountpoint": self.mountpoint,
            "type": self.fstype,
            "device": self.device,
            "way": self.way,
            "why": self.why,
            "holds": list(self.holds),
        }


@dataclass(frozen=True)
class Evidence:
    """What the machine showed, per mount point: root's records of this boot that its
    files got no large folios, and windows seen in 2 MiB folios now."""

    recorded_none: frozenset[str] = frozenset()
    seen_huge: frozenset[str] = frozenset()


def program_filesystems(mounted: list[Mount], files: list[str]) -> dict[Mount, list[str]]:
    """The mounted filesystems that hold programs: those of PROGRAM_DIRS, of PATH's
    directories and of `files`, each with what it holds, in mount-point order."""
    from hugify import kernel

    places = [*PROGRAM_DIRS, *os.environ.get("PATH", "").split(":"), *files]
    out: dict[Mount, list[str]] = {}
    for place in places:
        if not place or not os.path.exists(place):
            continue
        fs = kernel.mount_holding(place, mounted)
        if fs is not None and place not in out.setdefault(fs, []):
            out[fs].append(place)
    return dict(sorted(out.items(), key=lambda kv: kv[0].mountpoint))


def _shared_or_anonymous(s: System, shared_policy: str, none_because: str) -> tuple[str, str]:
    """Where files get no large folios: root's shared copies, unless they are off, else
    the opt-in anonymous copies."""
    if shared_policy == "off":
        off = 'shared copies are off (policy runtime.shared = "off")'
    elif s.shmem_enabled == "deny":
        off = "shared copies cannot be huge (transparent_hugepage/shmem_enabled is deny)"
    else:
        return SHARED, (
            f"{none_because}; root's shared copies take their place: one copy of each hugified file on a "
            "huge-page tmpfs, made by the boot service and mapped by every process"
        )
    return ANONYMOUS, (
        f"{none_because}; {off}; per program, opt in to anonymous copies (a copy in each process): "
        "hugify-run --anonymous PROGRAM, or the policy's [runtime] anonymous"
    )


def judge(
    fs: Mount, holds: list[str], *, s: System, release: str, engine: Engine, shared_policy: str, seen: Evidence
) -> Way:
    """What hugified code on `fs` gets on this machine: from the kernel's THP settings,
    its version (`release`) and the filesystem's type and options (the runtime's table
    of large folios, hugify.kernel), and from what was seen this boot."""
    from hugify import kernel

    def way(kind: str, why: str) -> Way:
        return Way(fs.mountpoint, fs.fstype, fs.device, kind, why, tuple(holds))

    if s.thp_enabled is None:
        return way(NONE, "this kernel has no transparent huge pages (CONFIG_TRANSPARENT_HUGEPAGE is off)")
    if s.thp_enabled == "never":
        return way(NONE, f"transparent huge pages are off ({kernel.THP}/enabled is never): no huge page of any kind")
    if fs.fstype in ("tmpfs", "ramfs"):
        huge = fs.huge
        if huge in ("within_size", "always"):
            return way(FILE_BACKED, f"a tmpfs mounted huge={huge}: its files are held in huge pages as written")
        return way(NONE, f"a {fs.fstype} holds its files in memory as written (huge={huge}: small pages)")
    if fs.mountpoint in seen.seen_huge:
        return way(FILE_BACKED, "seen: windows of its hugified files are in 2 MiB folios now")
    large = kernel.gives_large_folios(engine, fs.fstype, release)
    if large is None:
        return way(
            UNKNOWN,
            f"hugify does not know whether {fs.fstype} gives files large folios; a prefetch finds out on its "
            "files, and where it gives none, root's shared copies take their place",
        )
    if fs.mountpoint in seen.recorded_none:
        why = (
            f"root's record of this boot says {fs.fstype} gave two of its files no large folios "
            "(`hugify prefetch --clear-records` forgets it)"
        )
        return way(*_shared_or_anonymous(s, shared_policy, why))
    if not large:
        remedy = kernel.large_folios_remedy(engine, fs.fstype, release)
        why = f"{fs.fstype} gives files no large folios on Linux {release}; {remedy}"
        return way(*_shared_or_anonymous(s, shared_policy, why))
    if fs.fstype == "ext4" and "data=journal" in fs.options:
        why = "ext4 mounted data=journal gives its files no large folios (ext4 decides per file from Linux 6.16)"
        return way(*_shared_or_anonymous(s, shared_policy, why))
    since = kernel.large_folios_since(engine, fs.fstype)
    return way(
        FILE_BACKED,
        f"{fs.fstype} gives files large folios from Linux {since // 1000}.{since % 1000}, and this kernel is "
        f"{release}: the boot service loads hugified code as 2 MiB folios, shared by every process",
    )


def gather(r: Prefetcher, targets: list[Target], problems: list[str]) -> Found:
    """Measures `targets` and reads the system's settings, records and copies; reads
    nothing into the page cache."""
    from hugify import anoncopies, glibc_thp, kernel, rundir, shared
    from hugify import prefetch as pf
    from hugify.engine import HUGE, LOADED, REPAIRED, Engine

    s = r.system
    features = {
        "cachestat": s.cachestat,
        "pagemap_scan": r.engine.has(Engine.PAGEMAP_SCAN),
        "exec_pmd_readahead": s.exec_pmd_readahead,
        "read_only_thp_for_fs": kernel.kernel_config("CONFIG_READ_ONLY_THP_FOR_FS"),
    }
    cannot_measure = s.process_thp_disabled
    copies = anoncopies.running_copies(r.hp)
    held, removed = shared.inventory(r.rdir, r.engine, r.hp)
    reasons.printed(h.problem[0] for h in held if h.problem)
    work = pf.open_targets(targets, r.hp)
    try:
        if not cannot_measure:
            r.measure(work)  # a window seen huge drops a record that said otherwise
    finally:
        pf.close_targets(work)
    thp_advice = glibc_thp.advise([t.path for t in work], r.hp, s.thp_enabled, r.engine)
    records = rundir.without_large_folios(r.engine, r.rdir)
    no_large = [
        {
            "device": fs.device,
            "type": fs.fstype,
            "mountpoint": fs.mountpoint,
            "remedy": kernel.large_folios_remedy(r.engine, fs.fstype, s.kernel),
        }
        for fs in records
        if fs.inode is None
    ]
    files_no_large = [{"device": fs.device, "inode": fs.inode, "type": fs.fstype} for fs in records if fs.inode]
    mounted = kernel.mounts()
    seen = Evidence(
        recorded_none=frozenset(fs.mountpoint for fs in records if fs.inode is None and fs.mountpoint),
        seen_huge=frozenset(
            m.mountpoint
            for t in work
            if t.count(HUGE, REPAIRED, LOADED) and (m := kernel.mount_holding(t.path, mounted))
        ),
    )
    release = os.environ.get(RELEASE_ENV) or s.kernel
    shared_policy = _shared_policy()
    holding = program_filesystems(mounted, [t.path for t in targets])
    ways = [
        judge(fs, holds, s=s, release=release, engine=r.engine, shared_policy=shared_policy, seen=seen)
        for fs, holds in holding.items()
    ]
    return Found(
        hp=r.hp,
        system=s,
        features=features,
        cannot_measure=cannot_measure,
        targets=targets,
        problems=problems,
        copies=copies,
        held=held,
        removed=removed,
        shared_dir=shared.shared_dir(r.rdir),
        thp_advice=thp_advice,
        no_large=no_large,
        files_no_large=files_no_large,
        ways=ways,
        may_record=os.geteuid() == 0,  # the engine's may_record would make the directory
    )


def _shared_policy() -> str:
    """The policy's [runtime] shared, "auto" (its default) where the policy is not
    usable (the commands that act on it say why)."""
    from hugify import policy

    try:
        return policy.resolve(policy.load(None), None, for_build=False).shared
    except policy.PolicyError:
        return "auto"


def as_json(f: Found) -> dict[str, Any]:
    files = []
    for t in f.targets:
        d = t.as_json()
        for k in ("elapsed_ms",):
            d.pop(k, None)
        if f.cannot_measure and "coverage" in d:
            d["coverage"] = d["huge_bytes"] = None
        files.append(d)
    return {
        "system": f.system.as_json()
        | {
            "features": f.features,
            "problem": f.system.problem(),
            "filesystems_without_large_folios": f.no_large,
            "files_without_large_folios": f.files_no_large,
        }
        | {"glibc_elf_thp": f.thp_advice.as_json()},
        "machine": {"filesystems": [w.as_json() for w in f.ways], "measure": TRY_HINT},
        "files": files,
        "problems": f.problems,
        "anonymous_copies": [c.as_json(f.hp) for c in f.copies],
        "shared_copies": {
            "directory": str(f.shared_dir),
            "copies": [h.as_json() for h in f.held],
            "held_bytes": sum(h.held for h in f.held),
            "removed_but_mapped": [x.as_json() for x in f.removed],
        },
    }


TRY_HINT = "hugify try -- COMMAND"


def _print_ways(f: Found) -> None:
    """The answer to "what does this machine get?", per filesystem holding programs."""
    print("what hugified code gets on this machine, per filesystem holding programs:")
    for w in f.ways:
        more = f" and {len(w.holds) - 3} more" if len(w.holds) > 3 else ""
        print(f"  {w.mountpoint} ({w.fstype}, holding {', '.join(w.holds[:3])}{more}): {w.way}: {w.why}")
    if not f.ways:
        print("  no filesystem holding programs found")
    print(f"whether that makes a command faster here: {TRY_HINT} ({doc('try.md')})")


def _cachestat(f: Found) -> str:
    """cachestat(2) as this process found it: the kernel answers it only to a file's
    owner, root or a writer, so another user's "no" is a refusal, not a missing call."""
    if f.features["cachestat"] or f.may_record:
        return _yes(f.features["cachestat"])
    return "cannot tell as this user (permission: the kernel answers it only to a file's owner, root or a writer)"


def _exec_verdict(f: Found) -> str:
    if f.system.exec_pmd_readahead is not None:
        return _yes(f.system.exec_pmd_readahead)
    if f.may_record:
        return "unknown (not probed yet this boot: a prefetch as root probes it)"
    return "unknown (not recorded this boot: root's prefetch, the boot service's, records it)"


def _print_system(f: Found) -> None:
    from hugify.sizes import human

    s = f.system
    print(
        f"kernel {s.kernel}; transparent huge pages: enabled={s.thp_enabled or 'unavailable'} "
        f"defrag={s.thp_defrag or '-'}; PMD huge page {human(s.pmd_size)}; base page {human(s.page_size)}"
    )
    print(
        f"kernel features: cachestat {_cachestat(f)}; "
        f"PAGEMAP_SCAN {_yes(f.features['pagemap_scan'])}; "
        f"exec mappings read as PMD folios by the kernel itself {_exec_verdict(f)}; "
        f"read-only THP for filesystems {_yes(f.features['read_only_thp_for_fs'])}"
    )
    problem = s.problem()
    if problem:
        print(f"note: {problem}")
    for fs in f.no_large:  # found by a prefetch, hugify-run or the audit library this boot
        where = f"{fs['mountpoint']} ({fs['type']})" if fs["mountpoint"] else f"a {fs['type']} filesystem"
        print(
            f"note: {where}, device {fs['device']}, gives no large folios on this kernel: "
            f"its files stay in small pages; {fs['remedy']} (recorded for this boot; "
            "`hugify prefetch --clear-records` forgets it)"
        )
    if f.files_no_large:
        print(
            f"note: {len(f.files_no_large)} files get no large folios where their filesystem may "
            "(recorded for this boot; `hugify prefetch --clear-records` forgets them)"
        )
    for line in f.thp_advice.lines():
        print(f"hint: {line}")
    if f.cannot_measure:
        print("note: coverage cannot be measured from this process")


def _print_copies(copies: list[Copy], hp: int) -> None:
    from hugify.sizes import human

    if not copies:
        print("anonymous copies: none")
        return
    print("anonymous copies (per process; shared with forked children, so each counts its share):")
    for c in copies:
        print(
            f"  pid {c.pid} ({c.command}): {c.path}: {c.windows(hp)} windows, "
            f"{human(c.anon_huge)} in anonymous huge pages, its share {human(c.pss)}"
        )
    print(
        f"  total: {len({c.pid for c in copies})} processes hold {human(sum(c.pss for c in copies))} "
        "(the sum of their shares: a copy shared by forked processes counts once)"
    )


def _print_shared(held: list[Held], removed: list[Removed]) -> None:
    from hugify.sizes import human

    if not held and not removed:
        print("shared copies: none")
        return
    print("shared copies (one per file, held once whatever the number of processes mapping them):")
    for h in held:
        users = f"mapped by {len(h.mapped_by)} processes" if h.mapped_by else "mapped by no process"
        problem = f"; not used: {h.problem[1]} ({h.problem[0]})" if h.problem else ""
        print(
            f"  {h.record.path}: {h.windows} windows, {h.huge_windows} in huge pages, "
            f"{human(h.held)} held, {users}{problem}"
        )
    for r in removed:
        print(
            f"  removed {r.copy}: {human(r.mapped)} still mapped by {len(r.mapped_by)} processes (held until they exit)"
        )
    print(f"  total: {human(sum(h.held for h in held))} held in {len(held)} copies")


def _print_files(f: Found) -> None:
    """The table of the files: code, how much of it is in huge-page folios, coverage."""
    from hugify.sizes import exact, human

    targets = f.targets
    reasons.printed(t.error[0] for t in targets if t.error)
    width = min(max(len(t.path) for t in targets), 70)
    in_folios = f"IN {exact(f.hp)} FOLIOS"
    col = max(12, len(in_folios))
    print(f"{'FILE':<{width}}  {'CODE':>10}  {in_folios:>{col}}  COVERAGE")
    total_code = total_huge = 0
    for t in targets:
        if t.error:
            if t.error[0] == "hardlink":
                continue
            print(f"{t.path:<{width}}  {'-':>10}  {'-':>{col}}  {t.error[1]}")
            continue
        total_code += t.code_size
        total_huge += t.huge_bytes
        cov = "-" if f.cannot_measure else f"{100 * t.huge_bytes / t.code_size:5.1f} %"
        extra = f"  (also {', '.join(t.names[1:])})" if t.names[1:] else ""
        print(f"{t.path:<{width}}  {human(t.code_size):>10}  {human(t.huge_bytes):>{col}}  {cov}{extra}")
    if total_code and not f.cannot_measure:
        print(
            f"total: {human(total_code)} of code, {human(total_huge)} in {exact(f.hp, spelled=True)} folios "
            f"({100 * total_huge / total_code:.1f} %)"
        )


def print_text(f: Found, *, files_given: bool) -> None:
    _print_ways(f)
    _print_system(f)
    for p in f.problems:
        print(f"hugify: {p}", file=sys.stderr)
    _print_copies(f.copies, f.hp)
    _print_shared(f.held, f.removed)
    if not f.targets:
        print("no files" if files_given else "no hugified files installed (no manifests)")
        return
    _print_files(f)


def run(args: argparse.Namespace) -> Exit:
    from hugify import prefetch as pf
    from hugify.engine import engine_missing

    problems: list[str] = []
    if args.files:
        targets = [pf.Target(f) for f in args.files]
    else:
        targets, problems = pf.targets_from_manifests(pf.manifest_files(args.manifest_dir))
    missing = engine_missing()
    if missing:
        reasons.printed(["no-engine"])
        pf.say(missing)
        return Exit.REFUSED
    with pf.session(args.runtime_dir) as r:
        found = gather(r, targets, problems)
        if args.json:
            print_json(as_json(found))
        else:
            print_text(found, files_given=bool(args.files))
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="what hugified code gets on this machine, and how much of the installed files' code is huge now",
        description="First says, per mounted filesystem holding programs (those of /usr, /opt, PATH and the "
        "files reported), what hugified code gets on this machine: file-backed huge pages, root's shared "
        "copies, anonymous copies only, or none, each with its reason (the kernel's version and THP settings, "
        "the filesystem's type and options, what was seen this boot), and the command that measures it for a "
        "command of yours (hugify try). Then lists the files of the installed manifests and of the discovered "
        "list kept by the rpm file triggers (or the given files) with the share of their code that the page "
        "cache holds in 2 MiB folios right now, and the system settings that matter. Reads nothing into the "
        "page cache.",
        epilog=epilog(
            (
                ("hugify status", "what this machine gets, then the installed hugified files"),
                ("hugify status --json | jq .machine", "the per-filesystem answer, for a script"),
                ("hugify status ./gdb.huge", "how much of this file's code is huge now"),
            ),
            "0 reported; 2 usage; 4 this installation lacks the C runtime (no-engine).",
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="files to report instead of the installed ones")
    p.add_argument(
        "--manifest-dir", metavar="DIR", type=Path, help="default: $HUGIFY_MANIFEST_DIR or /usr/lib/hugify/manifest.d"
    )
    p.add_argument("--runtime-dir", metavar="DIR", help="where `hugify prefetch` records the kernel verdict")
    add_json_option(p)
    p.set_defaults(func=run)
