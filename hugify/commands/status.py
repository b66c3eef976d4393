"""``hugify status [--json]``: the installed hugified files, how much of their code is
in huge-page folios right now, and the system settings that decide it. `gather` finds
it all in one pass; `as_json` and `print_text` only render what it found."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hugify import reasons
from hugify.exitcodes import Exit

if TYPE_CHECKING:
    from hugify.anoncopies import Copy
    from hugify.glibc_thp import Advice
    from hugify.prefetch import Run, System, Target
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


def gather(r: Run, targets: list[Target], problems: list[str]) -> Found:
    """Measures `targets` and reads the system's settings, records and copies; reads
    nothing into the page cache."""
    from hugify import anoncopies, glibc_thp, shared
    from hugify import prefetch as pf

    s = r.system
    features = {
        "cachestat": s.cachestat,
        "pagemap_scan": r.engine.has(pf.Engine.PAGEMAP_SCAN),
        "exec_pmd_readahead": s.exec_pmd_readahead,
        "read_only_thp_for_fs": pf.kernel_config("CONFIG_READ_ONLY_THP_FOR_FS"),
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
    records = pf.without_large_folios(r.engine, r.rdir)
    no_large = [
        {
            "device": fs.device,
            "type": fs.fstype,
            "mountpoint": fs.mountpoint,
            "remedy": pf.large_folios_remedy(r.engine, fs.fstype, s.kernel),
        }
        for fs in records
        if fs.inode is None
    ]
    files_no_large = [{"device": fs.device, "inode": fs.inode, "type": fs.fstype} for fs in records if fs.inode]
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
    )


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


def _print_system(f: Found) -> None:
    from hugify.sizes import human

    s = f.system
    print(
        f"kernel {s.kernel}; transparent huge pages: enabled={s.thp_enabled or 'unavailable'} "
        f"defrag={s.thp_defrag or '-'}; PMD huge page {human(s.pmd_size)}; base page {human(s.page_size)}"
    )
    print(
        f"kernel features: cachestat {_yes(f.features['cachestat'])}; "
        f"PAGEMAP_SCAN {_yes(f.features['pagemap_scan'])}; "
        f"exec mappings read as PMD folios by the kernel itself "
        f"{_yes(s.exec_pmd_readahead, 'unknown (not probed yet: a prefetch probes it when it reads a cold window)')}; "
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

    problems: list[str] = []
    if args.files:
        targets = [pf.Target(f) for f in args.files]
    else:
        targets, problems = pf.targets_from_manifests(pf.manifest_files(args.manifest_dir))
    missing = pf.engine_missing()
    if missing:
        reasons.printed(["no-engine"])
        pf.say(missing)
        return Exit.REFUSED
    with pf.session(args.runtime_dir) as r:
        found = gather(r, targets, problems)
        if args.json:
            json.dump(as_json(found), sys.stdout, indent=2, sort_keys=True)
            print()
        else:
            print_text(found, files_given=bool(args.files))
    return Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="installed hugified files and how much of their code is on huge pages now",
        description="Lists the files of the installed manifests and of the discovered list kept by the rpm "
        "file triggers (or the given files) with the share of "
        "their code that the page cache holds in 2 MiB folios right now, and the system settings that "
        "matter. Reads nothing into the page cache.",
        epilog="Exit status: 0 reported; 4 this installation lacks the C runtime (no-engine); 2 usage.",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="files to report instead of the installed ones")
    p.add_argument(
        "--manifest-dir", metavar="DIR", type=Path, help="default: $HUGIFY_MANIFEST_DIR or /usr/lib/hugify/manifest.d"
    )
    p.add_argument("--runtime-dir", metavar="DIR", help="where `hugify prefetch` records the kernel verdict")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)
