"""``hugify prefetch [--all | FILE…]``: load hugified files into the page cache as 2 MiB
folios, so that every process maps their code with huge pages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hugify import reasons
from hugify.commands.common import add_json_option, add_policy_option, epilog, print_json
from hugify.exitcodes import Exit, worst

if TYPE_CHECKING:
    from hugify.policy import Policy
    from hugify.prefetch import Prefetcher, Target


def file_exit(t: Target) -> Exit:
    from hugify.engine import FAILED, UNSUPPORTED

    if t.error:
        return Exit.for_kind(reasons.table()[t.error[0]][0])
    if t.count(FAILED):
        return Exit.FAILED
    if any(w.reason == "madvise-refused" for w in t.windows):
        return Exit.REFUSED
    if t.count(UNSUPPORTED) and not (t.shared and t.shared.state != "none"):
        return Exit.REFUSED  # neither file-backed nor through a shared copy
    return Exit.OK  # huge, left to the kernel, busy (retried by the timer), or a shared copy


def file_line(t: Target) -> str:
    """One line per file: what happened, and the first problem with its reason."""
    from hugify.engine import BUSY, FAILED, GOOD_STATES, KERNEL, LOADED, REPAIRED, UNSUPPORTED, UNVERIFIED
    from hugify.sizes import human

    n = len(t.windows)
    good = t.count(*GOOD_STATES)
    parts = [f"{t.path}: {good}/{n} windows huge"]
    detail = [f"{t.count(s)} {s}" for s in (LOADED, REPAIRED) if t.count(s)]
    if t.count(KERNEL):
        detail.append(f"{t.count(KERNEL)} left to the kernel's exec readahead")
    if detail:
        parts.append(f" ({', '.join(detail)})")
    for state in (FAILED, BUSY):
        bad = [w for w in t.windows if w.state == state]
        if bad:
            parts.append(f"; {len(bad)} {state}: window {bad[0].offset:#x}: {bad[0].detail} ({bad[0].reason})")
    later = sum(1 for w in t.windows if w.reason == "budget")
    if later:
        parts.append(f"; {later} left for later (boot budget spent)")
    if t.count(UNVERIFIED):
        parts.append(f"; {t.count(UNVERIFIED)} unverified (no PAGEMAP_SCAN and no readable smaps)")
    if t.count(UNSUPPORTED):  # the reason is said once for the filesystem
        alone = [w for w in t.windows if w.reason == "file-no-large-folios"]
        if alone:
            parts.append(f"; {len(alone)} unsupported: {alone[0].detail} ({alone[0].reason})")
        if t.count(UNSUPPORTED) > len(alone):
            parts.append(f"; {t.count(UNSUPPORTED) - len(alone)} unsupported: files on {t.fs} cannot be prefetched")
    if t.shared and t.shared.state != "none":
        parts.append(f"; shared copy {t.shared.state} ({human(t.shared.held)} in huge pages: {t.shared.copy})")
    elif t.shared:
        parts.append(f"; no shared copy: {t.shared.detail} ({t.shared.reason})")
    for why in ("madvise-refused", "not-owner"):  # the process's own limits, said with their reason
        left = [w for w in t.windows if w.reason == why]
        if left:
            parts.append(f"; {len(left)} left as they are: {left[0].detail} ({why})")
    if t.names[1:]:
        parts.append(f" (also {', '.join(t.names[1:])})")
    return "".join(parts)


def run(args: argparse.Namespace) -> Exit:
    alone = args.clear_records and not args.all and not args.files
    if not alone and (args.all == bool(args.files) or (args.manifests and args.all)):
        print(
            "hugify prefetch: give --all, or FILE arguments (with --manifests: manifest files), or --clear-records",
            file=sys.stderr,
        )
        return Exit.USAGE
    from hugify import prefetch as pf
    from hugify import rundir
    from hugify.engine import BUSY, GOOD_STATES, engine_missing

    if args.clear_records:
        code = _clear_records(args.runtime_dir, say_done=alone)
        if alone or code != Exit.OK:
            return code

    problems: list[str] = []
    if args.all:
        targets, problems = pf.targets_from_manifests(pf.manifest_files(args.manifest_dir))
    elif args.manifests:
        targets, problems = pf.targets_from_manifests(Path(f) for f in args.files)
    else:
        targets = [pf.Target(f) for f in args.files]
    for p in problems:
        pf.say(p)
    codes: list[Exit] = [Exit.IO for _ in problems]
    messages: list[str] = []
    missing = engine_missing()
    if missing:
        reasons.printed(["no-engine"])
        pf.say(missing)
        return Exit.REFUSED
    from hugify.commands.common import usable_policy

    # Read once: the boot's budget and the anonymous programs both come from it. Without
    # a usable policy the boot's run cannot know its bound, and a --policy named here is
    # a mistake to stop at; other runs go on and leave the anonymous record as it was
    # (usable_policy said why).
    pol = usable_policy(args.policy, for_build=False)
    if pol is None and (args.boot or args.policy):
        return Exit.INVALID  # the boot's bound unknown, or the policy named here unusable
    with pf.session(args.runtime_dir) as r:
        if pol is not None and args.boot and rundir.first_run_this_boot(r.engine):
            r.engine.set_budget(pol.boot_budget)  # the boot's run: bounded (policy runtime.boot_budget)
        r.record()  # the THP mode (and verdict) for the audit library, also when refusing
        if pol is not None:
            _record_anonymous(r, pol.anonymous_programs)
        problem = r.system.problem()
        if problem:
            pf.say(problem)
            if args.json:
                print_json({"system": r.system.as_json(), "refused": problem, "files": []})
            return Exit.REFUSED
        for t in targets:
            if t.entry and t.entry.huge_page != r.hp:
                why = f"aligned to {t.entry.huge_page:#x}, this system's PMD huge page is {r.hp:#x}"
                t.error = ("huge-page-mismatch", why)
        work = pf.open_targets([t for t in targets if not t.error], r.hp)
        try:
            r.prefetch(work)
            r.probe_kernel(work)  # where no window was cold: status must not stay "unknown"
            if pol is not None:
                messages += _shared_copies(r, work, pol, complete=args.all)
        finally:
            pf.close_targets(work)
        messages += [f"files on {fs}: {why}" for fs, why in r.unable_fs.items()]
        for m in messages:
            pf.say(m)  # once per filesystem, not once per file
        reasons.printed(t.error[0] for t in targets if t.error)
        for t in targets:
            code = file_exit(t)
            codes.append(code)
            if args.json:
                continue
            if t.error:
                if t.error[0] != "hardlink":
                    pf.say(f"{t.path}: {t.error[1]} ({t.error[0]})")
            elif not args.quiet or code != Exit.OK or t.count(BUSY):
                print(file_line(t))
        if not args.json and not args.quiet and work:
            windows = sum(len(t.windows) for t in work)
            huge = sum(t.count(*GOOD_STATES) for t in work)
            ms = sum(t.elapsed for t in work) * 1e3
            print(f"{len(work)} files, {huge}/{windows} windows huge, {ms:.1f} ms")
        if args.json:
            print_json(
                {
                    "system": r.system.as_json(),
                    "messages": messages,
                    "files": [t.as_json() for t in targets],
                }
            )
    return worst(codes)


def _shared_copies(r: Prefetcher, work: list[Target], pol: Policy, complete: bool) -> list[str]:
    """Root's shared copies of the files whose windows are unsupported (policy
    [runtime] shared and shared_budget; docs/runtime.md "Shared copies"): each file's
    outcome goes to its target; returns what is said once for the run."""
    from hugify import shared

    if pol.shared == "off":
        dropped = shared.drop_all(r.rdir)
        return [f"shared copies off (policy runtime.shared): dropped {len(dropped)}"] if dropped else []
    report = shared.settle(r.rdir, r.engine, work, pol.shared_budget, complete)
    for t in work:
        t.shared = report.outcomes.get(t.path)
    reasons.printed(o.reason for o in report.outcomes.values() if o.reason)
    out = []
    if report.problem:
        reasons.printed([report.problem[0]])
        out.append(f"no shared copies: {report.problem[1]} ({report.problem[0]})")
    if report.dropped:
        out.append(f"shared copies dropped (changed, removed or no longer wanted): {', '.join(report.dropped)}")
    return out


def _record_anonymous(r: Prefetcher, programs: tuple[str, ...]) -> None:
    """Passes the policy's [runtime] anonymous programs to the audit library (records
    are root's: another user's run says so only when the record would change)."""
    from hugify import prefetch as pf
    from hugify import rundir

    if not rundir.write_anonymous_record(r.engine, programs):
        why = "" if r.engine.may_record() else ": records are written by root only, in a directory of root's"
        pf.say(f"cannot write {r.rdir / rundir.ANONYMOUS_FILE}{why}")


def _clear_records(runtime_dir: str | None, say_done: bool) -> Exit:
    """hugify prefetch --clear-records: forgets this boot's verdicts (what gives no large
    folios, the kernel's), so that the next runs find them out again."""
    from hugify import prefetch as pf
    from hugify import rundir
    from hugify.engine import engine_missing

    missing = engine_missing()
    if missing:
        reasons.printed(["no-engine"])
        pf.say(missing)
        return Exit.REFUSED
    with pf.session(runtime_dir) as r:
        if not r.engine.may_record():
            pf.say(f"only root clears the records in {r.rdir} (a directory of root's that nobody else may write)")
            return Exit.REFUSED
        names = rundir.verdict_records(r.rdir)
        left = rundir.clear_records(r.engine, r.rdir)
    for n in left:
        pf.say(f"cannot remove {r.rdir / n}")
    if not left and say_done:
        print(f"{len(names)} records cleared in {r.rdir}")
    return Exit.IO if left else Exit.OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "prefetch",
        help="load hugified files into the page cache as 2 MiB huge pages",
        description="Loads the code of hugified files into the page cache as 2 MiB folios, so that every "
        "process that maps them gets huge pages, and reports per file how many 2 MiB windows are huge, "
        "busy (small folios mapped by running processes) or failed, with the reason.",
        epilog=epilog(
            (
                ("sudo hugify prefetch --all", "every installed hugified file: what the boot service does"),
                ("hugify prefetch ./gdb.huge", "one file (another user's: only what the kernel lets it see)"),
                ("sudo hugify prefetch --clear-records", "forget this boot's verdicts, to find them out again"),
            ),
            "0 every window is huge, busy, or left to the kernel; 1 some window failed; 2 usage; 3 a file is "
            "not hugified or not a file, or the policy is not usable; 4 the system or its filesystem cannot do it "
            "(said once), or this installation lacks the C runtime (no-engine); 5 a file is missing or unreadable.",
        ),
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="files to prefetch (or manifests, with --manifests)")
    p.add_argument(
        "--all",
        action="store_true",
        help="every file listed in the installed manifests and in the discovered list "
        "(discovered.list in $HUGIFY_STATE_DIR or /var/lib/hugify, kept by the rpm file triggers)",
    )
    p.add_argument(
        "--manifests", action="store_true", help="the FILE arguments are manifests: prefetch the files they list"
    )
    p.add_argument(
        "--manifest-dir",
        metavar="DIR",
        type=Path,
        help="where --all finds the manifests (default: $HUGIFY_MANIFEST_DIR or /usr/lib/hugify/manifest.d)",
    )
    p.add_argument(
        "--runtime-dir",
        metavar="DIR",
        help="where the kernel verdict is recorded (default: $HUGIFY_RUNTIME_DIR or /run/hugify)",
    )
    p.add_argument(
        "--clear-records",
        action="store_true",
        help="first forget this boot's verdicts in the runtime directory (which filesystems and files give no "
        "large folios, whether the kernel makes exec code huge by itself), so that they are found out again; "
        "alone: only that (root only)",
    )
    p.add_argument(
        "--boot",
        action="store_true",
        help="the boot service's run: if no prefetch ran yet this boot, read at most the policy's "
        "runtime.boot_budget bytes of code (the rest stays cold: state cold, reason budget)",
    )
    add_policy_option(p, "an extra policy layer ([runtime] boot_budget and anonymous)")
    p.add_argument("-q", "--quiet", action="store_true", help="report only files with a problem")
    add_json_option(p)
    p.set_defaults(func=run)
