"""The ``hugify`` command line: parses arguments and dispatches to hugify.commands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

from hugify import _core
from hugify.commands import register
from hugify.commands.common import examples
from hugify.exitcodes import Exit


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, but a paragraph of indented lines in a description or
    epilog (a command's examples) is kept as written; other paragraphs are filled."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        out = []
        for para in text.split("\n\n"):
            if any(line.startswith("  ") for line in para.splitlines()[1:]):
                out.append("\n".join(indent + line for line in para.splitlines()))
            else:
                out.append(super()._fill_text(para, width, indent))
        return "\n\n".join(out)


class Parser(argparse.ArgumentParser):
    """Every hugify parser, subcommands' too: HelpFormatter by default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with just the command `only`."""
    parser = Parser(
        prog="hugify",
        description="Rewrite ELF programs and libraries so that their code lives on huge pages.",
        epilog=examples(
            ("hugify status", "what hugified code gets on this machine"),
            ("hugify inspect /usr/bin/gdb", "what hugify would do to a file"),
            ("hugify try -- make -j4", "whether hugified code makes a command faster here"),
            ("hugify COMMAND --help", "a command's options and examples (man hugify-COMMAND)"),
        )
        + "\n\nExit status: 0 done, 1 some files of a batch failed, 2 usage, 3 invalid input (a malformed "
        "file, a directory or device where a file is wanted, an unusable policy), 4 refused, 5 I/O error, "
        "6 unsafe file (a symlink where a file is replaced or written, a file swapped while hugify worked, "
        "a device at an output's name; nothing written), 7 the command behaved differently on hugified files "
        "(try), 8 the command cannot be measured (try), 10-13 verify's verdicts, 70 internal error; "
        "the same in every command (exit-status.md). "
        "`hugify explain` lists the refusal reasons.",
    )
    parser.add_argument("--version", action="version", version=f"hugify {_core.VERSION}")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser),
    )
    register(sub, only)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    func: Callable[[argparse.Namespace], Exit] = args.func
    try:
        return int(func(args))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
