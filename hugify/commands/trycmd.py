"""``hugify try [options] -- COMMAND [ARGS…]``: whether hugified code makes COMMAND
faster on this machine (the module is not called ``try``: a Python keyword)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from hugify import reasons
from hugify.commands.common import add_json_option, add_policy_option, examples, print_json
from hugify.docs import doc
from hugify.exitcodes import Exit

EPILOG = (
    "Exit status: 0 measured (whatever the answer); 3 the command failed on the original files, "
    "its output differs between two runs on them, or it changed a file under test; 4 refused: a setuid "
    "program, no private namespace here, nothing to hugify, or no C runtime; 5 the cache cannot be "
    "written, or the --plot file; 6 the cache is another user's or others can write it; 7 the hugified files "
    "behave differently (output, exit status or --compare-files); 8 the command cannot be measured: too "
    "short, its runs too rarely seen, or the --control shows a difference; 2 usage; 70 a run used the other "
    "side's files. Stopped by SIGINT, SIGTERM or SIGHUP, it reports the rounds made so far and ends by the "
    "signal. `hugify explain ID` describes each reason."
)


#: The examples that end --help (and the man page).
EXAMPLES = (
    ("hugify try -- make -j4", "is this build faster with hugified compilers and libraries?"),
    ("hugify try --budget 60 --compare-files out.o -- cc -O2 -c big.c -o out.o", "a shorter run, also comparing out.o"),
)


def _percent(text: str) -> float:
    try:
        value = float(text.removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 < value < 100:
        raise argparse.ArgumentTypeError("give a percentage between 0 and 100, e.g. 1 or 0.5%")
    return value / 100


def _rounds(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of rounds: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("give 1 or more")
    return value


def _seconds(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (seconds, or 90s, 5m, 1h)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("give a positive duration")
    return value


def _progress(enabled: bool) -> Callable[[str], None]:
    """The progress line: rewritten in place on a terminal, else nothing."""

    def show(text: str) -> None:
        sys.stderr.write(f"\r\x1b[Khugify try: {text}")
        sys.stderr.flush()

    return show if enabled else (lambda text: None)


def run(args: argparse.Namespace) -> Exit:
    from hugify import abtest
    from hugify.trial import report, session

    if args.clear_cache:
        return _clear_cache(args)
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("hugify try: give the command to compare after --, e.g. hugify try -- make -j4", file=sys.stderr)
        return Exit.USAGE
    if args.min_rounds > args.max_rounds:
        print("hugify try: --min-rounds is more than --max-rounds", file=sys.stderr)
        return Exit.USAGE
    if args.plot:
        where = args.plot.parent
        if not where.is_dir():  # found out now, not after the comparison; and never made
            why = "not a directory" if where.exists() else "No such file or directory"
            reasons.printed(["io-error"])
            print(f"hugify try: cannot write the plot {args.plot}: {where}: {why} (io-error)", file=sys.stderr)
            return Exit.IO
    from hugify.policy import PolicyError

    try:
        pol = session.try_policy(args.policy)
    except PolicyError as e:
        print(f"hugify: the policy is not usable:\n{e}", file=sys.stderr)
        return Exit.INVALID  # as every other command's unusable policy (docs/exit-status.md)
    tty = sys.stderr.isatty() and not args.json
    opts = session.Options(
        argv=command,
        env=dict(os.environ),
        cwd=os.getcwd(),
        policy=pol,
        limits=abtest.Limits(args.min_rounds, args.max_rounds, args.budget, args.target),
        compare_files=args.compare_files or [],
        cache_dir=args.cache_dir,
        way=args.way,
        control=args.control,
        jobs=args.jobs or os.cpu_count() or 1,
        progress=_progress(tty),
    )
    try:
        with _stopped_by_signals():
            result = session.run(opts)
    except session.Interrupted as e:
        if tty:
            sys.stderr.write("\r\x1b[K")
        print(f"hugify try: stopped by {signal.Signals(e.signum).name} before a report could be made; the command's "
              "processes and the run's files are gone", file=sys.stderr)  # fmt: skip
        return _end_by(e.signum)
    except session.TryError as e:
        if tty:
            sys.stderr.write("\r\x1b[K")
        reasons.printed([e.reason])
        kind = reasons.table()[e.reason][0]
        if args.json:
            print_json({**e.found, "error": {"reason": e.reason, "kind": kind, "detail": e.detail}})
        print(f"hugify try: {e.detail} ({e.reason})", file=sys.stderr)
        return Exit.for_kind(kind)
    if tty:
        sys.stderr.write("\r\x1b[K")
    verdict, line = report.answer(result)
    result["verdict"], result["answer"] = verdict, line
    if args.plot:
        try:
            _write_plot(args.plot, report.svg(result))
        except OSError as e:
            reasons.printed(["io-error"])
            print(f"hugify try: cannot write the plot {reasons.io_detail(e)} (io-error)", file=sys.stderr)
            return Exit.IO
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(report.text(result))
    if result.get("interrupted"):
        sys.stdout.flush()
        print(f"hugify try: stopped by {result['interrupted']} after {result['rounds']} round(s); the command's "
              "processes and the run's files are gone", file=sys.stderr)  # fmt: skip
        return _end_by(signal.Signals[result["interrupted"]])
    failed = report.FAILED.get(verdict)
    if failed:
        sys.stdout.flush()
        reasons.printed([failed])
        print(f"hugify try: {line}", file=sys.stderr)
        return Exit.for_kind(reasons.table()[failed][0])
    return Exit.INTERNAL if result["problems"] else Exit.OK


def _end_by(signum: int) -> Exit:
    """Ends this process by the signal that stopped it, as a shell expects (it then
    shows 128 + the signal's number, 130 for SIGINT)."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return Exit.INTERNAL


def _write_plot(path: Path, text: str) -> None:
    """The picture renamed in, in the directory named (never made: hugify try may run
    as root, where a typo would make directories); never written through a symlink
    at that name (others may write the directory, as /tmp)."""
    from hugify import files

    with files.Directory.open(path.parent, follow=True) as d, files.NewFile(d, path.name) as new:
        new.write(text.encode())
        os.fchmod(new.fd, 0o644)
        new.commit()


def _clear_cache(args: argparse.Namespace) -> Exit:
    """--clear-cache: every entry of the cache removed (not what runs under way use)."""
    from hugify.trial import cache, report

    if args.command and args.command != ["--"]:
        print("hugify try: --clear-cache takes no command", file=sys.stderr)
        return Exit.USAGE
    root = Path(os.path.realpath(args.cache_dir or cache.default_root()))
    try:
        removed = cache.clear(root)
    except cache.UntrustedCache as e:
        reasons.printed(["try-cache-unsafe"])
        print(f"hugify try: {e} (try-cache-unsafe)", file=sys.stderr)
        return Exit.UNSAFE
    except OSError as e:
        reasons.printed(["try-cache"])
        print(f"hugify try: cannot clear the cache of hugified copies in {root} ({reasons.io_detail(e)}) "
              "(try-cache)", file=sys.stderr)  # fmt: skip
        return Exit.IO
    if removed is None:
        print(f"hugify try: no cache of hugified copies in {root}")
    else:
        print(f"hugify try: removed {removed[0]} entries ({report.mib(removed[1])}) from {root}")
    return Exit.OK


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP end the comparison through its clean-up (the sides'
    processes and the command's are killed, the scratch files removed) instead of
    killing this process on the spot; a signal the caller ignores stays ignored."""
    from hugify.trial.session import Interrupted

    def stop(signum: int, frame: object) -> None:
        raise Interrupted(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) != signal.SIG_IGN:
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "try",
        help="measure whether hugified code makes a command faster on this machine",
        usage="hugify try [options] -- COMMAND [ARGS...]",
        description="Runs COMMAND once to find every ELF program and library it loads (its children's too), "
        "makes hugified copies of those with enough code in a private cache, then runs COMMAND again and again, "
        "alternately on the original files and on the copies (each side in a private mount namespace where the "
        "copies are bind-mounted over the originals' paths; nothing of the system changes), and reports the "
        "hugified/original ratios of CPU and wall time with 95 % intervals, an A/A noise floor, the huge-page "
        "coverage each side got, and one line of answer. Both sides must behave the same: exit status, standard "
        "output and --compare-files are compared after every round. "
        f"Details: {doc('try.md')}.",
        epilog=f"{examples(*EXAMPLES)}\n\n{EPILOG}",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the command to compare")
    p.add_argument(
        "--target",
        type=_percent,
        default=0.01,
        metavar="PERCENT",
        help="stop once the CPU-time interval is within +-PERCENT of its median (default: 1)",
    )
    p.add_argument(
        "--budget",
        type=_seconds,
        default=300.0,
        metavar="DURATION",
        help="stop after this long of timed rounds (seconds, or 90s, 5m, 1h; default: 300)",
    )
    p.add_argument(
        "--min-rounds", type=_rounds, default=6, metavar="N", help="rounds before the target may stop it (default: 6)"
    )
    p.add_argument("--max-rounds", type=_rounds, default=200, metavar="N", help="most rounds (default: 200)")
    p.add_argument(
        "--compare-files",
        nargs="+",
        action="extend",
        metavar="PATH",
        help="files the command writes, compared (sha256) between the sides after every round",
    )
    add_json_option(p, "machine-readable output, every round's times included")
    p.add_argument("--plot", type=Path, metavar="FILE", help="also write the per-round ratios as an SVG picture")
    p.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="where the hugified copies are kept (default: /var/cache/hugify/try for root, else "
        "$XDG_CACHE_HOME/hugify/try or ~/.cache/hugify/try); it must be the caller's and writable by nobody else",
    )
    add_policy_option(
        p,
        "a policy layered over the system's (threshold, mode, include/exclude globs); stripped files are "
        "transformed unless it says refuse_stripped = true",
    )
    p.add_argument(
        "--way",
        choices=("auto", "file", "shared", "anonymous"),
        default="auto",
        help="how the hugified side gets huge pages: file (the copies' page cache in 2 MiB folios), shared "
        "(root's shared copies on a huge-page tmpfs, the copies themselves put on a tmpfs without huge pages; "
        "root only), anonymous (the runtime's anonymous copies, always), auto (file; where the filesystem "
        "gives no 2 MiB folios, shared as root, else anonymous; default)",
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="the A/A control: give the hugified side plain copies of the originals instead, to see what "
        "the method shows where nothing differs (it must claim no difference)",
    )
    p.add_argument("--jobs", type=int, metavar="N", help="copies made in parallel (default: the CPUs)")
    p.add_argument(
        "--clear-cache",
        action="store_true",
        help="remove every entry of the cache (the one --cache-dir names, else the default) and run nothing; "
        "runs under way keep what they use",
    )
    p.set_defaults(func=run)
