"""One module per ``hugify`` subcommand. Each exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a callable returning an Exit status.
Add a new command by writing its module and listing it here."""

from __future__ import annotations

import argparse
import importlib

COMMANDS = ["inspect", "transform", "explain", "tree", "policy", "prefetch", "status", "sign", "verify"]


def register_all(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name in COMMANDS:
        importlib.import_module(f"hugify.commands.{name}").register(sub)
