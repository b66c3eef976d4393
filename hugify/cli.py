"""The ``hugify`` command line."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hugify import _core, render
from hugify.exitcodes import Exit, worst
from hugify.rewrite import Settings, rewrite
from hugify.sizes import parse_size


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--huge-page-size",
        type=_size,
        default=_core.DEFAULT_HUGE_PAGE,
        metavar="SIZE",
        help="huge-page size to align code to (default: %(default)s bytes, i.e. 2 MiB)",
    )
    p.add_argument(
        "--threshold",
        type=_size,
        default=_core.DEFAULT_THRESHOLD,
        metavar="SIZE",
        help="refuse files whose executable segment is smaller (default: 1 MiB; 0 for any size)",
    )
    p.add_argument(
        "--mode",
        choices=("auto", "shift", "align"),
        default="auto",
        help="shift: move code onto whole huge pages; align: pad file offsets only; "
        "auto: shift where provably safe, else align (default)",
    )


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(huge_page=args.huge_page_size, threshold=args.threshold, mode=args.mode)


def _failure(path: str, e: BaseException) -> tuple[Exit, dict[str, Any]]:
    """Turns an exception into an exit status and a structured description."""
    if isinstance(e, _core.HugifyError):
        return Exit.for_kind(e.kind), {"reason": e.reason, "kind": e.kind, "detail": e.detail}
    if isinstance(e, OSError):
        return Exit.IO, {"reason": "io-error", "kind": "io", "detail": f"{e.strerror or e}"}
    raise e


def _say_failure(path: str, info: dict[str, Any]) -> None:
    print(f"hugify: {path}: {info['detail']} ({info['reason']})", file=sys.stderr)


def cmd_inspect(args: argparse.Namespace) -> Exit:
    settings = _settings(args)
    codes: list[Exit] = []
    results: list[dict[str, Any]] = []
    for path in args.files:
        try:
            r = _core.inspect(path, settings.huge_page, settings.threshold, settings.mode)
        except (_core.HugifyError, OSError) as e:
            code, info = _failure(path, e)
            codes.append(code)
            results.append({"path": path, "error": info})
            if not args.json:
                _say_failure(path, info)
            continue
        codes.append(Exit.for_kind(r["refusal"]["kind"]) if r["refusal"] else Exit.OK)
        results.append({"path": path, **r})
        if not args.json:
            print(render.inspect_text(path, r))
    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
    return worst(codes)


def cmd_transform(args: argparse.Namespace) -> Exit:
    src = Path(args.file)
    dst = None if args.in_place else Path(args.output)
    try:
        r = rewrite(src, dst, _settings(args))
    except (_core.HugifyError, OSError) as e:
        code, info = _failure(args.file, e)
        if args.json:
            json.dump({"path": args.file, "error": info}, sys.stdout, indent=2, sort_keys=True)
            print()
        else:
            _say_failure(args.file, info)
        return code
    if args.json:
        json.dump({"path": args.file, "output": str(dst or src), **r}, sys.stdout, indent=2, sort_keys=True)
        print()
    else:
        print(render.transform_line(str(dst or src), r))
    return Exit.OK


def cmd_explain(args: argparse.Namespace) -> Exit:
    table = {rid: (kind, summary) for rid, kind, summary in _core.reasons()}
    ids = args.ids or sorted(table)
    code = Exit.OK
    for rid in ids:
        if rid not in table:
            print(f"hugify: no reason called {rid!r}; known: {', '.join(sorted(table))}", file=sys.stderr)
            code = Exit.USAGE
            continue
        kind, summary = table[rid]
        print(f"{rid} ({kind}, exit status {int(Exit.for_kind(kind))}): {summary}")
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hugify",
        description="Rewrite ELF programs and libraries so their code lives on huge pages.",
        epilog="Exit status: 0 done, 1 some files of a batch failed, 2 usage, 3 invalid input, "
        "4 refused, 5 I/O error, 70 internal error.",
    )
    parser.add_argument("--version", action="version", version=f"hugify {_core.VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("inspect", help="show the layout, both plans and the chosen one")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plan_options(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("transform", help="rewrite one file")
    p.add_argument("file", metavar="FILE")
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", metavar="OUT", help="write the result to OUT")
    out.add_argument("--in-place", action="store_true", help="replace FILE atomically, keeping its metadata")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plan_options(p)
    p.set_defaults(func=cmd_transform)

    p = sub.add_parser("explain", help="describe refusal reasons (all, or the IDs given)")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.set_defaults(func=cmd_explain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], Exit] = args.func
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
