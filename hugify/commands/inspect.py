"""``hugify inspect FILE…``: layout, both plans and the chosen one, with a picture."""

from __future__ import annotations

import argparse
from typing import Any

from hugify import _core, reasons
from hugify.commands.common import add_json_option, add_plan_options, epilog, failure, print_json, say_failure, settings
from hugify.exitcodes import Exit, worst
from hugify.rewrite import hugify_error


def run(args: argparse.Namespace) -> Exit:
    import shutil

    from hugify import render

    s = settings(args)
    # The terminal's width ($COLUMNS first); 80 where stdout is no terminal.
    width = shutil.get_terminal_size((render.DEFAULT_WIDTH, 24)).columns
    codes: list[Exit] = []
    results: list[dict[str, Any]] = []
    for path in args.files:
        try:
            r = _core.inspect(path, s.huge_page, s.threshold, s.mode, s.exposure_limit, s.page_size)
        except (_core.HugifyError, OSError) as e:
            if isinstance(e, _core.HugifyError) and e.reason == "not-regular":
                e = hugify_error("wrong-file-type", e.detail)  # a path named on the command line
            code, info = failure(e, path)
            codes.append(code)
            results.append({"path": path, "error": info})
            if not args.json:
                say_failure(path, info)
            continue
        codes.append(Exit.for_kind(r["refusal"]["kind"]) if r["refusal"] else Exit.OK)
        plans = (r["plans"]["shift"], r["plans"]["align"])
        reasons.printed([r["refusal"] and r["refusal"]["reason"], *(p["reason"] for p in plans if p["ok"] is False)])
        results.append({"path": path, **r})
        if not args.json:
            print(render.inspect_text(path, r, width))
    if args.json:
        print_json(results)
    return worst(codes)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the layout, both plans and the chosen one",
        description="Reads each FILE (nothing is written) and shows its layout, the shift and align plans with "
        "the share of code each puts on huge pages, the one `transform` would choose or why it refuses, and a "
        "picture of the loadable segments against huge-page windows, before and after, as wide as the terminal.",
        epilog=epilog(
            (
                ("hugify inspect /usr/bin/gdb", "the layout, both plans and a picture of the windows"),
                ("hugify inspect --json /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1", "the same, for a script"),
            ),
            "0 eligible, 3 invalid input (a malformed file, a directory or device), 4 refused (the reason id "
            "says why), 5 I/O error: what `transform` would return; several files: the most serious.",
        ),
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="ELF programs or libraries to look at")
    add_json_option(p)
    add_plan_options(p)
    p.set_defaults(func=run)
