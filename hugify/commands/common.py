"""Options and failure reporting shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import stat
import sys
from typing import TYPE_CHECKING, Any

from hugify import _core, reasons
from hugify.exitcodes import Exit
from hugify.files import UnsafeFile
from hugify.rewrite import Settings
from hugify.sizes import parse_size

# Type-only: pathlib and the policy module stay out of `transform`'s start-up.
if TYPE_CHECKING:
    from pathlib import Path

    from hugify.policy import Policy


def examples(*pairs: tuple[str, str]) -> str:
    """The examples paragraph that ends a command's --help: each command line, then
    what it does, indented (cli.HelpFormatter keeps indented lines as written;
    tools/manpages makes the EXAMPLES section of the command's man page from it)."""
    lines = ["examples:"]
    for command, what in pairs:
        lines += [f"  {command}", f"      {what}"]
    return "\n".join(lines)


def epilog(pairs: tuple[tuple[str, str], ...], status: str) -> str:
    """A command's --help epilog: its examples, then its exit statuses
    (docs/exit-status.md)."""
    return f"{examples(*pairs)}\n\nExit status: {status}"


def size_arg(text: str) -> int:
    """argparse type for sizes such as 2M or 4096."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _add_size_option(p: argparse.ArgumentParser, flag: str, default: int, help: str) -> None:
    p.add_argument(flag, type=size_arg, default=default, metavar="SIZE", help=help)


def add_plan_options(p: argparse.ArgumentParser) -> None:
    _add_size_option(p, "--huge-page-size", _core.DEFAULT_HUGE_PAGE, "huge-page size to align code to (default: 2M)")
    _add_size_option(
        p,
        "--threshold",
        _core.DEFAULT_THRESHOLD,
        "refuse files whose executable segment is smaller (default: 1M; 0 for any size)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "shift", "align"),
        default="auto",
        help="shift: move code onto whole huge pages; align: pad file offsets only; "
        "auto: shift where provably safe, else align (default)",
    )
    _add_size_option(
        p,
        "--exposure-limit",
        0,
        "bytes of a file that were not executable (read-only data) allowed to become executable, "
        "in any mode (default: 0, none)",
    )
    _add_size_option(
        p,
        "--page-size",
        0,
        "largest base page size the output runs with, which exposure is measured in and loads stay "
        "congruent modulo (default: the largest the architecture's distribution kernels use: 64K on aarch64, "
        "4K on x86_64 and i386)",
    )


def add_json_option(p: argparse.ArgumentParser, help: str = "machine-readable output") -> None:
    """--json, the same flag in every command that has one."""
    p.add_argument("--json", action="store_true", help=help)


def print_json(doc: object) -> None:
    """What --json prints: the document indented, keys sorted (the same input, the same
    bytes), then a newline."""
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    print()


def add_policy_option(p: argparse.ArgumentParser, help: str = "a policy layered over the system ones") -> None:
    """--policy FILE: one more policy layer, over the system's (hugify.policy.load)."""
    from pathlib import Path

    p.add_argument("--policy", type=Path, metavar="FILE", help=help)


def settings(args: argparse.Namespace) -> Settings:
    return Settings(
        huge_page=args.huge_page_size,
        threshold=args.threshold,
        mode=args.mode,
        exposure_limit=args.exposure_limit,
        page_size=args.page_size,
    )


def failure(e: BaseException, path: str | None = None) -> tuple[Exit, dict[str, Any]]:
    """An exit status and a structured description for a per-file failure of `path`.
    Anything that is neither a hugify verdict nor an I/O error propagates."""
    if isinstance(e, _core.HugifyError):
        reasons.printed([e.reason])
        return Exit.for_kind(e.kind), {"reason": e.reason, "kind": e.kind, "detail": e.detail}
    if isinstance(e, UnsafeFile):
        reasons.printed([e.reason])
        return Exit.UNSAFE, {"reason": e.reason, "kind": "unsafe", "detail": e.detail}
    if isinstance(e, OSError):
        reasons.printed(["io-error"])
        detail = reasons.io_detail(e, with_file=str(e.filename) != path)
        return Exit.IO, {"reason": "io-error", "kind": "io", "detail": detail}
    raise e


def say_failure(path: str, info: dict[str, Any]) -> None:
    print(f"hugify: {path}: {info['detail']} ({info['reason']})", file=sys.stderr)


def build_root(text: str) -> Path | Exit:
    """The build root a command works on, or the exit status after saying why it is
    not one: missing (io-error, 5) or not a directory (wrong-file-type, 3)."""
    import os
    from pathlib import Path

    try:
        st = os.stat(text)
    except OSError as e:
        reasons.printed(["io-error"])
        print(f"hugify: {text}: {reasons.io_detail(e, with_file=False)} (io-error)", file=sys.stderr)
        return Exit.IO
    if not stat.S_ISDIR(st.st_mode):
        reasons.printed(["wrong-file-type"])
        print(f"hugify: {text}: not a directory: give the build root (wrong-file-type)", file=sys.stderr)
        return Exit.INVALID
    return Path(text)


def usable_policy(
    path: Path | None, package: str | None = None, *, for_build: bool = True, recorded: bool = False
) -> Policy | None:
    """The effective policy, or None after saying why it is not usable. `recorded`
    (--recorded-policy, package builds): only the layers packages install, and a
    line on stdout, for the build log, naming an administrator's file left out."""
    from hugify import policy

    if recorded and (left_out := policy.unrecorded_admin_file()):
        print(
            f"hugify: note: {left_out[0]} (sha256 {left_out[1]}) is not read in package builds: a rebuild from "
            "the build's record would not have it; put the distribution's policy in a package",
            flush=True,
        )
    try:
        return policy.resolve(policy.load(path, recorded=recorded), package, for_build=for_build)
    except policy.PolicyError as e:
        print(f"hugify: the policy is not usable:\n{e}", file=sys.stderr)
        return None


def add_recorded_policy_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recorded-policy",
        action="store_true",
        help="a package build: read only the policy files packages install (and --policy), not "
        "/etc/hugify/policy.toml, which is in no package, so a rebuild from the build's record "
        "(.buildinfo, build-root package list) has the same policy",
    )
