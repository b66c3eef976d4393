"""``hugify inspect FILE…``: layout, both plans and the chosen one, with a picture."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hugify import _core, reasons
from hugify.commands.common import add_plan_options, failure, say_failure, settings
from hugify.exitcodes import Exit, worst
from hugify.rewrite import hugify_error


def run(args: argparse.Namespace) -> Exit:
    import json

    from hugify import render

    s = settings(args)
    codes: list[Exit] = []
    results: list[dict[str, Any]] = []
    for path in args.files:
        try:
            r = _core.inspect(path, s.huge_page, s.threshold, s.mode, s.exposure_limit)
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
            print(render.inspect_text(path, r))
    if args.json:
        json.dump(results, sys.stdout, indent=2, sort_keys=True)
        print()
    return worst(codes)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "inspect",
        help="show the layout, both plans and the chosen one",
        description="Exit status is what `transform` would return: 0 eligible, 3 invalid, 4 refused.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_plan_options(p)
    p.set_defaults(func=run)
