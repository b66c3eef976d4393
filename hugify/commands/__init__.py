"""One module per ``hugify`` subcommand. Each exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a callable returning an Exit status.
Add a new command by writing its module and listing it here."""

from __future__ import annotations

import argparse
import importlib

COMMANDS = [
    "inspect",
    "transform",
    "explain",
    "tree",
    "policy",
    "prefetch",
    "status",
    "manifest",
    "sign",
    "sign-packages",
    "verify",
    "check",
    "repack",
    "derive-source",
    "try",
]
#: Commands whose module has another name (`try` is a Python keyword); a dash
#: in a name is an underscore in its module.
MODULES = {"try": "trycmd"}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], only: str | None = None) -> None:
    """Registers every command, or only `only`: a command imports just its own
    modules, which keeps the start-up of a per-file `hugify transform` short."""
    for name in [only] if only in COMMANDS else COMMANDS:
        importlib.import_module(f"hugify.commands.{MODULES.get(name, name.replace('-', '_'))}").register(sub)
