"""``hugify policy show|check``: the effective policy and where each value comes from."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hugify.commands.common import add_json_option, add_policy_option, epilog, print_json
from hugify.exitcodes import Exit


def show(args: argparse.Namespace) -> Exit:

    from hugify import policy

    try:
        layers = policy.load(args.policy)
        pol = policy.resolve(layers, args.package)
    except policy.PolicyError as e:
        print(f"hugify: the policy is not usable:\n{e}", file=sys.stderr)
        return Exit.INVALID
    overrides = None if args.package else policy.package_overrides(layers)
    if args.json:
        doc = {
            "package": args.package,
            "layers": [{"path": str(p), "present": present} for p, present in layers.files],
            "values": pol.as_json(),
        }
        if overrides:
            doc["packages"] = {name: policy.settings_json(o) for name, o in sorted(overrides.items())}
        print_json(doc)
    else:
        sys.stdout.write(policy.render(pol, layers, overrides))
    return Exit.OK


def check(args: argparse.Namespace) -> Exit:
    from hugify import policy

    code = Exit.OK
    for f in args.files:
        try:
            policy.check_file(Path(f))
        except policy.PolicyError as e:
            print(e, file=sys.stderr)
            code = Exit.INVALID
            continue
        print(f"{f}: ok")
    return code


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "policy",
        help="show the effective policy, or validate policy files",
        description="The policy decides which files hugify transforms and how (threshold, mode, include and "
        "exclude globs, failure mode, huge-page size per architecture, signing, runtime), in layers: built-in "
        "defaults, /usr/lib/hugify/policy.toml, /etc/hugify/policy.toml, --policy FILE.",
        epilog=epilog(
            (
                ("hugify policy show", "every value in effect and the file it came from"),
                ("hugify policy show --package foo --json", "the values for the package foo"),
                ("hugify policy check /etc/hugify/policy.toml", "mistakes with file, line and a hint"),
            ),
            "0; 2 usage; 3 a policy is not usable.",
        ),
    )
    cmds = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    s = cmds.add_parser(
        "show",
        help="print the effective policy and the file each value came from",
        description="Layers, later wins: built-in defaults, /usr/lib/hugify/policy.toml, "
        "/etc/hugify/policy.toml (HUGIFY_POLICY_PATH replaces these two), --policy FILE.",
        epilog=epilog(
            (("hugify policy show --package foo", "the values in effect for the package foo"),),
            "0; 2 usage; 3 the policy is not usable.",
        ),
    )
    add_policy_option(s)
    s.add_argument("--package", metavar="NAME", help="show the values in effect for this package")
    add_json_option(s)
    s.set_defaults(func=show)
    c = cmds.add_parser(
        "check",
        help="validate policy files (exit status 3 if any is invalid)",
        description="Reports every unknown key, wrong type and bad value with file, line and a hint.",
        epilog=epilog(
            (("hugify policy check debian/hugify-policy.toml", "check a package's policy"),),
            "0 every file is valid; 3 one is not.",
        ),
    )
    c.add_argument("files", nargs="+", metavar="FILE")
    c.set_defaults(func=check)
